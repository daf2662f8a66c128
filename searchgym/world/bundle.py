"""The SyntheticQA bundle: a world, its index and a validated task pool, built once into a cache.

`ensure_bundle` finds (or builds, under a file lock so parallel workers build it once) a bundle
directory holding `corpus.jsonl`, `index/`, `tasks.jsonl` and `report.json`. The bundle is keyed by
everything that shapes it, and `bundle.json` is written last, so a half-built bundle is never used.

A first build takes about a minute at 20,000 pages. Envs are made by `gym.make`, which has no progress switch, so a
command that shows progress makes its envs inside `world_build_progress()`: a build started there says what it
builds and shows each of its three steps on stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from searchgym.core.file_lock import file_lock
from searchgym.envs.tools.local_index import LocalIndex
from searchgym.world.validation import synthesize_pool
from searchgym.world.world import World

BUNDLE_FORMAT = 1
DEFAULT_SIZE = 10_000
DEFAULT_TASKS = 2_000

_SHOW_BUILDS: ContextVar[bool] = ContextVar("searchgym_world_build_progress", default=False)


@contextlib.contextmanager
def world_build_progress(show: bool = True) -> Iterator[None]:
    """Inside, a bundle (or min_calls pool) built on an env's first use shows its progress on stderr."""
    token = _SHOW_BUILDS.set(show)
    try:
        yield
    finally:
        _SHOW_BUILDS.reset(token)


def showing_builds(progress: bool | None = None) -> bool:
    """`progress` when given, else whether the caller is inside `world_build_progress()`."""
    return _SHOW_BUILDS.get() if progress is None else progress


def note(progress: bool, text: str) -> None:
    """One line of a build's progress on stderr (where the build's bars go), when progress was asked for."""
    if progress:
        print(text, file=sys.stderr, flush=True)


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
    started = t0 = time.perf_counter()
    note(progress, f"world 1/3: writing {size:,} pages")
    world = World(size, seed)
    world.write(tmp, html=False, progress=progress)
    timings["world_s"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    note(progress, f"world 2/3: indexing the pages for search ({timings['world_s']:.0f} s so far)")
    index = LocalIndex.build(tmp / "corpus.jsonl", tmp / "index", progress=progress)
    timings["index_s"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    note(
        progress,
        f"world 3/3: {n_tasks:,} questions, each kept once the oracle answers it through the env's tools "
        f"({time.perf_counter() - started:.0f} s so far)",
    )
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
    note(progress, f"world built in {time.perf_counter() - started:.0f} s, cached in {out}")
    return manifest


def ensure_bundle(
    *,
    size: int = DEFAULT_SIZE,
    seed: int = 0,
    n_tasks: int = DEFAULT_TASKS,
    cache_dir: str | os.PathLike | None = None,
    progress: bool | None = None,
) -> Path:
    """The bundle directory for these settings, built on first use (showing its progress when `progress`, or when
    None inside `world_build_progress()`)."""
    progress = showing_builds(progress)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    bundle = root / "synthetic" / f"v{BUNDLE_FORMAT}-size{size}-seed{seed}-tasks{n_tasks}"
    if (bundle / "bundle.json").exists():
        return bundle
    with file_lock(bundle.with_name(bundle.name + ".lock")):  # parallel vector-env workers build it once
        if not (bundle / "bundle.json").exists():
            note(progress, f"building the world once ({size:,} pages, {n_tasks:,} questions); later runs reuse it")
            build_bundle(bundle, size=size, seed=seed, n_tasks=n_tasks, progress=progress)
    return bundle
