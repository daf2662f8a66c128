"""How new weights reach the inference engines after a learner step: one class per route, one interface.

    await sync.push(model, version)

- `InProcessSync`: engines in the learner's process (TorchEngine) load the state dict directly.
- `DiskSync`: the weights are saved as a Hugging Face model dir, `root/version-00012`, written
  atomically, and each engine loads it with `update_weights(path, version)`: SGLang's
  /update_weights_from_disk (the servers must see `root`: same machine or shared storage). Only
  the last `keep` versions stay on disk.
- `ObjectStoreSync`: Ray rollout actors holding TorchEngines on other processes or nodes. The CPU
  state dict is put in Ray's object store once; every actor's `update_weights(weights, version)`
  reads it from there (shared memory on the same node, one transfer per other node).
- `DistributedSync`: SGLang (or `serve model`) servers join a torch.distributed group with the learner
  and receive the weights broadcast in buckets (dist_sync.py, SGLang's protocol); then each engine
  that routes to them reads the new version back (`update_weights(None, version)`).

Every route returns once all engines serve `version`; generations in flight continue on the new
weights and their later tokens carry the new version.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from searchgym.trainers.run.checkpoint import prune, write_model_dir

KEEP_WEIGHT_DIRS = 2


class WeightSync(Protocol):
    """Sends the learner's current weights, labelled `version`, to every engine."""

    async def push(self, model: torch.nn.Module, version: int) -> None: ...


class UpdatableEngine(Protocol):
    """Anything with the engines' `update_weights(source, version)`: an engine, or a remote actor's proxy."""

    async def update_weights(self, source: Any, version: int) -> None: ...


class InProcessSync:
    """Engines in this process load the state dict in place (no copy beyond the engine's own)."""

    def __init__(self, engines: Sequence[UpdatableEngine]):
        self.engines = list(engines)

    async def push(self, model: torch.nn.Module, version: int) -> None:
        state = model.state_dict()
        await asyncio.gather(*(engine.update_weights(state, version) for engine in self.engines))


def weights_dir(root: str | os.PathLike, version: int) -> Path:
    """Where DiskSync writes `version`: root/version-00012."""
    return Path(root) / f"version-{version:05d}"


def save_weights(
    model: torch.nn.Module, tokenizer: Any, root: str | os.PathLike, version: int, keep: int = KEEP_WEIGHT_DIRS
) -> Path:
    """Write `version` as a model dir (model + tokenizer) atomically, then delete all but the last `keep` versions."""
    path = write_model_dir(weights_dir(root, version), model=model, tokenizer=tokenizer)
    prune(Path(root), "version-*", keep)
    return path


def local_weight_sync(route: str, engine: Any, tokenizer: Any, out: str | os.PathLike) -> WeightSync:
    """The local launcher's route (its deployment's `weight_route`) from the learner to its one engine: "disk" to
    SGLang servers through a model dir under out/weights, else in place into the TorchEngine."""
    if route == "disk":
        return DiskSync([engine], Path(out) / "weights", tokenizer)
    return InProcessSync([engine])


class DiskSync:
    """Save a Hugging Face checkpoint, then have every engine load it from disk (the SGLang route)."""

    def __init__(
        self, engines: Sequence[UpdatableEngine], root: str | os.PathLike, tokenizer: Any, keep: int = KEEP_WEIGHT_DIRS
    ):
        if keep < 1:
            raise ValueError("keep must be at least 1: the engines load the newest directory")
        self.engines, self.root, self.tokenizer, self.keep = list(engines), Path(root), tokenizer, keep

    async def push(self, model: torch.nn.Module, version: int) -> None:
        # Older dirs are pruned only here, after the previous push returned: no engine still reads them.
        path = await asyncio.to_thread(save_weights, model, self.tokenizer, self.root, version, self.keep)
        await asyncio.gather(*(engine.update_weights(os.fspath(path), version) for engine in self.engines))


def cpu_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights as detached CPU tensors (what crosses process boundaries)."""
    return {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}


class ObjectStoreSync:
    """`ray.put` the CPU state dict once; each Ray actor's `update_weights` receives it from the object store."""

    def __init__(self, actors: Sequence[Any]):
        self.actors = list(actors)

    async def push(self, model: torch.nn.Module, version: int) -> None:
        import ray

        weights = ray.put(cpu_state_dict(model))  # one copy in the store, however many actors read it
        try:
            await asyncio.gather(*(actor.update_weights.remote(weights, version) for actor in self.actors))
        finally:
            del weights  # the store frees it once no actor holds it


class DistributedSync:
    """Broadcast the weights to inference servers over a torch.distributed group; the engines then see `version`."""

    def __init__(
        self,
        servers: Sequence[str],
        engines: Sequence[UpdatableEngine],
        *,
        master_address: str,
        master_port: int,
        backend: str = "gloo",
        bucket_bytes: int = 256 << 20,
    ):
        from searchgym.trainers.rollout.dist_sync import DistributedWeightSync

        self.broadcast = DistributedWeightSync(
            servers, master_port=master_port, master_address=master_address, backend=backend, bucket_bytes=bucket_bytes
        )
        self.engines = list(engines)
        self._http: Any = None

    async def init(self) -> None:
        """Form the weight-update group with every server (they join over HTTP while this process hosts it)."""
        import aiohttp

        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        await self.broadcast.init(self._http)

    async def push(self, model: torch.nn.Module, version: int) -> None:
        if self._http is None:
            raise RuntimeError("call init() before push()")
        await self.broadcast.push(self._http, model, version)
        await asyncio.gather(*(engine.update_weights(None, version) for engine in self.engines))

    async def close(self) -> None:
        """Leave the weight-update group and close the HTTP session."""
        self.broadcast.close()
        if self._http is not None:
            await self._http.close()
            self._http = None


class RemoteEngine:
    """A Ray actor's `update_weights` seen as an engine's, so DiskSync can drive rollout actors too."""

    def __init__(self, actor: Any):
        self.actor = actor

    async def update_weights(self, source: Any, version: int) -> None:
        await self.actor.update_weights.remote(source, version)
