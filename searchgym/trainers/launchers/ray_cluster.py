"""The Ray launcher: the shared training loop (loop.py) with its handles on Ray actors.

Topology (the run's Deployment, deployment.py: resolved once in RayTrainer and handed to every actor; resources
from `config.ray`):

    driver          this process: the step loop, RunLog (metrics, TensorBoard, trajectories)
    learner actors  the deployment's learner ranks in one placement group (PACK), `learner_gpus` each: one
                    Learner, or the ranks of a ShardedLearner (FSDP2) in rank 0's process group
                    (rank 0's node IP and a free port), rank 0 leading and the others following it;
                    rank 0 pushes weights and writes checkpoints
    rollout actors  `num_rollout_actors` async actors, each with its engine (CPU TorchEngine, or an
                    SGLangEngine over its own SGLang servers), its env instances and a RolloutController
    server actors   optional: `sglang_servers` actors with `sglang_gpus_per_server` GPUs, each running
                    one SGLang server; their addresses are dealt out to the rollout actors

Sharding. Rollout actor i of n plays the tasks i::n of the env's pool, in its own seeded order
(seed `config.seed + i`), so the actors never play the same task in an epoch and a 1-actor run
plays exactly the local launcher's data order. Groups are labelled with run-wide positions
p * n + i (p: the actor's own position). SGLang servers are dealt the same way (actor i gets
servers i::n), so each actor pauses and updates only its own servers.

Staleness. Each actor runs AReaL's rule on its share: batch_size / n groups per step and
max_concurrent_rollouts // n episodes. Every step takes one sub-batch from each actor at the same
trained version v, and each actor's buffer only hands out groups started at version >= v - eta; so
every group of the step's batch started at >= v - eta, and all actors together admit at most
(v + eta + 1) * batch_size groups: AReaL's global bound, kept with no cross-actor coordination.

The step loop is loop.py's, with handles to the actors (`RayRollouts`, `RayLearner`): every actor
gives its sub-batch, the learner trains on it (fetching the sub-batches from the object store itself),
pushes the weights (object store for TorchEngines; for SGLang servers a torch.distributed broadcast from
learner rank 0, or disk), every actor gets the trained version, and checkpoints hold the learner state
and every actor's controller state.
Run files (out_dir, model dirs, weights/) must be on storage all nodes share.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from pathlib import Path
from typing import Any

from searchgym.settings import check_settings
from searchgym.trainers.build import make_env_factory, task_ids
from searchgym.trainers.config import TrainConfig, config_dict
from searchgym.trainers.deployment import Deployment, check_fits, resolve_deployment
from searchgym.trainers.launchers.ray_actors import LearnerWorker, RolloutWorker, forwarded_env, shard
from searchgym.trainers.launchers.ray_servers import SGLangServerWorker
from searchgym.trainers.loop import Batch, Schedule, train_loop
from searchgym.trainers.rollout.controller import RolloutStats
from searchgym.trainers.run.log import RunLog
from searchgym.trainers.run.start import RunStart, start_run
from searchgym.trainers.run.stopping import StopRequest
from searchgym.trainers.run.watchdog import Watchdog

log = logging.getLogger(__name__)

PLACEMENT_TIMEOUT_S = 300


def train_ray(config: TrainConfig, *, resume: bool = False, progress: bool = True) -> list[dict[str, float]]:
    """Train until step `config.steps` on a Ray cluster: the same outputs and `resume` as local.train()."""
    check_settings(config)  # a config built in Python is refused naming the key, before a cluster starts
    return run_ray(config, resolve_deployment(config), resume=resume, progress=progress)


def run_ray(
    config: TrainConfig, deployment: Deployment, *, resume: bool = False, progress: bool = True
) -> list[dict[str, float]]:
    """`train_ray` on a config already checked and its deployment already resolved (what `searchgym train` does)."""
    with RayTrainer(config, deployment, resume=resume, progress=progress) as trainer:
        return trainer.train()


def local_cluster_kwargs(config: TrainConfig, cpus_needed: float) -> dict[str, Any]:
    """ray.init's settings for a local cluster ({} when joining one at ray.address): CPU slots for every actor even
    on a small box (rollout actors mostly wait on their engine and tools), and no dashboard unless ray.dashboard,
    then on ray.local_host. Ray's own gRPC ports (GCS, raylet, workers) listen on every interface whatever ray.init
    is told (it turns a loopback node address into the routable one); Ray's token authentication guards them."""
    if config.ray.address:
        return {}
    kwargs: dict[str, Any] = {
        "num_cpus": max(os.cpu_count() or 1, math.ceil(cpus_needed)),
        "include_dashboard": config.ray.dashboard,
    }
    if config.ray.dashboard:
        kwargs["dashboard_host"] = config.ray.local_host
    return kwargs


class RayTrainer:
    """One Ray training run: `start()` builds the actors, `train()` runs the steps, `shutdown()` ends them all."""

    def __init__(self, config: TrainConfig, deployment: Deployment, *, resume: bool = False, progress: bool = True):
        self.deployment = deployment  # the config's, resolved once (resolve_deployment) by the caller
        if deployment.launcher != "ray":
            raise ValueError(
                f"launcher is {deployment.launcher!r}: this is the Ray launcher (launchers.local.train runs "
                "launcher=local; `searchgym train` picks the launcher from the config)"
            )
        self.config, self.resume, self.progress = config, resume, progress
        self.learner: Any = None  # rank 0: the one the loop drives
        self.learner_ranks: list[Any] = []  # every learner actor, rank 0 first
        self._following: list[Any] = []  # refs of the follower ranks' follow() calls
        self.rollout_actors: list[Any] = []
        self.server_actors: list[Any] = []
        self.server_addresses: list[str] = []  # host:port of the SGLang servers the rollout actors use
        self.run: RunStart | None = None
        self._placement: Any = None
        self._started_ray = False

    def __enter__(self) -> RayTrainer:
        try:
            self.start()
        except BaseException:
            self.shutdown()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # ---- setup -------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Join or start the cluster, launch servers, learner and rollout actors, and align their weights."""
        import ray

        config, deployment = self.config, self.deployment
        n = deployment.rollout_actors
        # the driver reads only the checkpoint's small parts
        self.run = run = start_run(
            config.out_dir,
            config.model.path,
            seed=config.seed,
            resume=self.resume,
            mmap=True,
            learner_ranks=deployment.learner_ranks,
            controllers=n,
        )
        states = run.rollouts
        tasks = task_ids(
            make_env_factory(config.env), config.tasks
        )  # builds a synthetic world's cache here, once, not in actors
        if len(tasks) < n:
            raise ValueError(f"{len(tasks)} tasks cannot be sharded over {n} rollout actors")
        env = forwarded_env()
        needed = deployment.resources
        if not ray.is_initialized():
            # A local cluster's CPUs are scheduling slots: make room for every actor even on a small box
            # (rollout actors mostly wait on their engine and tools); a running cluster is taken as it is.
            ray.init(
                address=config.ray.address,
                runtime_env={"env_vars": env},
                log_to_driver=True,
                **local_cluster_kwargs(config, needed["CPU"]),
            )
            self._started_ray = True
        check_fits(needed, ray.cluster_resources())
        model_dir = os.fspath(run.model_dir)
        joining = self._start_learners(model_dir, os.fspath(run.checkpoint) if run.checkpoint else None, env)
        servers = self._launch_servers(model_dir, env)
        # the rollout actors' processes start (imports, envs) while the servers load their model
        Rollout = ray.remote(RolloutWorker).options(num_cpus=config.ray.rollout_cpus, num_gpus=config.ray.rollout_gpus)
        self.rollout_actors = [
            Rollout.remote(config, deployment, i, model_dir, states[i], run.version, env) for i in range(n)
        ]
        self.server_addresses = addresses = list(config.rollout.sglang_addresses) or ray.get(servers)
        engine_versions = ray.get(
            [actor.start.remote(shard(addresses, i, n)) for i, actor in enumerate(self.rollout_actors)]
        )
        ray.get(joining)  # every learner rank has built its shard (and loaded the checkpoint's)
        self._following = [actor.follow.remote() for actor in self.learner_ranks[1:]]
        ray.get(self.learner.connect.remote(self.rollout_actors, addresses))
        if deployment.engine == "sglang" and (
            run.checkpoint is not None or any(v != run.version for v in engine_versions)
        ):
            ray.get(self.learner.push_weights.remote())  # the servers hold other weights than the learner's

    def _start_learners(self, model_dir: str, checkpoint: str | None, env: dict[str, str]) -> list[Any]:
        """Start the learner actor(s); for a sharded learner, refs to their joining rank 0's process group
        (each builds its shard while the servers and rollout actors start; then ranks > 0 follow rank 0)."""
        import ray

        deployment = self.deployment
        Learner = self._learner_class()
        self.learner_ranks = [
            Learner.remote(self.config, deployment, model_dir, checkpoint, env, rank)
            for rank in range(deployment.learner_ranks)
        ]
        self.learner = self.learner_ranks[0]
        if not deployment.sharded:
            return []
        master_addr, master_port = ray.get(self.learner.master_address.remote())
        return [actor.join.remote(master_addr, master_port) for actor in self.learner_ranks]

    def _learner_class(self) -> Any:
        """The learner actor class; with GPUs or several ranks, their bundles are reserved first (a placement group
        packing the ranks onto as few nodes as hold them).

        Reserving them before the server actors take GPUs one by one keeps the servers from leaving
        the nodes with fewer free GPUs than the learner needs.
        """
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        settings, ranks = self.config.ray, self.deployment.learner_ranks
        options: dict[str, Any] = {"num_cpus": settings.learner_cpus, "num_gpus": settings.learner_gpus}
        if self.deployment.learner_on_gpu or self.deployment.sharded:
            bundle = {k: v for k, v in {"CPU": settings.learner_cpus, "GPU": settings.learner_gpus}.items() if v}
            strategy = "PACK" if self.deployment.sharded else "STRICT_PACK"
            self._placement = placement_group([bundle] * ranks, strategy=strategy)
            ready, _ = ray.wait([self._placement.ready()], timeout=PLACEMENT_TIMEOUT_S)
            if not ready:
                raise TimeoutError(
                    f"the cluster could not hold {ranks} learner rank(s) of {bundle} within "
                    f"{PLACEMENT_TIMEOUT_S} s: lower learner.ranks or ray.learner_gpus/cpus"
                )
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(self._placement)
        return ray.remote(LearnerWorker).options(**options)

    def _launch_servers(self, model_dir: str, env: dict[str, str]) -> list[Any]:
        """Start `ray.sglang_servers` server actors (none for torch engines); refs to their addresses, once ready."""
        import ray

        settings = self.config.ray
        if self.deployment.servers != "launched":
            return []
        Server = ray.remote(SGLangServerWorker).options(num_cpus=1, num_gpus=settings.sglang_gpus_per_server)
        log_dir = os.fspath(Path(self.config.out_dir) / "sglang")
        self.server_actors = [
            Server.remote(settings, model_dir, i, log_dir, env) for i in range(self.deployment.server_count)
        ]
        return [server.start.remote() for server in self.server_actors]

    # ---- the step loop -----------------------------------------------------------------------------------

    def train(self) -> list[dict[str, float]]:
        """Run the shared training loop until `config.steps`; every step's metrics (also in TensorBoard)."""
        if self.run is None:
            raise RuntimeError("start() the trainer first")
        config, run = self.config, self.run
        schedule = Schedule(run.first_step, config.steps, run.version, config.save_every)
        watchdog = Watchdog.for_run(
            config.watchdog,
            run.out,
            run.model_dir,
            start_step=run.first_step - 1,
            state=run.state.get("watchdog"),
            can_restore=not self.deployment.sharded,
        )

        async def steps(run_log: RunLog) -> list[dict[str, float]]:
            with StopRequest().installed() as stop:  # SIGTERM/SIGINT: stop at a step boundary (stopping.py)
                return await train_loop(
                    RayRollouts(self.rollout_actors),
                    RayLearner(self.learner),
                    run_log,
                    schedule,
                    progress=self.progress,
                    desc=f"training ({config.mode}, ray)",
                    watchdog=watchdog,
                    stop=stop,
                )

        with RunLog(run.out, config_dict(config), resume_step=run.first_step - 1) as run_log:
            return asyncio.run(steps(run_log))

    # ---- teardown ----------------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop the rollout actors and the servers, end every actor, and stop Ray if this trainer started it."""
        import ray

        if not ray.is_initialized():
            return
        if self._following:  # release the follower ranks (a dead rank 0 cannot: they are killed below)
            try:
                ray.get(self.learner.stop_followers.remote(), timeout=60)
                ray.get(self._following, timeout=60)
            except Exception as e:  # noqa: BLE001
                log.warning("stopping learner ranks: %r", e)
            self._following = []
        for stop in (
            [actor.stop.remote() for actor in self.rollout_actors],
            [server.stop.remote() for server in self.server_actors],
            [self.learner.close.remote()] if self.learner is not None else [],
        ):
            try:
                ray.get(stop, timeout=60)
            except Exception as e:  # noqa: BLE001 -- a dead actor must not keep the others running
                log.warning("stopping actors: %r", e)
        for actor in [*self.rollout_actors, *self.server_actors, *self.learner_ranks]:
            ray.kill(actor)
        self.rollout_actors, self.server_actors, self.learner, self.learner_ranks = [], [], None, []
        if self._placement is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._placement)
            self._placement = None
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False


class RayRollouts:
    """The loop's rollout side as Ray rollout actors: a batch is one sub-batch from each, at the same version."""

    # a wait the loop abandons (a stop) is cancelled on the actors, and groups an actor had already handed out
    # are owed again in the next state_dicts: a stop's checkpoint loses none
    cancel_safe = True

    def __init__(self, actors: list[Any]):
        self.actors = actors
        self._abandoned: list[Any] = []  # the refs of a get_batch the loop stopped waiting for

    async def get_batch(self) -> Batch:
        refs = [actor.get_batch.remote() for actor in self.actors]
        try:
            sub_batches = await asyncio.gather(*refs)
        except asyncio.CancelledError:
            self._abandoned = refs
            raise
        return Batch([group for sub_batch in sub_batches for group in sub_batch], refs)

    async def set_trained_version(self, version: int) -> None:
        await asyncio.gather(*(actor.set_trained_version.remote(version) for actor in self.actors))

    async def stats(self) -> list[RolloutStats]:
        return list(await asyncio.gather(*(actor.stats.remote() for actor in self.actors)))

    async def state_dicts(self) -> list[dict[str, Any]]:
        owed = await self._reclaim()
        states = list(await asyncio.gather(*(actor.state_dict.remote() for actor in self.actors)))
        for state, positions in zip(states, owed, strict=True):
            if positions:  # handed to a batch nobody trains: played again first, and not counted as trained
                state["replay"] = [*positions, *state["replay"]]
                state["staleness"]["accepted"] -= len(positions)
        return states

    async def _reclaim(self) -> list[list[int]]:
        """Cancel an abandoned get_batch on the actors; the local positions each had already handed out."""
        import ray

        refs, self._abandoned = self._abandoned, []
        for ref in refs:
            ray.cancel(ref)
        results = await asyncio.gather(*refs, return_exceptions=True)  # a cancelled one: TaskCancelledError
        count = len(self.actors)  # global_group's inverse: the actor's own position
        return [
            [group[0].group // count for group in result] if isinstance(result, list) else [] for result in results
        ] or [[] for _ in self.actors]

    async def discard(self) -> int:
        return sum(await asyncio.gather(*(actor.discard.remote() for actor in self.actors)))


class RayLearner:
    """The loop's learner side as the Ray learner actor; it fetches a batch's groups from the object store itself."""

    def __init__(self, actor: Any):
        self.actor = actor

    async def train_step(self, batch: Batch) -> dict[str, float]:
        return await self.actor.step.remote(*(batch.refs or [batch.groups]))

    async def push_weights(self) -> int:
        return await self.actor.push_weights.remote()

    async def save_checkpoint(self, step: int, rollouts: list[dict[str, Any]]) -> None:
        await self.actor.save_checkpoint.remote(step, rollouts)

    async def restore(self, weights: str, from_checkpoint: bool, watchdog: dict[str, Any]) -> float:
        return await self.actor.restore.remote(weights, from_checkpoint, watchdog)
