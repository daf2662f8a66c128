"""`serve model`'s memory release and resume (verl, AReaL offload) and `/v1/loads` (slime's abort loop), with
SGLang 0.5.23's request and answer shapes, on the tiny model."""

import asyncio
import json

import aiohttp
import pytest
import pytest_asyncio
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchgym.agents.engines.sglang_engine import wait_until_ready
from searchgym.agents.engines.torch_engine import TorchEngine
from searchgym.serve.http import serve_app
from searchgym.serve.model import ModelServerSettings, create_app
from searchgym.serve.model.memory import TAGS
from tests.agents.servers import GREEDY, PROMPT, generate, post, wait_for_tokens
from tests.servers import JSON_VALUES

pytestmark = pytest.mark.asyncio(loop_scope="module")
LOGPROBS = {"input_ids": PROMPT, "return_logprob": True, "sampling_params": {"max_new_tokens": 8, **GREEDY}}


@pytest_asyncio.fixture(autouse=True, loop_scope="module")
async def restored(server, http):
    """Whatever a test leaves paused or released is given back, so a failure cannot hold the shared server."""
    yield
    url, _ = server
    await post(http, url, "/continue_generation", {})
    await control(http, url, "/resume_memory_occupation", {"tags": None})


async def waiting_requests(http, url, n, timeout_s=30.0):
    """Poll /v1/loads until `n` requests wait (fail after `timeout_s`); the load row."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        load = (await loads(http, url))["loads"][0]
        if load["num_waiting_reqs"] == n:
            return load
        assert asyncio.get_running_loop().time() < deadline, load
        await asyncio.sleep(0.02)


async def control(http, url, path, body=None, method="POST"):
    """(status, JSON answer) of a memory route; no body when `body` is None."""
    kwargs = {} if body is None else {"json": body}
    async with http.request(method, url + path, **kwargs) as resp:
        return resp.status, await resp.json()


async def loads(http, url, query=""):
    async with http.get(url + "/v1/loads" + query) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def server_info(http, url):
    async with http.get(url + "/server_info") as resp:
        return await resp.json()


def logprobs(out):
    return [t[0] for t in out["meta_info"]["output_token_logprobs"]]


# ---- release and resume --------------------------------------------------------------------------------------------


async def test_release_holds_generation_and_resume_gives_the_same_logprobs(server, http):
    url, engine = server
    before = await generate(http, url, **LOGPROBS, rid="episode-1")
    assert engine.stats()["prefix_cache_entries"] >= 1  # the finished request's keys and values are kept

    assert await control(http, url, "/release_memory_occupation") == (200, None)  # no body: every tag, as SGLang
    assert (await server_info(http, url))["released_memory"] == list(TAGS)
    assert engine.stats()["prefix_cache_entries"] == 0 and engine.prefix_cache.nbytes == 0  # the KV cache is freed

    held = asyncio.create_task(generate(http, url, **LOGPROBS))
    load = await waiting_requests(http, url, 1)
    assert not held.done()
    assert (load["num_running_reqs"], load["num_waiting_reqs"], load["queues"]["paused"]) == (0, 1, 1)

    assert await control(http, url, "/resume_memory_occupation", {"tags": ["weights"]}) == (200, None)
    await asyncio.sleep(0.2)
    assert not held.done()  # the KV cache is still released: generation still waits
    assert await control(http, url, "/resume_memory_occupation", {"tags": ["kv_cache"]}) == (200, None)
    after = await asyncio.wait_for(held, 60)
    assert after["output_ids"] == before["output_ids"]
    assert logprobs(after) == logprobs(before)  # same weights, bit for bit
    assert (await server_info(http, url))["released_memory"] == ["cuda_graph"]  # held no generation
    assert await control(http, url, "/resume_memory_occupation", {"tags": None}) == (200, None)
    assert (await server_info(http, url))["released_memory"] == []


async def test_release_needs_an_idle_server_and_resume_a_released_tag(server, http):
    url, engine = server
    running = asyncio.create_task(
        generate(http, url, input_ids=PROMPT, rid="busy", sampling_params={"max_new_tokens": 240, **GREEDY})
    )
    await wait_for_tokens(engine, 2)
    status, out = await control(http, url, "/release_memory_occupation", {"tags": ["kv_cache"]})
    assert status == 400 and "only when server is idle" in out["error"]["message"]
    async with http.post(url + "/abort_request", json={"rid": "busy"}) as resp:
        assert resp.status == 200
    await running
    status, out = await control(http, url, "/resume_memory_occupation", {"tags": ["weights"]})
    assert status == 400 and "not released" in out["error"]["message"] and "tags" in out["error"]["message"]


async def test_release_after_a_pause_lets_held_requests_wait(server, http):
    url, _ = server
    await post(http, url, "/pause_generation", {"mode": "abort"})
    held = asyncio.create_task(generate(http, url, **LOGPROBS))
    await waiting_requests(http, url, 1)
    assert await control(http, url, "/release_memory_occupation", {"tags": ["kv_cache", "weights"]}) == (200, None)
    await post(http, url, "/continue_generation", {})
    await asyncio.sleep(0.2)
    assert not held.done()  # continue_generation does not bring back released memory
    assert await control(http, url, "/resume_memory_occupation", method="GET") == (200, None)
    assert (await asyncio.wait_for(held, 60))["meta_info"]["completion_tokens"] == 8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="weights move off an accelerator only")
async def test_on_a_gpu_release_frees_the_weights_memory(tiny_model_dir, http):
    engine = TorchEngine(tiny_model_dir, device="cuda", seed=0)
    try:
        async with serve_app(
            create_app(engine, ModelServerSettings(model_path=str(tiny_model_dir), context_length=256))
        ) as url:
            await wait_until_ready(http, url, 60, interval=0.05)
            await check_gpu_release(http, url, engine)
    finally:
        await engine.close()


async def check_gpu_release(http, url, engine):
    """Release moves the weights to the host and frees their device memory; resume brings back the same ones."""
    before = await generate(http, url, **LOGPROBS)
    used = torch.cuda.memory_allocated()
    assert await control(http, url, "/release_memory_occupation", {"tags": ["weights", "kv_cache"]}) == (200, None)
    weights = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    assert used - torch.cuda.memory_allocated() >= weights
    assert next(engine.model.parameters()).device.type == "cpu"
    assert await control(http, url, "/resume_memory_occupation") == (200, None)
    assert next(engine.model.parameters()).device.type == "cuda"
    after = await generate(http, url, **LOGPROBS)
    assert after["output_ids"] == before["output_ids"] and logprobs(after) == logprobs(before)


# ---- /v1/loads -----------------------------------------------------------------------------------------------------


async def test_loads_report_a_running_request_and_zero_after(server, http):
    url, engine = server
    idle = await loads(http, url)
    assert set(idle) == {"timestamp", "version", "accelerator", "num_accelerators", "loads"}
    (load,) = idle["loads"]
    assert (load["dp_rank"], load["num_running_reqs"], load["num_waiting_reqs"]) == (0, 0, 0)
    running = asyncio.create_task(
        generate(http, url, input_ids=PROMPT, rid="load-1", sampling_params={"max_new_tokens": 200, **GREEDY})
    )
    await wait_for_tokens(engine, 2)
    (load,) = (await loads(http, url))["loads"]
    assert load["num_running_reqs"] == 1 and load["num_waiting_reqs"] == 0
    assert load["utilization"] > 0 and load["max_running_requests"] == 256
    await running
    (load,) = (await loads(http, url))["loads"]
    assert (load["num_running_reqs"], load["num_waiting_reqs"]) == (0, 0)


async def test_loads_query_parameters_as_sglang(server, http):
    url, _ = server
    core = (await loads(http, url, "?include=core"))["loads"][0]
    assert "queues" not in core and "num_running_reqs" in core
    assert (await loads(http, url, "?dp_rank=3"))["loads"] == []
    async with http.get(url + "/v1/loads?include=bogus") as resp:
        assert resp.status == 400 and "include" in (await resp.json())["detail"]
    async with http.get(url + "/v1/loads?format=prometheus") as resp:
        text = await resp.text()
        assert resp.status == 200 and 'sglang_num_running_reqs{dp_rank="0"} 0' in text


# ---- junk never makes a 500 ----------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    path=st.sampled_from(["/release_memory_occupation", "/resume_memory_occupation"]),
    body=JSON_VALUES | st.fixed_dictionaries({"tags": JSON_VALUES}),
)
async def test_junk_bodies_to_the_memory_routes_are_a_400_naming_the_field(server, path, body):
    url, _ = server
    async with aiohttp.ClientSession() as http:
        async with http.post(url + path, data=json.dumps(body)) as resp:
            out = await resp.json()
            assert resp.status in (200, 400), (resp.status, out)
            if resp.status == 400 and isinstance(body, dict) and "tags" in body:
                assert "tags" in out["error"]["message"]
        assert await control(http, url, "/resume_memory_occupation") == (200, None)  # whatever was released


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    query=st.dictionaries(
        st.sampled_from(["include", "dp_rank", "format", "other"]),
        st.text(st.characters(codec="ascii", exclude_categories=["Cc"]), max_size=12),
        max_size=3,
    )
)
async def test_junk_loads_queries_are_answered_never_a_500(server, query):
    url, _ = server
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/v1/loads", params=query) as resp:
            assert resp.status in (200, 400, 422), (resp.status, await resp.text())
            if resp.status != 200:
                detail = (await resp.json())["detail"]
                assert "include" in detail or "dp_rank" in detail
