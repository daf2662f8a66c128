"""The main job for now: build the default world, then watch agents play SyntheticQA episodes."""

from __future__ import annotations

import asyncio
import json
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path

from searchgym.agents.scripted import SearchOnceAgent
from searchgym.envs.search_env import SearchEnv
from searchgym.envs.tasks import TaskPool
from searchgym.envs.tools.indexes import open_index
from searchgym.envs.tools.local_index import LocalIndex
from searchgym.settings import setting
from searchgym.world.bundle import DEFAULT_TASKS, ensure_bundle
from searchgym.world.mincalls import PROOF_ENV, ensure_min_calls_pool, parse_min_calls
from searchgym.world.oracle import OracleAgent


def run_demo(
    *, size: int, episodes: int, seed: int = 0, cache_dir: str | os.PathLike | None = None, min_calls: int | None = None
) -> None:
    """Print the build report, a few oracle episodes turn by turn, and a baseline's success rate; with
    `min_calls`, the oracle's play of questions proven to need that many tool calls instead."""
    if min_calls is not None:
        parse_min_calls(min_calls)  # a bad value fails before the world is built
    bundle = ensure_bundle(size=size, seed=seed, n_tasks=DEFAULT_TASKS, cache_dir=cache_dir, progress=True)
    if min_calls is not None:
        _show_min_calls(bundle, min_calls, episodes)
        return
    manifest = json.loads((bundle / "bundle.json").read_text())
    print(f"world: {size} pages, seed {seed}, bundle {bundle}")
    print(f"build timings (s): {manifest['timings']}")
    print(f"task pool: {json.dumps(manifest['report'], indent=None)}")
    pool = TaskPool.from_jsonl(bundle / "tasks.jsonl").filter(split="test")
    index = open_index(bundle)
    asyncio.run(_play(pool, index, episodes))


async def _play(pool: TaskPool, index: LocalIndex, episodes: int) -> None:
    env = SearchEnv(pool, index, index, judge="em")
    for task in list(pool)[:episodes]:
        print("\n" + "=" * 100)
        print(f"task {task.id} ({task.metadata['hops']} hops, {task.metadata['kind']}): {task.question}")
        result = await OracleAgent().arun(env, task)
        for i, turn in enumerate(result.turns, 1):
            print(f"--- turn {i} agent: {turn['action']}")
            print(textwrap.indent(textwrap.shorten(turn["observation"], 400, placeholder=" ..."), "    "))
        print(f"reward {result.reward}  (references: {list(task.answers)})")
    baseline = SearchOnceAgent()
    n = min(len(pool), 200)
    rewards = []
    for task in list(pool)[:n]:
        await env.areset(options={"task_id": task.id})
        rewards.append(await baseline.arun(env, task.question))
    print("\n" + "=" * 100)
    print(
        f"baseline 'search the question once, answer the top title' on {n} test tasks: "
        f"exact match {sum(rewards) / max(n, 1):.3f}; the oracle that walks the path scores 1.0 by construction"
    )
    env.close()


def _show_min_calls(bundle: Path, min_calls: int, episodes: int) -> None:
    """Questions whose proof says no play of fewer than `min_calls` calls observes the answer, played by the oracle."""
    path = ensure_min_calls_pool(bundle, min_calls, episodes, progress=True)
    report = json.loads(path.with_suffix(".report.json").read_text())
    print(
        f"min_calls={min_calls} pool: {report['accepted']} questions from {report['candidates']} candidates; "
        f"proven minima of the candidates: {report['proven_minima']}"
    )
    pool = TaskPool.from_jsonl(path)
    env = SearchEnv(pool, open_index(bundle), judge="em", max_turns=min_calls + 2, **PROOF_ENV)
    for task in list(pool)[:episodes]:
        proof = task.metadata["min_calls_proof"]
        print("\n" + "=" * 100)
        print(f"task {task.id} ({task.metadata['hops']} hops): {task.question}")
        print(
            f"proof: min_calls={proof['min_calls']}; {proof['explored_calls']} calls explored, none of fewer "
            f"calls observes the answer.\n  queries: {proof['queries']}\n  urls: {proof['urls']}"
        )
        result = asyncio.run(OracleAgent(think=False).arun(env, task))
        for i, turn in enumerate(result.turns, 1):
            print(f"--- turn {i} agent: {turn['action']}")
            print(textwrap.indent(textwrap.shorten(turn["observation"], 300, placeholder=" ..."), "    "))
        print(f"reward {result.reward} after {len(result.turns) - 1} tool calls (references: {list(task.answers)})")
    env.close()


@dataclass
class DemoSettings:
    """`searchgym demo`: the default world built (cached) and a scripted agent watched playing it."""

    size: int = setting(10_000, help="pages in the world")
    episodes: int = setting(3, at_least=1, help="episodes shown")
    seed: int = setting(0, help="the world's seed")
    cache: Path | None = setting(None, help="bundle cache (default $SEARCHGYM_CACHE or ~/.cache/searchgym)")
    min_calls: int | None = setting(
        None, help="show questions proven to need this many tool calls, played by the oracle"
    )


def demo_command(settings: DemoSettings) -> None:
    run_demo(
        size=settings.size,
        episodes=settings.episodes,
        seed=settings.seed,
        cache_dir=settings.cache,
        min_calls=settings.min_calls,
    )
