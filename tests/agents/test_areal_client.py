"""AReaL's own client code against `serve model`: requests built and answers parsed by AReaL 1.0.4's SGLangBackend,
the weight-update group formed by AReaL's init_custom_process_group (tests/agents/areal_client.py, a child process
with AReaL's packages from `.areal-site`, which .ci/run installs without their pins)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.agents.servers import model_server, teacher_forced

ROOT = Path(__file__).resolve().parents[2]
AREAL_SITE = Path(os.environ.get("SEARCHGYM_AREAL_SITE", ROOT / ".areal-site"))
PROMPT = [11, 22, 33, 44, 55, 66]  # the client's own (areal_client.PROMPT)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def moved(model_dir: Path, seed: int) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


@pytest.mark.asyncio(loop_scope="function")
async def test_areals_client_generates_updates_weights_both_ways_and_offloads(tiny_model_dir, tmp_path):
    if not (AREAL_SITE / "areal").is_dir():
        pytest.skip(f"AReaL's client is not installed in {AREAL_SITE} (.ci/run installs it)")
    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    pushed, on_disk = moved(tiny_model_dir, 1), moved(tiny_model_dir, 2)
    torch.save(pushed.state_dict(), tmp_path / "pushed.pt")
    on_disk.save_pretrained(tmp_path / "disk_model")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (Path(tiny_model_dir) / name).exists():
            (tmp_path / "disk_model" / name).write_bytes((Path(tiny_model_dir) / name).read_bytes())
    async with model_server(tiny_model_dir) as (url, engine):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(AREAL_SITE)])}
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.agents.areal_client",
            url,
            str(tmp_path),
            "127.0.0.1",
            str(free_port()),
            env=env,
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            output, _ = await asyncio.wait_for(child.communicate(), 240)
        finally:
            if child.returncode is None:
                child.kill()
                await child.wait()
        assert child.returncode == 0, output.decode()[-3000:]
        seen = json.loads((tmp_path / "areal.json").read_text())
        served = engine.model.state_dict()
    # every route AReaL called answered 200
    assert seen["statuses"] == dict.fromkeys(
        ["health", "pause", "resume", "offload", "onload", "init_group", "update_distributed", "update_disk"], 200
    )
    # AReaL's own payload for the group (string port, rank_offset 1, world size 2) was accepted and joined
    assert isinstance(seen["init_payload"]["master_port"], str) and seen["init_payload"]["rank_offset"] == 1
    assert seen["init_payload"]["world_size"] == 2 and seen["init_answer"]["success"] is True
    assert seen["update_answer"]["success"] is True and seen["disk_answer"]["success"] is True
    # AReaL's parser read each generation: greedy tokens with the model's own log-probs at each stage
    for key, model in (
        ("generate_before", original),
        ("generate_after_onload", original),
        ("generate_after_distributed", pushed),
        ("generate_after_disk", on_disk),
    ):
        got = seen[key]
        assert got["stop_reason"] == "length" and len(got["output_tokens"]) == 8, (key, got)
        assert got["output_logprobs"] == pytest.approx(teacher_forced(model, PROMPT, got["output_tokens"]), abs=1e-4), (
            key
        )
    assert seen["generate_after_onload"] == seen["generate_before"]  # offload and onload lose nothing
    for name, tensor in on_disk.state_dict().items():
        assert torch.equal(served[name], tensor), name
