"""The local launcher: fully asynchronous decoupled-PPO training in one process, one event loop.

It builds in-process handles for the shared training loop (loop.py): the rollout side is one
RolloutController keeping episode groups in flight under the staleness rule; the learner side is a
Learner training in a worker thread, whose new weights go to the engine after each step: in-process
for the TorchEngine (between its decode steps), or for `rollout.engine: sglang` through disk (a model
dir under out_dir/weights, loaded by SGLang's /update_weights_from_disk). In-flight generations
continue and their later tokens carry the new version. `mode: sync` is the same code with staleness
0, so no group starts before the previous batch is trained (the baseline).

What runs where comes from the run's Deployment (deployment.py), resolved once in `train()`. With a sharded
deployment (`learner.ranks: N > 1`, fsdp.py) this process is rank 0 and runs the loop with its ShardedLearner
leading; N-1 follower processes (local_ranks.py) hold the other shards (`ShardedRanks`; `OneRank` is the plain
Learner behind the same calls, so `_train` branches on the learner's kind once). The weights pushed to the
engines are rank 0's consolidated copy; checkpoints are sharded (DCP) plus the consolidated model, and `--resume`
restores them on the ranks.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Literal

import torch

from searchgym.agents.engines.memory import memory_after_release
from searchgym.agents.engines.open import EngineHandle
from searchgym.core.ports import free_port
from searchgym.settings import check_settings
from searchgym.trainers.algorithm.learner import Learner
from searchgym.trainers.build import build_controller, load_learner, make_env_factory, task_ids
from searchgym.trainers.config import TrainConfig, config_dict
from searchgym.trainers.deployment import Deployment, resolve_deployment
from searchgym.trainers.launchers.local_ranks import FollowerRanks
from searchgym.trainers.learner_side import InProcessLearner, RankSpec
from searchgym.trainers.loop import Batch, Schedule, train_loop
from searchgym.trainers.plan import engine_budget, few_rows_warning, model_shape
from searchgym.trainers.rollout.controller import RolloutController, RolloutStats
from searchgym.trainers.rollout.engine import open_rollout_engine
from searchgym.trainers.rollout.weight_sync import local_weight_sync
from searchgym.trainers.run.log import RunLog
from searchgym.trainers.run.start import RunStart, start_run
from searchgym.trainers.run.stopping import StopRequest, TrainingStopped
from searchgym.trainers.run.watchdog import Watchdog

logger = logging.getLogger(__name__)
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
    A config that fails its checks, or whose settings cannot be deployed together, is refused (ValueError naming
    the key) before anything starts. `progress_label` names the progress bar (default "training (MODE, local)";
    the quickstart's says which of its stages this is).
    """
    check_settings(config)
    return run_local(
        config, resolve_deployment(config), resume=resume, progress=progress, progress_label=progress_label
    )


def run_local(
    config: TrainConfig,
    deployment: Deployment,
    *,
    resume: bool = False,
    progress: bool = True,
    progress_label: str | None = None,
) -> list[dict[str, float]]:
    """`train` on a config already checked and its deployment already resolved (what `searchgym train` does once)."""
    if deployment.launcher != "local":
        raise ValueError(
            f"launcher is {deployment.launcher!r}: this is the local launcher (launchers.ray_cluster.train_ray runs "
            "launcher=ray; `searchgym train` picks the launcher from the config)"
        )
    label = progress_label or f"training ({config.mode}, local)"
    return asyncio.run(_train(config, deployment, resume, progress, label))


def engine_memory_budget(config: TrainConfig, deployment: Deployment) -> int | Literal["auto"]:
    """The in-process TorchEngine's batch budget when it and the learner share this machine's CPU memory: what the
    plan leaves after the learner's step, the engine's weights and the rest (`plan.engine_budget`), so that the two
    are sized not to exceed the memory together; elsewhere the engine's own default ("auto"). Read before the run
    loads anything, as the dry run reads it."""
    on_cpu = torch.device(deployment.engine_device).type == "cpu" and not deployment.learner_on_gpu
    if deployment.engine != "torch" or not on_cpu:
        return "auto"
    found = memory_after_release()  # what earlier stages of this process freed is available, not held by glibc
    if found is None:
        return "auto"
    try:
        shape = model_shape(config.model.path)
    except (ValueError, KeyError, OSError) as exc:  # PlanError too: loading the model says what is wrong, and how
        logger.warning("the engine's memory budget is its default: the model's shapes could not be read (%s)", exc)
        return "auto"
    budget = engine_budget(config, deployment, shape, found[0])
    gib = (budget / 2**30, found[0] / 2**30, found[1])
    logger.info("the engine's batch budget: %.2f GiB of %.1f GiB available (%s)", *gib)
    for line in few_rows_warning(config, deployment, shape, found[0]):
        logger.warning("%s", line)
    return budget


class OneRank:
    """The plain Learner, in this process: what `_train` calls on the learner ranks, with nothing to follow."""

    def __init__(self, config: TrainConfig, deployment: Deployment, run: RunStart):
        self.config, self.deployment, self.run = config, deployment, run

    async def lead(self, pad_id: int | None) -> Learner:
        config, run = self.config, self.run
        return load_learner(
            config.model,
            config.learner,
            run.model_dir,
            device=self.deployment.learner_device,
            pad_id=pad_id,
            state=run.state,
        )

    def failure(self, wait: float = 0.0) -> str | None:
        return None

    def close(self, learner: Learner | None = None) -> None:
        pass


class ShardedRanks:
    """Rank 0 of a sharded learner in this process, ranks 1..N-1 spawned at once (local_ranks.FollowerRanks)."""

    def __init__(self, config: TrainConfig, deployment: Deployment, run: RunStart):
        self.followers = FollowerRanks(rank_spec(config, deployment, run))

    async def lead(self, pad_id: int | None) -> Learner:
        return await asyncio.to_thread(self.followers.lead)  # every rank loads the pad id from the model dir

    def failure(self, wait: float = 0.0) -> str | None:
        return self.followers.failure(wait=wait)

    def close(self, learner: Learner | None = None) -> None:
        self.followers.close(learner)  # type: ignore[arg-type]  # what lead() gave: a ShardedLearner


async def _train(
    config: TrainConfig, deployment: Deployment, resume: bool, progress: bool, label: str
) -> list[dict[str, float]]:
    budget = engine_memory_budget(config, deployment)  # before the run loads its model, state and ranks
    run = start_run(
        config.out_dir, config.model.path, seed=config.seed, resume=resume, learner_ranks=deployment.learner_ranks
    )
    # the one branch on the learner's kind; a sharded learner's other ranks start first: their processes import
    # and load while the engine starts here
    ranks = (ShardedRanks if deployment.sharded else OneRank)(config, deployment, run)
    try:
        handle = await open_rollout_engine(
            config.rollout,
            run.model_dir,
            device=deployment.engine_device,
            seed=config.seed,
            version=run.version,
            addresses=config.rollout.sglang_addresses,
            start_timeout=config.ray.sglang_start_timeout_s,
            memory_budget_bytes=budget,
        )
    except BaseException:
        ranks.close()
        raise
    learner: Learner | None = None
    stop, finished = StopRequest(), False
    try:
        learner = await ranks.lead(handle.tokenizer.pad_token_id)
        history = await _steps(config, deployment, run, handle, learner, stop, progress, label)
        finished = True
        return history
    except Exception as e:
        # a clean stop releases the learner ranks as a finished run does
        finished = isinstance(e, TrainingStopped) and not stop.abandoned
        if (failure := ranks.failure(wait=FOLLOWER_EXIT_WAIT_S)) is not None:
            raise RuntimeError(failure) from e
        raise
    finally:
        ranks.close(learner if finished else None)
        await handle.aclose()


async def _steps(
    config: TrainConfig,
    deployment: Deployment,
    run: RunStart,
    handle: EngineHandle,
    learner: Learner,
    stop: StopRequest,
    progress: bool,
    label: str,
) -> list[dict[str, float]]:
    """The learner side and the controller on the opened engine, then the shared loop until `config.steps`."""
    sync = local_weight_sync(deployment.weight_route, handle.engine, handle.tokenizer, run.out)
    side = InProcessLearner(learner, sync, handle.tokenizer, run.out, config.keep_checkpoints)
    side.watchdog_state = dict(run.state.get("watchdog") or {})
    engine = handle.engine
    assert engine is not None  # open_rollout_engine opens a token engine (torch or SGLang), never a chat endpoint
    if deployment.engine == "sglang" and (run.checkpoint is not None or engine.version != learner.version):
        await side.push_weights()  # the servers hold other weights than the learner's
    make_env = make_env_factory(config.env)
    tasks = task_ids(make_env, config.tasks)
    controller = build_controller(
        config.rollout, handle, tasks, make_env=make_env, synchronous=config.mode == "sync", seed=config.seed
    )
    controller.trained_version = learner.version
    [state] = run.rollouts
    if state is not None:
        controller.load_state_dict(state)
    schedule = Schedule(run.first_step, config.steps, run.version, config.save_every)
    async with controller.running():
        with (
            RunLog(run.out, config_dict(config), resume_step=run.first_step - 1) as run_log,
            stop.installed(),
        ):
            watchdog = Watchdog.for_run(
                config.watchdog,
                run.out,
                run.model_dir,
                start_step=run.first_step - 1,
                state=side.watchdog_state,
                can_restore=not deployment.sharded,
            )
            return await train_loop(
                InProcessRollouts(controller),
                side,
                run_log,
                schedule,
                progress=progress,
                desc=label,
                watchdog=watchdog,
                stop=stop,
            )


def rank_spec(config: TrainConfig, deployment: Deployment, run: RunStart) -> RankSpec:
    """How every rank of the local sharded learner builds it: the run's weights, resumed from its checkpoint."""
    from transformers import AutoTokenizer

    if deployment.learner_on_gpu and deployment.learner_ranks > (available := torch.cuda.device_count()):
        raise ValueError(f"learner.ranks={deployment.learner_ranks} needs a GPU per rank; {available} are visible")
    return RankSpec(
        world=deployment.learner_ranks,
        master_addr="127.0.0.1",
        master_port=free_port(),
        model_dir=os.fspath(run.model_dir),
        dtype=config.model.dtype,
        learner=config.learner,
        pad_id=AutoTokenizer.from_pretrained(run.model_dir).pad_token_id or 0,
        checkpoint=os.fspath(run.checkpoint) if run.checkpoint else None,
        threads=torch.get_num_threads(),
        device=deployment.rank_device,
    )
