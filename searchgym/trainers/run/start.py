"""Where a training run starts: fresh (step 1, version 0, the configured model) or from its latest checkpoint."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchgym.agents.tiny_model import build_tiny_model
from searchgym.trainers.algorithm.fsdp import SHARDED
from searchgym.trainers.run.checkpoint import checkpoint_root, latest_checkpoint, load_trainer_state, rollout_states
from searchgym.trainers.run.partials import remove_stale

log = logging.getLogger(__name__)


@dataclass
class RunStart:
    """The run directory, the weights to start from, and (when resuming) the checkpoint and its trainer state."""

    out: Path
    model_dir: Path | str
    checkpoint: Path | None = None
    state: dict[str, Any] = field(default_factory=dict)  # trainer.pt of the checkpoint, or {}
    rollouts: list[dict[str, Any] | None] = field(default_factory=lambda: [None])  # each controller's saved state

    @property
    def version(self) -> int:
        """The weight version the run starts from (the learner steps already taken)."""
        return int(self.state["learner"]["version"]) if self.state else 0

    @property
    def first_step(self) -> int:
        """The first step this process trains."""
        return int(self.state.get("step", 0)) + 1


def refuse_existing_run(out: Path) -> None:
    """A fresh run never starts in a directory holding another run's checkpoints or metrics.

    Starting over there used to prune the new checkpoints against the old ones by name, leave `latest`
    pointing at a deleted directory, and break the next --resume; so the user chooses: --resume, or
    another out_dir (or removing the old run themselves).
    """
    from searchgym.trainers.run.checkpoint import checkpoint_root

    held = sorted(p.name for p in checkpoint_root(out).glob("step-*")) if checkpoint_root(out).is_dir() else []
    metrics = out / "metrics.jsonl"
    if held or (metrics.exists() and metrics.stat().st_size > 0):
        what = f"checkpoints {held[0]}..{held[-1]}" if held else "metrics.jsonl"
        raise ValueError(
            f"{out} already holds a training run ({what}); pass --resume to continue it, or choose "
            "another out_dir. Nothing was changed."
        )


def start_run(
    out_dir: str | os.PathLike,
    model_path: str | None,
    *,
    seed: int,
    resume: bool,
    mmap: bool = False,
    learner_ranks: int = 1,
    controllers: int = 1,
) -> RunStart:
    """The checkpoint to resume from (with `resume`, if any), else `model_path` or a fresh tiny model (`seed`).

    A checkpoint written by another kind of learner (`learner_ranks`) or another number of rollout controllers
    (`controllers`) is refused here, before any rank or actor starts. `mmap` reads the checkpoint's tensors lazily,
    for a process that needs only its small parts.
    """
    out = Path(out_dir)
    if not resume:
        refuse_existing_run(out)
    for directory in (checkpoint_root(out), out / "weights"):  # partial writes of killed earlier processes
        for path in remove_stale(directory):
            log.info("removed %s, left by an earlier process's unfinished write", path)
    checkpoint = latest_checkpoint(out) if resume else None
    if checkpoint is None:
        model_dir = model_path or build_tiny_model(out / "init-model", seed=seed)
        return RunStart(out, model_dir, rollouts=[None] * controllers)
    state = load_trainer_state(checkpoint, mmap=mmap)
    check_resume(checkpoint, learner_ranks)
    rollouts = _rollout_states(checkpoint, state, controllers)
    log.info("resuming from %s (step %d, version %d)", checkpoint, state["step"], state["learner"]["version"])
    return RunStart(out, checkpoint, checkpoint, state, rollouts)


def check_resume(checkpoint: str | os.PathLike | None, ranks: int) -> None:
    """Refuse to resume a sharded checkpoint with one learner rank, or a single-rank one with several."""
    if checkpoint is None:
        return
    sharded = (Path(checkpoint) / SHARDED).is_dir()
    if ranks > 1 and not sharded:
        raise ValueError(f"{checkpoint} was written by a single-rank learner: resume it with learner.ranks=1")
    if ranks == 1 and sharded:
        raise ValueError(
            f"{checkpoint} was written by a sharded learner: resume it with learner.ranks set to its "
            "ranks (trainer.pt's learner.sharded_ranks)"
        )


def _rollout_states(checkpoint: Path, state: dict[str, Any], count: int) -> list[dict[str, Any] | None]:
    """The `count` rollout controllers' saved states in `state`; refuses another count."""
    states = rollout_states(state)
    if len(states) != count:
        raise ValueError(
            f"{checkpoint} holds {len(states)} rollout controller states: resume it with "
            f"{'launcher=local' if len(states) == 1 else 'launcher=ray'} and "
            f"ray.num_rollout_actors={len(states)} (this run has {count})"
        )
    return list(states)
