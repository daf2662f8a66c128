"""The local launcher: fully asynchronous decoupled-PPO training in one process, one event loop.

It builds in-process handles for the shared training loop (loop.py): the rollout side is one
RolloutController keeping episode groups in flight under the staleness rule; the learner side is a
Learner training in a worker thread, whose new weights go to the engine after each step: in-process
for the TorchEngine (between its decode steps), or for `rollout.engine: sglang` through disk (a model
dir under out_dir/weights, loaded by SGLang's /update_weights_from_disk). In-flight generations
continue and their later tokens carry the new version. `mode: sync` is the same code with staleness
0, so no group starts before the previous batch is trained (the baseline).

With `learner.ranks: N > 1` the learner is sharded (fsdp.py): this process is rank 0 and runs the loop
with its ShardedLearner leading; N-1 follower processes (local_ranks.py) hold the other shards. The
weights pushed to the engines are rank 0's consolidated copy; checkpoints are sharded (DCP) plus the
consolidated model, and `--resume` restores them on the ranks.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import torch

from searchgym.agents.engines.sglang_engine import SGLangEngine
from searchgym.core.ports import free_port
from searchgym.settings import check_settings
from searchgym.trainers.algorithm.learner import Learner
from searchgym.trainers.build import build_controller, load_learner, make_env_factory, open_rollout_engine, task_ids
from searchgym.trainers.config import TrainConfig, config_dict
from searchgym.trainers.launchers.local_ranks import FollowerRanks
from searchgym.trainers.learner_side import InProcessLearner, RankSpec, check_resume
from searchgym.trainers.loop import Batch, Schedule, train_loop
from searchgym.trainers.rollout.controller import RolloutController, RolloutStats
from searchgym.trainers.rollout.weight_sync import DiskSync, InProcessSync, WeightSync
from searchgym.trainers.run.log import RunLog
from searchgym.trainers.run.start import start_run
from searchgym.trainers.run.stopping import StopRequest, TrainingStopped
from searchgym.trainers.run.watchdog import Watchdog

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


def train(
    config: TrainConfig, *, resume: bool = False, progress: bool = True, progress_label: str | None = None
) -> list[dict[str, float]]:
    """Train until step `config.steps`; returns every step's metrics (also in TensorBoard and metrics.jsonl).

    With `resume`, continue from the run directory's latest checkpoint (same version numbering, same
    data order, unfinished groups replayed); without a checkpoint it starts from scratch. SIGTERM or SIGINT
    during the steps stops at a step boundary with the last trained step checkpointed (TrainingStopped).
    A config that fails its checks is refused (ValueError naming the key) before anything starts.
    `progress_label` names the progress bar (default "training (MODE, local)"; the quickstart's says which of its
    stages this is).
    """
    check_settings(config)
    return asyncio.run(_train(config, resume, progress, progress_label or f"training ({config.mode}, local)"))


async def _train(config: TrainConfig, resume: bool, progress: bool, progress_label: str) -> list[dict[str, float]]:
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
        handle = await open_rollout_engine(
            rollout,
            run.model_dir,
            device=config.model.device,
            seed=config.seed,
            version=run.version,
            addresses=rollout.sglang_addresses,
            start_timeout=config.ray.sglang_start_timeout_s,
        )
    except BaseException:
        if followers is not None:
            followers.close()
        raise
    try:
        engine, tokenizer = handle.engine, handle.tokenizer
        if followers is not None:
            learner = await asyncio.to_thread(followers.lead)
        else:
            learner = load_learner(
                config.model, config.learner, run.model_dir, pad_id=tokenizer.pad_token_id, state=run.state
            )
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
        controller = build_controller(
            rollout,
            handle,
            task_ids(make_env, config.tasks),
            make_env=make_env,
            synchronous=config.mode == "sync",
            seed=config.seed,
        )
        controller.trained_version = learner.version
        if state is not None:
            controller.load_state_dict(state)
        schedule = Schedule(run.first_step, config.steps, run.version, config.save_every)
        async with controller.running():
            with (
                RunLog(run.out, config_dict(config), resume_step=run.first_step - 1) as run_log,
                StopRequest().installed() as stop,
            ):
                watchdog = Watchdog.for_run(
                    config.watchdog,
                    run.out,
                    run.model_dir,
                    start_step=run.first_step - 1,
                    state=side.watchdog_state,
                    can_restore=config.learner.ranks == 1,
                )
                try:
                    history = await train_loop(
                        InProcessRollouts(controller),
                        side,
                        run_log,
                        schedule,
                        progress=progress,
                        desc=progress_label,
                        watchdog=watchdog,
                        stop=stop,
                    )
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
        await handle.aclose()


def rank_spec(config: TrainConfig, run: Any) -> RankSpec:
    """How every rank of the local sharded learner builds it: the run's weights, resumed from its checkpoint."""
    from transformers import AutoTokenizer

    if config.learner.ranks > 1 and config.model.device.startswith("cuda"):
        available = torch.cuda.device_count()
        if config.learner.ranks > available:
            raise ValueError(f"learner.ranks={config.learner.ranks} needs a GPU per rank; {available} are visible")
    elif config.model.device != "cpu":
        raise ValueError(
            f"learner.ranks > 1 runs on 'cpu' (gloo) or 'cuda' (NCCL), not model.device={config.model.device!r}"
        )
    return RankSpec(
        world=config.learner.ranks,
        master_addr="127.0.0.1",
        master_port=free_port(),
        model_dir=os.fspath(run.model_dir),
        dtype=config.model.dtype,
        learner=config.learner,
        pad_id=AutoTokenizer.from_pretrained(run.model_dir).pad_token_id or 0,
        checkpoint=os.fspath(run.checkpoint) if run.checkpoint else None,
        threads=torch.get_num_threads(),
        device="cuda" if config.model.device.startswith("cuda") else "cpu",
    )
