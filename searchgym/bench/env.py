"""`searchgym bench env`: what the embedded env costs. World generation, index build, search QPS, env steps/s.

Numbers are written to a JSON file (quoted in README), never asserted in tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchgym.envs.search_env import SearchEnv
from searchgym.envs.tasks import TaskPool
from searchgym.envs.tools.local_index import LocalIndex
from searchgym.settings import setting
from searchgym.world.oracle import OracleAgent
from searchgym.world.validation import synthesize_pool
from searchgym.world.world import MAX_SIZE, MIN_SIZE, World


@dataclass
class EnvBenchSettings:
    """`searchgym bench env`: a `size`-page world built, indexed, searched and played; results to `out`."""

    size: int = setting(100_000, at_least=MIN_SIZE, at_most=MAX_SIZE, help="pages in the synthetic world")
    out: Path = setting(Path("results/bench_env.json"), help="the results JSON")
    workdir: Path | None = setting(None, help="where to build the world (default: a temp dir)")
    n_queries: int = setting(3000, at_least=1, help="queries of each kind timed")
    n_tasks: int = setting(300, at_least=1, help="tasks the oracle plays")


def run_env_bench(settings: EnvBenchSettings) -> dict[str, Any]:
    """Build a `size`-page world and measure each stage; write the results to `out`."""
    n_queries, n_tasks, out = settings.n_queries, settings.n_tasks, settings.out
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(settings.workdir or tmp)
        results: dict[str, Any] = {"size": settings.size, "machine": _machine()}
        world = World(settings.size, seed=0)
        t0 = time.perf_counter()
        world.write(root, progress=True)
        results["world_write_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        index = LocalIndex.build(root / "corpus.jsonl", root / "index", threads=2, progress=True)
        results["index_build_s"] = round(time.perf_counter() - t0, 2)
        results["search_qps"] = _search_qps(world, index, n_queries)
        t0 = time.perf_counter()
        pool, report = synthesize_pool(world, index, n_tasks, seed=0, progress=True)
        results["task_synthesis"] = {
            "tasks": len(pool),
            "seconds": round(time.perf_counter() - t0, 2),
            "oracle_solve_rate_by_hops": report["oracle_solve_rate_by_hops"],
        }
        results["env_steps"] = asyncio.run(_env_steps(pool, index))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(results, indent=2) + "\n")
    return results


def _search_qps(world: World, index: LocalIndex, n: int) -> dict[str, float]:
    """Queries per second for entity names (2-4 terms) and for whole questions (10-20 terms)."""
    rng = random.Random(0)
    names = [world.name(rng.randrange(world.size)) for _ in range(n)]
    questions = [f"In which year was the company founded by {name} established and where" for name in names]
    qps = {}
    for label, queries in (("name_queries", names), ("question_queries", questions)):
        t0 = time.perf_counter()
        for q in queries:
            index.search_sync(q, 5)
        qps[label] = round(len(queries) / (time.perf_counter() - t0), 1)
    return qps


async def _env_steps(pool: TaskPool, index: LocalIndex) -> dict[str, float]:
    """Env steps per second while the oracle plays every task (a realistic mix of search, access, answer)."""
    env = SearchEnv(pool, index, index, judge="em")
    oracle = OracleAgent()
    steps, t0 = 0, time.perf_counter()
    for task in pool:
        steps += len((await oracle.arun(env, task)).turns)
    elapsed = time.perf_counter() - t0
    env.close()
    return {
        "steps": steps,
        "episodes": len(pool),
        "steps_per_s": round(steps / elapsed, 1),
        "episodes_per_s": round(len(pool) / elapsed, 1),
    }


def _machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}


def env_bench_command(settings: EnvBenchSettings) -> None:
    print(json.dumps(run_env_bench(settings), indent=2))
