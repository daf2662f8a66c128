"""TRL: a searchgym env as an environment for `GRPOTrainer(environment_factory=...)`.

TRL makes one environment object per rollout, calls `reset(**row)` with the dataset row, exposes
the object's public methods as the model's tools (their signatures and docstrings become the tool
schema), and scores each rollout with `get_reward()`. Here:

- `SearchGymEnv.configured(env_id, **env_kwargs)` is the environment class for one env id. Its tools
  are `search(query)`, `access(url)` and `answer(answer)`; each runs one turn of the searchgym env
  and returns its observation. After the answer or the env's turn budget, a tool call raises, which
  TRL shows the model as the tool's error (TRL's way of saying the episode is over).
- `reset` starts the episode on the row's `task_id` and returns the env's opening text (question
  and instructions), which TRL appends to the row's prompt.
- `get_reward` is the env judge's verdict (plus Clip/Delta-refined process rewards when asked), or
  None when the judge failed: TRL then treats the rollout as unscorable (no advantage), not as a 0.
- `task_dataset(env_id, ...)` is the prompt dataset: one row per task, with its `task_id`;
  `environment_and_dataset(env_id, ...)` builds the class and the dataset from the same kwargs.
- Each rollout's transcript (its task, every tool call with its observation, the reward) is the env object's
  `transcript` property; `configured(..., transcripts="FILE.jsonl")` also appends every scored rollout's
  transcript to that file, so a run's rollouts can be read without TRL's internals.
- `tool_calling_tokenizer(model)` loads a tokenizer and gives a Hermes-style template (the tiny model's,
  Qwen's) the response parser TRL needs to read `<tool_call>` blocks; a ChatML template that cannot render tools
  (SmolLM2's) gets the same turns with Hermes tool blocks (`formats.CHATML_TOOLS_TEMPLATE`).

Needs `pip install 'searchgym[trl]'`.
"""

from __future__ import annotations

import json
import os
import threading
import weakref
from pathlib import Path
from typing import Any, ClassVar

import gymnasium as gym

import searchgym  # noqa: F401 - registers the env ids
from searchgym.agents.formats import CHATML_TOOLS_TEMPLATE
from searchgym.core.extras import needs
from searchgym.envs.env_ids import SYNTHETIC_QA
from searchgym.envs.env_kwargs import check_env_kwargs
from searchgym.envs.factory import make_unwrapped
from searchgym.envs.rewards import PROCESS_MODES, episode_reward, judge_error
from searchgym.integrations.actions import ARGUMENTS, tool_call_action

EPISODE_OVER = "The episode is over: {why}. Do not call more tools."

# How TRL (through transformers' `parse_response`) reads an assistant turn written in the Hermes/Qwen
# format: text, then `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, then <|im_end|>.
HERMES_RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


class SearchGymEnv:
    """One rollout's searchgym env for TRL; make the class for an env id with `SearchGymEnv.configured`."""

    env_id: ClassVar[str] = SYNTHETIC_QA
    env_kwargs: ClassVar[dict[str, Any]] = {}
    process_reward: ClassVar[str | None] = None  # "clip" | "delta": pay the answer-page evidence, refined
    process_weight: ClassVar[float] = 0.0
    process_threshold: ClassVar[float] = 0.0
    transcripts_path: ClassVar[str | None] = None  # where each scored rollout's transcript is appended

    def __init__(self) -> None:
        self._env = gym.make(self.env_id, **self.env_kwargs)
        weakref.finalize(self, self._env.close)  # TRL has no close hook: the env closes when this object goes
        self.task_id: str | None = None
        self.steps: list[dict[str, Any]] = []  # each turn's tool, argument and info, for logs and metrics
        self.done = True

    @classmethod
    def configured(
        cls,
        env_id: str = SYNTHETIC_QA,
        *,
        process_reward: str | None = None,
        process_weight: float = 0.0,
        process_threshold: float = 0.0,
        transcripts: str | os.PathLike | None = None,
        **env_kwargs: Any,
    ) -> type[SearchGymEnv]:
        """The environment class for `env_id` built with `env_kwargs` (what `environment_factory` takes); with
        `transcripts`, every scored rollout's transcript is appended to that JSONL file."""
        if env_kwargs.get("tool_format", "hermes") != "hermes":
            raise ValueError(
                "TRL calls tools through the chat template, so the env must teach the Hermes "
                f"format: tool_format='hermes', got {env_kwargs['tool_format']!r}"
            )
        if process_reward is not None and process_reward not in PROCESS_MODES:
            raise ValueError(
                f"process_reward must be one of {PROCESS_MODES} or None (process rewards cross "
                f"only refined), got {process_reward!r}"
            )
        if env_id not in gym.registry:
            raise ValueError(
                f"unknown env id {env_id!r}; registered searchgym ids: "
                f"{sorted(i for i in gym.registry if i.startswith('searchgym/'))}"
            )
        check_env_kwargs(env_id, env_kwargs)  # a misspelt kwarg fails here, not at the first rollout
        attrs = {
            "env_id": env_id,
            "env_kwargs": {**env_kwargs, "tool_format": "hermes"},
            "process_reward": process_reward,
            "process_weight": float(process_weight),
            "process_threshold": float(process_threshold),
            "__module__": cls.__module__,
            "transcripts_path": os.fspath(transcripts) if transcripts is not None else None,
        }
        return type(cls.__name__, (cls,), attrs)

    # --- what TRL calls ---------------------------------------------------------------------

    def reset(self, **row: Any) -> str:
        """Start the episode on the row's task (`task_id`, else `index`, else a draw seeded by `seed`)."""
        options = {k: row[k] for k in ("task_id", "index") if row.get(k) is not None}
        seed = row.get("seed")
        try:
            obs, info = self._env.reset(seed=None if seed is None else int(seed), options=options or None)
        except KeyError as e:  # the dataset was built from other env kwargs than this class
            raise ValueError(
                f"{e.args[0]}: the dataset's task is not in this env's pool; build both from the same "
                "kwargs (environment_and_dataset)"
            ) from None
        self.task_id, self.steps, self.done = info["task_id"], [], False
        return obs

    def get_reward(self) -> float | None:
        """The judge's verdict on the answer (0 without one), refined process rewards added; None if the judge
        failed."""
        reward = episode_reward(
            [s["info"] for s in self.steps],
            process=self.process_reward,
            process_weight=self.process_weight,
            threshold=self.process_threshold,
        )
        if self.transcripts_path is not None and self.task_id is not None:
            _append_line(self.transcripts_path, {**self.transcript, "reward": reward})
        return reward

    @property
    def search_env(self) -> Any:
        """The in-process `SearchEnv` under the tools: its world (page backend) and current task."""
        return self._env.unwrapped

    @property
    def transcript(self) -> dict[str, Any]:
        """This rollout so far: its task, each tool call with its argument and observation, whether it ended."""
        return {
            "env_id": self.env_id,
            "task_id": self.task_id,
            "done": self.done,
            "judge_error": self.judge_error,
            "steps": [{k: s.get(k) for k in ("tool", "argument", "observation")} for s in self.steps],
        }

    def search(self, query: str) -> str:
        """
        Search the knowledge source.

        Args:
            query: What to search for, e.g. a name or a short question.

        Returns:
            The top results, each with its title, url and a snippet.
        """
        return self._step("search", query)

    def access(self, url: str) -> str:
        """
        Open a page from the search results; opening the same url again shows its next part.

        Args:
            url: The url of a page listed in the search results.

        Returns:
            One part of the page's text.
        """
        return self._step("access", url)

    def answer(self, answer: str) -> str:
        """
        Give the final answer; this ends the episode.

        Args:
            answer: A short answer, such as a name, a year or a number.

        Returns:
            A confirmation that the answer was recorded.
        """
        return self._step("answer", answer)

    # --- helpers ---------------------------------------------------------------------------

    @property
    def judge_error(self) -> str | None:
        """Why the judge could not score the answer, if it failed."""
        return judge_error([s["info"] for s in self.steps])

    def _step(self, tool: str, argument: Any) -> str:
        """Run one turn; raise (TRL's signal to the model) once the episode is over."""
        self._check_open()
        action = tool_call_action(tool, argument)
        obs, _reward, terminated, truncated, info = self._env.step(action)
        self.steps.append({"tool": tool, "argument": argument, "action": action, "observation": obs, "info": info})
        self.done = terminated or truncated
        return obs

    def _check_open(self) -> None:
        """Raise unless an episode is running."""
        if self.task_id is None:
            raise RuntimeError("reset() must be called before the tools")
        if self.done:
            why = (
                "the answer was given" if any(s["tool"] == "answer" for s in self.steps) else "the turn budget is spent"
            )
            raise ValueError(EPISODE_OVER.format(why=why))

    @classmethod
    def served(cls, base_url: str) -> type[SearchGymEnv]:
        """The environment class for an env served by `searchgym serve env` (OpenEnv): the same tools, played
        through `SearchGymClient`, one server session per rollout; env kwargs and rewards are the server's."""
        return type(cls.__name__, (ServedSearchGymEnv,), {"base_url": base_url, "__module__": cls.__module__})


class ServedSearchGymEnv(SearchGymEnv):
    """`SearchGymEnv` over an OpenEnv session (needs `searchgym[openenv]`); make it with `SearchGymEnv.served`."""

    base_url: ClassVar[str] = ""

    def __init__(self) -> None:
        from searchgym.integrations.openenv import SearchGymClient

        self._client = SearchGymClient(base_url=self.base_url).sync()
        self._client.connect()
        weakref.finalize(self, self._client.close)
        self.task_id, self.steps, self.done = None, [], True

    @property
    def search_env(self) -> Any:
        raise TypeError("a served env's SearchEnv lives in its server; use SearchGymEnv.configured(...) for its world")

    def reset(self, **row: Any) -> str:
        """Start the episode on the row's task (`task_id`, else `index`, else a draw seeded by `seed`)."""
        request = {k: row[k] for k in ("task_id", "index", "seed") if row.get(k) is not None}
        result = self._client.reset(**request)
        if result.observation.task_id is None:
            raise ValueError(result.observation.text)
        self.task_id, self.steps, self.done = result.observation.task_id, [], False
        return result.observation.text

    def get_reward(self) -> float | None:
        """The server's reward for the finished episode (0 until it ends); None if its judge failed."""
        if not self.steps or not self.done:
            return 0.0
        return self.steps[-1]["reward"]

    @property
    def judge_error(self) -> str | None:
        return self.steps[-1]["judge_error"] if self.steps else None

    def _step(self, tool: str, argument: Any) -> str:
        from searchgym.integrations.openenv import SearchAction

        self._check_open()
        result = self._client.step(
            SearchAction(tool=tool, argument=argument if isinstance(argument, str) else str(argument))
        )
        self.steps.append(
            {
                "tool": tool,
                "argument": argument,
                "observation": result.observation.text,
                "info": result.observation.info,
                "reward": result.reward,
                "judge_error": result.observation.judge_error,
            }
        )
        self.done = result.done
        return result.observation.text


_TRANSCRIPT_LOCK = threading.Lock()  # TRL may step environments from several threads


def _append_line(path: str, row: dict[str, Any]) -> None:
    """Append one JSON line (whole, flushed) to `path`."""
    line = json.dumps(row, ensure_ascii=False, default=str) + "\n"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with _TRANSCRIPT_LOCK, open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()


def environment_and_dataset(
    env_id: str = SYNTHETIC_QA,
    *,
    task_ids: list[str] | None = None,
    limit: int | None = None,
    process_reward: str | None = None,
    process_weight: float = 0.0,
    process_threshold: float = 0.0,
    transcripts: str | os.PathLike | None = None,
    **env_kwargs: Any,
) -> tuple[type[SearchGymEnv], Any]:
    """`SearchGymEnv.configured(...)` and `task_dataset(...)` from the same env kwargs, so every row's task is in
    the env's pool: `environment_factory, train_dataset = environment_and_dataset(ID, size=1000)`."""
    env_class = SearchGymEnv.configured(
        env_id,
        process_reward=process_reward,
        process_weight=process_weight,
        process_threshold=process_threshold,
        transcripts=transcripts,
        **env_kwargs,
    )
    return env_class, task_dataset(env_id, task_ids=task_ids, limit=limit, **env_class.env_kwargs)


def task_dataset(
    env_id: str = SYNTHETIC_QA, *, task_ids: list[str] | None = None, limit: int | None = None, **env_kwargs: Any
) -> Any:
    """A `datasets.Dataset` for GRPOTrainer: one row per task of the env's pool (or of `task_ids`), with an
    empty user prompt that `SearchGymEnv.reset` fills with the task's question and instructions."""
    with needs("task_dataset"):
        from datasets import Dataset

    env = make_unwrapped(env_id, **env_kwargs)  # checks the kwargs before building anything
    try:
        pool = env.tasks
        ids = [t.id for t in pool] if task_ids is None else [pool.by_id(i).id for i in task_ids]
    finally:
        env.close()
    if limit is not None:
        ids = ids[:limit]
    if not ids:
        raise ValueError(f"{env_id} has no tasks to train on (task_ids={task_ids!r}, limit={limit!r})")
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}] for _ in ids], "task_id": ids})


def tool_schemas(env: SearchGymEnv) -> list[dict[str, Any]]:
    """The JSON schemas of `env`'s tools, in the order TRL lists them (what the chat template shows the model)."""
    with needs("tool_schemas"):
        from transformers.utils import get_json_schema

    return [get_json_schema(getattr(env, name)) for name in sorted(ARGUMENTS)]


def demonstrations(env_class: type[SearchGymEnv], task_ids: list[str], *, final_reply: str = "Done.") -> Any:
    """Oracle episodes on `task_ids` as TRL's conversational prompt-completion rows with tool calls, for a
    supervised warm start (`SFTTrainer`) before GRPO: a small model first learns to call the tools.

    The oracle (`searchgym.world.oracle`) searches each task's question verbatim, reads what it needs and
    answers; tasks it cannot solve through the env are left out. Columns: prompt, completion, tools (JSON
    text), task_id.
    """
    with needs("demonstrations"):
        from datasets import Dataset, Features, Json, List, Value

    from searchgym.envs.actions import parse_action
    from searchgym.world.oracle import OracleAgent

    oracle = OracleAgent(skim=True, think=False, question_query=True)
    env = env_class()
    schemas = json.dumps(tool_schemas(env))
    rows: list[dict[str, Any]] = []
    for task_id in task_ids:
        first = env.reset(task_id=task_id)
        search_env = env.search_env
        script = oracle.script(search_env.task, search_env.max_page_chunks)
        completion: list[dict[str, Any]] = []
        try:
            action = next(script)
            while not env.done:
                call = parse_action(action)
                assert call.tool is not None, call.errors  # the oracle's actions are well-formed
                key = ARGUMENTS[call.tool]
                completion.append(
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {"type": "function", "function": {"name": call.tool, "arguments": {key: call.argument}}}
                        ],
                    }
                )
                obs = getattr(env, call.tool)(call.argument)
                completion.append({"role": "tool", "name": call.tool, "content": obs})
                if not env.done:
                    action = script.send((obs, env.steps[-1]["info"]))
        except StopIteration:
            continue  # the oracle gave up on this task
        if env.get_reward() != 1.0:
            continue
        completion.append({"role": "assistant", "content": final_reply})
        rows.append(
            {
                "prompt": [{"role": "user", "content": first}],
                "completion": completion,
                "tools": schemas,
                "task_id": task_id,
            }
        )
    if not rows:
        raise ValueError(f"the oracle solved none of the {len(task_ids)} tasks through {env_class.env_id}")
    # messages stored as JSON: Arrow would merge the tool calls' argument objects into one struct (adding
    # `"answer": null` to every search call, which the model would learn to write)
    features = Features(
        {"prompt": List(Json()), "completion": List(Json()), "tools": Value("string"), "task_id": Value("string")}
    )
    return Dataset.from_list(rows, features=features)


def tool_calling_tokenizer(model: Any) -> Any:
    """The model's tokenizer (a path or a tokenizer), checked to render tool calls, with a Hermes response
    parser set when its template writes `<tool_call>` blocks and it has none (TRL needs one to read them)."""
    with needs("tool_calling_tokenizer"):
        from transformers import AutoTokenizer
        from trl.chat_template_utils import supports_tool_calling

    tokenizer = (
        AutoTokenizer.from_pretrained(model)
        if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__")
        else model
    )
    if not supports_tool_calling(tokenizer) and "<|im_start|>" in (getattr(tokenizer, "chat_template", None) or ""):
        # a ChatML model whose template has no tools (SmolLM2's): the same turns, with Hermes tool blocks added
        tokenizer.chat_template = CHATML_TOOLS_TEMPLATE
    if not supports_tool_calling(tokenizer):
        raise ValueError(
            "the model's chat template cannot render tool calls and tool results; use a tool-capable "
            "template (e.g. Qwen2.5's, or the one `searchgym model tiny` writes)"
        )
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        probe = tokenizer.apply_chat_template(
            [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": {"query": "x"}}}],
                },
            ],
            tokenize=False,
        )
        if "<tool_call>" in probe and "<|im_start|>assistant\n" in probe:
            tokenizer.response_template = HERMES_RESPONSE_TEMPLATE
    return tokenizer


def completion_lengths(tokenizer: Any, demos: Any) -> list[int]:
    """Each demonstration's completion in tokens as TRL counts it against `max_completion_length`: the assistant
    turns and the tool results between them (the chat template's rendering of prompt + completion, less the
    prompt's)."""
    lengths = []
    for row in demos:
        whole = tokenizer.apply_chat_template(row["prompt"] + row["completion"], tools=_tools(row), tokenize=False)
        lengths.append(len(tokenizer(whole)["input_ids"]) - _prompt_length(tokenizer, row))
    return lengths


def prompt_lengths(tokenizer: Any, demos: Any) -> list[int]:
    """Each demonstration's prompt in tokens (the chat template's rendering with the tools and the generation
    prompt): with the completion budget, the positions a rollout's logits cover."""
    return [_prompt_length(tokenizer, row) for row in demos]


def _tools(row: dict[str, Any]) -> Any:
    """A demonstration row's tool schemas (a JSON string once the dataset has stored them)."""
    return json.loads(row["tools"]) if isinstance(row["tools"], str) else row["tools"]


def _prompt_length(tokenizer: Any, row: dict[str, Any]) -> int:
    prompt = tokenizer.apply_chat_template(row["prompt"], tools=_tools(row), tokenize=False, add_generation_prompt=True)
    return len(tokenizer(prompt)["input_ids"])


# bytes a GRPO pass holds per logit: fp32 logits, their log-softmax, their gradient and a copy's margin
LOGIT_BYTES = 16
# the logits one pass may hold by default: with the model, its optimizer and TRL's copies, a 135M model peaks near 14 GB
LOGIT_BUDGET_BYTES = 4 << 30


def _rollout_logit_bytes(tokens: int, vocab_size: int) -> int:
    """What one rollout's logits hold in a GRPO pass: every position's vocabulary at LOGIT_BYTES each."""
    return tokens * vocab_size * LOGIT_BYTES


def rollouts_per_pass(batch: int, tokens: int, vocab_size: int, *, budget_bytes: int = LOGIT_BUDGET_BYTES) -> int:
    """The most rollouts of a GRPO step (a divisor of `batch`) whose logits over `tokens` positions each fit
    `budget_bytes` in one forward and backward pass; TRL accumulates the step's other passes, so the optimizer step
    still sees the whole batch. A real model's vocabulary makes the logits the peak: SmolLM2's 49,152 over 1,000
    positions are 0.8 GB a rollout, and 16 at once passed 24 GB. At least 1."""
    given = {"batch": batch, "tokens": tokens, "vocab_size": vocab_size, "budget_bytes": budget_bytes}
    for name, value in given.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"rollouts_per_pass: {name} must be a positive integer, got {value!r}")
    per_rollout = _rollout_logit_bytes(tokens, vocab_size)
    return max(m for m in range(1, batch + 1) if batch % m == 0 and (m == 1 or m * per_rollout <= budget_bytes))


def oversized_rollout_warning(tokens: int, vocab_size: int, *, budget_bytes: int = LOGIT_BUDGET_BYTES) -> str | None:
    """A plain-words warning when one rollout's logits alone pass `budget_bytes` (long multi-turn contexts): one
    rollout a pass is then the least the split can do, and the pass may still run out of memory; None when it fits."""
    per_rollout = _rollout_logit_bytes(tokens, vocab_size)
    if per_rollout <= budget_bytes:
        return None
    return (
        f"warning: one rollout's logits ({tokens} positions x {vocab_size} vocabulary x {LOGIT_BYTES} bytes = "
        f"{per_rollout / 2**30:.1f} GiB) exceed the {budget_bytes / 2**30:.1f} GiB a pass is sized for; each pass "
        "takes one rollout and may still run out of memory. Shorten --max-completion-length or the prompts."
    )


def groups_with_spread(log: dict[str, Any]) -> float:
    """The share of a GRPO step's groups whose rewards differed (TRL's `1 - frac_reward_zero_std`): only those give
    nonzero advantages. TRL's `reward_std` is over the whole batch, so it is nonzero when one question's group all
    failed and another's all succeeded, though neither group teaches anything."""
    if "frac_reward_zero_std" in log:
        return 1.0 - float(log["frac_reward_zero_std"])
    return 1.0 if log.get("reward_std", 0.0) > 0 else 0.0  # a log without the fraction: the batch's spread


def quiet_groups_warning(logs: list[dict[str, Any]]) -> str | None:
    """A plain-words warning when GRPO had nothing to learn from (`logs`: TRL's log history): no tool call ran, or
    every group's rewards were equal (zero spread, so every advantage was 0); None when some step had both."""
    steps = [log for log in logs if "reward" in log]
    if not steps:
        return None
    calls = sum(log.get("tools/call_frequency", 0.0) for log in steps)
    spread = max(groups_with_spread(log) for log in steps)
    if calls > 0 and spread > 0:
        return None
    what = []
    if calls == 0:
        what.append(
            "no tool call ran (the model wrote no <tool_call> block TRL could parse: warm-start it on the "
            "demonstrations for more steps, or use a model that already calls tools)"
        )
    if spread == 0:
        what.append(
            f"every group's rollouts got the same reward (mean {steps[-1]['reward']:.3f}), so every advantage was "
            "0 and GRPO changed nothing; try more generations per question, a larger --max-completion-length "
            "(tool results count against it), easier tasks, a longer warm start, or a model that can copy a name "
            "from its context (a random-init tiny model cannot copy the question into a search or the answer "
            "out of a result: try `searchgym model tiny --copy-steps 600`)"
        )
    return f"GRPO learned nothing in {len(steps)} step(s): " + "; ".join(what) + "."


def play(
    model: Any, tokenizer: Any, env_class: type[SearchGymEnv], task_ids: list[str], *, max_new_tokens: int = 64
) -> list[dict[str, Any]]:
    """Greedy episodes of `model` on `task_ids` through the same tools and parser TRL uses (for a before/after
    accuracy on held-out tasks): per task its reward (the env judge's verdict) and the tool calls that ran."""
    import torch
    from trl.chat_template_utils import parse_response

    env = env_class()
    schemas: list[Any] = tool_schemas(env)  # parse_response takes dicts or callables
    results = []
    for task_id in task_ids:
        chat: list[dict[str, Any]] = [{"role": "user", "content": env.reset(task_id=task_id)}]
        calls = 0
        while not env.done:
            prompt = tokenizer.apply_chat_template(chat, tools=schemas, add_generation_prompt=True, tokenize=False)
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"].to(model.device)
            with torch.no_grad():
                out = model.generate(
                    ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
                )
            message = parse_response(tokenizer, out[0, ids.shape[1] :].tolist(), prefix=ids[0].tolist(), tools=schemas)
            chat.append(message)
            if not message.get("tool_calls"):
                break
            for call in message["tool_calls"]:
                name, arguments = call["function"]["name"], call["function"].get("arguments") or {}
                try:
                    if name not in ARGUMENTS:
                        raise ValueError(f"Tool {name} not found.")
                    result: Any = getattr(env, name)(**arguments)
                    calls += 1
                except Exception as e:  # noqa: BLE001 - shown to the model as TRL does
                    result = {"error": str(e)}
                chat.append({"role": "tool", "name": name, "content": str(result)})
        reward = env.get_reward() if env.steps else 0.0
        results.append({"task_id": task_id, "reward": reward, "tool_calls": calls})
    return results


def assistant_tokens(tokenizer: Any, demos: Any) -> Any:
    """`demos` (from `demonstrations`) tokenized for `SFTTrainer` with the loss on the assistant turns only: the
    tool calls and replies the model must write, not the tool results it is shown (a small model spends itself
    on memorising search results otherwise, and still writes tool-call JSON TRL cannot parse)."""
    with needs("assistant_tokens"):
        from datasets import Dataset

    rows = []
    for row in demos:
        tools = _tools(row)
        chat = list(row["prompt"])
        ids = list(tokenizer.apply_chat_template(chat, tools=tools, add_generation_prompt=True, return_dict=False))
        mask = [0] * len(ids)
        for message in row["completion"]:
            chat.append(message)
            longer = list(tokenizer.apply_chat_template(chat, tools=tools, return_dict=False))
            if longer[: len(ids)] != ids:
                raise ValueError(
                    "the chat template renders a conversation's start differently once it goes on, so the "
                    "assistant turns' tokens cannot be told apart; warm-start on `demonstrations` directly"
                )
            mask += [int(message["role"] == "assistant")] * (len(longer) - len(ids))
            ids = longer
        rows.append({"input_ids": ids, "completion_mask": mask})
    return Dataset.from_list(rows)
