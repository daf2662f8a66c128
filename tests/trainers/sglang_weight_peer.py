"""The other end of a weight-update group in a child process: SGLang 0.5.23's own code, or our trainer.

- `sglang_trainer`: rank 0 formed by SGLang's `init_custom_process_group` (AReaL's trainer forms its group
  with the same function), broadcasting each tensor with `torch.distributed.broadcast(src=0, group=...)` as
  AReaL's trainer does.
- `sglang_receiver`: a server rank as SGLang's scheduler runs it: a default process group of its own first
  (its tensor-parallel world of one), then `WeightUpdater.init_weights_update_group` and
  `WeightUpdater.receive_weights_from_distributed` from the wheel, bound to a stand-in `self`.

- `searchgym_trainer`: our `DistributedWeightSync` driving a `serve model` over HTTP (a process holds one
  group per name, so the trainer end cannot share the test's process with the server's).

The SGLang definitions are read out of the installed wheel (tests/agents/sglang_source.py). A group needs two
processes, and SGLang's calls wait up to 30 minutes: `Peer` runs each in a spawned child, writes its error
to a file, and kills it when a bound passes, so a broken pairing fails fast instead of hanging.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import multiprocessing as mp
import os
import socket
import sys
import traceback
import typing
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from tests.agents.sglang_source import load

UPDATER = "srt/model_executor/model_runner_components/weight_updater.py"


def sglang_functions() -> dict[str, Any]:
    """SGLang's init_custom_process_group, NetworkAddress and the WeightUpdater methods that join and receive."""
    from packaging import version as pkg_version

    module = sys.modules.setdefault("sglang_from_wheel", ModuleType("sglang_from_wheel"))  # dataclass looks it up
    namespace = module.__dict__
    namespace.update(
        {
            "torch": torch,
            "pkg_version": pkg_version,
            "logging": logging,
            "logger": logging.getLogger("sglang_from_wheel"),
            "ipaddress": ipaddress,
            "socket": socket,
            "dataclass": dataclasses.dataclass,
            **{name: getattr(typing, name) for name in typing.__all__},
        }
    )
    load("srt/utils/common.py", ["torch_release", "init_custom_process_group"], namespace)
    load("srt/utils/network.py", ["_is_ipv6", "_wrap", "NetworkAddress"], namespace)
    return load(
        UPDATER,
        ["WeightUpdater.init_weights_update_group", "WeightUpdater.receive_weights_from_distributed"],
        namespace,
    )


def sglang_trainer(host: str, port: int, world_size: int, group_name: str, tensors_path: str) -> None:
    """Rank 0 by SGLang's function (as AReaL's trainer calls it), then broadcast the saved tensors in order."""
    sglang = sglang_functions()
    group = sglang["init_custom_process_group"](
        backend="gloo",
        init_method=f"tcp://{host}:{port}",
        world_size=world_size,
        rank=0,
        group_name=group_name,
        timeout=timedelta(seconds=120),
    )
    for tensor in torch.load(tensors_path).values():
        dist.broadcast(tensor.contiguous(), src=0, group=group)


def sglang_receiver(
    host: str,
    port: int,
    rank_offset: int,
    world_size: int,
    group_name: str,
    specs: list[tuple[str, str, list[int]]],
    out_path: str,
) -> None:
    """A server rank by SGLang's own WeightUpdater methods; saves what it received to `out_path`."""
    sglang = sglang_functions()
    # SGLang's scheduler has its default group (its TP world) before any weight-update group, and asserts it
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    updater = SimpleNamespace(tp_rank=0, device="cpu", _model_update_group={})
    ok, message = sglang["init_weights_update_group"](
        updater, host, port, rank_offset, world_size, group_name, backend="gloo"
    )
    if not ok:
        raise RuntimeError(message)
    names, dtypes, shapes = (list(column) for column in zip(*specs, strict=True))
    received = sglang["receive_weights_from_distributed"](
        updater, names=names, dtypes=dtypes, shapes=shapes, group_name=group_name
    )
    torch.save(dict(received), out_path)


def _run(target: Callable[..., None], args: tuple, error_path: str) -> None:
    try:
        target(*args)
    except BaseException:
        Path(error_path).write_text(traceback.format_exc())
        os._exit(1)
    # the work is done and saved; a normal interpreter exit can abort in gloo's threads once the peer has left
    # ("terminate called without an active exception", exit -6, seen once in a clean-clone CI run), so leave at once
    os._exit(0)


class Peer:
    """One child process running `target(*args)`; `join` bounds the wait and reports the child's error."""

    def __init__(self, target: Callable[..., None], *args: Any, tmp: Path):
        self.error_path = tmp / f"{target.__name__}-{id(self)}.err"
        self.process = mp.get_context("spawn").Process(
            target=_run, args=(target, args, str(self.error_path)), daemon=True
        )
        self.process.start()

    def join(self, timeout_s: float) -> None:
        """Wait for the child; fail naming its error, or kill it and fail when `timeout_s` passes."""
        self.process.join(timeout_s)
        if self.process.is_alive():
            self.kill()
            raise AssertionError(f"the SGLang-side process did not finish within {timeout_s}s")
        if self.process.exitcode != 0:
            error = self.error_path.read_text() if self.error_path.exists() else "(no traceback)"
            raise AssertionError(f"the SGLang-side process failed (exit {self.process.exitcode}):\n{error}")

    def kill(self) -> None:
        """End the child now (a pairing that cannot form leaves SGLang waiting for 30 minutes)."""
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)


def searchgym_trainer(url: str, master_port: int, model_dir: str, version: str, bucket_bytes: int) -> None:
    """Our trainer end (DistributedWeightSync) in its own process, pushing the model saved at `model_dir`."""
    import asyncio

    import aiohttp
    from transformers import AutoModelForCausalLM

    from searchgym.trainers.rollout.dist_sync import DistributedWeightSync

    async def push() -> None:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        sync = DistributedWeightSync([url], master_port=master_port, backend="gloo", bucket_bytes=bucket_bytes)
        async with aiohttp.ClientSession() as http:
            await sync.init(http)
            await sync.push(http, model, version)
        sync.close()

    asyncio.run(push())
