"""The trainer's end of SGLang's distributed weight update: rank 0 of a group with the inference servers.

    sync = DistributedWeightSync(["127.0.0.1:30000", ...], master_port=...)
    await sync.init(http)                       POST /init_weights_update_group to each server (rank 1, 2, ...)
    await sync.push(http, model, version)       per bucket: POST /update_weights_from_distributed to each server
                                                while broadcasting the bucket's tensors from rank 0

The group is formed as SGLang's and AReaL's `init_custom_process_group` forms it (dist_weights.py), so the
servers can be SGLang's own. Each server answers once its bucket has arrived and is loaded; generations in
flight continue, their later tokens carrying the new version. Disk sync (`weight_sync.py`) stays the fallback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import aiohttp
import torch

from searchgym.serve.model.dist_weights import close_group, open_group, send


def buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive (name, tensor) lists of at most `bucket_bytes` each (a larger tensor goes alone)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


class DistributedWeightSync:
    """Rank 0 of a weight-update group whose other members are `serve model` or SGLang servers."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        master_port: int,
        master_address: str = "127.0.0.1",
        group_name: str = "searchgym_weights",
        backend: str = "gloo",
        bucket_bytes: int = 256 << 20,
    ):
        if not addresses:
            raise ValueError("DistributedWeightSync needs at least one server address (host:port)")
        self.addresses, self.master_address, self.master_port = list(addresses), master_address, master_port
        self.group_name, self.backend, self.bucket_bytes = group_name, backend, bucket_bytes
        self.group: Any = None

    async def init(self, http: aiohttp.ClientSession) -> None:
        """Form the group: every server joins (rank 1, 2, ...) while this process hosts it as rank 0."""
        world = len(self.addresses) + 1
        posts = [
            self._post(
                http,
                address,
                "/init_weights_update_group",
                {
                    "master_address": self.master_address,
                    "master_port": self.master_port,
                    "rank_offset": rank,
                    "world_size": world,
                    "group_name": self.group_name,
                    "backend": self.backend,
                },
            )
            for rank, address in enumerate(self.addresses, start=1)
        ]
        hosting = asyncio.to_thread(
            open_group, self.master_address, self.master_port, 0, world, self.group_name, self.backend
        )
        self.group, *_ = await asyncio.gather(hosting, *posts)

    async def push(self, http: aiohttp.ClientSession, model: torch.nn.Module, version: int | str) -> None:
        """Broadcast the model's weights bucket by bucket; every server then serves `version`."""
        if self.group is None:
            raise RuntimeError("call init() before push()")
        named = list(model.state_dict().items())
        parts = list(buckets(named, self.bucket_bytes))
        # as AReaL: generation pauses in place (requests keep their state) so that no token is sampled from a
        # half-updated model, then the buckets are broadcast, then generation continues on the new weights
        # (pause -> update -> continue: AReaL's FSDPEngine._update_weights_from_distributed,
        # areal/engine/fsdp_engine.py at inclusionAI/AReaL 4aef98d8d818af55b43621aaadba047ae10f4e77)
        await asyncio.gather(*(self._post(http, a, "/pause_generation", {"mode": "in_place"}) for a in self.addresses))
        try:
            await self._send_buckets(http, parts, version)
        finally:
            await asyncio.gather(*(self._post(http, a, "/continue_generation", {}) for a in self.addresses))

    async def _send_buckets(
        self, http: aiohttp.ClientSession, parts: list[list[tuple[str, torch.Tensor]]], version: int | str
    ) -> None:
        for i, bucket in enumerate(parts):
            body = {
                "names": [n for n, _ in bucket],
                "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
                "shapes": [list(t.shape) for _, t in bucket],
                "group_name": self.group_name,
                "flush_cache": i == len(parts) - 1,
                "abort_all_requests": False,
                "weight_version": str(version) if i == len(parts) - 1 else None,
            }
            tensors = [t.to("cuda") if self.backend == "nccl" else t for _, t in bucket]  # NCCL sends from a GPU
            await asyncio.gather(
                asyncio.to_thread(send, self.group, tensors),
                *(self._post(http, a, "/update_weights_from_distributed", body) for a in self.addresses),
            )

    def close(self) -> None:
        """Leave the group (this process may form one of the same name again)."""
        if self.group is not None:
            close_group(self.group)
            self.group = None

    async def _post(self, http: aiohttp.ClientSession, address: str, path: str, body: dict) -> dict:
        """POST to one server; a refusal raises with the server's message."""
        url = address if address.startswith("http") else f"http://{address}"
        async with http.post(url + path, json=body) as response:
            answer = await response.json(content_type=None)
        if response.status != 200 or answer.get("success", answer.get("status") == "ok") is not True:
            raise RuntimeError(f"{address}{path} failed ({response.status}): {answer.get('message', answer)}")
        return answer
