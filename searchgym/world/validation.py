"""Task validation: keep the KB-walk candidates that the oracle solves through a real SearchEnv.

A candidate enters a task pool only when the oracle reaches its answer with the env's own tools,
so every task is answerable by search in the world it was drawn from.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from tqdm import tqdm

from searchgym.envs.search_env import SearchEnv
from searchgym.envs.tasks import Task, TaskPool
from searchgym.envs.tools.local_index import LocalIndex
from searchgym.world.kbwalk import KBWalker, to_task
from searchgym.world.oracle import OracleAgent
from searchgym.world.world import World

T = TypeVar("T")

TEST_SHARE = 10  # one task in TEST_SHARE goes to the "test" split


@dataclass
class WalkOptions:
    """How the KB walk draws candidates (`KBWalker`'s knobs): the share of fuzzed questions, of comparison
    questions, and the weight of each hop count (None: the walker's own)."""

    fuzz_prob: float = 0.25
    comparison_prob: float = 0.15
    hop_weights: dict[int, float] | None = None


def synthesize_pool(
    world: World,
    index: LocalIndex,
    n_tasks: int,
    *,
    seed: int = 0,
    walk: WalkOptions | None = None,
    max_turns: int = 32,
    progress: bool = False,
) -> tuple[TaskPool, dict[str, Any]]:
    """Draw KB-walk candidates (`walk`) and keep the first `n_tasks` that the oracle solves through a SearchEnv.

    Blocking; also callable from inside a running event loop (a trainer creating its first env), where
    the work runs on a loop of its own in a worker thread.
    """
    walk = walk or WalkOptions()
    walker = KBWalker(
        world, seed=seed, fuzz_prob=walk.fuzz_prob, comparison_prob=walk.comparison_prob, hop_weights=walk.hop_weights
    )
    return run_blocking(_synthesize(world, index, n_tasks, seed, walker, max_turns, progress))


def run_blocking(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run `coroutine` to its end and return its result: here, or from inside a running event loop (a trainer
    creating its first env) on a loop of its own in a worker thread."""
    work = partial(asyncio.run, coroutine)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return work()
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(work).result()


async def _synthesize(
    world: World, index: LocalIndex, n_tasks: int, seed: int, walker: KBWalker, max_turns: int, progress: bool
) -> tuple[TaskPool, dict[str, Any]]:
    oracle = OracleAgent()
    accepted: list[Task] = []
    seen: set[str] = set()
    rejections: Counter[str] = Counter()
    tried: Counter[int] = Counter()
    solved: Counter[int] = Counter()
    candidates = walker.candidates()
    with tqdm(total=n_tasks, desc="validating tasks", disable=not progress, unit="task") as bar:
        while len(accepted) < n_tasks:
            batch = []
            for candidate in candidates:
                if candidate.question in seen:
                    rejections["duplicate question"] += 1
                    continue
                seen.add(candidate.question)
                digest = int(hashlib.sha256(candidate.question.encode()).hexdigest(), 16)
                split = "test" if digest % TEST_SHARE == 0 else "train"
                batch.append(to_task(candidate, f"syn{world.seed}-{seed}-{len(seen):07d}", split))
                if len(batch) >= min(256, 2 * (n_tasks - len(accepted)) + 1):
                    break
            env = SearchEnv(TaskPool(batch), index, index, max_turns=max_turns, judge="em")
            for task in batch:
                if len(accepted) >= n_tasks:
                    break
                result = await oracle.arun(env, task)
                hops = task.metadata["hops"]
                tried[hops] += 1
                if result.solved:
                    solved[hops] += 1
                    accepted.append(task)
                    bar.update(1)
                else:
                    rejections["oracle: " + (result.failure or "").split(":")[0]] += 1
            env.close()
    rejections.update({f"kb: {k}": v for k, v in walker.rejections.items()})
    report = {
        "accepted": len(accepted),
        "rejections": dict(sorted(rejections.items())),
        "oracle_solve_rate_by_hops": {h: round(solved[h] / tried[h], 4) for h in sorted(tried)},
        "oracle_tried_by_hops": dict(sorted(tried.items())),
        "splits": dict(Counter(t.metadata["split"] for t in accepted)),
        "hops": dict(sorted(Counter(t.metadata["hops"] for t in accepted).items())),
    }
    return TaskPool(accepted, name=f"synthetic-{world.size}-{world.seed}"), report
