"""Putting a learner back on healthy weights after a collapse (the watchdog's restore), with a lower learning rate.

The weights come from a checkpoint's model dir, or from the model the run started from; the optimizer and
scheduler state from the checkpoint's trainer.pt, or the state the learner had before its first step. The weight
version is not rolled back: it counts learner steps, and the staleness rule and the recorded token versions need it
to only ever grow. The learning rate is the restored state's times `lr_scale / its own scale`, so restoring a
checkpoint written after an earlier restore does not lower it twice; the scale is saved with later checkpoints
(trainer.pt's "watchdog" entry), so `--resume` keeps it.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

from searchgym.trainers.algorithm.learner import Learner
from searchgym.trainers.run.checkpoint import load_trainer_state, load_weights


def initial_state(learner: Learner) -> dict[str, Any] | None:
    """The optimizer and scheduler state of a learner that has not stepped yet (small: no moments), to restore later."""
    return copy.deepcopy(learner.trainer_state()) if not learner.optimizer.state else None


def restore_learner(
    learner: Learner,
    weights: str | os.PathLike,
    *,
    from_checkpoint: bool,
    lr_scale: float,
    initial: dict[str, Any] | None = None,
) -> float:
    """Load `weights` into `learner` with their optimizer state and the learning rate scaled to `lr_scale`; the new lr.

    `from_checkpoint`: `weights` is a checkpoint whose trainer.pt holds the optimizer state; otherwise it is the
    run's initial model and `initial` (`initial_state` before the first step) is the optimizer state to restore.
    """
    weights = Path(weights)
    if from_checkpoint:
        state = load_trainer_state(weights)
        trainer, saved_scale = state["learner"], float(state.get("watchdog", {}).get("lr_scale", 1.0))
    elif initial is not None:
        trainer, saved_scale = initial, 1.0
    else:
        raise ValueError(f"no optimizer state to restore with {weights}: the learner had stepped when it was built")
    load_weights(learner.model, weights)
    learner.load_state_dict(
        {"optimizer": trainer["optimizer"], "scheduler": trainer["scheduler"], "version": learner.version}
    )
    factor = lr_scale / saved_scale
    for group in learner.optimizer.param_groups:
        group["lr"] *= factor
        if "initial_lr" in group:
            group["initial_lr"] *= factor
    learner.scheduler.base_lrs = [lr * factor for lr in learner.scheduler.base_lrs]
    return float(learner.optimizer.param_groups[0]["lr"])
