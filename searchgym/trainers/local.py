"""The local launcher: fully asynchronous decoupled-PPO training in one process, one event loop.

It builds in-process handles for the shared training loop (loop.py): the rollout side is one
RolloutController keeping episode groups in flight under the staleness rule; the learner side is a
Learner training in a worker thread, whose new weights go to the engine after each step: in-process
for the TorchEngine (between its decode steps), or for `rollout.engine: sglang` through disk (a model
dir under out_dir/weights, loaded by SGLang's /update_weights_from_disk). In-flight generations
continue and their later tokens carry the new version. `mode: sync` is the same code with staleness
0, so no group starts before the previous batch is trained (the baseline).

With `learner.ranks: N > 1` the learner is sharded (fsdp.py): this process is rank 0 and runs the loop
with its ShardedLearner leading; N-1 follower processes (learner_ranks.py) hold the other shards. The
weights pushed to the engines are rank 0's consolidated copy; checkpoints are sharded (DCP) plus the
consolidated model, and `--resume` restores them on the ranks.
"""
from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import torch

from searchgym.agents.engines.sglang_engine import SGLangEngine
from searchgym.trainers.build import build_controller, load_learner, make_env_factory, open_rollout_workflow, task_ids
from searchgym.trainers.checkpoint import save_checkpoint
from searchgym.trainers.config import TrainConfig, config_dict
from searchgym.trainers.fsdp import ShardedLearner
from searchgym.trainers.learner import Learner
from searchgym.trainers.learner_ranks import FollowerRanks, RankSpec, check_resume
from searchgym.trainers.loop import Batch, Schedule, train_loop
from searchgym.trainers.ray_servers import free_port
from searchgym.trainers.restore import initial_state, restore_learner
from searchgym.trainers.rollout import RolloutController, RolloutStats
from searchgym.trainers.run_log import RunLog
from searchgym.trainers.run_start import start_run
from searchgym.trainers.stopping import StopRequest, TrainingStopped
from searchgym.trainers.watchdog import Watchdog
from searchgym.trainers.weight_sync import DiskSync, InProcessSync, WeightSync

FOLLOWER_EXIT_WAIT_S = 5.0  # after a failure, how long a dying learner rank gets to be seen exiting


class InProcessRollouts:
    """The loop's rollout side as one RolloutController in this event loop."""

    cancel_safe = True  # the ledger hands out a batch without awaiting in between: a cancelled wait takes no group

    def __init__(self, controller: RolloutController):
        self.controller = controller

    async def get_batch(self) -> Batch:
        return Batch(await self.controller.get_batch())

    async def set_trained_version(self, version: int) -> None:
        self.controller.trained_version = version

    async def stats(self) -> list[RolloutStats]:
        return [self.controller.stats()]

    async def state_dicts(self) -> list[dict[str, Any]]:
        return [self.controller.state_dict()]

    async def discard(self) -> int:
        return await self.controller.discard()


class InProcessLearner:
    """The loop's learner side in this process: a Learner, the WeightSync to its engines, and checkpoints.

    Training and checkpoint writing run in worker threads, so the event loop (the rollouts) keeps going.
    The Ray learner actor wraps one of these too.
    """

    def __init__(self, learner: Learner, sync: WeightSync, tokenizer: Any, out_dir: str | os.PathLike,
                 keep_checkpoints: int):
        self.learner, self.sync, self.tokenizer = learner, sync, tokenizer
        self.out_dir, self.keep_checkpoints = Path(out_dir), keep_checkpoints
        self.watchdog_state: dict[str, Any] = {}  # the watchdog's restores and lr scale, saved with checkpoints
        self._initial = initial_state(learner) if isinstance(learner, Learner) else None

    async def train_step(self, batch: Batch) -> dict[str, float]:
        return await asyncio.to_thread(self.learner.step, batch.groups)

    async def push_weights(self) -> int:
        await self.sync.push(await self.full_model(), self.learner.version)
        return self.learner.version

    async def full_model(self) -> torch.nn.Module:
        """The whole model to send: the learner's own, or a sharded learner's consolidated copy (a collective)."""
        if isinstance(self.learner, ShardedLearner):
            return await asyncio.to_thread(self.learner.consolidated_model)  # type: ignore[arg-type]  # rank 0: a model
        return self.learner.model

    async def save_checkpoint(self, step: int, rollouts: list[dict[str, Any]]) -> None:
        if isinstance(self.learner, ShardedLearner):  # sharded weights and optimizer, and the consolidated model
            await asyncio.to_thread(self.learner.save_checkpoint, self.out_dir, step, tokenizer=self.tokenizer,
                                    state={"rollouts": rollouts, "watchdog": self.watchdog_state},
                                    keep=self.keep_checkpoints)
            return
        state = {"learner": self.learner.trainer_state(), "rollouts": rollouts, "watchdog": self.watchdog_state}
        await asyncio.to_thread(save_checkpoint, self.out_dir, step, model=self.learner.model,
                                tokenizer=self.tokenizer, keep=self.keep_checkpoints, state=state)

    async def restore(self, weights: str, from_checkpoint: bool, watchdog: dict[str, Any]) -> float:
        """Put the learner back on healthy weights with the watchdog's lr scale (restore.py); the new lr."""
        if isinstance(self.learner, ShardedLearner):
            raise NotImplementedError("the collapse watchdog cannot restore a sharded learner yet: "
                                      "set watchdog.enabled=false with learner.ranks > 1")
        lr = await asyncio.to_thread(restore_learner, self.learner, weights, from_checkpoint=from_checkpoint,
                                     lr_scale=float(watchdog["lr_scale"]), initial=self._initial)
        self.watchdog_state = dict(watchdog)
        return lr


def train(config: TrainConfig, *, resume: bool = False, progress: bool = True) -> list[dict[str, float]]:
    """Train until step `config.steps`; returns every step's metrics (also in TensorBoard and metrics.jsonl).

    With `resume`, continue from the run directory's latest checkpoint (same version numbering, same
    data order, unfinished groups replayed); without a checkpoint it starts from scratch. SIGTERM or SIGINT
    during the steps stops at a step boundary with the last trained step checkpointed (TrainingStopped).
    """
    return asyncio.run(_train(config, resume, progress))


async def _train(config: TrainConfig, resume: bool, progress: bool) -> list[dict[str, float]]:
    rollout = config.rollout
    if rollout.engine == "sglang" and config.model.path is None:
        raise ValueError("rollout.engine=sglang needs model.path: the model the SGLang servers serve")
    run = start_run(config.out_dir, config.model.path, seed=config.seed, resume=resume)
    [state] = run.rollout_states(1)
    check_resume(run.checkpoint, config.learner.ranks)
    # the learner's other ranks start first: their processes import and load while the engine starts here
    followers = FollowerRanks(rank_spec(config, run)) if config.learner.ranks > 1 else None
    learner: Learner | None = None
    finished = False
    try:
        workflow = await open_rollout_workflow(rollout, run.model_dir, device=config.model.device, seed=config.seed,
                                               version=run.version, addresses=rollout.sglang_addresses,
                                               start_timeout=config.ray.sglang_start_timeout_s)
    except BaseException:
        if followers is not None:
            followers.close()
        raise
    try:
        engine, tokenizer = workflow.handle.engine, workflow.handle.tokenizer  # type: ignore[union-attr]  # the engine-ownership rewrite removes this reach-in
        if followers is not None:
            learner = await asyncio.to_thread(followers.lead)
        else:
            learner = load_learner(config.model, config.learner, run.model_dir, pad_id=tokenizer.pad_token_id,
                                   state=run.state)
        sync: WeightSync
        if isinstance(engine, SGLangEngine):
            sync = DiskSync([engine], run.out / "weights", tokenizer)
        else:
            sync = InProcessSync([engine])  # type: ignore[list-item]  # a TorchEngine: updatable in process
        side = InProcessLearner(learner, sync, tokenizer, run.out, config.keep_checkpoints)
        side.watchdog_state = dict(run.state.get("watchdog") or {})
        if isinstance(engine, SGLangEngine) and (run.checkpoint is not None or engine.version != learner.version):
            await side.push_weights()  # the servers hold other weights than the learner's
        make_env = make_env_factory(config.env)
        controller = build_controller(rollout, workflow, task_ids(make_env, config.tasks), make_env=make_env,
                                      synchronous=config.mode == "sync", seed=config.seed)
        controller.trained_version = learner.version
        if state is not None:
            controller.load_state_dict(state)
        schedule = Schedule(run.first_step, config.steps, run.version, config.save_every)
        async with controller.running():
            with RunLog(run.out, config_dict(config), resume_step=run.first_step - 1) as run_log, \
                    StopRequest().installed() as stop:
                watchdog = Watchdog.for_run(config.watchdog, run.out, run.model_dir, start_step=run.first_step - 1,
                                            state=side.watchdog_state, can_restore=config.learner.ranks == 1)
                try:
                    history = await train_loop(InProcessRollouts(controller), side, run_log, schedule,
                                               progress=progress, desc=f"training ({config.mode}, local)",
                                               watchdog=watchdog, stop=stop)
                except TrainingStopped:
                    finished = not stop.abandoned  # a clean stop releases the learner ranks as a finished run does
                    raise
        finished = True
        return history
    except Exception as e:
        if followers is not None and (failure := followers.failure(wait=FOLLOWER_EXIT_WAIT_S)) is not None:
            raise RuntimeError(failure) from e
        raise
    finally:
        if followers is not None:
            followers.close(learner if finished else None)  # type: ignore[arg-type]  # with followers: a ShardedLearner
        await workflow.aclose()


def rank_spec(config: TrainConfig, run: Any) -> RankSpec:
    """How every rank of the local sharded learner builds it: the run's weights, resumed from its checkpoint."""
    from transformers import AutoTokenizer

    if config.learner.ranks > 1 and config.model.device.startswith("cuda"):
        available = torch.cuda.device_count()
        if config.learner.ranks > available:
            raise ValueError(f"learner.ranks={config.learner.ranks} needs a GPU per rank; {available} are visible")
    elif config.model.device != "cpu":
        raise ValueError(f"learner.ranks > 1 runs on 'cpu' (gloo) or 'cuda' (NCCL), not model.device={config.model.device!r}")
    return RankSpec(world=config.learner.ranks, master_addr="127.0.0.1", master_port=free_port(),
                    model_dir=os.fspath(run.model_dir), dtype=config.model.dtype, learner=config.learner,
                    pad_id=AutoTokenizer.from_pretrained(run.model_dir).pad_token_id or 0,
                    checkpoint=os.fspath(run.checkpoint) if run.checkpoint else None,
                    threads=torch.get_num_threads(), device="cuda" if config.model.device.startswith("cuda") else "cpu")
