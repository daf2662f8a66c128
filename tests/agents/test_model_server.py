"""The model server speaks SGLang 0.5.23's native API for real: the tiny model behind it, loopback only.

Every JSON answer of a native route in these tests (and in every test that starts a server through
`model_server`) is decoded with SGLang's own generated contract (tests/agents/sglang_contract.py).
"""

import asyncio
import json

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from searchgym.agents.engines.sglang_engine import wait_until_ready
from searchgym.agents.engines.torch_engine import TorchEngine
from searchgym.serve.model import ModelServerSettings, serving
from tests.agents.servers import (
    CONTEXT,
    GREEDY,
    PROMPT,
    generate,
    model_server,
    perturbed_copy,
    post,
    teacher_forced,
    wait_for_tokens,
)
from tests.servers import JSON_VALUES

pytestmark = pytest.mark.asyncio(loop_scope="module")

META_KEYS = {
    "id",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "weight_version",
    "weight_versions",
    "e2e_latency",
}


# ---- /generate ---------------------------------------------------------------------------------------------------


async def test_generate_input_ids_has_sglang_shape_and_exact_logprobs(server, http):
    url, engine = server
    out = await generate(
        http, url, input_ids=PROMPT, sampling_params={"max_new_tokens": 6, **GREEDY}, return_logprob=True, rid="r-1"
    )
    assert set(out) == {"text", "output_ids", "meta_info"}
    meta = out["meta_info"]
    assert set(meta) == META_KEYS | {"output_token_logprobs"}
    assert meta["id"] == "r-1" and meta["finish_reason"] == {"type": "length", "length": 6}
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"]) == (5, 6, 0)
    assert meta["weight_version"] == "0" and meta["weight_versions"] == [{"version": "0", "start": 0, "end": 6}]
    assert meta["e2e_latency"] >= 0
    ids = out["output_ids"]
    assert [t[1] for t in meta["output_token_logprobs"]] == ids
    assert all(t[2] is None for t in meta["output_token_logprobs"])
    expected = teacher_forced(engine.model, PROMPT, ids)
    assert [t[0] for t in meta["output_token_logprobs"]] == pytest.approx(expected, abs=1e-4)
    assert out["text"] == engine.tokenizer.decode(ids, skip_special_tokens=True)


async def test_text_batch_matches_input_ids_and_returns_token_texts(server, http):
    url, engine = server
    texts = ["Where was the founder born?", "<search> capital </search>"]
    sampling = {"max_new_tokens": 5, **GREEDY}
    batch = await generate(
        http,
        url,
        text=texts,
        sampling_params=sampling,
        rid=["a", "b"],
        return_logprob=True,
        return_text_in_logprobs=True,
    )
    assert isinstance(batch, list) and [o["meta_info"]["id"] for o in batch] == ["a", "b"]
    for text, out in zip(texts, batch, strict=True):
        single = await generate(http, url, input_ids=engine.tokenizer.encode(text), sampling_params=sampling)
        assert out["output_ids"] == single["output_ids"]
        assert "output_token_logprobs" not in single["meta_info"]
        assert [t[2] for t in out["meta_info"]["output_token_logprobs"]] == [
            engine.tokenizer.decode([t]) for t in out["output_ids"]
        ]


async def test_batch_takes_per_prompt_sampling_params(server, http):
    url, _ = server
    batch = await generate(
        http,
        url,
        input_ids=[PROMPT, PROMPT[:3]],
        sampling_params=[{"max_new_tokens": 2, **GREEDY}, {"max_new_tokens": 4, **GREEDY}],
    )
    assert [o["meta_info"]["completion_tokens"] for o in batch] == [2, 4]
    assert [o["meta_info"]["prompt_tokens"] for o in batch] == [5, 3]


async def test_stop_token_and_stop_string_finish_reasons_and_trimming(server, http):
    url, engine = server
    free = (await generate(http, url, input_ids=PROMPT, sampling_params={"max_new_tokens": 12, **GREEDY}))["output_ids"]
    stop_id = free[2]
    first = free.index(stop_id)
    by_id = await generate(
        http,
        url,
        input_ids=PROMPT,
        sampling_params={"max_new_tokens": 12, "temperature": 0, "stop_token_ids": [stop_id]},
    )
    assert by_id["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    assert by_id["output_ids"] == free[: first + 1]
    assert by_id["text"] == engine.tokenizer.decode(free[:first])  # the matched token is trimmed from the text
    kept = await generate(
        http,
        url,
        input_ids=PROMPT,
        sampling_params={"max_new_tokens": 12, "temperature": 0, "stop_token_ids": [stop_id], "no_stop_trim": True},
    )
    assert kept["text"] == engine.tokenizer.decode(free[: first + 1])

    full_text = engine.tokenizer.decode(free)
    word = engine.tokenizer.decode(free[3:4]).strip()
    stop = word[: max(1, len(word) // 2)]
    by_str = await generate(
        http, url, input_ids=PROMPT, sampling_params={"max_new_tokens": 12, **GREEDY, "stop": [stop]}
    )
    assert by_str["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert by_str["text"] == full_text[: full_text.find(stop)]
    assert by_str["output_ids"] == free[: len(by_str["output_ids"])]


async def test_max_new_tokens_zero_and_sglang_defaults(server, http):
    url, _ = server
    empty = await generate(http, url, input_ids=PROMPT, sampling_params={"max_new_tokens": 0})
    assert empty["output_ids"] == [] and empty["meta_info"]["finish_reason"]["type"] == "length"
    default = await generate(http, url, input_ids=PROMPT, sampling_params={"ignore_eos": True})
    assert default["meta_info"]["completion_tokens"] == 128  # SGLang's default max_new_tokens


BAD_GENERATE = [
    ({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, "best_of": 2}}, "unknown sampling_params"),
    ({"input_ids": PROMPT, "sampling_params": {"n": 2}}, "n=2"),
    ({"input_ids": PROMPT, "sampling_params": {"repetition_penalty": 1.2}}, "repetition_penalty"),
    ({"input_ids": PROMPT, "top_logprobs_num": -1, "return_logprob": True}, "top_logprobs_num must be at least 0"),
    ({"input_ids": PROMPT, "return_logprob": True, "logprob_start_len": 6}, "higher than the number of input tokens"),
    ({"input_ids": [PROMPT, PROMPT], "stream": True}, "one prompt per request"),
    ({"input_ids": PROMPT, "stream": "yes"}, "stream"),
    ({"input_ids": PROMPT, "lora_path": "x"}, "lora_path='x' is not supported"),
    ({"input_ids": PROMPT, "return_hidden_states": True}, "return_hidden_states=True is not supported"),
    ({"input_ids": PROMPT, "sampling_params": {"json_schema": "{}"}}, "json_schema='{}' is not supported"),
    ({"input_ids": PROMPT, "priority": "high"}, "priority must be an integer"),
    ({"input_ids": PROMPT, "sampling_params": {"logit_bias": {"99999": 1}}}, "logit_bias keys must be token ids"),
    ({"input_ids": PROMPT, "sampling_params": {"sampling_seed": 1.5}}, "sampling_seed must be an integer"),
    ({"input_ids": [PROMPT, PROMPT], "rid": ["a", "a"]}, "Duplicate request ID detected: a"),
    ({"input_ids": [1, 10**9]}, "token ids must be integers in"),
    ({"input_ids": [1, True]}, "token ids must be integers in"),
    ({"input_ids": []}, "non-empty"),
    ({"text": ""}, "non-empty"),
    ({"text": "hi", "input_ids": PROMPT}, "exactly one of"),
    ({}, "exactly one of"),
    ({"input_ids": list(range(CONTEXT))}, "longer than the model's context length"),
    ({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": CONTEXT}}, "exceeds the model's maximum context"),
    ({"input_ids": PROMPT, "sampling_params": {"temperature": -1}}, "temperature"),
    ({"input_ids": PROMPT, "sampling_params": {"top_p": 0}}, "top_p"),
    ({"input_ids": PROMPT, "sampling_params": {"top_k": 0}}, "top_k"),
    ({"input_ids": PROMPT, "sampling_params": {"stop": [""]}}, "stop"),
    ({"input_ids": PROMPT, "sampling_params": "greedy"}, "sampling_params must be an object"),
    ({"input_ids": [PROMPT, PROMPT], "rid": "same"}, "rid"),
    ({"input_ids": [PROMPT, PROMPT], "sampling_params": [{}]}, "1 entries for 2 prompts"),
]


@pytest.mark.parametrize("body,reason", BAD_GENERATE)
async def test_generate_refuses_bad_input_with_a_400_that_says_why(server, http, body, reason):
    url, _ = server
    status, out = await post(http, url, "/generate", body)
    assert status == 400
    assert out["error"]["code"] == 400 and reason in out["error"]["message"]


async def test_malformed_json_and_non_objects_are_400(server, http):
    url, _ = server
    for raw in (b"{bad", b"[1, 2]", b"\xff\xfe", b"", b"[" * 100_000):
        async with http.post(url + "/generate", data=raw) as resp:
            assert resp.status == 400, raw[:10]
            assert (await resp.json())["error"]["message"]


_JSON = JSON_VALUES
_VALID = {  # a valid body per endpoint, and the fields mutations replace (sampling ones inside sampling_params)
    "/generate": (
        {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}},
        [
            "text",
            "input_ids",
            "rid",
            "return_logprob",
            "logprob_start_len",
            "top_logprobs_num",
            "return_text_in_logprobs",
            "stream",
            "sampling_params",
            "return_prompt_token_ids",
            "lora_path",
            "image_data",
            "priority",
            "custom_labels",
            "routing_key",
            "session_params",
        ],
    ),
    "/v1/chat/completions": (
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        [
            "messages",
            "max_tokens",
            "max_completion_tokens",
            "temperature",
            "top_p",
            "stop",
            "n",
            "seed",
            "stream",
            "model",
            "tools",
            "logprobs",
            "presence_penalty",
            "tool_choice",
            "response_format",
            "logit_bias",
            "parallel_tool_calls",
            "chat_template_kwargs",
            "user",
            "metadata",
            "top_k",
        ],
    ),
    "/v1/completions": (
        {"prompt": "hi", "max_tokens": 2},
        ["prompt", "max_tokens", "echo", "suffix", "best_of", "logprobs", "seed", "stop", "n"],
    ),
    "/update_weights_from_disk": (
        {"model_path": "/nonexistent"},
        ["model_path", "load_format", "weight_version", "abort_all_requests", "flush_cache"],
    ),
    "/abort_request": ({"rid": "nobody"}, ["rid", "abort_all"]),
}
_SAMPLING_KEYS = [
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "no_stop_trim",
    "n",
    "min_new_tokens",
    "frequency_penalty",
    "logit_bias",
    "sampling_seed",
    "spaces_between_special_tokens",
    "stop_regex",
    "custom_params",
    "watermark",
]


@st.composite
def junk_requests(draw):
    """(path, body): pure junk JSON, or a valid body with one to three fields replaced by junk."""
    path = draw(st.sampled_from(sorted(_VALID)))
    if draw(st.booleans()):
        return path, draw(_JSON)
    base, keys = _VALID[path]
    body = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(1, 3))):
        inner = path == "/generate" and isinstance(body.get("sampling_params"), dict) and draw(st.booleans())
        target, names = (body["sampling_params"], _SAMPLING_KEYS) if inner else (body, keys)
        target[draw(st.sampled_from(names))] = draw(_JSON)
    return path, body


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(request=junk_requests())
async def test_junk_bodies_never_cause_a_500(server, request):
    url, _ = server
    path, body = request
    async with aiohttp.ClientSession() as http:
        async with http.post(url + path, data=json.dumps(body)) as resp:
            assert resp.status in (200, 400), (resp.status, await resp.text())


async def test_request_size_limit(tiny_model_dir, http):
    async with model_server(tiny_model_dir, client_max_size=1024) as (url, _):
        async with http.post(url + "/generate", json={"input_ids": [1] * 2000}) as resp:
            assert resp.status == 413


# ---- control: pause, continue, abort, flush ------------------------------------------------------------------------


async def test_pause_abort_returns_partial_tokens_and_holds_new_requests(server, http):
    url, engine = server
    long = asyncio.create_task(
        generate(http, url, input_ids=PROMPT, return_logprob=True, sampling_params={"max_new_tokens": 200, **GREEDY})
    )
    await wait_for_tokens(engine, 3)
    assert await post(http, url, "/pause_generation", {"mode": "abort"}) == (
        200,
        {"message": "Generation paused successfully.", "status": "ok"},
    )
    partial = await long
    assert partial["meta_info"]["finish_reason"]["type"] == "abort"
    assert 0 < partial["meta_info"]["completion_tokens"] < 200
    assert len(partial["meta_info"]["output_token_logprobs"]) == len(partial["output_ids"])
    waiting = asyncio.create_task(generate(http, url, input_ids=PROMPT, sampling_params={"max_new_tokens": 2}))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    async with http.get(url + "/get_server_info") as resp:
        info = await resp.json()
    assert info["paused"] and info["waiting_requests"] == 1 and info["running_requests"] == 0
    async with http.post(url + "/flush_cache") as resp:
        assert resp.status == 200  # nothing is running
    assert (await post(http, url, "/continue_generation", {}))[1]["status"] == "ok"
    assert (await waiting)["meta_info"]["completion_tokens"] == 2


@pytest.mark.parametrize("mode,flush_status", [("in_place", 400), ("retract", 200)])
async def test_pause_in_place_or_retract_keeps_requests_and_continues_them(server, http, mode, flush_status):
    url, engine = server
    sampling = {"max_new_tokens": 60, **GREEDY}
    reference = await generate(http, url, input_ids=PROMPT, sampling_params=sampling)
    held = asyncio.create_task(generate(http, url, input_ids=PROMPT, sampling_params=sampling))
    await wait_for_tokens(engine, 3)
    await post(http, url, "/pause_generation", {"mode": mode})
    generated = engine.stats()["generated_tokens"]
    await asyncio.sleep(0.2)
    assert not held.done() and engine.stats()["generated_tokens"] == generated
    async with http.post(url + "/flush_cache") as resp:  # as SGLang: refused while a request runs in place,
        assert resp.status == flush_status  # allowed once running requests are retracted
    await post(http, url, "/continue_generation", {})
    out = await held
    assert out["output_ids"] == reference["output_ids"]
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 60}


async def test_abort_request_by_rid(server, http):
    url, engine = server
    victim = asyncio.create_task(
        generate(http, url, input_ids=PROMPT, rid="victim", sampling_params={"max_new_tokens": 200, **GREEDY})
    )
    other = asyncio.create_task(
        generate(http, url, input_ids=PROMPT, rid="other", sampling_params={"max_new_tokens": 40, **GREEDY})
    )
    await wait_for_tokens(engine, 4)
    async with http.post(url + "/abort_request", json={"rid": "victim"}) as resp:
        assert resp.status == 200
    assert (await victim)["meta_info"]["finish_reason"]["type"] == "abort"
    assert (await other)["meta_info"]["finish_reason"] == {"type": "length", "length": 40}
    assert (await post(http, url, "/pause_generation", {"mode": "sideways"}))[0] == 400


async def test_bounded_concurrency(tiny_model_dir, http):
    async with model_server(tiny_model_dir, max_running_requests=2) as (url, engine):
        await engine.pause()  # requests admitted by the server queue inside the paused engine
        tasks = [
            asyncio.create_task(generate(http, url, input_ids=PROMPT, sampling_params={"max_new_tokens": 2}))
            for _ in range(5)
        ]
        await asyncio.sleep(0.2)
        async with http.get(url + "/get_server_info") as resp:
            info = await resp.json()
        assert (info["running_requests"], info["waiting_requests"]) == (2, 3)
        await engine.resume()
        assert len(await asyncio.gather(*tasks)) == 5


# ---- health and info ----------------------------------------------------------------------------------------------


async def test_health_generate_is_503_until_a_token_is_generated(tiny_model_dir, http):
    engine = TorchEngine(tiny_model_dir)
    await engine.pause()  # the server's warm-up generation waits
    async with serving(engine, ModelServerSettings(model_path=str(tiny_model_dir), port=0)) as url:
        for path, status in (("/health", 200), ("/health_generate", 503), ("/ready", 503)):
            async with http.get(url + path) as resp:
                assert resp.status == status
        await engine.resume()
        await wait_until_ready(http, url, 10, interval=0.02)
        async with http.get(url + "/ready") as resp:
            assert resp.status == 200
    await engine.close()


async def test_model_and_server_info_under_current_and_deprecated_names(server, http):
    url, engine = server
    async with http.get(url + "/get_model_info") as resp:
        info = await resp.json()
    async with http.get(url + "/model_info") as resp:
        assert await resp.json() == info
    assert info["is_generation"] is True and info["weight_version"] == str(engine.version)
    assert {"model_path", "tokenizer_path"} <= set(info)
    async with http.get(url + "/server_info") as resp:
        assert (await resp.json())["max_context_length"] == CONTEXT
    async with http.get(url + "/get_server_info") as resp:
        server_info = await resp.json()
    assert server_info["context_length"] == CONTEXT and "generated_tokens" in server_info["internal_states"][0]
    async with http.get(url + "/v1/models") as resp:
        models = await resp.json()
    assert models["object"] == "list" and models["data"][0]["id"] == info["model_path"]


# ---- weights -------------------------------------------------------------------------------------------------------


async def test_update_weights_from_disk_bad_path_keeps_serving(server, http, tmp_path):
    url, engine = server
    before = await generate(http, url, input_ids=PROMPT, sampling_params={"max_new_tokens": 4, **GREEDY})
    status, out = await post(
        http, url, "/update_weights_from_disk", {"model_path": str(tmp_path / "missing"), "weight_version": "9"}
    )
    assert status == 400 and out["success"] is False and "missing" in out["message"]
    assert out["num_paused_requests"] == 0
    after = await generate(http, url, input_ids=PROMPT, sampling_params={"max_new_tokens": 4, **GREEDY})
    assert after["output_ids"] == before["output_ids"] and after["meta_info"]["weight_version"] == "0"


async def test_update_weights_from_disk_sets_the_version_of_later_tokens(tiny_model_dir, http, tmp_path):
    perturbed = perturbed_copy(tiny_model_dir, tmp_path / "perturbed")
    async with model_server(tiny_model_dir) as (url, engine):
        sampling = {"max_new_tokens": 8, **GREEDY}
        before = await generate(http, url, input_ids=PROMPT, sampling_params=sampling)
        status, out = await post(
            http,
            url,
            "/update_weights_from_disk",
            {
                "model_path": str(perturbed),
                "load_format": "auto",
                "abort_all_requests": True,
                "weight_version": "3",
                "flush_cache": True,
            },
        )
        assert (status, out["success"], out["num_paused_requests"]) == (200, True, 0)
        assert "Weight version updated to 3" in out["message"]
        async with http.get(url + "/get_model_info") as resp:
            assert (await resp.json())["weight_version"] == "3"
        after = await generate(http, url, input_ids=PROMPT, sampling_params=sampling, return_logprob=True)
        assert after["meta_info"]["weight_version"] == "3" and after["output_ids"] != before["output_ids"]
        fresh = AutoModelForCausalLM.from_pretrained(perturbed)
        assert [t[0] for t in after["meta_info"]["output_token_logprobs"]] == pytest.approx(
            teacher_forced(fresh, PROMPT, after["output_ids"]), abs=1e-4
        )


# ---- SGLang 0.5.23 semantics ---------------------------------------------------------------------------------------


async def test_unknown_top_level_fields_are_ignored_as_sglang_ignores_them(server, http):
    url, _ = server
    sampling = {"max_new_tokens": 3, **GREEDY}
    plain = await generate(http, url, input_ids=PROMPT, sampling_params=sampling)
    out = await generate(
        http,
        url,
        input_ids=PROMPT,
        sampling_params=sampling,
        image_data=None,
        return_routed_experts=True,
        a_field_from_the_future={"x": 1},
        return_prompt_token_ids=True,
    )
    assert out["output_ids"] == plain["output_ids"] and out["prompt_token_ids"] == PROMPT


async def test_sampling_seed_makes_a_request_reproducible_and_keys_tokens_by_position(server, http):
    url, _ = server

    def seeded(seed, prompt=PROMPT, n=20):
        return {
            "input_ids": prompt,
            "sampling_params": {"max_new_tokens": n, "temperature": 1.0, "ignore_eos": True, "sampling_seed": seed},
        }

    first = await generate(http, url, **seeded(7))
    await generate(http, url, input_ids=PROMPT, sampling_params={"max_new_tokens": 5, "ignore_eos": True})
    again = await generate(http, url, **seeded(7))
    other = await generate(http, url, **seeded(8))
    assert again["output_ids"] == first["output_ids"] != other["output_ids"]
    ids = first["output_ids"]  # resubmitting prompt + partial output (as after an abort) continues the same text
    tail = await generate(http, url, **seeded(7, PROMPT + ids[:7], 13))
    assert tail["output_ids"] == ids[7:]


async def test_logit_bias_and_special_token_rendering(server, http):
    url, engine = server
    start = engine.tokenizer.convert_tokens_to_ids("<|im_start|>")
    for temperature in (0.0, 1.0):
        sampling = {
            "max_new_tokens": 3,
            "temperature": temperature,
            "ignore_eos": True,
            "logit_bias": {str(start): 100.0},
        }
        kept = await generate(
            http,
            url,
            input_ids=PROMPT,
            sampling_params={**sampling, "skip_special_tokens": False, "spaces_between_special_tokens": False},
        )
        assert kept["output_ids"] == [start] * 3 and kept["text"] == "<|im_start|>" * 3
        skipped = await generate(http, url, input_ids=PROMPT, sampling_params=sampling)
        assert skipped["text"] == ""


async def test_a_rid_in_flight_is_refused_until_it_finishes(server, http):
    url, engine = server
    first = asyncio.create_task(
        generate(http, url, input_ids=PROMPT, rid="dup", sampling_params={"max_new_tokens": 100, **GREEDY})
    )
    await wait_for_tokens(engine, 2)
    status, out = await post(http, url, "/generate", {"input_ids": PROMPT, "rid": "dup"})
    assert status == 400 and out["error"]["message"] == "Duplicate request ID detected: dup"
    assert (await first)["meta_info"]["completion_tokens"] == 100
    assert await generate(http, url, input_ids=PROMPT, rid="dup", sampling_params={"max_new_tokens": 1})


async def test_string_weight_versions_spans_relabelling_and_keep_pause(tiny_model_dir, http, tmp_path):
    perturbed = perturbed_copy(tiny_model_dir, tmp_path / "perturbed")
    async with model_server(tiny_model_dir, weight_version="v1-step0") as (url, engine):
        sampling = {"max_new_tokens": 80, **GREEDY}
        running = asyncio.create_task(generate(http, url, input_ids=PROMPT, sampling_params=sampling))
        await wait_for_tokens(engine, 5)
        status, out = await post(
            http, url, "/update_weights_from_disk", {"model_path": str(perturbed), "weight_version": "v2-step7"}
        )
        assert status == 200 and out["message"].endswith("Weight version updated to v2-step7.")
        meta = (await running)["meta_info"]
        assert meta["weight_version"] == "v2-step7"
        old = meta["weight_versions"][0]["end"]
        assert 0 < old < 80 and meta["weight_versions"] == [
            {"version": "v1-step0", "start": 0, "end": old},
            {"version": "v2-step7", "start": old, "end": 80},
        ]
        async with http.get(url + "/model_info") as resp:
            assert (await resp.json())["weight_version"] == "v2-step7"
        short = {"max_new_tokens": 6, **GREEDY}
        before = await generate(http, url, input_ids=PROMPT, sampling_params=short)
        assert await post(http, url, "/update_weight_version", {"new_version": "v3"}) == (
            200,
            {"success": True, "message": "Weight version updated to v3", "new_version": "v3"},
        )
        after = await generate(http, url, input_ids=PROMPT, sampling_params=short)
        assert after["output_ids"] == before["output_ids"] and after["meta_info"]["weight_version"] == "v3"

        status, out = await post(
            http,
            url,
            "/update_weights_from_disk",
            {"model_path": str(tiny_model_dir), "weight_version": "5", "keep_pause": True},
        )
        assert status == 200 and engine.version == 5  # a numeric label is the engine's version
        held = asyncio.create_task(generate(http, url, input_ids=PROMPT, sampling_params=short))
        await asyncio.sleep(0.2)
        assert not held.done()  # keep_pause: the server stays paused until /continue_generation
        await post(http, url, "/continue_generation", {})
        assert (await held)["meta_info"]["weight_versions"] == [{"version": "5", "start": 0, "end": 6}]


async def test_unknown_routes_and_wrong_methods_answer_json_in_the_callers_dialect(server, http):
    url, _ = server
    for method, path, status in (("GET", "/nope", 404), ("GET", "/generate", 405), ("DELETE", "/health", 405)):
        async with http.request(method, url + path) as resp:
            assert resp.status == status and (await resp.json())["error"]["code"] == status
    async with http.get(url + "/v1/nope") as resp:
        body = await resp.json()
    assert resp.status == 404 and body["error"]["type"] == "invalid_request_error" and body["error"]["message"]


async def test_a_weight_version_of_thousands_of_digits_is_a_label_not_a_500(server, http):
    """int() refuses strings over 4,300 digits; such a label is just a label (it used to be an internal error)."""
    url, _ = server
    huge = "9" * 5000
    status, out = await post(http, url, "/update_weight_version", {"new_version": huge})
    assert status == 200, out
    meta = (await generate(http, url, input_ids=PROMPT, sampling_params={"max_new_tokens": 1}))["meta_info"]
    assert meta["weight_version"] == huge
    status, out = await post(http, url, "/update_weight_version", {"new_version": "default"})
    assert status == 200
