"""Memory occupation of the served model: SGLang's `/release_memory_occupation` and `/resume_memory_occupation`.

Colocated RL (verl's `free_cache_engine`, AReaL's offload) asks the inference server to give its GPU memory
to the trainer between rollouts, then to take it back. SGLang's tags name what to release: `kv_cache`,
`weights`, `cuda_graph` (no tags: all three). On the TorchEngine:

- `kv_cache`: the prefix cache (finished sequences' keys and values) is emptied; with the server idle there
  is no running batch, so nothing else holds keys and values. On a GPU the allocator's cache is returned.
- `weights`: on a GPU the weights move to host memory and come back on resume (their values unchanged); on
  a CPU there is no cheaper place for them, so nothing moves.
- `cuda_graph`: the engine captures none; accepted and recorded.

While `kv_cache` or `weights` is released, new requests wait at this gate (SGLang gives no answer there; a
request run on released memory would compute garbage), and go on once both are resumed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import torch

from searchgym.agents.engines.fields import require, show
from searchgym.agents.engines.torch_engine import TorchEngine

TAGS = ("kv_cache", "weights", "cuda_graph")  # SGLang's GPU memory types, in its order
GATING = frozenset({"kv_cache", "weights"})  # generation needs these


def memory_tags(value: Any) -> list[str]:
    """A request's `tags`: null or empty means all of TAGS; else a list of known tag names."""
    if value is None or value == []:
        return list(TAGS)
    require(
        isinstance(value, list) and all(isinstance(t, str) for t in value),
        f"tags must be null or a list of strings, got {show(value)}",
    )
    unknown = [t for t in value if t not in TAGS]
    require(not unknown, f"tags: unknown memory type(s) {unknown}; SGLang's are {list(TAGS)}")
    return list(dict.fromkeys(value))


class MemoryOccupation:
    """Which memory of one TorchEngine is released, the gate generation waits at, and the moves themselves."""

    def __init__(self, engine: TorchEngine) -> None:
        self.engine = engine
        self.released: set[str] = set()
        self.resumed = asyncio.Event()
        self.resumed.set()
        self._moving = asyncio.Lock()  # one release or resume at a time: weights move in a thread

    def released_tags(self) -> list[str]:
        """The released tags, in SGLang's order."""
        return [t for t in TAGS if t in self.released]

    async def release(self, tags: list[str] | None) -> None:
        """Release `tags` (all when None); the caller has checked that nothing is running."""
        async with self._moving:
            await self._release(memory_tags(tags))

    async def _release(self, tags: list[str]) -> None:
        if GATING & set(tags):
            self.resumed.clear()
        new = [t for t in tags if t not in self.released]
        self.released.update(tags)
        if "kv_cache" in new:
            self.engine.prefix_cache.discard()
        if "weights" in new and self._on_accelerator():
            await asyncio.to_thread(self.engine.model.to, "cpu")
        if new and self._on_accelerator():
            await asyncio.to_thread(_empty_device_cache, self.engine.device)

    async def resume(self, tags: list[str] | None) -> None:
        """Take back `tags` (all when None); each must be released (as SGLang, which refuses others)."""
        async with self._moving:
            await self._resume(tags)

    async def _resume(self, tags: list[str] | None) -> None:
        tags = self.released_tags() if tags is None or tags == [] else memory_tags(tags)  # null: what is released
        missing = [t for t in tags if t not in self.released]
        require(not missing, f"tags: {missing} not released (released: {self.released_tags()})")
        if "weights" in tags and self._on_accelerator():
            await asyncio.to_thread(self.engine.model.to, self.engine.device)
        self.released.difference_update(tags)
        if not GATING & self.released:
            self.resumed.set()

    def _on_accelerator(self) -> bool:
        return self.engine.device.type != "cpu"


def _empty_device_cache(device: torch.device) -> None:
    """Return the allocator's unused blocks to the device, so the trainer can have them."""
    module = getattr(torch, device.type, None)
    if module is not None and hasattr(module, "empty_cache"):
        module.synchronize()
        module.empty_cache()
