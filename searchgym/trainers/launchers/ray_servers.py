"""The Ray launcher's server actor: one SGLang server (or our CPU stand-in) per actor, on the GPUs Ray gave it.

Kept apart from ray_actors.py so that the actor process imports no torch: the server is its own
process, and this actor only launches it, waits until it is ready and stops it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import sys
from pathlib import Path
from typing import Any

from searchgym.core.ports import free_port
from searchgym.trainers.config import RayConfig

STAND_IN_MODULE = "searchgym.serve.model"  # `python -m` module of our model server (sglang_server: searchgym)


class SGLangServerWorker:
    """Runs one SGLang server (or our CPU stand-in, `sglang_server: searchgym`) on this actor's GPUs."""

    def __init__(self, settings: RayConfig, model_dir: str, index: int, log_dir: str, env: dict[str, str]):
        os.environ.update(env)
        self.settings, self.model_dir, self.index, self.log_dir = settings, model_dir, index, Path(log_dir)
        self.server: Any = None  # an SGLangServer once started (imported on the actor)

    def start(self) -> str:
        """Launch the server on this node (CUDA_VISIBLE_DEVICES as Ray set it), wait until ready; its host:port."""
        import ray

        from searchgym.agents.engines.sglang_engine import SGLangServer, sglang_launch_command

        settings = self.settings
        host, host_for_clients = server_hosts(settings, ray.util.get_node_ip_address())
        port = free_port(host)
        if settings.sglang_server == "searchgym":
            command = [
                sys.executable,
                "-m",
                STAND_IN_MODULE,
                "--model-path",
                self.model_dir,
                "--host",
                host,
                "--port",
                str(port),
                *settings.sglang_args,
            ]
        else:
            command = sglang_launch_command(
                self.model_dir,
                host=host,
                port=port,
                tp_size=max(1, settings.sglang_gpus_per_server),
                mem_fraction_static=settings.sglang_mem_fraction_static,
                extra_args=settings.sglang_args,
            )
        address = f"{host_for_clients}:{port}"
        self.server = SGLangServer(command, address, log_path=self.log_dir / f"server-{self.index}.log")
        self.server.start()
        asyncio.run(self.server.wait_ready(settings.sglang_start_timeout_s))
        return address

    def stop(self) -> int | None:
        """Stop the server process (SIGTERM, then SIGKILL); its exit code."""
        return self.server.stop() if self.server is not None else None


def server_hosts(settings: RayConfig, node_ip: str) -> tuple[str, str]:
    """(the address a launched server binds, the one its clients dial): ray.local_host on a local cluster (loopback
    by default: nothing off this machine reaches the server), the node's IP on a joined one (ray.address)."""
    if settings.address:
        return node_ip, node_ip
    bind = settings.local_host
    return bind, node_ip if ipaddress.ip_address(bind).is_unspecified else bind
