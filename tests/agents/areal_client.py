"""AReaL 1.0.4's own SGLang client code driving `serve model`, run in a child process (AReaL's packages come from
the `.areal-site` folder that .ci/run fills with `pip install --no-deps --target`, so its pins never touch ours).

    python -m tests.agents.areal_client URL WORKDIR HOST PORT

Every request is built by AReaL's `SGLangBackend` (areal/engine/sglang_remote.py), every generation answer parsed
by its `parse_generation_response`, and the weight-update group formed by AReaL's own `init_custom_process_group`
(areal/engine/core/distributed.py) as its FSDP trainer forms it, then fed by `dist.broadcast` per tensor as that
trainer does. WORKDIR holds `pushed.pt` (the state dict to broadcast) and `disk_model/` (a model directory for the
disk update); what the client saw is written to WORKDIR/areal.json for the test to judge.
"""

from __future__ import annotations

import json
import sys
import threading
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from areal.api import ModelRequest, ParamSpec, WeightUpdateMeta
from areal.api.alloc_mode import ModelAllocation
from areal.api.cli_args import GenerationHyperparameters
from areal.engine.core.distributed import init_custom_process_group
from areal.engine.sglang_remote import SGLangBackend

PROMPT = [11, 22, 33, 44, 55, 66]
GROUP = "areal_update_weight_group"
TIMEOUT_S = 120


def send(url: str, request: Any) -> tuple[int, Any]:
    """One AReaL HttpRequest sent as AReaL's client sends it (JSON body; GET without one)."""
    body = None if request.method == "GET" else json.dumps(request.payload).encode()
    http = urllib.request.Request(
        url + request.endpoint, data=body, method=request.method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(http, timeout=TIMEOUT_S) as answer:
            text = answer.read().decode()
            return answer.status, json.loads(text) if text.strip().startswith(("{", "[")) else text
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def generate(backend: SGLangBackend, url: str) -> dict[str, Any]:
    request = ModelRequest(
        input_ids=list(PROMPT), gconfig=GenerationHyperparameters(max_new_tokens=8, greedy=True, n_samples=1)
    )
    status, answer = send(url, backend.build_generation_request(request, with_lora=False, version=0))
    assert status == 200, answer
    parsed = backend.parse_generation_response(answer)
    return {
        "output_tokens": parsed.output_tokens,
        "output_logprobs": parsed.output_logprobs,
        "stop_reason": parsed.stop_reason,
    }


def main(url: str, workdir: Path, host: str, port: int) -> None:
    backend = SGLangBackend()
    seen: dict[str, Any] = {"statuses": {}}

    def call(name: str, request: Any) -> Any:
        status, answer = send(url, request)
        seen["statuses"][name] = status
        return answer

    call("health", backend.get_health_check_request())
    seen["generate_before"] = generate(backend, url)
    call("pause", backend.get_pause_request())
    call("resume", backend.get_resume_request())
    call("offload", backend.get_offload_request())
    call("onload", backend.get_onload_request(tags=["weights", "kv_cache"]))
    seen["generate_after_onload"] = generate(backend, url)

    # the distributed update, as AReaL's trainer runs it: rank 0 of a group the server joins at rank_offset 1
    allocation = ModelAllocation.from_str("sglang:d1", name="rollout")  # one server, tp 1
    meta = WeightUpdateMeta(
        type="xccl", gen_allocation=allocation, nccl_master_address=host, nccl_master_port=port, nccl_group_name=GROUP
    )
    init = backend.build_init_weights_group_request(host, 0, meta)
    seen["init_payload"] = init.payload
    init.payload["backend"] = "gloo"  # AReaL's CPU platform says gloo; a GPU box would say nccl
    joined: dict[str, Any] = {}
    server_join = threading.Thread(target=lambda: joined.update(answer=call("init_group", init)))
    server_join.start()
    group = init_custom_process_group(
        backend="gloo",
        init_method=f"tcp://{host}:{port}",
        world_size=2,
        rank=0,
        group_name=GROUP,
        timeout=timedelta(seconds=TIMEOUT_S),
    )
    server_join.join(TIMEOUT_S)
    seen["init_answer"] = joined.get("answer")
    state = torch.load(workdir / "pushed.pt")
    specs = [ParamSpec(name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in state.items()]
    (update,) = backend.build_distributed_weight_update_requests(meta, specs).requests
    received: dict[str, Any] = {}
    server_receive = threading.Thread(target=lambda: received.update(answer=call("update_distributed", update)))
    server_receive.start()
    for tensor in state.values():
        dist.broadcast(tensor, src=0, group=group)
    server_receive.join(TIMEOUT_S)
    seen["update_answer"] = received.get("answer")
    seen["generate_after_distributed"] = generate(backend, url)

    # the disk update (AReaL's default weight_update_mode)
    (disk,) = backend.build_disk_weight_update_requests(
        WeightUpdateMeta(type="disk", path=str(workdir / "disk_model"))
    ).requests
    seen["disk_answer"] = call("update_disk", disk)
    seen["generate_after_disk"] = generate(backend, url)
    (workdir / "areal.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
