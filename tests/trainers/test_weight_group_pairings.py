"""The weight-update group against SGLang 0.5.23's own code, on gloo, in all four pairings.

- our trainer end -> serve model: test_dist_weight_sync.py (weights equal, log-probs are the pushed model's)
- SGLang's function as trainer -> serve model, with AReaL's request bodies: log-probs are the pushed model's
- our trainer end -> SGLang's own WeightUpdater join and receive: tensors equal
- SGLang -> SGLang: the control, so a failure elsewhere is ours and not the harness's

SGLang's side runs in a child process with the functions read out of the installed wheel (AReaL's trainer
forms its group with the same `init_custom_process_group`). Every wait is bounded: a pairing whose store keys
do not meet fails in seconds (the control at the end shows the layout searchgym used before does exactly that).
"""

from __future__ import annotations

import asyncio
import socket
from datetime import timedelta

import aiohttp
import pytest
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from searchgym.serve.model.dist_weights import close_group, open_group, send
from tests.agents.servers import model_server, post
from tests.agents.sglang_source import require_sglang
from tests.trainers.sglang_weight_peer import Peer, sglang_receiver, sglang_trainer
from tests.trainers.test_dist_weight_sync import assert_serves_logprobs_of

HOST = "127.0.0.1"
JOIN_S = 120  # a child imports torch and reads SGLang's source first: generous, but bounded


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@pytest.fixture
def trained(tiny_model_dir):
    """(original, pushed) models: the pushed one has every weight moved."""
    require_sglang()
    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    pushed = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    torch.manual_seed(5)
    with torch.no_grad():
        for p in pushed.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return original, pushed


def specs(state: dict[str, torch.Tensor]) -> list[tuple[str, str, list[int]]]:
    """(name, dtype, shape) per tensor, as AReaL's ParamSpec sends them: dtype "float32", shape a list."""
    return [(name, str(t.dtype).removeprefix("torch."), list(t.shape)) for name, t in state.items()]


@pytest.mark.asyncio(loop_scope="function")
async def test_sglangs_trainer_to_serve_model(tiny_model_dir, trained, tmp_path):
    """SGLang's init_custom_process_group as rank 0, with AReaL's exact request bodies to serve model."""
    original, pushed = trained
    state = pushed.state_dict()
    torch.save(state, tmp_path / "pushed.pt")
    port, group = free_port(), "areal_weight_update_group"
    async with model_server(tiny_model_dir) as (url, engine), aiohttp.ClientSession() as http:
        trainer = Peer(sglang_trainer, HOST, port, 2, group, str(tmp_path / "pushed.pt"), tmp=tmp_path)
        try:
            # AReaL's SGLangBackend.build_init_weights_group_request (inclusionAI/AReaL 4aef98d8, sglang_remote.py)
            status, answer = await asyncio.wait_for(
                post(
                    http,
                    url,
                    "/init_weights_update_group",
                    {
                        "master_address": HOST,
                        "master_port": str(port),
                        "rank_offset": 1,
                        "world_size": 2,
                        "backend": "gloo",
                        "group_name": group,
                    },
                ),
                JOIN_S,
            )
            assert status == 200 and answer["success"] is True, answer
            # ... build_distributed_weight_update_requests: one bucket, abort_all_requests true
            names, dtypes, shapes = (list(c) for c in zip(*specs(state), strict=True))
            status, answer = await asyncio.wait_for(
                post(
                    http,
                    url,
                    "/update_weights_from_distributed",
                    {
                        "names": names,
                        "dtypes": dtypes,
                        "shapes": shapes,
                        "group_name": group,
                        "abort_all_requests": True,
                    },
                ),
                JOIN_S,
            )
            assert status == 200 and answer["success"] is True, answer
            await asyncio.to_thread(trainer.join, JOIN_S)
        finally:
            trainer.kill()
        served = engine.model.state_dict()
        for name, tensor in state.items():
            assert torch.equal(served[name], tensor), name
        await assert_serves_logprobs_of(http, url, pushed, original)


def test_our_trainer_end_to_sglangs_receiver(trained, tmp_path):
    """open_group + send (what DistributedWeightSync runs as rank 0) -> SGLang's own join and receive."""
    _, pushed = trained
    state = pushed.state_dict()
    port, group_name = free_port(), "searchgym_to_sglang"
    receiver = Peer(sglang_receiver, HOST, port, 1, 2, group_name, specs(state), str(tmp_path / "got.pt"), tmp=tmp_path)
    try:
        group = open_group(HOST, port, 0, 2, group_name, timeout_s=JOIN_S)
        try:
            send(group, list(state.values()))
        finally:
            close_group(group)
        receiver.join(JOIN_S)
    finally:
        receiver.kill()
    got = torch.load(tmp_path / "got.pt")
    assert list(got) == list(state)
    for name, tensor in state.items():
        assert torch.equal(got[name], tensor), name


def test_sglangs_trainer_to_sglangs_receiver(trained, tmp_path):
    """The control: SGLang's function at both ends (so a failure above is ours, not the harness's)."""
    _, pushed = trained
    state = {name: t for name, t in list(pushed.state_dict().items())[:3]}
    torch.save(state, tmp_path / "pushed.pt")
    port, group_name = free_port(), "sglang_to_sglang"
    trainer = Peer(sglang_trainer, HOST, port, 2, group_name, str(tmp_path / "pushed.pt"), tmp=tmp_path)
    receiver = Peer(sglang_receiver, HOST, port, 1, 2, group_name, specs(state), str(tmp_path / "got.pt"), tmp=tmp_path)
    try:
        trainer.join(JOIN_S)
        receiver.join(JOIN_S)
    finally:
        trainer.kill()
        receiver.kill()
    got = torch.load(tmp_path / "got.pt")
    assert all(torch.equal(got[name], tensor) for name, tensor in state.items())


def test_the_old_layout_never_meets_sglang_and_fails_fast(tmp_path):
    """TCPStore -> PrefixStore(name) -> ProcessGroupGloo (searchgym before) waits on keys SGLang never writes."""
    require_sglang()
    port, group_name = free_port(), "old_layout"
    receiver = Peer(
        sglang_receiver, HOST, port, 1, 2, group_name, [("w", "float32", [2])], str(tmp_path / "got.pt"), tmp=tmp_path
    )
    try:
        timeout = timedelta(seconds=5)
        store = dist.TCPStore(HOST, port, 2, is_master=True, timeout=timedelta(seconds=JOIN_S))
        with pytest.raises(dist.DistStoreError, match="timeout"):
            dist.ProcessGroupGloo(dist.PrefixStore(group_name, store), 0, 2, timeout)
    finally:
        receiver.kill()  # SGLang's side would wait 30 minutes
