"""`searchgym world build` and `searchgym tasks build`: their settings (the commands' flags are these fields) and
what each runs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from searchgym.settings import setting
from searchgym.world.world import MAX_SIZE, MIN_SIZE


@dataclass
class WorldBuildSettings:
    """A seeded world written to `out`: corpus.jsonl, kb.jsonl, world.json (and html.jsonl)."""

    out: Path = setting(help="the world's directory")
    size: int = setting(10_000, at_least=MIN_SIZE, at_most=MAX_SIZE, help="number of pages (100 to 1,000,000)")
    seed: int = setting(0, help="the world's seed")
    html: bool = setting(False, help="also write html.jsonl")


def build_world(settings: WorldBuildSettings) -> None:
    from searchgym.world.world import World

    manifest = World(settings.size, settings.seed).write(settings.out, html=settings.html, progress=True)
    print(json.dumps({"out": str(settings.out), "counts": manifest["counts"]}, indent=2))


@dataclass
class TasksBuildSettings:
    """`n` validated KB-walk questions over a built world, written to `out` as JSONL."""

    world: Path = setting(help="a directory from `searchgym world build`")
    out: Path = setting(help="tasks JSONL (an existing one is kept unless --overwrite)")
    index: Path | None = setting(None, help="its index (default WORLD/index, built if missing)")
    n: int = setting(1000, at_least=1, help="questions wanted")
    seed: int = setting(0, help="the questions' seed")
    fuzz: float = setting(
        0.25, at_least=0, at_most=1, help="share of questions whose start entity is described, not named"
    )
    overwrite: bool = setting(False, help="replace an existing --out")
    dataset: Path | None = setting(None, help="also save as a `datasets` dataset in this directory")


def refuse_to_replace(path: Path, overwrite: bool) -> None:
    """A pool file already holding rows is not replaced unless the user asked for it (--overwrite)."""
    if not overwrite and path.exists() and path.stat().st_size > 0:
        raise ValueError(f"{path} already holds a task pool; pass --overwrite to replace it, or choose another --out")


def build_tasks(settings: TasksBuildSettings) -> None:
    refuse_to_replace(Path(settings.out), settings.overwrite)
    from searchgym.envs.tools.indexes import open_index
    from searchgym.world.validation import WalkOptions, synthesize_pool
    from searchgym.world.world import World

    meta = json.loads((Path(settings.world) / "world.json").read_text())
    world = World(meta["size"], meta["seed"])
    index = open_index(settings.index or settings.world, progress=True)  # WORLD/index is built on first use
    pool, report = synthesize_pool(
        world, index, settings.n, seed=settings.seed, walk=WalkOptions(fuzz_prob=settings.fuzz), progress=True
    )
    pool.to_jsonl(settings.out)
    if settings.dataset:
        pool.to_dataset(settings.dataset)
    print(json.dumps(report, indent=2))
