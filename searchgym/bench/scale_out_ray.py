"""The Ray Serve arms of `searchgym bench scale-out`: the whole index as a Ray Serve application with 1 and with 2
replicas (`serve/ray_search.py`), and the shards as one (a deployment per shard), beside the one server, in the same
run.

Each arm is its own application on one local Ray (started here unless one runs) behind Serve's HTTP proxy, at
`/ray-N` (`/ray-sharded`); its ingress has as many replicas as each shard, and no replica reserves a CPU, so every
arm fits any machine. Clients reach an arm as they reach one server (`RemoteSearch` on its URL): what differs is only
what answers. Without `searchgym[serve-ray]` the arms are skipped and the report says why.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from searchgym.core.extras import MissingExtra
from searchgym.serve.ray_search import RayServeLayout, deploy, ray_serve, start_serve

RAY_REPLICAS = (1, 2)  # the arms: replicas of the whole index


@contextlib.contextmanager
def ray_arms(
    index: Path, shards: Path, replicas: Sequence[int], starts: dict[str, list[float]], report: dict[str, Any]
) -> Iterator[dict[str, str]]:
    """For the block, one Ray Serve application per count in `replicas` over the whole `index`, and one over the
    `shards` (a deployment per shard, one replica each); yields each arm's URL (`{"ray_N": url, "ray_sharded":
    url}`), records each arm's start-up seconds in `starts` and Ray's own in `report["ray_start_s"]` (or why the arms
    were skipped in `report["ray_skipped"]`)."""
    try:
        serve = ray_serve()
    except MissingExtra as e:
        report["ray_skipped"] = str(e)
        yield {}
        return
    import ray

    started = not ray.is_initialized()
    t0 = time.perf_counter()
    if started:
        ray.init(
            num_cpus=os.cpu_count() or 1,
            include_dashboard=False,
            object_store_memory=256 * 2**20,
            log_to_driver=False,
        )
    try:
        base = start_serve()
        report["ray_start_s"] = round(time.perf_counter() - t0, 2)
        arms = {f"ray_{n}": (index, n) for n in replicas} | {"ray_sharded": (shards, 1)}
        layouts = {}
        for name, (root, n) in arms.items():
            t0 = time.perf_counter()
            layout = RayServeLayout(str(root), replicas=n, ingress_replicas=n, shard_cpus=0, ingress_cpus=0)
            route = "/" + name.replace("_", "-")
            deploy(layout, name=name, route_prefix=route)  # returns once every replica is up
            starts[name] = [time.perf_counter() - t0]
            layouts[name] = base + route
        yield layouts
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        if started:
            ray.shutdown()
