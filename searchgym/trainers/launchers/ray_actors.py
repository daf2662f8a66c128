"""The Ray launcher's actors, as plain classes (ray_cluster.py wraps them with `ray.remote` and resources).

- `LearnerWorker`: owns the model and the Learner; trains a step on the sub-batches the driver passes
  (as object refs, fetched straight from the rollout actors' results), pushes the new weights to the
  rollout actors (object store, disk, or broadcast to their servers: the deployment's weight route), and writes
  checkpoints. A sharded deployment has one of them per rank, each with a ShardedLearner rank; rank 0 leads, the
  others follow.
- `RolloutWorker`: an async actor owning one engine (a TorchEngine, or an SGLangEngine over its own
  SGLang servers), its env instances, and a RolloutController running in the actor's event loop.

The SGLang server actor is in ray_servers.py: it needs neither torch nor a model in its own process.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from searchgym.agents.trajectory import Trajectory
from searchgym.core.ports import free_port
from searchgym.trainers.algorithm.learner import Learner
from searchgym.trainers.build import build_controller, load_learner, make_env_factory, task_ids
from searchgym.trainers.config import TrainConfig
from searchgym.trainers.deployment import Deployment
from searchgym.trainers.learner_side import InProcessLearner, RankSpec, sharded_learner
from searchgym.trainers.loop import Batch
from searchgym.trainers.rollout.controller import RolloutStats
from searchgym.trainers.rollout.engine import open_rollout_engine
from searchgym.trainers.rollout.weight_sync import DiskSync, DistributedSync, ObjectStoreSync, RemoteEngine, WeightSync
from searchgym.trainers.run.checkpoint import load_trainer_state

FORWARDED_ENV_PREFIXES = ("SEARCHGYM_", "HF_", "TRANSFORMERS_", "TOKENIZERS_")


def forwarded_env() -> dict[str, str]:
    """The driver's environment variables the workers need too (bundle cache, Hugging Face settings)."""
    return {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}


def shard(items: list[str], index: int, count: int) -> list[str]:
    """Rollout actor `index`'s share of the tasks: every `count`-th one from `index` (disjoint, near-equal)."""
    return items[index::count]


def global_group(position: int, index: int, count: int) -> int:
    """A group's run-wide data position: actor `index`'s position p becomes p * count + index (unique, invertible)."""
    return position * count + index


class LearnerWorker:
    """A learner actor: the local launcher's in-process learner side (model, optimizer, weight pushes, checkpoints).

    With one learner rank in the deployment it holds a Learner from construction. With N > 1 there are N of these
    actors, `rank` 0..N-1: each `join()`s rank 0's process group and builds its ShardedLearner; rank 0 then leads
    (the driver calls it as it calls a single learner) while the others `follow()` its collectives.
    """

    def __init__(
        self,
        config: TrainConfig,
        deployment: Deployment,
        model_dir: str,
        checkpoint: str | None,
        env: dict[str, str],
        rank: int = 0,
    ):
        os.environ.update(env)
        from transformers import AutoTokenizer

        self.config, self.deployment = config, deployment
        self.model_dir, self.checkpoint, self.rank = model_dir, checkpoint, rank
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.learner: Learner | None = None
        if not deployment.sharded:
            state = load_trainer_state(checkpoint) if checkpoint else None
            self.learner = load_learner(
                config.model,
                config.learner,
                model_dir,
                pad_id=self.tokenizer.pad_token_id,
                state=state,
                device=deployment.learner_device,
            )
        self.side: InProcessLearner | None = None

    def master_address(self) -> tuple[str, int]:
        """This node's IP and a free port on it: where rank 0 hosts the learner's process group."""
        import ray

        host = ray.util.get_node_ip_address()
        return host, free_port(host)

    async def join(self, master_addr: str, master_port: int) -> None:
        """Build this rank's ShardedLearner in rank 0's group (all ranks together: loading a checkpoint is a
        collective); rank 0 then leads."""
        config, deployment = self.config, self.deployment
        spec = RankSpec(
            world=deployment.learner_ranks,
            master_addr=master_addr,
            master_port=master_port,
            model_dir=self.model_dir,
            dtype=config.model.dtype,
            learner=config.learner,
            pad_id=self.tokenizer.pad_token_id or 0,
            checkpoint=self.checkpoint,
            device=deployment.rank_device,
        )
        learner = await asyncio.to_thread(sharded_learner, spec, self.rank, 0)  # Ray shows each actor its GPU as 0
        if self.rank == 0:
            learner.lead()
        self.learner = learner

    async def follow(self) -> None:
        """On ranks > 0: replay rank 0's collectives until it stops; returns then."""
        if not self.deployment.sharded or self.rank == 0 or self.learner is None:
            raise RuntimeError("follow() is for learner ranks > 0 after join()")
        await asyncio.to_thread(self.learner.follow)

    def stop_followers(self) -> None:
        """On rank 0 of a sharded learner: release the followers from follow()."""
        if self.deployment.sharded and self.rank == 0 and self.learner is not None:
            self.learner.stop()

    async def connect(self, rollout_actors: list[Any], servers: Sequence[str] = ()) -> None:
        """Push weights to these rollout actors from now on, by the deployment's route: "object_store", "disk", or
        "distributed" (a torch.distributed group with their inference `servers`, host:port, formed here)."""
        if self.learner is None:
            raise RuntimeError("join() the learner ranks first")
        sync: WeightSync
        route = self.deployment.weight_route
        if route == "object_store":
            sync = ObjectStoreSync(rollout_actors)
        elif route == "distributed":
            import ray

            host = ray.util.get_node_ip_address()
            sync = DistributedSync(
                list(servers),
                [RemoteEngine(a) for a in rollout_actors],
                master_address=host,
                master_port=free_port(host),
                backend=self.deployment.backend,
            )
            await sync.init()
        else:
            sync = DiskSync(
                [RemoteEngine(a) for a in rollout_actors], Path(self.config.out_dir) / "weights", self.tokenizer
            )
        self.side = InProcessLearner(
            self.learner, sync, self.tokenizer, self.config.out_dir, self.config.keep_checkpoints
        )
        if self.checkpoint:  # the collapse watchdog's restores and lr scale carry on into later checkpoints
            self.side.watchdog_state = dict(load_trainer_state(self.checkpoint, mmap=True).get("watchdog") or {})

    async def close(self) -> None:
        """Close what the weight sync opened (DistributedSync's HTTP session) before the actor is killed."""
        close = getattr(self.side.sync, "close", None) if self.side is not None else None
        if close is not None:
            await close()

    def version(self) -> int:
        return self.learner.version if self.learner is not None else -1

    async def step(self, *sub_batches: list[list[Trajectory]]) -> dict[str, float]:
        """One learner step on the rollout actors' sub-batches, in a thread so the actor stays responsive."""
        return await self._connected().train_step(Batch([group for sub_batch in sub_batches for group in sub_batch]))

    async def push_weights(self) -> int:
        """Send the current weights to every rollout actor; returns their version."""
        return await self._connected().push_weights()

    async def save_checkpoint(self, step: int, rollouts: list[dict[str, Any]]) -> None:
        """Checkpoint `step`: the model dir, the learner state and every rollout actor's controller state."""
        await self._connected().save_checkpoint(step, rollouts)

    async def restore(self, weights: str, from_checkpoint: bool, watchdog: dict[str, Any]) -> float:
        """The collapse watchdog's restore: healthy weights (a checkpoint dir, or the initial model), lower lr."""
        return await self._connected().restore(weights, from_checkpoint, watchdog)

    def _connected(self) -> InProcessLearner:
        if self.side is None:
            raise RuntimeError("connect() the rollout actors first")
        return self.side


class RolloutWorker:
    """A rollout actor: its engine, its envs and its RolloutController, on its shard of the tasks.

    It plays tasks `index::count` of the env's pool with seed `config.seed + index`, `batch_size / count`
    groups per sub-batch and `max_concurrent_rollouts // count` episodes at once, under its own
    staleness controller. Its groups are labelled with run-wide positions (`global_group`).
    """

    def __init__(
        self,
        config: TrainConfig,
        deployment: Deployment,
        index: int,
        model_dir: str,
        state: dict[str, Any] | None,
        version: int,
        env: dict[str, str],
    ):
        os.environ.update(env)
        self.config, self.deployment = config, deployment
        self.index, self.count = index, deployment.rollout_actors
        self.model_dir, self.state, self.version = model_dir, state, version
        self.handle: Any = None  # the engine this actor opened: its rollouts play on it, weight updates reach it
        self.controller: Any = None
        self._run: asyncio.Task | None = None

    async def start(self, addresses: list[str]) -> int:
        """Open this actor's engine (its SGLang servers' `addresses`, if any), build the controller's workflow on it
        and start admitting groups; returns the engine's version."""
        config, count, index = self.config, self.count, self.index
        make_env = make_env_factory(config.env)
        tasks = shard(task_ids(make_env, config.tasks), index, count)
        self.handle = await open_rollout_engine(
            config.rollout,
            self.model_dir,
            device=self.deployment.engine_device,
            seed=config.seed + index,
            version=self.version,
            addresses=addresses,
            start_timeout=config.ray.sglang_start_timeout_s,
        )
        self.controller = build_controller(
            config.rollout,
            self.handle,
            tasks,
            make_env=make_env,
            synchronous=config.mode == "sync",
            seed=config.seed + index,
            shares=count,
        )
        self.controller.trained_version = self.version
        if self.state:
            self.controller.load_state_dict(self.state)
        self._run = asyncio.create_task(self.controller.run())
        return self.engine.version

    async def get_batch(self) -> list[list[Trajectory]]:
        """This actor's next sub-batch (oldest first, within the staleness bound), with run-wide group positions."""
        batch = await self.controller.get_batch()
        for group in batch:
            for traj in group:
                traj.group = global_group(traj.group, self.index, self.count)
        return batch

    async def update_weights(self, source: Any, version: int) -> None:
        """Load new weights into the engine: a state dict from the object store, or a model dir; or, when the
        learner already broadcast them to the servers (`source` None), re-read the servers' version."""
        if source is None:
            await self.engine.start(wait_ready=False)  # SGLangEngine: the version from each server's /model_info
            if self.engine.version != version:
                raise RuntimeError(f"the servers report weight version {self.engine.version}, not {version}")
            return
        await self.engine.update_weights(source, version)

    def set_trained_version(self, version: int) -> None:
        """The learner has trained `version`: admit groups against it."""
        self.controller.trained_version = version

    def state_dict(self) -> dict[str, Any]:
        return self.controller.state_dict()

    async def discard(self) -> int:
        """Drop this actor's groups in flight or buffered (after a watchdog restore); their positions replay."""
        return await self.controller.discard()

    def stats(self) -> RolloutStats:
        return self.controller.stats()

    @property
    def engine(self) -> Any:
        """This actor's rollout engine (None before start)."""
        return self.handle.engine if self.handle is not None else None

    def engine_version(self) -> int:
        return self.engine.version

    def engine_weight(self, name: str) -> torch.Tensor:
        """One weight of the engine's model (TorchEngine only), to check a sync reached this actor."""
        return self.engine.model.state_dict()[name].detach().cpu().clone()

    async def stop(self) -> None:
        """Stop admitting, cancel the groups in flight, close the engine."""
        if self.controller is not None:
            self.controller.stop()
        if self._run is not None:
            await self._run
        if self.handle is not None:
            await self.handle.aclose()
