"""The SyntheticQA bundle: a world, its index and a validated task pool, built once into a cache.

`ensure_bundle` finds (or builds, under a file lock so parallel workers build it once) a bundle
directory holding `corpus.jsonl`, `index/`, `tasks.jsonl` and `report.json`. The bundle is keyed by
everything that shapes it, and `bundle.json` is written last, so a half-built bundle is never used.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from searchgym.envs.tools.index_files import file_lock
from searchgym.envs.tools.local_index import LocalIndex
from searchgym.world.validation import synthesize_pool
from searchgym.world.world import World

BUNDLE_FORMAT = 1
DEFAULT_SIZE = 10_000
DEFAULT_TASKS = 2_000


def default_cache_dir() -> Path:
    """Where built worlds live: $SEARCHGYM_CACHE, else ~/.cache/searchgym."""
    return Path(os.environ.get("SEARCHGYM_CACHE") or Path.home() / ".cache" / "searchgym")


def build_bundle(
    out_dir: str | os.PathLike,
    *,
    size: int = DEFAULT_SIZE,
    seed: int = 0,
    n_tasks: int = DEFAULT_TASKS,
    progress: bool = False,
) -> dict[str, Any]:
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
    manifest = {
        "format": BUNDLE_FORMAT,
        "size": size,
        "seed": seed,
        "n_tasks": n_tasks,
        "timings": timings,
        "report": report,
    }
    (tmp / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (tmp / "bundle.json").write_text(json.dumps(manifest, indent=2) + "\n")
    del index
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return manifest


def ensure_bundle(
    *,
    size: int = DEFAULT_SIZE,
    seed: int = 0,
    n_tasks: int = DEFAULT_TASKS,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = False,
) -> Path:
    """The bundle directory for these settings, built on first use."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    bundle = root / "synthetic" / f"v{BUNDLE_FORMAT}-size{size}-seed{seed}-tasks{n_tasks}"
    if (bundle / "bundle.json").exists():
        return bundle
    with file_lock(bundle.with_name(bundle.name + ".lock")):  # parallel vector-env workers build it once
        if not (bundle / "bundle.json").exists():
            build_bundle(bundle, size=size, seed=seed, n_tasks=n_tasks, progress=progress)
    return bundle
