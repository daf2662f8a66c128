"""SGLang 0.5.23 routes RL clients call around rollouts: memory release and resume, and `/v1/loads`.

- `GET|POST /release_memory_occupation` {`tags`} and `/resume_memory_occupation` {`tags`} (verl's
  `free_cache_engine`, AReaL's offload and onload). As SGLang: the body is optional, `tags` null or empty
  means every memory type, the answer is 200 with a JSON `null` body, and a failure is a 400
  `{"error": {"message"}}` (release needs an idle server; resume refuses a tag that is not released). What
  each tag frees on the TorchEngine is in `memory.py`; requests that arrive meanwhile wait.
- `GET /v1/loads` (slime's abort loop polls it until the server is idle): SGLang's envelope
  `{timestamp, version, accelerator, num_accelerators, loads: [per-rank load]}` with one rank. Its
  `num_running_reqs` counts requests the server has admitted (holding a slot: queued in or running on the
  engine) and `num_waiting_reqs` those held at the pause or memory gate or waiting for a slot; both are 0
  exactly when nothing is in flight. Query `include` (core, memory, spec, lora, disagg, queues, all),
  `dp_rank` (another rank: no loads) and `format=prometheus` as SGLang's.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import torch
from aiohttp import web

from searchgym.agents.engines.fields import show
from searchgym.serve.model.core import ServedModel
from searchgym.serve.model.wire import json_response

SGLANG_VERSION = "0.5.23"  # the SGLang whose API this server speaks
LOAD_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})


class ControlAPI:
    """Memory occupation and load routes over one served model."""

    def __init__(self, model: ServedModel) -> None:
        self.model = model

    async def _tags(self, request: web.Request) -> Any:
        """The optional body's `tags` (a GET, or a POST without a body, means all)."""
        return (await self.model.json_body(request, empty_ok=True))[0].get("tags")

    async def release(self, request: web.Request) -> web.Response:
        """POST|GET /release_memory_occupation {tags}."""
        await self.model.release_memory(await self._tags(request))
        return json_response(None)

    async def resume(self, request: web.Request) -> web.Response:
        """POST|GET /resume_memory_occupation {tags}."""
        await self.model.resume_memory(await self._tags(request))
        return json_response(None)

    async def loads(self, request: web.Request) -> web.Response:
        """GET /v1/loads?include=&dp_rank=&format=: this server's one rank, in SGLang's shape."""
        query = request.query
        include = {s.strip() for s in query["include"].split(",")} if query.get("include") else None
        if include is not None and not include <= LOAD_SECTIONS:
            return json_response(
                {
                    "detail": f"Invalid include sections: {sorted(include - LOAD_SECTIONS)}. "
                    f"Valid options: {sorted(LOAD_SECTIONS)}"
                },
                status=400,
            )
        raw_rank, dp_rank = query.get("dp_rank"), None
        if raw_rank is not None:
            try:
                dp_rank = int(raw_rank)
            except ValueError:
                return json_response({"detail": f"dp_rank must be an integer, got {show(raw_rank)}"}, status=422)
        loads = [self.load(include)] if dp_rank in (None, 0) else []
        if query.get("format") == "prometheus":
            return web.Response(
                body=prometheus(loads).encode(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
            )
        return json_response(
            {
                "timestamp": datetime.now(UTC).isoformat(),
                "version": SGLANG_VERSION,
                "accelerator": accelerator_name(self.model.engine.device),
                "num_accelerators": 1,
                "loads": loads,
            }
        )

    def load(self, include: set[str] | None) -> dict[str, Any]:
        """One rank's load: SGLang's core keys (0 for what a dense-batch engine does not have), then sections."""
        model = self.model
        stats = model.engine.stats()
        paused = not model.resumed.is_set() or not model.memory.resumed.is_set()
        prefilled = stats["prefill_tokens"] + stats["reused_tokens"]
        load: dict[str, Any] = {
            "timestamp": time.time(),
            "dp_rank": 0,
            "num_running_reqs": model.running,
            "num_waiting_reqs": model.waiting,
            "num_waiting_uncached_tokens": 0,
            "num_used_tokens": 0,
            "num_total_tokens": 0,
            "num_active_tokens": 0,
            "num_prealloc_ready_tokens": 0,
            "max_total_num_tokens": model.context_length * model.engine.max_batch_size,
            "max_running_requests": model.max_running_requests,
            "token_usage": 0.0,
            "gen_throughput": 0.0,
            "cache_hit_rate": stats["reused_tokens"] / prefilled if prefilled else 0.0,
            "utilization": model.running / model.max_running_requests,
            "total_prefill_uncached_tokens": stats["prefill_tokens"],
            "total_prefill_busy_us": 0,
            "decode_moments": None,
        }
        if include is None or "all" in include or "queues" in include:
            load["queues"] = {
                "waiting": model.waiting,
                "grammar": 0,
                "paused": model.waiting if paused else 0,
                "retracted": model.running if model.pause_mode == "retract" else 0,
                "prealloc_ready": 0,
            }
        return load

    def add_routes(self, app: web.Application) -> None:
        """Register the memory and load routes."""
        for method in ("GET", "POST"):
            app.router.add_route(method, "/release_memory_occupation", self.release)
            app.router.add_route(method, "/resume_memory_occupation", self.resume)
        app.router.add_get("/v1/loads", self.loads)


def accelerator_name(device: torch.device) -> str | None:
    """The accelerator's marketing name ("NVIDIA H100 80GB HBM3"), as SGLang reports it; None on a CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return None if device.type == "cpu" else str(device)


def prometheus(loads: list[dict[str, Any]]) -> str:
    """SGLang's Prometheus text form of the loads: one gauge per numeric field, labelled by dp_rank."""
    samples: dict[str, list[tuple[int, float]]] = {}
    for load in loads:
        rank = load["dp_rank"]
        for key, value in load.items():
            if key == "dp_rank":
                continue
            if isinstance(value, dict):
                for sub, v in value.items():
                    if isinstance(v, (int, float)):
                        samples.setdefault(f"sglang_{key}_{sub}", []).append((rank, v))
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                samples.setdefault(f"sglang_{key}", []).append((rank, value))
    lines = []
    for name, values in samples.items():
        lines.append(f"# TYPE {name} gauge")
        lines += [f'{name}{{dp_rank="{rank}"}} {value}' for rank, value in values]
    return "\n".join(lines) + "\n"
