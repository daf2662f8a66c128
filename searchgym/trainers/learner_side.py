"""The learner side both launchers run: the learner, its weight sync to the engines, and its checkpoints.

`InProcessLearner` is what the shared training loop (loop.py) calls on the learner side: the local launcher
holds one in its process, each Ray learner actor wraps one. `RankSpec` and `sharded_learner` build one rank
of a sharded learner, whichever launcher started the rank (run/start.py refuses a checkpoint of the other kind
before any rank starts). Learner kinds differ by their methods (`full_model`, `save_checkpoint`,
`restorable`), never by type checks here.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from searchgym.trainers.algorithm.fsdp import ShardedLearner, load_sharded_learner
from searchgym.trainers.algorithm.learner import Learner
from searchgym.trainers.config import LearnerConfig
from searchgym.trainers.loop import Batch
from searchgym.trainers.rollout.weight_sync import WeightSync
from searchgym.trainers.run.restore import initial_state, restore_learner


@dataclass(frozen=True)
class RankSpec:
    """What every rank needs to build the same sharded learner."""

    world: int
    master_addr: str
    master_port: int
    model_dir: str
    dtype: str
    learner: LearnerConfig
    pad_id: int
    checkpoint: str | None = None  # resume every rank from this checkpoint's sharded/ directory
    threads: int = 0  # torch threads per follower (0: torch's default)
    device: str | None = None  # "cpu" (gloo) or "cuda" (NCCL); None: CUDA when available


def sharded_learner(spec: RankSpec, rank: int, device_index: int | None = None) -> ShardedLearner:
    """Rank `rank`'s ShardedLearner: joins the group, loads the model (and the checkpoint: a collective)."""
    return load_sharded_learner(
        spec.model_dir,
        spec.learner,
        dtype=getattr(torch, spec.dtype),
        pad_id=spec.pad_id,
        checkpoint=spec.checkpoint,
        device=spec.device,
        rank=rank,
        world_size=spec.world,
        master_addr=spec.master_addr,
        master_port=spec.master_port,
        device_index=rank if device_index is None else device_index,
    )


class InProcessLearner:
    """The loop's learner side in this process: a Learner, the WeightSync to its engines, and checkpoints.

    Training and checkpoint writing run in worker threads, so the event loop (the rollouts) keeps going.
    The Ray learner actor wraps one of these too.
    """

    def __init__(
        self, learner: Learner, sync: WeightSync, tokenizer: Any, out_dir: str | os.PathLike, keep_checkpoints: int
    ):
        self.learner, self.sync, self.tokenizer = learner, sync, tokenizer
        self.out_dir, self.keep_checkpoints = Path(out_dir), keep_checkpoints
        self.watchdog_state: dict[str, Any] = {}  # the watchdog's restores and lr scale, saved with checkpoints
        self._initial = initial_state(learner) if learner.restorable else None

    async def train_step(self, batch: Batch) -> dict[str, float]:
        return await asyncio.to_thread(self.learner.step, batch.groups)

    async def push_weights(self) -> int:
        model = await self.full_model()
        if model is None:
            raise RuntimeError("only rank 0 of a sharded learner holds the whole model to push")
        await self.sync.push(model, self.learner.version)
        return self.learner.version

    async def full_model(self) -> torch.nn.Module | None:
        """The whole model to send: the learner's own, or a sharded learner's consolidated copy (a collective)."""
        return await asyncio.to_thread(self.learner.full_model)

    async def save_checkpoint(self, step: int, rollouts: list[dict[str, Any]]) -> None:
        """Checkpoint `step` in a worker thread: the learner's weights and state, the rollouts' and the watchdog's."""
        await asyncio.to_thread(
            self.learner.save_checkpoint,
            self.out_dir,
            step,
            tokenizer=self.tokenizer,
            state={"rollouts": rollouts, "watchdog": self.watchdog_state},
            keep=self.keep_checkpoints,
        )

    async def restore(self, weights: str, from_checkpoint: bool, watchdog: dict[str, Any]) -> float:
        """Put the learner back on healthy weights with the watchdog's lr scale (restore.py); the new lr."""
        if not self.learner.restorable:
            raise NotImplementedError(
                "the collapse watchdog cannot restore a sharded learner yet: "
                "set watchdog.enabled=false with learner.ranks > 1"
            )
        lr = await asyncio.to_thread(
            restore_learner,
            self.learner,
            weights,
            from_checkpoint=from_checkpoint,
            lr_scale=float(watchdog["lr_scale"]),
            initial=self._initial,
        )
        self.watchdog_state = dict(watchdog)
        return lr
