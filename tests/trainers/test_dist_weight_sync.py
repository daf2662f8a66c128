"""SGLang's distributed weight update against a real `serve model` on loopback (gloo on CPU): after the broadcast
the server's weights equal the trainer's bit for bit, its log-probs are the pushed model's, it serves the new
version, and a request in flight finishes. Pairings with SGLang's own code: test_weight_group_pairings.py."""

import asyncio
import json
import socket

import aiohttp
import pytest
import pytest_asyncio
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from searchgym.trainers.rollout.dist_sync import buckets
from tests.agents.servers import PROMPT, model_server, post, teacher_forced
from tests.servers import JSON_VALUES
from tests.trainers.sglang_weight_peer import Peer, searchgym_trainer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_buckets_keep_order_and_respect_the_size():
    tensors = [(f"w{i}", torch.zeros(n)) for i, n in enumerate([3, 3, 10, 1])]  # 12, 12, 40, 4 bytes
    got = [[name for name, _ in b] for b in buckets(tensors, 24)]
    assert got == [["w0", "w1"], ["w2"], ["w3"]]


async def assert_serves_logprobs_of(http, url, pushed, original):
    """The server's log-probs for a sampled continuation are the pushed model's (and not the original's)."""
    status, out = await post(
        http,
        url,
        "/generate",
        {
            "input_ids": PROMPT,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": 8, "temperature": 1.0, "ignore_eos": True, "sampling_seed": 3},
        },
    )
    assert status == 200, out
    served = [row[0] for row in out["meta_info"]["output_token_logprobs"]]
    expected = teacher_forced(pushed, PROMPT, out["output_ids"])
    assert served == pytest.approx(expected, abs=1e-4)
    assert served != pytest.approx(teacher_forced(original, PROMPT, out["output_ids"]), abs=1e-3)


@pytest.mark.asyncio(loop_scope="function")
async def test_distributed_update_reaches_serve_model_bit_for_bit(tiny_model_dir, tmp_path):
    """Our trainer end (in its own process, as in a run) -> serve model: weights equal, log-probs the pushed model's."""
    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    trained = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():  # "the learner's step": every weight changes
        for p in trained.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    trained.save_pretrained(tmp_path / "trained")
    async with model_server(tiny_model_dir) as (url, engine), aiohttp.ClientSession() as http:
        assert not torch.equal(engine.model.state_dict()["lm_head.weight"], trained.state_dict()["lm_head.weight"])
        # a long generation in flight across the update
        long = asyncio.create_task(
            post(
                http,
                url,
                "/generate",
                {
                    "input_ids": PROMPT,
                    "sampling_params": {"max_new_tokens": 60, "temperature": 0.0, "ignore_eos": True},
                },
            )
        )
        await asyncio.sleep(0.2)
        bucket_bytes = 64 << 10
        assert len(list(buckets(trained.state_dict().items(), bucket_bytes))) > 1  # several buckets
        trainer = Peer(searchgym_trainer, url, free_port(), str(tmp_path / "trained"), "7", bucket_bytes, tmp=tmp_path)
        try:
            await asyncio.to_thread(trainer.join, 180)
        finally:
            trainer.kill()

        served = engine.model.state_dict()
        for name, tensor in trained.state_dict().items():
            assert torch.equal(served[name], tensor), name
        status, info = await post(
            http, url, "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}}
        )
        assert status == 200 and info["meta_info"]["weight_version"] == "7"
        status, body = await long
        assert status == 200 and len(body["output_ids"]) == 60
        await assert_serves_logprobs_of(http, url, trained, original)

        # a bucket for a group the server never joined is refused (before any broadcast), a clear 400
        status, answer = await post(
            http,
            url,
            "/update_weights_from_distributed",
            {"names": ["x"], "dtypes": ["float32"], "shapes": [[2]], "group_name": "no-such-group"},
        )
        assert status == 400 and "no weight-update group" in str(answer)


_JSON = JSON_VALUES
# valid-looking bodies that can never form a group (world_size 1, no group joined), and the fields junk replaces
_BASES = {
    "/init_weights_update_group": (
        {
            "master_address": "127.0.0.1",
            "master_port": 1,
            "rank_offset": 1,
            "world_size": 1,
            "group_name": "g",
            "backend": "gloo",
        },
        ["master_address", "master_port", "rank_offset", "group_name", "backend"],
    ),
    "/update_weights_from_distributed": (
        {"names": ["lm_head.weight"], "dtypes": ["float32"], "shapes": [[2]], "group_name": "g"},
        ["names", "dtypes", "shapes", "group_name", "flush_cache", "abort_all_requests", "weight_version"],
    ),
}


@st.composite
def junk_requests(draw):
    """(path, body): junk JSON, or a body that cannot form a group with one to three fields replaced by junk."""
    path = draw(st.sampled_from(sorted(_BASES)))
    if draw(st.booleans()):
        return path, draw(_JSON)
    base, keys = _BASES[path]
    body = dict(base)
    for _ in range(draw(st.integers(1, 3))):
        body[draw(st.sampled_from(keys))] = draw(_JSON)
    return path, body


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(tiny_model_dir):
    async with model_server(tiny_model_dir) as running:
        yield running


@pytest.mark.asyncio(loop_scope="module")
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(request=junk_requests())
async def test_junk_weight_update_bodies_are_a_clear_400_never_a_500_or_a_wait(server, request):
    url, engine = server
    path, body = request
    before = engine.model.state_dict()["lm_head.weight"].clone()
    async with aiohttp.ClientSession() as http:
        async with http.post(url + path, data=json.dumps(body), timeout=aiohttp.ClientTimeout(total=10)) as resp:
            assert resp.status == 400, (resp.status, await resp.text())
    assert torch.equal(engine.model.state_dict()["lm_head.weight"], before)
