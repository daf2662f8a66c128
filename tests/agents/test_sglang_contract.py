"""`serve model` judged by SGLang 0.5.23's own generated contract, and by what AReaL, slime and verl really send.

The client fixtures (tests/fixtures/sglang_clients/*.json) are request bodies read from each project's
source at a named commit. Every answer of a native route is decoded with SGLang's contract by the
test server's middleware (see `model_server` in test_model_server.py).
"""

import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchgym.serve.model import sglang_api
from tests.agents.servers import PROMPT, model_server
from tests.agents.sglang_contract import require_contract

in_module_loop = pytest.mark.asyncio(loop_scope="module")  # shares the loop of the module's server

FIXTURES = sorted((Path(__file__).parents[1] / "fixtures" / "sglang_clients").glob("*.json"))

# one value per field this server refuses unless neutral: each is valid under SGLang's contract
NON_NEUTRAL = {
    "token_ids_logprob": [1, 2],
    "return_hidden_states": True,
    "bootstrap_host": "10.0.0.1",
    "bootstrap_port": 8998,
    "bootstrap_room": 7,
    "bootstrap_pair_key": "key",
    "decode_tp_size": 2,
    "routed_dp_rank": 1,
    "disagg_prefill_dp_rank": 1,
    "image_data": "http://example.com/cat.png",
    "mm_hashes": ["abc"],
    "video_data": "http://example.com/a.mp4",
    "audio_data": "http://example.com/a.wav",
    "require_reasoning": True,
    "lora_path": "my-adapter",
    "session_params": {"id": "s1"},
    "kv_hints": {"protocol_version": "1", "message_id": "m", "actions": []},
    "max_thinking_tokens": 10,
    "session_id": "s1",
    "custom_logit_processor": "serialized-processor",
    "images_config": {"image_mode": "tiles"},
    "routed_experts_start_len": 3,
    "return_sampling_mask": True,
    "modalities": ["image"],
}
NON_NEUTRAL_SAMPLING = {
    "stop_regex": "[0-9]+",
    "frequency_penalty": 0.5,
    "presence_penalty": 0.5,
    "repetition_penalty": 1.1,
    "min_new_tokens": 2,
    "n": 2,
    "json_schema": "{}",
    "regex": "a+",
    "ebnf": 'root ::= "a"',
    "structural_tag": "{}",
    "beam_width": 2,
    "watermark": {"enabled": True},
    "choice": ["yes", "no"],
}


def _substitute(value, replacements):
    """The fixture body with placeholders ($MODEL_DIR) replaced."""
    if isinstance(value, str):
        return replacements.get(value, value)
    if isinstance(value, list):
        return [_substitute(v, replacements) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, replacements) for k, v in value.items()}
    return value


def test_every_field_of_the_contract_is_honoured_inert_or_neutral_only():
    contract = require_contract()
    ours = set(sglang_api.HONOURED) | set(sglang_api.INERT) | set(sglang_api.NEUTRAL)
    assert set(contract.GenerateRequest.__struct_fields__) == ours
    assert set(contract.SamplingParams.__struct_fields__) == set(sglang_api.SAMPLING_FIELDS)
    assert set(NON_NEUTRAL) == set(sglang_api.NEUTRAL)
    assert set(NON_NEUTRAL_SAMPLING) == set(sglang_api.SAMPLING_NEUTRAL)


@in_module_loop
@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.stem)
async def test_client_fixtures_get_200_and_contract_valid_answers(fixture, tiny_model_dir, http):
    contract = require_contract()
    spec = json.loads(fixture.read_text())
    assert spec["source"]["commit"] and spec["source"]["files"]
    async with model_server(tiny_model_dir) as (url, _):  # a server per client: they update weights
        for step in spec["requests"]:
            body = _substitute(step.get("body"), {"$MODEL_DIR": str(tiny_model_dir)})
            if step["path"] == "/generate":
                contract.decode_GenerateRequest(body)  # the fixture is a request SGLang admits
            async with http.request(step["method"], url + step["path"], json=body) as resp:
                text = await resp.text()
                assert resp.status == 200, (step["name"], text)
            if step["path"] != "/generate":
                continue
            answer = contract.decode_GenerateResponse(json.loads(text))
            meta = answer.meta_info
            assert meta.completion_tokens == len(answer.output_ids) <= body["sampling_params"]["max_new_tokens"]
            if body.get("return_logprob"):  # what the clients read: ids and logprobs from output_token_logprobs
                assert [e.token_id for e in meta.output_token_logprobs] == answer.output_ids
                assert all(e.logprob <= 0 for e in meta.output_token_logprobs)
            assert meta.weight_version and meta.weight_versions[-1].end == len(answer.output_ids)


@in_module_loop
@pytest.mark.parametrize("field", sorted(NON_NEUTRAL))
async def test_fields_not_honoured_are_accepted_when_neutral_and_refused_naming_them_otherwise(server, http, field):
    contract = require_contract()
    url, _ = server
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}, field: NON_NEUTRAL[field]}
    contract.decode_GenerateRequest(body)  # SGLang would admit it: refusing it must be said, not silent
    async with http.post(url + "/generate", json=body) as resp:
        assert resp.status == 400 and field in (await resp.json())["error"]["message"]
    neutral = 0 if field == "routed_experts_start_len" else None  # the contract has no null for that one
    async with http.post(url + "/generate", json={**body, field: neutral}) as resp:
        assert resp.status == 200


@in_module_loop
@pytest.mark.parametrize("field", sorted(NON_NEUTRAL_SAMPLING))
async def test_sampling_fields_not_honoured_are_refused_naming_them(server, http, field):
    contract = require_contract()
    url, _ = server
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, field: NON_NEUTRAL_SAMPLING[field]}}
    contract.decode_GenerateRequest(body)
    async with http.post(url + "/generate", json=body) as resp:
        assert resp.status == 400 and field in (await resp.json())["error"]["message"]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-2, 2) | st.sampled_from(["", "a", "</answer>"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "1", "enabled"]), inner, max_size=2)
    ),
    max_leaves=6,
)


@st.composite
def generate_bodies(draw):
    """/generate bodies around a valid one: contract fields (top level and sampling) and unknown keys set to junk."""
    contract = require_contract()
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}}
    top = sorted(set(contract.GenerateRequest.__struct_fields__) - {"input_ids", "text", "stream"}) + ["unknown_key"]
    inner = sorted(contract.SamplingParams.__struct_fields__)
    for _ in range(draw(st.integers(1, 3))):
        if isinstance(body.get("sampling_params"), dict) and draw(st.booleans()):
            body["sampling_params"][draw(st.sampled_from(inner))] = draw(_JSON)
        else:
            body[draw(st.sampled_from(top))] = draw(_JSON)
    return body


@in_module_loop
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=generate_bodies())
async def test_what_sglang_refuses_is_refused_and_nothing_is_a_500(server, body):
    contract = require_contract()
    url, _ = server
    try:
        contract.decode_GenerateRequest(body)
        admitted = True
    except contract.JsonContractError:
        admitted = False
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "/generate", json=body) as resp:
            text = await resp.text()
    assert resp.status in (200, 400), text
    assert admitted or resp.status == 400, (body, text)


def test_every_server_the_suite_starts_is_judged_by_the_contract_and_the_server_module_runs():
    from searchgym.serve.model import app

    assert app.create_app.contract_checked  # tests/agents/conftest.py: serving() and create_app() check answers
    run = subprocess.run(
        [sys.executable, "-m", "searchgym.serve.model", "--help"], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0 and "--model-path" in run.stdout and "--weight-version" in run.stdout
