"""`serve model` streams: SGLang's native SSE checked with SGLang's own contract, OpenAI's chunks read by the
official `openai` client (content, tool calls, usage), and a client that leaves mid-stream leaks nothing."""

import asyncio
import json

import aiohttp
import openai
import pytest

from tests.agents.servers import generate, post, tool_model_fixtures, wait_for_tokens
from tests.agents.sglang_contract import require_contract
from tests.agents.tool_model import ANSWER, ARGUMENTS, TOOLS, exchange

pytestmark = pytest.mark.asyncio(loop_scope="module")
NAME = "tiny-tools"
PROMPT = [11, 22, 33, 44, 55]
MESSAGES = [{"role": "user", "content": "Who founded it?"}]
GREEDY = {"temperature": 0, "max_tokens": 8, "extra_body": {"ignore_eos": True}}


server_fixture, client_fixture = tool_model_fixtures(NAME)  # `server` and `client`


async def sse(resp):
    """The `data:` payloads of a server-sent event stream, in order (JSON decoded, [DONE] kept as text)."""
    out = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def stream_generate(http, url, body):
    async with http.post(url + "/generate", json={**body, "stream": True}) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        return await sse(resp)


async def loads(http, url):
    async with http.get(url + "/v1/loads") as resp:
        assert resp.status == 200
        return (await resp.json())["loads"][0]


# ---- SGLang's native stream ----------------------------------------------------------------------------------------


async def test_native_stream_is_cumulative_and_ends_with_the_non_streamed_answer(server):
    contract = require_contract()
    url, _ = server
    body = {
        "input_ids": PROMPT,
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True},
    }
    async with aiohttp.ClientSession() as http:
        events = await stream_generate(http, url, {**body, "rid": "s-1"})
        whole = await generate(http, url, **body, rid="s-2")
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    for chunk in chunks:
        contract.decode_GenerateResponse(chunk)  # every event is a GenerateResponse of SGLang's contract
    *partials, last = chunks
    assert len(partials) >= 2
    previous = []
    for chunk in partials:
        meta = chunk["meta_info"]
        assert meta["finish_reason"] is None and meta["id"] == "s-1"
        ids = chunk["output_ids"]
        assert ids[: len(previous)] == previous and len(ids) > len(previous)  # cumulative, growing
        assert meta["completion_tokens"] == len(ids) == len(meta["output_token_logprobs"])
        assert whole["output_ids"][: len(ids)] == ids
        assert [t[0] for t in meta["output_token_logprobs"]] == pytest.approx(
            [t[0] for t in whole["meta_info"]["output_token_logprobs"][: len(ids)]], abs=1e-5
        )
        previous = ids
    drop = {"id", "e2e_latency", "output_token_logprobs"}
    assert last["text"] == whole["text"] and last["output_ids"] == whole["output_ids"]
    assert {k: v for k, v in last["meta_info"].items() if k not in drop} == {
        k: v for k, v in whole["meta_info"].items() if k not in drop
    }
    assert last["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
    assert [t[0] for t in last["meta_info"]["output_token_logprobs"]] == pytest.approx(
        [t[0] for t in whole["meta_info"]["output_token_logprobs"]], abs=1e-5
    )


async def test_native_stream_honours_stream_interval(server):
    url, _ = server
    body = {
        "input_ids": PROMPT,
        "sampling_params": {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True, "stream_interval": 4},
    }
    async with aiohttp.ClientSession() as http:
        events = await stream_generate(http, url, body)
    counts = [e["meta_info"]["completion_tokens"] for e in events[:-1]]
    assert counts[-1] == 10 and all(b - a >= 4 for a, b in zip([0, *counts[:-2]], counts[:-1], strict=True))


async def test_native_stream_refuses_a_batch_and_a_duplicate_rid_before_streaming(server):
    url, engine = server
    async with aiohttp.ClientSession() as http:
        status, out = await post(http, url, "/generate", {"input_ids": [PROMPT, PROMPT], "stream": True})
        assert status == 400 and "one prompt per request" in out["error"]["message"]
        long = asyncio.create_task(
            generate(
                http, url, input_ids=PROMPT, rid="dup", sampling_params={"max_new_tokens": 300, "ignore_eos": True}
            )
        )
        await wait_for_tokens(engine, 2)
        status, out = await post(http, url, "/generate", {"input_ids": PROMPT, "rid": "dup", "stream": True})
        assert status == 400 and "Duplicate request ID" in out["error"]["message"]
        async with http.post(url + "/abort_request", json={"rid": "dup"}) as resp:
            assert resp.status == 200
        assert (await long)["meta_info"]["finish_reason"]["type"] == "abort"


# ---- OpenAI's stream, through the openai client ---------------------------------------------------------------------


async def collect(stream):
    """(content, tool calls by index, finish_reason, usage, chunks) of an openai chat stream."""
    content, calls, finish, usage, chunks = "", {}, None, None, []
    async for chunk in stream:
        chunks.append(chunk)
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
                entry["id"] = call.id or entry["id"]
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, calls, finish, usage, chunks


async def test_streamed_chat_equals_the_non_streamed_reply_with_usage(client):
    plain = await client.chat.completions.create(model=NAME, messages=MESSAGES, **GREEDY)
    stream = await client.chat.completions.create(
        model=NAME, messages=MESSAGES, stream=True, stream_options={"include_usage": True}, **GREEDY
    )
    content, calls, finish, usage, chunks = await collect(stream)
    assert content == plain.choices[0].message.content and not calls
    assert finish == plain.choices[0].finish_reason == "length"
    assert usage == plain.usage and usage.completion_tokens == 8
    assert chunks[0].object == "chat.completion.chunk" and chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1 and chunks[-1].choices == []  # the usage chunk has no choices
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 2  # pieces arrive as generated
    assert all(c.usage is None for c in chunks[:-1])


async def test_streamed_chat_cuts_stop_strings_like_the_non_streamed_reply(client):
    free = (await client.chat.completions.create(model=NAME, messages=MESSAGES, **GREEDY)).choices[0].message.content
    stop = free[len(free) // 2 : len(free) // 2 + 2]
    assert stop.strip()
    plain = await client.chat.completions.create(model=NAME, messages=MESSAGES, stop=[stop], **GREEDY)
    stream = await client.chat.completions.create(model=NAME, messages=MESSAGES, stop=[stop], stream=True, **GREEDY)
    content, _, finish, usage, _ = await collect(stream)
    assert content == plain.choices[0].message.content == free[: free.find(stop)]
    assert finish == plain.choices[0].finish_reason == "stop" and usage is None


async def test_streamed_tool_call_parses_into_the_same_call(client):
    first, _ = exchange()
    plain = await client.chat.completions.create(model=NAME, messages=first, tools=TOOLS, temperature=0)
    stream = await client.chat.completions.create(
        model=NAME, messages=first, tools=TOOLS, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    content, calls, finish, usage, _ = await collect(stream)
    (expected,) = plain.choices[0].message.tool_calls
    assert finish == "tool_calls" and content == "" and list(calls) == [0]
    assert calls[0]["name"] == expected.function.name == "search" and calls[0]["id"].startswith("call_")
    assert json.loads(calls[0]["arguments"]) == json.loads(expected.function.arguments) == ARGUMENTS
    assert usage == plain.usage
    # the openai client's own accumulation gives the same message
    async with client.beta.chat.completions.stream(model=NAME, messages=first, tools=TOOLS, temperature=0) as s:
        final = await s.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    assert call.function.name == "search" and json.loads(call.function.arguments) == ARGUMENTS
    # and the answer turn streams its content
    _, second = exchange()
    answer = await client.chat.completions.create(model=NAME, messages=second, tools=TOOLS, temperature=0, stream=True)
    content, calls, finish, _, _ = await collect(answer)
    assert content == ANSWER and not calls and finish == "stop"


async def test_streamed_completions_equal_the_non_streamed_text(client):
    for echo in (False, True):
        kwargs = {
            "model": NAME,
            "prompt": "Where was the founder born?",
            "max_tokens": 7,
            "temperature": 0,
            "echo": echo,
            "extra_body": {"ignore_eos": True},
        }
        plain = await client.completions.create(**kwargs)
        text, finish, usage = "", None, None
        async for chunk in await client.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        ):
            assert chunk.object == "text_completion"
            for choice in chunk.choices:
                text += choice.text
                finish = choice.finish_reason or finish
            usage = chunk.usage or usage
        assert text == plain.choices[0].text and finish == "length" and usage == plain.usage


async def test_a_pause_that_aborts_a_streamed_chat_is_an_error_the_client_raises(server, client):
    url, engine = server
    stream = await client.chat.completions.create(
        model=NAME, messages=MESSAGES, stream=True, temperature=0, max_tokens=900, extra_body={"ignore_eos": True}
    )
    async with aiohttp.ClientSession() as http:
        try:
            with pytest.raises(openai.APIError, match="aborted"):
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        await post(http, url, "/pause_generation", {"mode": "abort"})
        finally:  # the module's other tests share this server
            await post(http, url, "/continue_generation", {})


async def test_stream_options_need_stream_and_known_fields(client):
    with pytest.raises(openai.BadRequestError, match="stream_options"):
        await client.chat.completions.create(
            model=NAME, messages=MESSAGES, max_tokens=2, stream_options={"include_usage": True}
        )
    with pytest.raises(openai.BadRequestError, match="include_obfuscation"):
        await client.chat.completions.create(
            model=NAME, messages=MESSAGES, max_tokens=2, stream=True, stream_options={"include_obfuscation": True}
        )


# ---- a client that leaves -------------------------------------------------------------------------------------------


async def wait_idle(http, url, engine, timeout=10.0):
    """Until the server reports nothing in flight and the engine's batch is empty."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        load = await loads(http, url)
        if load["num_running_reqs"] == 0 and load["num_waiting_reqs"] == 0 and engine.stats()["running"] == 0:
            return
        assert asyncio.get_running_loop().time() < deadline, (load, engine.stats())
        await asyncio.sleep(0.02)


async def settled_tokens(engine, timeout=10.0):
    """The engine's generated-token count once it stops growing (a step already running when the request was
    cancelled still finishes)."""
    deadline = asyncio.get_running_loop().time() + timeout
    count = engine.stats()["generated_tokens"]
    while True:
        await asyncio.sleep(0.2)
        now = engine.stats()["generated_tokens"]
        if now == count:
            return now
        assert asyncio.get_running_loop().time() < deadline, "the engine keeps generating"
        count = now


async def test_a_client_leaving_mid_stream_aborts_its_request(server, client):
    url, engine = server
    body = {
        "input_ids": PROMPT,
        "rid": "leaver",
        "stream": True,
        "sampling_params": {"max_new_tokens": 900, "temperature": 0, "ignore_eos": True},
    }
    async with aiohttp.ClientSession() as http:
        async with aiohttp.ClientSession() as leaving:
            resp = await leaving.post(url + "/generate", json=body)
            seen = 0
            async for raw in resp.content:
                seen += raw.startswith(b"data: ")
                if seen == 3:
                    break
            assert (await loads(http, url))["num_running_reqs"] == 1
            at_close = engine.stats()["generated_tokens"]
            resp.close()  # drop the connection mid-stream
        await wait_idle(http, url, engine)
        assert await settled_tokens(engine) - at_close < 50  # stopped within a few steps, far from its 900 tokens
        assert engine._running == []  # the engine dropped its row
        # its rid is free again
        again = await generate(
            http, url, input_ids=PROMPT, rid="leaver", sampling_params={"max_new_tokens": 2, "ignore_eos": True}
        )
        assert again["meta_info"]["completion_tokens"] == 2

        # the same through the openai client, closing its stream early
        stream = await client.chat.completions.create(
            model=NAME, messages=MESSAGES, stream=True, temperature=0, max_tokens=900, extra_body={"ignore_eos": True}
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        at_close = engine.stats()["generated_tokens"]
        await stream.close()
        await wait_idle(http, url, engine)
        assert await settled_tokens(engine) - at_close < 50
        assert engine._running == []
