"""A Ray run's topology from its config alone: the settings checks, the weight route and the resources it reserves.

The plan (`train --dry-run`) and the Ray launcher both read these; nothing here imports Ray.
"""

from __future__ import annotations

from searchgym.trainers.config import TrainConfig


def weight_route(config: TrainConfig) -> str:
    """How weights reach the rollout actors: the configured route, or by default (`auto`) the object store for
    CPU torch engines, a broadcast for SGLang servers this run launches (they and the learner are in one Ray
    cluster, so each reaches the other), and disk for servers given by address (reachability unknown)."""
    route, engine = config.ray.weight_sync, config.rollout.engine
    if route == "auto":
        if engine != "sglang":
            return "object_store"
        return "distributed" if config.ray.sglang_servers else "disk"
    if route == "object_store" and engine == "sglang":
        raise ValueError(
            "SGLang servers load weights from disk or a broadcast: use ray.weight_sync=disk, distributed (or auto)"
        )
    if route == "distributed" and engine != "sglang":
        raise ValueError(
            "ray.weight_sync=distributed broadcasts to SGLang servers: set rollout.engine=sglang, or "
            "use object_store (or auto) for torch engines"
        )
    return route


def check_ray_config(config: TrainConfig) -> None:
    """Refuse topologies that cannot keep the staleness bound or feed every actor, naming the setting."""
    ray_cfg, rollout = config.ray, config.rollout
    n = ray_cfg.num_rollout_actors
    if n < 1:
        raise ValueError("ray.num_rollout_actors must be at least 1")
    if rollout.batch_size % n:
        raise ValueError(
            f"rollout.batch_size ({rollout.batch_size} groups) must split evenly over "
            f"ray.num_rollout_actors ({n}): each actor's controller takes batch_size / n groups a step"
        )
    if rollout.max_concurrent_rollouts // n < rollout.group_size:
        raise ValueError(
            f"rollout.max_concurrent_rollouts ({rollout.max_concurrent_rollouts} episodes) split over "
            f"{n} rollout actors leaves less than one group of {rollout.group_size} episodes per actor"
        )
    weight_route(config)
    if rollout.engine == "sglang":
        if config.model.path is None:
            raise ValueError("rollout.engine=sglang needs model.path: the model the SGLang servers serve")
        if ray_cfg.sglang_servers and rollout.sglang_addresses:
            raise ValueError("give either ray.sglang_servers (launched here) or rollout.sglang_addresses, not both")
        servers = ray_cfg.sglang_servers or len(rollout.sglang_addresses)
        if servers < n:
            raise ValueError(
                f"{servers} SGLang servers for {n} rollout actors: each actor needs its own server(s) "
                "(set ray.sglang_servers or rollout.sglang_addresses)"
            )
    elif ray_cfg.sglang_servers:
        raise ValueError("ray.sglang_servers is set but rollout.engine is 'torch': set rollout.engine=sglang")


def required_resources(config: TrainConfig) -> dict[str, float]:
    """CPUs and GPUs all the run's actors reserve: learner, rollout actors, launched SGLang servers."""
    settings, n, ranks = config.ray, config.ray.num_rollout_actors, config.learner.ranks
    return {
        "CPU": ranks * settings.learner_cpus + n * settings.rollout_cpus + settings.sglang_servers,
        "GPU": ranks * settings.learner_gpus
        + n * settings.rollout_gpus
        + settings.sglang_servers * settings.sglang_gpus_per_server,
    }


def check_fits(needed: dict[str, float], available: dict[str, float]) -> None:
    """Fail now, naming the settings, rather than wait forever for actors the cluster cannot place."""
    short = {k: (v, available.get(k, 0.0)) for k, v in needed.items() if v > available.get(k, 0.0)}
    if short:
        detail = ", ".join(f"{v:g} {k} needed, {have:g} in the cluster" for k, (v, have) in short.items())
        raise ValueError(
            f"the Ray cluster is too small for this run ({detail}): lower ray.learner_cpus/gpus, "
            "ray.rollout_cpus/gpus, ray.num_rollout_actors or ray.sglang_servers"
        )
