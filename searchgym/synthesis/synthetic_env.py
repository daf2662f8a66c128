"""SyntheticQA: a world, its index and a validated KB-walk task pool, built once into a cache and reused.

`gym.make("searchgym/SyntheticQA-v0")` calls `make_synthetic_qa`, which finds (or builds, under a
file lock so parallel workers build it once) a bundle directory holding `corpus.jsonl`, `index/`,
`tasks.jsonl` and `report.json`. The bundle is keyed by everything that shapes it, and
`bundle.json` is written last, so a half-built bundle is never used.
"""
from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Iterator

from tqdm import tqdm

from searchgym.envs.search_env import SearchEnv
from searchgym.envs.tasks import Task, TaskPool, load_pool
from searchgym.envs.tools.local_index import LocalIndex
from searchgym.synthesis.kbwalk import KBWalker, to_task
from searchgym.synthesis.oracle import OracleAgent
from searchgym.synthesis.world import World

BUNDLE_FORMAT = 1
DEFAULT_SIZE = 10_000
DEFAULT_TASKS = 2_000
TEST_SHARE = 10  # one task in TEST_SHARE goes to the "test" split


def default_cache_dir() -> Path:
    """Where built worlds live: $SEARCHGYM_CACHE, else ~/.cache/searchgym."""
    return Path(os.environ.get("SEARCHGYM_CACHE") or Path.home() / ".cache" / "searchgym")


def synthesize_pool(
    world: World,
    index: LocalIndex,
    n_tasks: int,
    *,
    seed: int = 0,
    fuzz_prob: float = 0.25,
    comparison_prob: float = 0.15,
    hop_weights: dict[int, float] | None = None,
    max_turns: int = 32,
    progress: bool = False,
) -> tuple[TaskPool, dict[str, Any]]:
    """Draw KB-walk candidates and keep the first `n_tasks` that the oracle solves through a SearchEnv.

    Blocking; also callable from inside a running event loop (a trainer creating its first env), where
    the work runs on a loop of its own in a worker thread.
    """
    work = partial(asyncio.run, _synthesize(world, index, n_tasks, seed, KBWalker(
        world, seed=seed, fuzz_prob=fuzz_prob, comparison_prob=comparison_prob, hop_weights=hop_weights),
        max_turns, progress))
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return work()
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(work).result()


async def _synthesize(world: World, index: LocalIndex, n_tasks: int, seed: int, walker: KBWalker,
                      max_turns: int, progress: bool) -> tuple[TaskPool, dict[str, Any]]:
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


def build_bundle(out_dir: str | os.PathLike, *, size: int = DEFAULT_SIZE, seed: int = 0, n_tasks: int = DEFAULT_TASKS,
                 progress: bool = False) -> dict[str, Any]:
    """World + index + validated task pool in `out_dir`, built in a temp dir and renamed into place."""
    out = Path(out_dir)
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    world = World(size, seed)
    world.write(tmp, html=False, progress=progress)
    timings["world_s"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    index = LocalIndex.build(tmp / "corpus.jsonl", tmp / "index", progress=progress)
    timings["index_s"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    pool, report = synthesize_pool(world, index, n_tasks, seed=seed, progress=progress)
    timings["tasks_s"] = round(time.perf_counter() - t0, 2)
    pool.to_jsonl(tmp / "tasks.jsonl")
    manifest = {"format": BUNDLE_FORMAT, "size": size, "seed": seed, "n_tasks": n_tasks,
                "timings": timings, "report": report}
    (tmp / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (tmp / "bundle.json").write_text(json.dumps(manifest, indent=2) + "\n")
    del index
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return manifest


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive inter-process lock, so parallel vector-env workers build one bundle once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_bundle(*, size: int = DEFAULT_SIZE, seed: int = 0, n_tasks: int = DEFAULT_TASKS,
                  cache_dir: str | os.PathLike | None = None, progress: bool = False) -> Path:
    """The bundle directory for these settings, built on first use."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    bundle = root / "synthetic" / f"v{BUNDLE_FORMAT}-size{size}-seed{seed}-tasks{n_tasks}"
    if (bundle / "bundle.json").exists():
        return bundle
    with _locked(bundle.with_name(bundle.name + ".lock")):
        if not (bundle / "bundle.json").exists():
            build_bundle(bundle, size=size, seed=seed, n_tasks=n_tasks, progress=progress)
    return bundle


def make_synthetic_qa(
    size: int = DEFAULT_SIZE,
    seed: int = 0,
    *,
    n_tasks: int = DEFAULT_TASKS,
    split: str | None = None,
    hops: int | list[int] | None = None,
    cache_dir: str | os.PathLike | None = None,
    **env_kwargs: Any,
) -> SearchEnv:
    """`searchgym/SyntheticQA-v0`: a SearchEnv over the embedded synthetic world (no server, no network)."""
    bundle = ensure_bundle(size=size, seed=seed, n_tasks=n_tasks, cache_dir=cache_dir)
    pool = load_pool(bundle / "tasks.jsonl", split=split, hops=hops)
    index = LocalIndex(bundle / "index")
    return SearchEnv(pool, index, index, **env_kwargs)
