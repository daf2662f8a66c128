"""SGLangEngine against two real model servers (the tiny model, loopback): routing, resume after abort, weights."""

import asyncio
import dataclasses
import socket
import sys

import pytest
import pytest_asyncio
from aiohttp import web

from searchgym.agents.engines.sglang_engine import (
    SGLangEngine,
    SGLangError,
    SGLangServer,
    _payload,
    sglang_launch_command,
)
from searchgym.agents.engines.types import FinishReason, GenerateRequest, SamplingParams
from searchgym.serve.http import serve_app
from tests.agents.servers import model_server, perturbed_copy, teacher_forced, wait_for_tokens
from tests.agents.sglang_contract import check_generate_request

in_module_loop = pytest.mark.asyncio(loop_scope="module")  # shares the loop of the module's servers

PROMPTS = [[11, 22, 33, 44, 55], [7, 8, 9], [100, 200, 300, 400]]
LONG = SamplingParams(max_new_tokens=120, temperature=0.0, ignore_eos=True)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def servers(tiny_model_dir):
    """Two servers on the same model; yields [(url, engine), (url, engine)]."""
    async with model_server(tiny_model_dir) as first, model_server(tiny_model_dir) as second:
        yield [first, second]


@pytest_asyncio.fixture(loop_scope="module")
async def client(servers):
    engine = await SGLangEngine([url for url, _ in servers], retry_backoff=0.01).start(timeout=30)
    yield engine
    await engine.close()


def free_port():
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def generated(servers):
    return [engine.stats()["generated_tokens"] for _, engine in servers]


def sglang_answer(ids, finish_reason, weight_version):
    """A /generate answer exactly as SGLang shapes it."""
    return {
        "text": "",
        "output_ids": ids,
        "meta_info": {
            "id": "x",
            "finish_reason": finish_reason,
            "prompt_tokens": 2,
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "weight_version": weight_version,
            "output_token_logprobs": [[-0.5, t, None] for t in ids],
        },
    }


@in_module_loop
async def test_wire_payload_and_resubmission_after_an_abort():
    """Against a test double of SGLang's /generate: every sampling field is sent, and an aborted request is
    resubmitted as prompt + partial with the rest of the budget, each token keeping its response's version."""
    answers = [
        sglang_answer([5, 6], {"type": "abort", "message": "Abort in waiting queue"}, "3"),
        sglang_answer([7], {"type": "stop", "matched": 7}, "4"),
        sglang_answer([], {"type": "abort", "message": "too long", "status_code": 400}, "4"),
    ]
    bodies = []

    async def generate(request):
        bodies.append(await request.json())
        return web.json_response(answers[len(bodies) - 1])

    app = web.Application()
    app.router.add_post("/generate", generate)
    sampling = SamplingParams(max_new_tokens=9, temperature=0.7, stop=("</answer>",), stop_token_ids=(7,))
    async with serve_app(app) as url:
        engine = SGLangEngine([url], resume_poll_interval=0.01)
        out = await engine.agenerate(GenerateRequest([1, 2], sampling, "traj-1"))
        with pytest.raises(SGLangError, match="rejected the request \\(400\\): too long"):
            await engine.agenerate(GenerateRequest([1, 2], sampling))
        await engine.close()
    assert set(bodies[0]["sampling_params"]) == {
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
    }
    for body in bodies:  # every body is one a real SGLang 0.5.23 admits
        check_generate_request(body)
    seeded = SamplingParams(seed=3, logit_bias=((5, -2.0),))
    check_generate_request(_payload([1, 2], seeded, "r"))
    assert _payload([1, 2], seeded, "r")["sampling_params"]["sampling_seed"] == 3
    first = {
        "input_ids": [1, 2],
        "sampling_params": sampling.to_sglang(),
        "return_logprob": True,
        "logprob_start_len": -1,
        "rid": "traj-1",
    }
    assert bodies[0] == first
    assert bodies[1] == {
        **first,
        "input_ids": [1, 2, 5, 6],
        "sampling_params": {**sampling.to_sglang(), "max_new_tokens": 7},
    }
    assert "rid" not in bodies[2]
    assert (out.output_ids, out.logprobs, out.versions) == ([5, 6, 7], [-0.5] * 3, [3, 3, 4])
    assert out.finish_reason == FinishReason("stop", 7) and out.prompt_tokens == 2


@in_module_loop
async def test_generates_what_the_engine_generates_with_logprobs_and_versions(servers, client):
    sampling = SamplingParams(max_new_tokens=10, temperature=0.0, ignore_eos=True)
    response = await client.agenerate(GenerateRequest(PROMPTS[0], sampling, "t-exact"))
    version = servers[0][1].version
    assert client.version == version
    assert response.finish_reason.type == "length" and response.finish_reason.matched == 10
    assert response.prompt_tokens == 5 and response.versions == [version] * 10 and response.rid == "t-exact"
    direct = await servers[0][1].agenerate(GenerateRequest(PROMPTS[0], sampling))
    assert response.output_ids == direct.output_ids
    assert response.logprobs == pytest.approx(
        teacher_forced(servers[0][1].model, PROMPTS[0], direct.output_ids), abs=1e-4
    )


@in_module_loop
async def test_sampled_generation_with_stop_token(client):
    first = await client.agenerate(GenerateRequest(PROMPTS[1], SamplingParams(max_new_tokens=6, temperature=0.0)))
    stop_id = first.output_ids[1]
    stopped = await client.agenerate(
        GenerateRequest(PROMPTS[1], SamplingParams(max_new_tokens=6, temperature=0.0, stop_token_ids=(stop_id,)))
    )
    assert stopped.finish_reason.type == "stop" and stopped.finish_reason.matched == stop_id
    assert stopped.output_ids == first.output_ids[: first.output_ids.index(stop_id) + 1]


@in_module_loop
async def test_same_rid_sticks_to_its_server(servers, client):
    sampling = SamplingParams(max_new_tokens=4, temperature=1.0)
    home = None
    for turn in range(3):
        before = generated(servers)
        await client.agenerate(GenerateRequest(PROMPTS[0] * (turn + 1), sampling, "trajectory-7"))
        grew = [after > b for after, b in zip(generated(servers), before, strict=True)]
        assert grew.count(True) == 1
        home = grew.index(True) if home is None else home
        assert grew.index(True) == home
    assert client.server_of("trajectory-7") == servers[home][0]


@in_module_loop
async def test_new_rids_spread_by_load(servers, client):
    sampling = SamplingParams(max_new_tokens=3, temperature=1.0)
    await asyncio.gather(*(client.agenerate(GenerateRequest(PROMPTS[0], sampling, f"spread-{i}")) for i in range(6)))
    homes = [client.server_of(f"spread-{i}") for i in range(6)]
    assert homes.count(servers[0][0]) == homes.count(servers[1][0]) == 3
    for i in range(4):  # one at a time, nothing in flight: ties rotate
        await client.agenerate(GenerateRequest(PROMPTS[1], sampling, f"sequential-{i}"))
    assert len({client.server_of(f"sequential-{i}") for i in range(4)}) == 2


@in_module_loop
async def test_pause_resume_resubmits_aborted_requests_to_the_same_greedy_output(servers, client):
    reference = await asyncio.gather(*(client.agenerate(GenerateRequest(p, LONG)) for p in PROMPTS))
    tasks = [
        asyncio.create_task(client.agenerate(GenerateRequest(p, LONG, f"resume-{i}"))) for i, p in enumerate(PROMPTS)
    ]
    await wait_for_tokens(servers[0][1], 5)
    await client.pause()
    await asyncio.sleep(0.2)
    assert not any(t.done() for t in tasks)
    await client.resume()
    results = await asyncio.gather(*tasks)
    assert client.stats()["resubmitted"] >= 1
    for ref, out in zip(reference, results, strict=True):
        assert out.output_ids == ref.output_ids
        assert out.logprobs == pytest.approx(ref.logprobs, abs=1e-4)
        assert out.versions == [client.version] * LONG.max_new_tokens
        assert out.finish_reason.type == "length" and out.finish_reason.matched == LONG.max_new_tokens


@in_module_loop
async def test_dead_server_is_retried_elsewhere_then_reported(servers):
    live = servers[0][0]
    dead = f"127.0.0.1:{free_port()}"
    engine = SGLangEngine([dead, live], retry_backoff=0.01)
    engine._pin("doomed", 0)  # the first attempt goes to the dead server
    out = await engine.agenerate(GenerateRequest(PROMPTS[1], SamplingParams(max_new_tokens=3), "doomed"))
    assert len(out.output_ids) == 3 and engine.stats()["retries"] == 1 and engine.server_of("doomed") == live
    await engine.close()
    nowhere = SGLangEngine([dead], max_retries=2, retry_backoff=0.01)
    with pytest.raises(SGLangError, match="failed 3 times"):
        await nowhere.agenerate(GenerateRequest(PROMPTS[1], SamplingParams(max_new_tokens=3)))
    await nowhere.close()


@in_module_loop
async def test_bad_request_fails_fast_with_the_server_message(client):
    with pytest.raises(SGLangError, match="token ids must be integers"):
        await client.agenerate(GenerateRequest([10**7], SamplingParams(max_new_tokens=2)))
    assert client.stats().get("retries", 0) == 0


@in_module_loop
async def test_update_weights_mid_generation_versions_each_token(servers, client, tiny_model_dir, tmp_path):
    perturbed = perturbed_copy(tiny_model_dir, tmp_path / "perturbed")
    tasks = [
        asyncio.create_task(client.agenerate(GenerateRequest(p, LONG, f"update-{i}"))) for i, p in enumerate(PROMPTS)
    ]
    await wait_for_tokens(servers[0][1], 5)
    await client.update_weights(perturbed, version=1)
    assert client.version == 1
    results = await asyncio.gather(*tasks)
    straddling = [r for r in results if 0 in r.versions and 1 in r.versions]
    assert straddling, [sorted(set(r.versions)) for r in results]
    for prompt, out in zip(PROMPTS, results, strict=True):
        old = out.versions.count(0)
        assert out.versions == [0] * old + [1] * (LONG.max_new_tokens - old)
        if 0 < old < LONG.max_new_tokens:  # the tail continues the head under the new weights
            rest = dataclasses.replace(LONG, max_new_tokens=LONG.max_new_tokens - old)
            tail = await servers[0][1].agenerate(GenerateRequest(prompt + out.output_ids[:old], rest))
            assert tail.output_ids == out.output_ids[old:] and set(tail.versions) == {1}
    for _url, engine in servers:
        assert engine.version == 1
    with pytest.raises(SGLangError, match="weight update failed"):
        await client.update_weights(tmp_path / "missing", version=2)
    assert client.version == 1
    after = await client.agenerate(GenerateRequest(PROMPTS[0], SamplingParams(max_new_tokens=2), "after"))
    assert after.versions == [1, 1]


# ---- launching ----------------------------------------------------------------------------------------------------


def test_sglang_launch_command():
    command = sglang_launch_command(
        "/models/qwen",
        host="0.0.0.0",
        port=31000,
        tp_size=2,
        mem_fraction_static=0.7,
        dtype="bfloat16",
        extra_args=("--enable-metrics",),
    )
    assert command == [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/qwen",
        "--host",
        "0.0.0.0",
        "--port",
        "31000",
        "--tp-size",
        "2",
        "--mem-fraction-static",
        "0.7",
        "--dtype",
        "bfloat16",
        "--enable-metrics",
    ]
    server = SGLangServer.for_model("/models/qwen", port=31001, gpu_ids=[0, 1])
    assert server.command[3:5] == ["--model-path", "/models/qwen"] and server.url == "http://127.0.0.1:31001"


@in_module_loop
async def test_wait_ready_reports_a_dead_process_with_its_log(tmp_path):
    code = "import os, sys; print('visible', os.environ['CUDA_VISIBLE_DEVICES']); sys.exit(3)"
    server = SGLangServer(
        [sys.executable, "-c", code], f"127.0.0.1:{free_port()}", gpu_ids=[2, 3], log_path=tmp_path / "server.log"
    ).start()
    with pytest.raises(RuntimeError, match=r"exited with code 3(.|\n)*visible 2,3"):
        await server.wait_ready(timeout=30)
    assert server.stop() == 3


@in_module_loop
async def test_server_process_runs_our_model_server_and_stops_gracefully(tiny_model_dir, tmp_path):
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "searchgym.serve.model",
        "--model-path",
        str(tiny_model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--context-length",
        "128",
    ]
    server = SGLangServer(command, f"127.0.0.1:{port}", log_path=tmp_path / "server.log").start()
    try:
        await server.wait_ready(timeout=120)
        engine = await SGLangEngine([server.url]).start(timeout=5)
        out = await engine.agenerate(GenerateRequest(PROMPTS[0], SamplingParams(max_new_tokens=4), "proc"))
        assert len(out.output_ids) == 4 and out.versions == [0] * 4
        await engine.close()
    finally:
        code = server.stop(timeout=30)
    assert code == 0, server.log_tail()  # SIGTERM is a clean shutdown
    assert "shutting down" in server.log_tail()


@in_module_loop
async def test_a_reply_past_the_size_cap_is_an_error_not_a_retry(monkeypatch):
    import searchgym.agents.engines.sglang_engine as sglang_engine

    monkeypatch.setattr(sglang_engine, "MAX_REPLY_BYTES", 2048)
    calls = []

    async def generate(request):
        calls.append(await request.json())
        return web.json_response(sglang_answer(list(range(400)), {"type": "length"}, "0"))  # ~10 kB of logprobs

    app = web.Application()
    app.router.add_post("/generate", generate)
    async with serve_app(app) as url:
        engine = SGLangEngine([url], resume_poll_interval=0.01)
        with pytest.raises(SGLangError, match="over the 2048-byte cap"):
            await engine.agenerate(GenerateRequest([1, 2], SamplingParams(max_new_tokens=400)))
        await engine.close()
    assert len(calls) == 1
