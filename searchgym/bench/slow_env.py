"""`searchgym-bench/SlowSyntheticQA-v0`: SyntheticQA with heavy-tailed tool latency and heavy-tailed episode lengths.

Real search agents wait on tools whose latency has a heavy tail (web search APIs, page fetches) and
play episodes whose length has one too (a few turns for most questions, dozens for some). This env,
registered for `bench trainer` only, is the normal SyntheticQA env with

- every search and page fetch delayed by a seeded Pareto-distributed `asyncio.sleep` (the event loop
  keeps running the other episodes meanwhile);
- with a `Workload`, each episode's turn budget drawn from it at reset (keyed on the episode's seed
  and task, so every trainer mode plays the same episodes), every turn played as a search (the
  tiny policy cannot yet write calls, and an answer would end the episode before its drawn length;
  a trained agent searches on nearly every turn), the turn's text being the query. Its reward is
  the benchmark workflow's (plan_workflow.py), the env's judge never runs.

Without a workload it behaves as before: only turns without a valid call become searches, and
rewards are the env's judge's.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from searchgym.bench.workload import EpisodePlan, Workload
from searchgym.envs.actions import parse_action
from searchgym.envs.search_env import SearchEnv
from searchgym.envs.tools.base import Page, PageBackend, SearchBackend, SearchHit

SLOW_SYNTHETIC_QA = "searchgym-bench/SlowSyntheticQA-v0"

# Every delay drawn by a ParetoLatency in this process, in order; the benchmark clears it per run.
TOOL_DELAYS: list[float] = []


@dataclass
class ParetoLatency:
    """Seeded Pareto tool latency: P(delay > x) = (scale / x) ** alpha for x >= scale, capped at max_s.

    Parameterised by the median (scale = median / 2 ** (1 / alpha)); alpha 1.2 gives a tail heavy
    enough that the uncapped variance is infinite. `reseed(*keys)` makes the sequence a function of
    the keys (the benchmark keys it on the episode's seed and task), so an episode draws the same
    delays whichever mode plays it.
    """

    median_s: float = 0.25
    alpha: float = 1.2
    max_s: float = 10.0
    seed: int = 0
    _rng: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.median_s < 0 or self.alpha <= 0 or self.max_s < 0:
            raise ValueError("latency median_s and max_s must be >= 0 and alpha > 0")
        self.reseed()

    @property
    def scale_s(self) -> float:
        return self.median_s / 2 ** (1 / self.alpha)

    def reseed(self, *keys: Any) -> None:
        self._rng = random.Random(":".join(str(k) for k in (self.seed, *keys)))

    def draw(self) -> float:
        """One delay in seconds (inverse-CDF sampling of the Pareto, then the cap)."""
        u = self._rng.random()  # in [0, 1)
        return min(self.scale_s * (1.0 - u) ** (-1.0 / self.alpha), self.max_s)

    async def sleep(self) -> float:
        delay = self.draw()
        TOOL_DELAYS.append(delay)
        await asyncio.sleep(delay)
        return delay


class SlowSearch:
    """A SearchBackend that waits a drawn latency, then asks the wrapped backend."""

    def __init__(self, inner: SearchBackend, latency: ParetoLatency):
        self.inner, self.latency = inner, latency

    async def search(self, query: str, k: int) -> list[SearchHit]:
        await self.latency.sleep()
        return await self.inner.search(query, k)


class SlowPages:
    """A PageBackend that waits a drawn latency, then asks the wrapped backend."""

    def __init__(self, inner: PageBackend, latency: ParetoLatency):
        self.inner, self.latency = inner, latency

    async def fetch(self, url: str) -> Page:
        await self.latency.sleep()
        return await self.inner.fetch(url)


_TAG = re.compile(r"<[^<>]{0,64}>")


class SlowSearchEnv(SearchEnv):
    """SearchEnv whose backends are slowed by `latency`, reseeded per episode; see the module docstring."""

    def __init__(
        self,
        *args: Any,
        latency: ParetoLatency,
        coerce_invalid: bool = True,
        workload: Workload | None = None,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.latency, self.coerce_invalid, self.workload = latency, coerce_invalid, workload
        self.search_backend = SlowSearch(self.search_backend, latency)
        self.page_backend = SlowPages(self.page_backend, latency)
        self.plan: EpisodePlan | None = None

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        key = seed if seed is not None else f"instance-{id(self)}"
        if self.workload is not None:  # the prompt quotes the largest budget; this episode's is drawn below
            self.max_turns = self.workload.turns_max
        obs, info = await super().areset(seed=seed, options=options)
        if self.workload is not None:
            self.plan = self.workload.plan(key, info["task_id"])
            self.max_turns = self.plan.turns
        self.latency.reseed(key, info["task_id"])
        if self.plan is not None:
            info["plan"] = list(self.plan.turn_tokens)
        return obs, info

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.task is not None and isinstance(action, str) and not self._done:
            tool = parse_action(action).tool
            if (self.workload is not None and tool != "search") or (self.coerce_invalid and tool is None):
                action = f"<search>{self._query_from(action)}</search>"
        return await super().astep(action)

    def _query_from(self, text: str) -> str:
        """The turn's words without tags (at most 32 words), else the question."""
        found = _TAG.sub(" ", text).replace("<", " ").replace(">", " ").split()
        return " ".join(found[:32])[:300].strip() or self._task.question


def make_slow_synthetic_qa(
    size: int = 1000,
    seed: int = 0,
    *,
    n_tasks: int = 200,
    split: str | None = None,
    hops: int | list[int] | None = None,
    cache_dir: str | os.PathLike | None = None,
    latency_median_s: float = 0.25,
    latency_alpha: float = 1.2,
    latency_max_s: float = 10.0,
    latency_seed: int = 0,
    coerce_invalid: bool = True,
    workload: dict[str, Any] | None = None,
    **env_kwargs: Any,
) -> SlowSearchEnv:
    """`searchgym-bench/SlowSyntheticQA-v0`: SyntheticQA-v0 with Pareto-slowed backends (and a `Workload`'s fields)."""
    from searchgym.world.synthetic_env import make_synthetic_qa

    base = make_synthetic_qa(size, seed, n_tasks=n_tasks, split=split, hops=hops, cache_dir=cache_dir, **env_kwargs)
    latency = ParetoLatency(latency_median_s, latency_alpha, latency_max_s, latency_seed)
    if workload is not None:
        env_kwargs["max_turns"] = max(env_kwargs.get("max_turns", 1), int(workload.get("turns_max", 40)))
    return SlowSearchEnv(
        base.tasks,
        base.search_backend,
        base.page_backend,
        latency=latency,
        coerce_invalid=coerce_invalid,
        workload=Workload(**workload) if workload is not None else None,
        **env_kwargs,
    )


def register() -> None:
    """Register the benchmark-only env id (idempotent); importing this module does it."""
    if SLOW_SYNTHETIC_QA not in gym.registry:
        gym.register(id=SLOW_SYNTHETIC_QA, entry_point=f"{__name__}:make_slow_synthetic_qa")


register()
