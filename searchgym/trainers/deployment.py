"""A training run's deployment: where its parts run and how weights travel, resolved once from its config.

    deployment = resolve_deployment(config)      # reads the config alone: imports no torch or Ray, starts nothing
    deployment.sharded, deployment.weight_route, deployment.processes, deployment.resources, ...

`searchgym train` resolves it once and hands it to the launcher (`launchers/local.py`; `launchers/ray_cluster.py`,
which hands it to its actors) or to the resource plan (`plan.py`, `train --dry-run`); none of them decides again
what it says. `learner.ranks` in particular is read here and in config.py's own checks only (a test greps the package).

What each field is, and the one rule that decides it:

- `launcher`: "local" (one process, launchers/local.py) or "ray" (actors on a Ray cluster, ray_cluster.py):
  `launcher`. `cluster`: with Ray, the cluster joined (`ray.address`) or a local one started here; None locally.
- `engine`: "torch" (a TorchEngine: in this process, or one in each rollout actor) or "sglang" (HTTP clients of
  inference servers): `rollout.engine`.
- `servers`: where those servers come from: "none" (torch), "given" (already running, `rollout.sglang_addresses`)
  or "launched" (Ray server actors, `ray.sglang_servers`); `server_count` of them, and for launched ones the
  `server_program`: "sglang" (`python -m sglang.launch_server`) or "searchgym" (`serve model`, the CPU stand-in).
- `learner_ranks`: `learner.ranks`; `sharded` when over 1 (FSDP2's ShardedLearner; 1: the plain Learner).
- `learner_device`: where each learner rank trains. Locally `model.device` (rank r of a sharded learner on CUDA
  takes cuda:r; rank 0 shares its GPU with the engine). On Ray the GPUs an actor holds are the ones Ray gives it,
  so "cuda" when `ray.learner_gpus` > 0, else `model.device`, and the two must agree (below).
  `learner_on_gpu` says whether that is CUDA, `rank_device` is the kind a rank takes ("cuda" or "cpu"), and
  `backend` the collectives' backend over it ("nccl" or "gloo"): the sharded learner's process group and the
  group a `distributed` weight route broadcasts over.
- `engine_device`: a TorchEngine's device: locally `model.device`; on Ray "cuda" when `ray.rollout_gpus` > 0, else
  "cpu". Clients of servers ignore it.
- `rollout_actors`: the Ray rollout actors, `ray.num_rollout_actors`; 0 locally (the loop's process plays).
- `weight_route`: how the learner's new weights reach the engines after each step (rollout/weight_sync.py):
  "in_process" (a local TorchEngine loads the state dict in place: InProcessSync), "disk" (a Hugging Face
  model dir under out_dir/weights, loaded by `/update_weights_from_disk`: DiskSync; the local launcher's route to
  SGLang servers), "object_store" (Ray rollout actors' TorchEngines read one `ray.put` copy: ObjectStoreSync) or
  "distributed" (learner rank 0 broadcasts to the servers over a torch.distributed group, SGLang's protocol:
  DistributedSync and dist_sync.py). On Ray `ray.weight_sync` chooses it; `auto` is the object store for torch
  engines, the broadcast for servers launched here (one cluster: each side reaches the other) and disk for servers
  given by address (whether they reach the learner is unknown). The local launcher has one route per engine and
  does not read `ray.weight_sync`.
- `processes`: the processes or actors the run starts, each kind with its count and each one's CPUs and GPUs
  (`Processes`); `resources` sums them: what a Ray cluster must hold, and the dry run's totals.

Settings that contradict each other are refused while resolving, with a `DeploymentError` (a ValueError) whose
message opens with the dotted key to change, as settings checks do.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from searchgym.trainers.config import TrainConfig

LOCAL_CLUSTER = "a local cluster started here"


class DeploymentError(ValueError):
    """Settings that cannot be deployed together; the message opens with the dotted key, `key` holds it."""

    def __init__(self, key: str, message: str):
        if not message.startswith(key):
            raise AssertionError(f"a deployment error opens with its key {key!r}: {message!r}")
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class Processes:
    """Processes or actors of one kind: how many, and each one's CPUs, GPUs, and what it runs where."""

    name: str
    count: int
    cpus: float
    gpus: float
    detail: str


@dataclass(frozen=True)
class Deployment:
    """Where a run's parts run and how its weights travel (module docstring: each field and the rule behind it)."""

    launcher: str  # "local" | "ray"
    cluster: str | None  # Ray: ray.address, or LOCAL_CLUSTER; None locally
    engine: str  # "torch" | "sglang"
    servers: str  # "none" | "given" | "launched"
    server_count: int
    server_program: str | None  # launched servers: "sglang" | "searchgym"
    learner_ranks: int
    learner_device: str
    engine_device: str
    rollout_actors: int  # Ray's rollout actors; 0 locally
    weight_route: str  # "in_process" | "disk" | "object_store" | "distributed"
    processes: tuple[Processes, ...]

    @property
    def sharded(self) -> bool:
        """More than one learner rank: the FSDP2 ShardedLearner, rank 0 leading and the others following."""
        return self.learner_ranks > 1

    @property
    def learner_on_gpu(self) -> bool:
        """The learner ranks train on CUDA devices."""
        return self.learner_device.startswith("cuda")

    @property
    def rank_device(self) -> str:
        """The kind of device each learner rank takes: "cuda" (its own GPU) or "cpu"."""
        return "cuda" if self.learner_on_gpu else "cpu"

    @property
    def backend(self) -> str:
        """The collectives' backend: the sharded learner's process group and the `distributed` weight route's."""
        return "nccl" if self.learner_on_gpu else "gloo"

    @property
    def resources(self) -> dict[str, float]:
        """CPUs and GPUs every process or actor of the run holds, together."""
        return {
            "CPU": float(sum(p.count * p.cpus for p in self.processes)),
            "GPU": float(sum(p.count * p.gpus for p in self.processes)),
        }

    def to_json(self) -> dict[str, Any]:
        """The deployment as plain JSON-ready data (`train --dry-run --json`'s "deployment")."""
        data = asdict(self)
        data.update(
            processes=[asdict(p) for p in self.processes],
            sharded=self.sharded,
            backend=self.backend,
            resources=self.resources,
        )
        return data


def resolve_deployment(config: TrainConfig) -> Deployment:
    """The run's deployment, decided once from `config` (already checked by `check_settings`); settings that
    contradict each other raise DeploymentError naming the key."""
    if config.rollout.engine == "sglang" and config.model.path is None:
        raise DeploymentError(
            "model.path", "model.path must name the model the SGLang servers serve (rollout.engine=sglang)"
        )
    if config.launcher == "ray":
        return _ray(config)
    return _local(config)


def _local(config: TrainConfig) -> Deployment:
    """One process: the loop, learner rank 0 and the engine here; with N ranks, N - 1 follower processes."""
    rollout, device, ranks = config.rollout, config.model.device, config.learner.ranks
    if ranks > 1 and device != "cpu" and not device.startswith("cuda"):
        raise DeploymentError("model.device", sharded_device_message(device))
    if rollout.engine == "sglang" and not rollout.sglang_addresses:
        raise DeploymentError(
            "rollout.sglang_addresses",
            "rollout.sglang_addresses must name the running SGLang servers (host:port) for rollout.engine=sglang",
        )
    on_gpu = device.startswith("cuda")
    gpu = 1.0 if on_gpu else 0.0
    engine = (
        "an in-process TorchEngine"
        if rollout.engine == "torch"
        else f"SGLang clients of {len(rollout.sglang_addresses)} running servers"
    )
    processes = [
        Processes(
            "this process",
            1,
            1,
            gpu,
            f"the training loop, learner rank 0 and {engine}, on "
            + (f"{device}:0" if on_gpu and ranks > 1 and ":" not in device else device),
        )
    ]
    if ranks > 1:
        devices = f"cuda:1..cuda:{ranks - 1}" if on_gpu else "cpu"
        processes.append(
            Processes(
                "follower ranks",
                ranks - 1,
                1,
                gpu,
                f"spawned processes replaying rank 0's collectives, on {devices} ({'NCCL' if on_gpu else 'gloo'})",
            )
        )
    return Deployment(
        launcher="local",
        cluster=None,
        engine=rollout.engine,
        servers="none" if rollout.engine == "torch" else "given",
        server_count=len(rollout.sglang_addresses) if rollout.engine == "sglang" else 0,
        server_program=None,
        learner_ranks=ranks,
        learner_device=device,
        engine_device=device,
        rollout_actors=0,
        weight_route="in_process" if rollout.engine == "torch" else "disk",
        processes=tuple(processes),
    )


def _ray(config: TrainConfig) -> Deployment:
    """Actors on a Ray cluster: learner ranks in one placement group, rollout actors, optionally server actors."""
    settings, rollout = config.ray, config.rollout
    _check_ray_shares(config)
    servers, count = _ray_servers(config)
    learner_device = _ray_learner_device(config)
    return Deployment(
        launcher="ray",
        cluster=settings.address or LOCAL_CLUSTER,
        engine=rollout.engine,
        servers=servers,
        server_count=count,
        server_program=settings.sglang_server if servers == "launched" else None,
        learner_ranks=config.learner.ranks,
        learner_device=learner_device,
        engine_device="cuda" if settings.rollout_gpus > 0 else "cpu",
        rollout_actors=settings.num_rollout_actors,
        weight_route=_ray_weight_route(config, servers),
        processes=_ray_processes(config, learner_device),
    )


def _check_ray_shares(config: TrainConfig) -> None:
    """Each rollout actor takes batch_size / n groups a step and max_concurrent_rollouts // n episodes: both must
    give every actor whole groups (the staleness bound holds per actor, so it holds for their sum)."""
    rollout, n = config.rollout, config.ray.num_rollout_actors
    if n < 1:
        raise DeploymentError("ray.num_rollout_actors", f"ray.num_rollout_actors must be at least 1, got {n}")
    if rollout.batch_size % n:
        raise DeploymentError(
            "rollout.batch_size",
            f"rollout.batch_size ({rollout.batch_size} groups) must split evenly over ray.num_rollout_actors "
            f"({n}): each actor's controller takes batch_size / n groups a step",
        )
    if rollout.max_concurrent_rollouts // n < rollout.group_size:
        raise DeploymentError(
            "rollout.max_concurrent_rollouts",
            f"rollout.max_concurrent_rollouts ({rollout.max_concurrent_rollouts} episodes) split over {n} rollout "
            f"actors leaves less than one group of {rollout.group_size} episodes per actor",
        )


def _ray_servers(config: TrainConfig) -> tuple[str, int]:
    """Where the rollout actors' servers come from ("none", "given", "launched") and how many; each actor needs
    its own (actor i gets servers i::n, and pauses and updates only those)."""
    settings, rollout, n = config.ray, config.rollout, config.ray.num_rollout_actors
    if rollout.engine != "sglang":
        if settings.sglang_servers:
            raise DeploymentError(
                "ray.sglang_servers",
                "ray.sglang_servers is set but rollout.engine is 'torch': set rollout.engine=sglang",
            )
        return "none", 0
    if settings.sglang_servers and rollout.sglang_addresses:
        raise DeploymentError(
            "ray.sglang_servers",
            "ray.sglang_servers and rollout.sglang_addresses both name the servers: give either, not both",
        )
    servers, key = (
        ("launched", "ray.sglang_servers") if settings.sglang_servers else ("given", "rollout.sglang_addresses")
    )
    count = settings.sglang_servers or len(rollout.sglang_addresses)
    if count < n:
        raise DeploymentError(
            key,
            f"{key} gives {count} SGLang servers for {n} rollout actors (ray.num_rollout_actors): each actor "
            "needs its own server(s)",
        )
    return servers, count


def _ray_learner_device(config: TrainConfig) -> str:
    """The learner ranks' device on Ray: "cuda" with GPUs reserved for them, else `model.device`; the two must agree,
    since a rank reserving GPUs it does not train on, or training on CUDA with none reserved, is a mistake."""
    device, gpus = config.model.device, config.ray.learner_gpus
    if gpus > 0 and not device.startswith("cuda"):
        raise DeploymentError(
            "model.device",
            f"model.device is {device!r}, but ray.learner_gpus={gpus:g} reserves GPUs for each learner rank: "
            "set model.device=cuda (or ray.learner_gpus=0 to train on the CPU)",
        )
    if gpus == 0 and device.startswith("cuda"):
        raise DeploymentError(
            "ray.learner_gpus",
            f"ray.learner_gpus is 0, so the learner ranks hold no GPU, but model.device={device!r}: set "
            "ray.learner_gpus (GPUs per learner rank) or model.device=cpu",
        )
    if gpus > 0:
        return "cuda"
    if config.learner.ranks > 1 and device != "cpu":
        raise DeploymentError("model.device", sharded_device_message(device))
    return device


def _ray_weight_route(config: TrainConfig, servers: str) -> str:
    """The configured `ray.weight_sync`, or for `auto`: the object store for torch engines, the broadcast for servers
    launched here (they and the learner are in one cluster), disk for servers given by address."""
    route, engine = config.ray.weight_sync, config.rollout.engine
    if route == "auto":
        if engine != "sglang":
            return "object_store"
        return "distributed" if servers == "launched" else "disk"
    if route == "object_store" and engine == "sglang":
        raise DeploymentError(
            "ray.weight_sync",
            "ray.weight_sync=object_store cannot reach SGLang servers, which load weights from disk or a "
            "broadcast: use ray.weight_sync=disk, distributed (or auto)",
        )
    if route == "distributed" and engine != "sglang":
        raise DeploymentError(
            "ray.weight_sync",
            "ray.weight_sync=distributed broadcasts to SGLang servers: set rollout.engine=sglang, or use "
            "object_store (or auto) for torch engines",
        )
    return route


def _ray_processes(config: TrainConfig, learner_device: str) -> tuple[Processes, ...]:
    """The Ray run's actors: learner ranks in one placement group, server actors, rollout actors."""
    settings, rollout, ranks = config.ray, config.rollout, config.learner.ranks
    backend = "NCCL" if learner_device.startswith("cuda") else "gloo"
    if ranks > 1:
        how = f"one placement group (PACK: as few nodes as hold them), FSDP2 over {backend}"
    else:
        how = "the plain Learner" + (" in a placement group" if settings.learner_gpus else "")
    processes = [Processes("learner ranks", ranks, settings.learner_cpus, settings.learner_gpus, how)]
    if settings.sglang_servers:
        kind = "SGLang" if settings.sglang_server == "sglang" else "searchgym serve model"
        processes.append(
            Processes(
                "inference servers",
                settings.sglang_servers,
                1,
                settings.sglang_gpus_per_server,
                f"{kind}, --tp-size {settings.sglang_gpus_per_server}",
            )
        )
    elif rollout.engine == "sglang":
        processes.append(
            Processes(
                "inference servers",
                len(rollout.sglang_addresses),
                0,
                0,
                "already running (rollout.sglang_addresses): not reserved here",
            )
        )
    engine = "its TorchEngine" if rollout.engine == "torch" else "SGLang clients"
    processes.append(
        Processes(
            "rollout actors",
            settings.num_rollout_actors,
            settings.rollout_cpus,
            settings.rollout_gpus,
            f"{engine}, envs and a staleness controller over {rollout.batch_size} / "
            f"{settings.num_rollout_actors} groups a step",
        )
    )
    return tuple(processes)


def sharded_device_message(device: str) -> str:
    return f"model.device must be 'cpu' (gloo) or 'cuda' (NCCL) with learner.ranks > 1, got {device!r}"


def check_fits(needed: dict[str, float], available: dict[str, float]) -> None:
    """Fail now, naming the settings, rather than wait forever for actors the cluster cannot place."""
    short = {k: (v, available.get(k, 0.0)) for k, v in needed.items() if v > available.get(k, 0.0)}
    if short:
        detail = ", ".join(f"{v:g} {k} needed, {have:g} in the cluster" for k, (v, have) in short.items())
        raise ValueError(
            f"the Ray cluster is too small for this run ({detail}): lower ray.learner_cpus/gpus, "
            "ray.rollout_cpus/gpus, ray.num_rollout_actors or ray.sglang_servers"
        )
