"""SearchEnv: search-and-browse question answering as a Gymnasium text environment.

One episode is one question. Each `step` takes the agent's whole turn as text, runs its single tool
call (search, access a page, or answer) and returns the tool's result as the next observation.
Reward is 0 until the answer, which is judged and ends the episode; the turn budget and the
observation-token budget truncate it. A malformed turn is explained in the observation, never raised.

The native interface is async (`areset`, `astep`) so thousands of episodes share one event loop in
a trainer; `reset`/`step` are thin sync wrappers for the standard Gymnasium API.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec
from gymnasium.error import ResetNeeded

from searchgym.core.cost_meter import metered
from searchgym.envs import prompts
from searchgym.envs.actions import Action, parse_action
from searchgym.envs.judges import FormatGate, Judge, aug_kwargs, make_judge
from searchgym.envs.spaces import UnicodeText
from searchgym.envs.tasks import Task, TaskPool
from searchgym.envs.tools.base import (
    SEARCHING_FOR,
    BackendError,
    PageBackend,
    PageNotFound,
    SearchBackend,
    backend_stats,
)
from searchgym.envs.tools.chunking import chunk_text
from searchgym.envs.tools.costs import check_cost_budget

T = TypeVar("T")

MAX_ACTION_CHARS = 1 << 20  # a turn longer than this is outside the action space (still parsed, never fatal)
MAX_OBS_CHARS = 1 << 18


def approx_tokens(text: str) -> int:
    """A tokenizer-free token estimate (about 4 characters a token); pass a real counter for exact budgets."""
    return len(text) // 4 + 1


class SearchEnv(gym.Env[str, str]):
    """Question answering by search: observations and actions are text; the reward comes from a judge.

    ## Description

    One episode is one question drawn from a task pool. Each turn the agent writes text holding one
    tool call: search a corpus, open (access) a page, or answer. The env runs the call and returns its
    result as the next observation. The answer is graded against the task's reference answers (aliases
    included) and ends the episode. The question is the only part of a task the agent ever sees.

    ## Action Space

    `UnicodeText(1_048_576)`: any `str` of at most 2**20 characters, the agent's whole turn. One tool
    call in it runs, in either syntax (both are always parsed; `tool_format` only picks the one the
    instructions teach):

    | tool   | ASearcher tags           | Hermes/Qwen JSON                                                           |
    |--------|--------------------------|----------------------------------------------------------------------------|
    | search | `<search>query</search>` | `<tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>` |
    | access | `<access>url</access>`   | `<tool_call>{"name": "access", "arguments": {"url": "..."}}</tool_call>`   |
    | answer | `<answer>text</answer>`  | `<tool_call>{"name": "answer", "arguments": {"answer": "..."}}</tool_call>` |

    Text inside `<think>...</think>` is never an action. The last call of a turn is the one that runs.
    No call, several calls, unbalanced or nested tags, invalid JSON, an unknown tool or an empty
    argument are format errors: listed in `info["format_errors"]`, explained in the next observation
    (a turn with no valid call uses the turn and runs nothing). An argument is cut to 4,096 characters.
    No action raises.

    ## Observation Space

    `UnicodeText(262_144, min_length=1)`: any non-empty `str` of at most 2**18 characters (longer
    text is cut, with a note saying so). `reset` returns the opening prompt: the instructions
    (`instructions="full"`: ASearcher's wording; `"brief"`: one line; or a template with `{question}`
    and optionally `{max_turns}`) followed by the question. `step` returns the tool's result inside
    `<information>...</information>`:

    - search: up to `top_k` hits (a BM25 index returns fewer when fewer pages match the query), each
      `[Doc k](url):` then title and snippet (cut to `doc_chars`), or "No search results are found.";
    - access: the page (cut to `max_page_chars`) in parts of `page_chunk_chars` characters, at most
      `max_page_chunks` of them, headed `>>>> Page n >>>> (of N) Title`; accessing the same url again
      gives the next part, and after the last one a note says all parts were read;
    - answer: "Your answer was recorded. The episode is over.";
    - a failed tool (unknown page, backend down, timeout): what failed and what to try instead.

    ## Rewards

    0.0 on every turn but the answer. An answer gets the judge's score in [0, 1]: `judge="f1"` (token
    F1, the default), `"em"`, `"cover_em"`, the reference projects' own rewards `"asearcher_f1"`,
    `"asearcher_em"` (which blend a task's `aug_answer` in at 0.3) and `"searchr1_em"`, a comma list such
    as `"em,f1"` (the first is the reward, all are in the verdict), or any `Judge` object (e.g. `LLMJudge`). With
    `format_gate=True` an
    answer from an episode that had a format error scores 0 (the verdict keeps what it would have
    scored).

    ## Starting State

    `reset(seed=s)` draws a task with `self.np_random`; `options={"task_id": ...}` or
    `options={"index": i}` picks one. Counters, page cursors and budgets start afresh.

    ## Episode End

    - Termination: the turn's valid call is an answer.
    - Truncation: `max_turns` turns played (default 32), or the observations so far reached
      `max_obs_tokens` tokens as counted by `token_counter` (default: none; the default counter is
      about 4 characters a token, pass e.g. `lambda s: len(tokenizer(s).input_ids)` for exact counts),
      or the tools' cost reached a unit's limit in `cost_budget` (e.g. `{"api_calls": 20}`; default:
      none): the observation then says which budget was spent.
    - `env.spec.max_episode_steps` is `max_turns`, so wrappers that read it (`TimeAwareObservation`)
      see the env's own limit; `gym.make` adds no `TimeLimit`.
    - A `step` after the end changes nothing, as Gymnasium's convention has it: a warning, a note as
      the observation, reward 0, the same `terminated`/`truncated` as the step that ended the episode,
      and `info["error"]`. A `step` before the first `reset` raises `gymnasium.error.ResetNeeded`
      (what `gym.make`'s `OrderEnforcing` raises).

    ## Info

    `reset`: `task_id`, `turn` (0), `obs_tokens`. `step`: `task_id`, `turn`, `tool` ("search",
    "access", "answer" or "invalid"), `format_errors` (this turn's), `obs_tokens` (so far), `counts`
    (searches, accesses, answers, invalid turns, backend errors so far); a search adds `query` and
    `hits` (doc id, url, title, score each); an access adds `url` and `page` (url, doc id, part
    number, parts); a failed tool adds `error`; backends with counters (caches, web clients) add
    `backend`; a search or access adds `cost` (what the call cost in the backend's units, e.g. `api_calls`,
    `bytes_fetched`, `model_calls`; {} for a local index: tools/costs.py) and `episode_cost` (summed so far);
    a truncation adds `truncation` ("turn budget", "observation-token budget" or "cost budget"); the
    answer adds `prediction`, `verdict` (score, correct, judge, detail, error) and `answers` (the
    references). Where the task names its answer page, `evidence` holds `answer_page_rank` (its rank in
    this search's hits, or None) or `answer_page_accessed` (whether this access opened it): privileged
    signals for process rewards, never for the policy's eyes. Before the answer, neither the
    observation nor `info` holds the reference answers.

    ## Determinism

    Same task pool, same seed (or task option), same actions and a local backend (`LocalIndex`,
    the embedded world) give the same episode, observations and `info` included. Web-backed envs are
    registered `nondeterministic=True`. `reset`/`step` are sync wrappers over the native `areset`/
    `astep` (thousands of episodes share one event loop); they also work inside a running loop
    (Jupyter). An env pickles and deep-copies (an index is opened again from its directory), so
    `AsyncVectorEnv` works with its default shared memory: a text observation travels as code points.

    ## Arguments

    `SearchEnv(tasks, search, pages=None, *, judge="f1", max_turns=32, max_obs_tokens=None, top_k=5,
    doc_chars=5000, page_chunk_chars=10_000, max_page_chars=250_000, max_page_chunks=10,
    tool_format="tags", instructions="full", format_gate=False, token_counter=approx_tokens,
    render_mode=None)`: `tasks` is a `TaskPool` or a task file; `search` a `SearchBackend` and `pages`
    a `PageBackend` (default: the search backend, if it can fetch pages). `render_mode="ansi"` makes
    `render()` return the transcript. The gym ids (`searchgym/SyntheticQA-v0`, `LocalQA-v0`,
    `WebQA-v0` and the benchmark suites) pass these keywords through; see docs/environments.md.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}  # fps is meaningless for text; the checker wants > 0
    _spec: EnvSpec | None = None

    def __init__(
        self,
        tasks: TaskPool | str,
        search: SearchBackend,
        pages: PageBackend | None = None,
        *,
        judge: str | Judge = "f1",
        max_turns: int = 32,
        max_obs_tokens: int | None = None,
        top_k: int = 5,
        doc_chars: int = 5000,
        page_chunk_chars: int = 10_000,
        max_page_chars: int = 250_000,
        max_page_chunks: int = 10,
        tool_format: str = "tags",
        instructions: str = "full",
        format_gate: bool = False,
        token_counter: Callable[[str], int] = approx_tokens,
        render_mode: str | None = None,
        cost_budget: dict[str, float] | None = None,
    ):
        if tool_format not in prompts.INSTRUCTIONS:
            raise ValueError(f"tool_format must be one of {sorted(prompts.INSTRUCTIONS)}, got {tool_format!r}")
        if not 1 <= max_turns <= 100_000:
            raise ValueError("max_turns must be at least 1")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        cost_budget = check_cost_budget(cost_budget)
        if pages is None:
            if not isinstance(search, PageBackend):
                raise ValueError("the search backend cannot fetch pages: pass pages=...")
            pages = search
        self.tasks = TaskPool.load(tasks)
        if len(self.tasks) == 0:
            raise ValueError(f"task pool {self.tasks.name} is empty")
        self.search_backend, self.page_backend = search, pages
        self.judge = FormatGate(make_judge(judge)) if format_gate else make_judge(judge)
        self.max_turns, self.max_obs_tokens, self.top_k = max_turns, max_obs_tokens, top_k
        self.doc_chars, self.page_chunk_chars = doc_chars, page_chunk_chars
        self.max_page_chars, self.max_page_chunks = max_page_chars, max_page_chunks
        self.tool_format = tool_format
        self.instructions = prompts.instructions_template(tool_format, instructions)
        self.token_counter = token_counter
        self.render_mode = render_mode
        self.cost_budget = dict(cost_budget or {})
        self.episode_cost: dict[str, float] = {}
        self.observation_space = UnicodeText(MAX_OBS_CHARS, min_length=1)
        self.action_space = UnicodeText(MAX_ACTION_CHARS)
        self.task: Task | None = None
        self._transcript: list[tuple[str, str]] = []
        self._done = True
        self._end: tuple[bool, bool] = (False, False)  # (terminated, truncated) of the step that ended the episode
        self._runner: _SyncRunner | None = None

    @property
    def spec(self) -> EnvSpec | None:
        """The registration `gym.make` records, with `max_episode_steps` set to `max_turns` (the env truncates
        there)."""
        return self._spec

    @spec.setter
    def spec(self, value: EnvSpec | None) -> None:
        self._spec = None if value is None else dataclasses.replace(value, max_episode_steps=self.max_turns)

    def __getstate__(self) -> dict[str, Any]:
        """Everything but the sync runner's event loop (a copy makes its own); backends pickle themselves."""
        return {**self.__dict__, "_runner": None}

    # --- the Gymnasium API ------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        return self._sync(self.areset(seed=seed, options=options))

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return self._sync(self.astep(action))

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return "\n\n".join(f"[{role}]\n{text}" for role, text in self._transcript)

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None

    def _spent_budget(self) -> str | None:
        """The cost budget this episode has used up ("api_calls 20 of 20"), or None."""
        for unit, limit in self.cost_budget.items():
            if self.episode_cost.get(unit, 0) >= limit:
                return f"{unit} {self.episode_cost[unit]:g} of {limit:g}"
        return None

    def set_trained_version(self, version: int) -> None:
        """The trainer reports the policy's trained version before an episode; backends with a schedule over
        training (the simulated search's noise curriculum) follow it, the others ignore it."""
        for backend in dict.fromkeys((self.search_backend, self.page_backend)):
            follow = getattr(backend, "set_trained_version", None)
            if callable(follow):
                follow(version)

    # --- the native async API ---------------------------------------------------------------

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode on a drawn task, or on `options={"task_id": ...}` / `{"index": i}`."""
        super().reset(seed=seed)
        self.task = self._choose_task(options or {})
        self.turn = 0
        self.obs_tokens = 0
        self.counts = {"search": 0, "access": 0, "answer": 0, "invalid": 0, "backend_errors": 0}
        self.episode_cost = {}
        self.format_errors: list[str] = []
        self._page_cursor: dict[str, int] = {}
        self._done, self._end = False, (False, False)
        obs = self._fit(self.instructions.format(question=self.task.question, max_turns=self.max_turns))
        self.obs_tokens = self.token_counter(obs)
        self._transcript = [("task", obs)]
        return obs, {"task_id": self.task.id, "turn": 0, "obs_tokens": self.obs_tokens}

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Run the turn's tool call; judge the answer if it is one."""
        if self.task is None:
            raise ResetNeeded("Cannot call env.step() before calling env.reset()")
        if self._done:
            gym.logger.warn(
                "step() after the episode ended (terminated or truncated): call reset() first; "
                "this step changes nothing"
            )
            note = "The episode is over. Call reset() to start a new one."
            return prompts.information(note), 0.0, *self._end, {"error": "step after the episode ended"}
        self.turn += 1
        parsed = parse_action(action)
        self.format_errors.extend(f"turn {self.turn}: {e}" for e in parsed.errors)
        info: dict[str, Any] = {
            "task_id": self.task.id,
            "turn": self.turn,
            "tool": parsed.tool or "invalid",
            "format_errors": list(parsed.errors),
        }
        reward, terminated = 0.0, False
        if parsed.tool is None:
            self.counts["invalid"] += 1
            text = prompts.invalid_action(parsed.errors, self.tool_format)
        elif parsed.tool in ("search", "access"):
            with metered() as cost:  # what the backends charge for this call (tools/costs.py)
                text = await (self._search(parsed, info) if parsed.tool == "search" else self._access(parsed, info))
            info["cost"] = dict(cost)
            for unit, amount in cost.items():
                self.episode_cost[unit] = self.episode_cost.get(unit, 0) + amount
            info["episode_cost"] = dict(self.episode_cost)
        else:
            reward, text = await self._answer(parsed, info)
            terminated = True
        spent = self._spent_budget() if not terminated else None
        if spent is not None:
            text += f"\n\nThe episode's tool budget is spent ({spent}). The episode ends here without an answer."
        obs = self._fit(prompts.information(text))
        self.obs_tokens += self.token_counter(obs)
        truncated = not terminated and (
            spent is not None
            or self.turn >= self.max_turns
            or (self.max_obs_tokens is not None and self.obs_tokens >= self.max_obs_tokens)
        )
        if truncated:
            info["truncation"] = (
                "cost budget"
                if spent is not None
                else "turn budget"
                if self.turn >= self.max_turns
                else "observation-token budget"
            )
        self._done, self._end = terminated or truncated, (terminated, truncated)
        info.update(obs_tokens=self.obs_tokens, counts=dict(self.counts))
        if parsed.tool in ("search", "access") and (stats := self._backend_stats()):
            info["backend"] = stats
        self._transcript += [("agent", (action if isinstance(action, str) else repr(action))[:4000]), ("env", obs)]
        return obs, reward, terminated, truncated, info

    # --- tools -------------------------------------------------------------------------------

    async def _search(self, action: Action, info: dict[str, Any]) -> str:
        self.counts["search"] += 1
        info["query"] = action.argument
        serving = SEARCHING_FOR.set((self._task.question, tuple(self._task.answers)))
        try:
            hits = await self.search_backend.search(action.argument, self.top_k)
        except (TimeoutError, BackendError, OSError) as e:
            self.counts["backend_errors"] += 1
            info["error"] = f"search failed: {e}"
            return f"The search failed ({e}). Try again or rephrase the query."
        finally:
            SEARCHING_FOR.reset(serving)
        info["hits"] = [{"doc_id": h.doc_id, "url": h.url, "title": h.title, "score": h.score} for h in hits]
        if getattr(self.search_backend, "simulated", False):  # written by an LLM, not retrieved (simulated_search.py)
            info["simulated"] = True
        answer_page = self._task.metadata.get("answer_page")
        if answer_page:  # privileged evidence for process rewards; never shown to the agent
            rank = next((k for k, h in enumerate(hits, 1) if h.url == answer_page), None)
            info["evidence"] = {"answer_page_rank": rank}
        return prompts.format_hits(hits, self.doc_chars)

    async def _access(self, action: Action, info: dict[str, Any]) -> str:
        self.counts["access"] += 1
        url = action.argument.strip().strip("<>\"'")
        info["url"] = url
        try:
            page = await self.page_backend.fetch(url)
        except PageNotFound:
            info["error"] = "page not found"
            return f"The page {url[:300]} could not be found. Access a url that appeared in the search results."
        except (TimeoutError, BackendError, OSError) as e:
            self.counts["backend_errors"] += 1
            info["error"] = f"access failed: {e}"
            return f"Accessing {url[:300]} failed ({e}). Try again or open another result."
        chunks = chunk_text(page.text[: self.max_page_chars], self.page_chunk_chars)[: self.max_page_chunks]
        number = self._page_cursor.get(page.url, 0) + 1
        if number > len(chunks):
            info["page"] = {"url": page.url, "chunk": None, "chunks": len(chunks)}
            return f"You have read all {len(chunks)} parts of {page.url}. Search again or answer."
        self._page_cursor[page.url] = number
        info["page"] = {"url": page.url, "doc_id": page.doc_id, "chunk": number, "chunks": len(chunks)}
        answer_page = self._task.metadata.get("answer_page")
        if answer_page:
            info["evidence"] = {"answer_page_accessed": page.url == answer_page}
        return prompts.format_chunk(page.title, chunks[number - 1], number, len(chunks))

    async def _answer(self, action: Action, info: dict[str, Any]) -> tuple[float, str]:
        self.counts["answer"] += 1
        task = self._task
        verdict = await self.judge.ajudge(
            action.argument,
            task.answers,
            question=task.question,
            format_errors=self.format_errors,
            **aug_kwargs(self.judge, task.aug_answers),
        )  # asearcher_* blend them
        info.update(prediction=action.argument, verdict=verdict.to_dict(), answers=list(task.answers))
        return float(verdict.score), "Your answer was recorded. The episode is over."

    # --- helpers -----------------------------------------------------------------------------

    @property
    def _task(self) -> Task:
        """The episode's task (reset() chose it)."""
        if self.task is None:
            raise ResetNeeded("Cannot call env.step() before calling env.reset()")
        return self.task

    def _choose_task(self, options: dict[str, Any]) -> Task:
        if "task_id" in options:
            return self.tasks.by_id(options["task_id"])
        if "index" in options:
            return self.tasks[int(options["index"]) % len(self.tasks)]
        return self.tasks.sample(self.np_random)

    def _backend_stats(self) -> dict[str, Any]:
        """Merged `stats()` of the backends that have one (cache hit rates, web error counters), for info."""
        out: dict[str, Any] = {}
        backends: list[SearchBackend | PageBackend] = [self.search_backend] + (
            [self.page_backend] if self.page_backend is not self.search_backend else []
        )
        for backend in backends:
            out.update(backend_stats(backend))
        return out

    def _fit(self, obs: str) -> str:
        """Keep an observation inside the observation space, saying so when it is cut."""
        if len(obs) <= MAX_OBS_CHARS:
            return obs
        note = "\n[... observation cut to fit the observation space]"
        return obs[: MAX_OBS_CHARS - len(note)] + note

    def _sync(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._runner is None:
            self._runner = _SyncRunner()
        return self._runner.run(coro)


class _SyncRunner:
    """Runs the env's coroutines from sync code, also when the caller already has a running loop (Jupyter)."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if self._thread is None:
                return self._loop.run_until_complete(coro)
        if self._thread is None:  # inside someone else's loop: move ours to a thread of its own
            self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
            self._thread.start()
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def close(self) -> None:
        """Stop the loop; first close what lives in it (a LoopSession's session closes at async-generator shutdown)."""
        if self._thread is not None:
            asyncio.run_coroutine_threadsafe(self._loop.shutdown_asyncgens(), self._loop).result(timeout=5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        else:
            with contextlib.suppress(RuntimeError):  # closed from inside another running loop: cannot run ours here
                self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()
