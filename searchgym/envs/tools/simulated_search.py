"""A search engine simulated by an LLM: for a query, a chat model writes the documents (ZeroSearch, arXiv 2505.04588).

Web search APIs are too costly to call millions of times in RL; ZeroSearch replaces the engine by an LLM that
writes k documents per query, a share of them deliberately unhelpful (noise), the share following a curriculum
over training. `SimulatedSearch` is that engine behind searchgym's search and page contracts:

- `search(query, k)`: `noisy(k)` of the k documents come from the "noisy" prompt and the rest from the "useful"
  one (which slots are noisy is drawn from the seed and the query, so it is the same on every run); each
  document is a hit whose url is `sim://<id>` and whose page (`fetch`) is the document itself.
- The share of noise is `noise` (fixed) or a `NoiseSchedule` over the trained version the trainer reports
  (`set_trained_version`): ZeroSearch's curriculum p(i) = p_start + (b^(i/m) - 1) / (b - 1) * (p_end - p_start).
- Deterministic for a seed: the documents are recorded in a `WebCache` (the web's record/replay file) under
  the query, k, the noise slots and the seed; `replay_only` serves recorded answers and never calls the model.
- An LLM call that fails, is cut off or writes no document is retried, then raised as `BackendError` (the env
  shows "search failed"): a failure is never a set of results.
- Prompts are data (`simulated_search_prompts.json` beside this file, or `prompts=PATH`), not code.
- `simulated = True` and hit doc ids `sim-u-...` / `sim-n-...` (useful / noisy) let the env mark simulated hits
  in `info` without showing the agent which documents are noise.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchgym.core.cost_meter import charge
from searchgym.core.llm_calls import CallFailed, ChatModel, ReplyRetry, Unparseable, ask
from searchgym.envs.tools.base import SEARCHING_FOR, BackendError, Page, PageNotFound, SearchHit
from searchgym.envs.tools.web_cache import WebCache, normalise_query

PROMPTS = Path(__file__).with_name("simulated_search_prompts.json")
# prompt sets that ship with searchgym, by name; "answer_aware" is ZeroSearch's: the simulator is told the question
# and its answer, so a useful document can hold what a small simulator could not know (the world is fictional)
PROMPT_SETS = {"blind": PROMPTS, "answer_aware": Path(__file__).with_name("simulated_search_prompts_answer_aware.json")}
TASK_FIELDS = ("{question}", "{answers}")
PROMPT_KEYS = ("system", "useful", "noisy", "style")
URL_PREFIX = "sim://"
_FIELD = re.compile(r"^\s*(title|url|text)\s*:\s*(.*)$", re.IGNORECASE)


@dataclass(frozen=True)
class NoiseSchedule:
    """ZeroSearch's noise curriculum: from `start` to `end` over `steps` trained versions, shaped by `base` (> 1:
    slow at first, then faster; the paper uses b = 4)."""

    start: float = 0.0
    end: float = 0.5
    steps: int = 200
    base: float = 4.0

    def __post_init__(self) -> None:
        for key in ("start", "end"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(f"noise schedule {key} must be in [0, 1], got {getattr(self, key)!r}")
        if not (isinstance(self.steps, int) and self.steps >= 1):
            raise ValueError(f"noise schedule steps must be a whole number >= 1, got {self.steps!r}")
        if not self.base > 1.0:
            raise ValueError(f"noise schedule base must be > 1, got {self.base!r}")

    def at(self, step: int) -> float:
        """The share of noisy documents at trained version `step` (clamped to the schedule's end)."""
        t = min(max(step, 0), self.steps) / self.steps
        return self.start + (self.base**t - 1) / (self.base - 1) * (self.end - self.start)


def load_prompts(path: str | os.PathLike | None = None) -> dict[str, str]:
    """The prompt templates (system, useful, noisy, style) from `path`, a packaged set's name, or the default; checked.

    Besides `{query}` and `{n}`, a prompt may use `{question}` and `{answers}`: the task the search serves (ZeroSearch
    gives its simulator both), which SearchEnv passes along in `SEARCHING_FOR`.
    """
    source = PROMPT_SETS.get(str(path), Path(path)) if path is not None else PROMPTS
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"simulated search prompts {source}: {e}") from None
    missing = [k for k in PROMPT_KEYS if not isinstance(data.get(k), str)]
    if missing:
        raise ValueError(f"simulated search prompts {source}: missing text for {missing}")
    for key in ("useful", "noisy"):
        if "{query}" not in data[key] or "{n}" not in data[key]:
            raise ValueError(f"simulated search prompts {source}: {key!r} must contain {{query}} and {{n}}")
    return {k: data[k] for k in PROMPT_KEYS}


def parse_documents(text: str) -> list[dict[str, str]]:
    """The `Title:` / `URL:` / `Text:` documents of a reply, in order; Unparseable when it holds none."""
    docs: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    field = None
    for line in text.splitlines():
        match = _FIELD.match(line)
        if match:
            key, value = match.group(1).lower(), match.group(2).strip()
            if key == "title" or current is None or key in current:
                current = {}
                docs.append(current)
            current[key], field = value, key
        elif current is not None and field == "text" and line.strip():
            current["text"] += " " + line.strip()
    docs = [d for d in docs if d.get("title") and d.get("text")]
    if not docs:
        raise Unparseable("no document with a Title and a Text in the reply")
    return docs


def simulator_messages(
    prompts: dict[str, str], kind: str, query: str, n: int, task: tuple[str, tuple[str, ...]] = ("", ())
) -> list[dict[str, str]]:
    """The chat `SimulatedSearch` sends for n documents of `kind` ("useful" or "noisy") for `query`: the system
    prompt, then the kind's prompt; `task` is the (question, answers) the search serves, for answer-aware prompts.
    Demonstrations of the simulator (`world.simulator_demos`) are written in these very messages."""
    question, answers = task
    prompt = prompts[kind].format(
        query=query, n=n, style=prompts["style"], question=question, answers=" | ".join(answers)
    )
    return [{"role": "system", "content": prompts["system"]}, {"role": "user", "content": prompt}]


@dataclass
class SimulatorOptions:
    """How `SimulatedSearch` writes its results: the share of noise (fixed, or a schedule over the trained version),
    the seed of what is written, the prompts file and a style line, and the chat model's sampling and retries."""

    noise: float | NoiseSchedule = 0.0
    seed: int = 0
    prompts: str | os.PathLike | None = None  # None: the built-in prompts
    style: str | None = None  # replaces the prompts' style line
    max_tokens: int = 768
    temperature: float = 0.0
    retry: ReplyRetry = field(default_factory=ReplyRetry)


class SimulatedSearch:
    """Search and pages written by a chat model (see the module docstring); one instance serves many envs.

    `cache` keeps what was written, so that a query asked again (by any env, in any run) gets the same results."""

    simulated = True

    def __init__(
        self, chat: ChatModel, options: SimulatorOptions | None = None, *, cache: WebCache | None = None
    ) -> None:
        o = self.options = options or SimulatorOptions()
        noise = o.noise
        if not isinstance(noise, NoiseSchedule) and not (isinstance(noise, (int, float)) and 0.0 <= noise <= 1.0):
            raise ValueError(f"noise must be a share in [0, 1] or a NoiseSchedule, got {noise!r}")
        self.chat, self.noise, self.seed, self.cache = chat, noise, o.seed, cache
        self.prompts = load_prompts(o.prompts)
        if o.style is not None:
            self.prompts["style"] = o.style
        self.max_tokens, self.temperature, self.retry = o.max_tokens, o.temperature, o.retry
        self.trained_version = 0
        self.pages: dict[str, Page] = {}  # url -> the document written for it
        self.counters: Counter[str] = Counter()

    # --- the schedule ------------------------------------------------------------------------------

    def set_trained_version(self, version: int) -> None:
        """The policy's trained version (the trainer reports it): where the noise schedule stands."""
        self.trained_version = int(version)

    def noise_share(self) -> float:
        return self.noise.at(self.trained_version) if isinstance(self.noise, NoiseSchedule) else float(self.noise)

    def noisy_slots(self, query: str, k: int) -> list[bool]:
        """Which of the k result slots are noisy: round(share * k) of them, placed by the seed and the query."""
        n = min(k, math.floor(self.noise_share() * k + 0.5))
        order = sorted(range(k), key=lambda i: _digest(f"{self.seed}\x00{normalise_query(query)}\x00{i}"))
        noisy = set(order[:n])
        return [i in noisy for i in range(k)]

    # --- the contracts -----------------------------------------------------------------------------

    async def search(self, query: str, k: int) -> list[SearchHit]:
        """k documents for `query`, the noisy slots written by the noisy prompt; recorded in the cache."""
        slots = self.noisy_slots(query, k)
        key = f"{k}\x00{self.seed}\x00{''.join('n' if s else 'u' for s in slots)}\x00{normalise_query(query)}"
        if self.answer_aware:  # the documents depend on the task too: never serve one task's answer to another
            key += "\x00" + _digest(repr(self._task()))
        rows = self.cache.get("simulated_search", key) if self.cache is not None else None
        if rows is None:
            if self.cache is not None and self.cache.mode == "replay_only":
                raise BackendError(f"replay-only cache has no simulated search for {query[:200]!r}; no model call made")
            rows = await self._write(query, slots)
            if self.cache is not None:
                self.cache.put("simulated_search", key, rows)
        hits = []
        for rank, row in enumerate(rows):
            page = Page(url=row["url"], title=row["title"], text=row["text"], doc_id=row["doc_id"])
            self.pages[page.url] = page
            hits.append(
                SearchHit(
                    doc_id=row["doc_id"],
                    title=row["title"],
                    url=row["url"],
                    snippet=row["text"][:400],
                    score=float(len(rows) - rank),
                )
            )
        self.counters["searches"] += 1
        self.counters["noisy_hits"] += sum(row["doc_id"].startswith("sim-n-") for row in rows)
        self.counters["hits"] += len(rows)
        return hits

    async def fetch(self, url: str) -> Page:
        """A document this engine wrote (in this process, or recorded in the cache); PageNotFound otherwise."""
        page = self.pages.get(url)
        if page is None and self.cache is not None:
            row = self.cache.get("simulated_page", url)
            if isinstance(row, dict) and {"url", "title", "text", "doc_id"} <= set(row):
                page = Page(url=row["url"], title=row["title"], text=row["text"], doc_id=row["doc_id"])
        if page is None:
            raise PageNotFound(url)
        return page

    def stats(self) -> dict[str, Any]:
        """Counters for the env's info: searches, hits, noisy hits, model calls, and the noise share now."""
        return {**self.counters, "noise_share": round(self.noise_share(), 4), "trained_version": self.trained_version}

    # --- writing -----------------------------------------------------------------------------------

    async def _write(self, query: str, slots: list[bool]) -> list[dict[str, str]]:
        """Ask the model for the useful and the noisy documents and lay them out in the slots' order."""
        written: dict[bool, list[dict[str, str]]] = {}
        for noisy in (False, True):
            n = sum(s == noisy for s in slots)
            if n:
                written[noisy] = await self._ask(query, n, "noisy" if noisy else "useful")
        rows: list[dict[str, str]] = []
        used: Counter[bool] = Counter()
        for i, noisy in enumerate(slots):
            docs = written[noisy]
            doc = docs[used[noisy] % len(docs)]  # a model that wrote fewer than asked: its documents repeat
            used[noisy] += 1
            doc_id = f"sim-{'n' if noisy else 'u'}-{_digest(f'{self.seed}{query}{i}')[:12]}"
            url = f"{URL_PREFIX}{doc_id[6:]}/{_slug(doc['title'])}"
            row = {"doc_id": doc_id, "title": doc["title"][:200], "url": url, "text": doc["text"][:20_000]}
            rows.append(row)
            if self.cache is not None:
                self.cache.put("simulated_page", url, row)
        return rows

    @property
    def answer_aware(self) -> bool:
        """Whether the prompts tell the simulator the question and its answers (ZeroSearch's useful documents)."""
        return any(f in self.prompts[kind] for kind in ("useful", "noisy") for f in TASK_FIELDS)

    def _task(self) -> tuple[str, tuple[str, ...]]:
        task = SEARCHING_FOR.get()
        if task is None:
            raise BackendError(
                "these simulated-search prompts need the question and its answers ({question}/{answers}), which "
                "SearchEnv passes along; call search() from an env step, or use prompts without them"
            )
        return task

    async def _ask(self, query: str, n: int, kind: str) -> list[dict[str, str]]:
        question, answers = self._task() if self.answer_aware else ("", ())
        messages = simulator_messages(self.prompts, kind, query, n, (question, tuple(answers)))
        try:
            docs, calls = await ask(
                self.chat,
                messages,
                parse_documents,
                retry=self.retry,
                max_tokens=self.max_tokens,
                temperature=self.temperature,
            )
        except CallFailed as e:
            self.counters["model_calls"] += e.calls
            self.counters["failed_calls"] += 1
            charge(model_calls=e.calls)
            raise BackendError(f"the simulated search engine failed: {e}") from None
        self.counters["model_calls"] += calls
        charge(model_calls=calls)
        return docs

    async def close(self) -> None:
        """Nothing of its own to close: the chat model belongs to whoever opened it."""


def noisy_share(hit_infos: list[dict[str, Any]]) -> float | None:
    """The share of noisy documents among simulated hits (`info["hits"]` rows), None when none is simulated."""
    simulated = [h for h in hit_infos if str(h.get("doc_id", "")).startswith(("sim-n-", "sim-u-"))]
    return sum(str(h["doc_id"]).startswith("sim-n-") for h in simulated) / len(simulated) if simulated else None


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:60] or "page"
