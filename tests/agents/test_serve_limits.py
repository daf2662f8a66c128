"""`serve model` under one client's big request: others stay fast, limits answer a 400 naming the field, and
anonymous requests leave the prefix cache to the conversations (issue 26 items 2 and 5)."""

import asyncio
import os
import time

import openai
import pytest

from searchgym.agents.engines.torch_engine import EngineLimits, TorchEngine
from searchgym.agents.engines.types import GenerateRequest, SamplingParams
from searchgym.serve.model import ModelServerSettings, create_app, run_server
from tests.agents.servers import CONTEXT, GREEDY, PROMPT, generate, model_server, post

pytestmark = pytest.mark.asyncio(loop_scope="module")

SMALL = {"input_ids": PROMPT[:4], "sampling_params": {"max_new_tokens": 4, **GREEDY}}
WORDS = "the quick brown fox jumps over the lazy dog while searching for answers "


def text_of(chars: int) -> str:
    return (WORDS * (chars // len(WORDS) + 1))[:chars]


async def timed(coro):
    start = time.perf_counter()
    result = await coro
    return time.perf_counter() - start, result


async def health(http, url):
    async with http.get(url + "/health") as resp:
        assert resp.status == 200


# ---- no client stalls the others ------------------------------------------------------------------------------


async def test_health_and_small_requests_stay_fast_while_a_huge_prompt_is_tokenized(tiny_model_dir, http):
    big = text_of(3_000_000)  # accepted by this server's --max-prompt-chars, so it really is tokenized
    async with model_server(tiny_model_dir, max_prompt_chars=len(big)) as (url, _engine):
        started = time.perf_counter()
        huge = asyncio.ensure_future(
            post(http, url, "/generate", {"text": big, "sampling_params": {"max_new_tokens": 1}})
        )
        await asyncio.sleep(0.2)  # its body is read and its tokenizing has begun
        during = []  # every round begun before the huge one ended, so a loop blocked by it shows in some round
        while not huge.done():
            rounds = await asyncio.gather(
                timed(health(http, url)),
                timed(generate(http, url, **SMALL)),
                timed(generate(http, url, text="a small prompt", sampling_params={"max_new_tokens": 4, **GREEDY})),
            )
            during.append([seconds for seconds, _ in rounds])
        status, out = await huge
        big_s = time.perf_counter() - started
    # the prompt was tokenized in full, then refused: it is longer than the context (naming the field)
    assert status == 400 and out["error"]["message"].startswith("text: The input (")
    assert "longer than the model's context length" in out["error"]["message"]
    assert len(during) >= 3, "too few small requests ran while the huge prompt was being tokenized"
    worst = max(max(r) for r in during)
    print(
        f"\nhuge prompt ({len(big):,} chars): {big_s:.2f} s; {len(during)} rounds of /health, small /generate "
        f"(ids), small /generate (text) meanwhile; worst {worst * 1000:.0f} ms"
    )
    assert worst < 2.0


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/generate", {"text": "x"}, "text"),
        ("/generate", {"text": ["short", "x"]}, "text[1]"),
        ("/v1/completions", {"prompt": "x"}, "prompt"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, "messages"),
    ],
)
async def test_a_10_mb_prompt_is_refused_at_once_naming_the_field(server, http, path, body, field):
    url, _ = server
    ten_mb = text_of(10 * 2**20)
    if "text" in body:
        body = {"text": ten_mb if isinstance(body["text"], str) else ["short", ten_mb]}
    elif "prompt" in body:
        body = {"prompt": ten_mb}
    else:
        body = {"messages": [{"role": "user", "content": ten_mb}]}
    seconds, (status, out) = await timed(post(http, url, path, body))
    message = out["error"]["message"]
    assert status == 400 and message.startswith(f"{field}: the prompt holds {len(ten_mb) // 1000}")
    assert f"at most {32 * CONTEXT} per prompt (--max-prompt-chars)" in message
    assert seconds < 2.0  # refused before tokenizing (a tokenizing takes ~20 s on a slow CPU)
    await health(http, url)


async def test_reply_limit_is_a_setting_named_in_each_dialect(tiny_model_dir, http):
    async with model_server(tiny_model_dir, max_reply_tokens=8) as (url, _engine):
        status, out = await post(
            http, url, "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 9}}
        )
        assert status == 400 and out["error"]["message"].startswith("sampling_params.max_new_tokens=9 is above")
        assert "--max-reply-tokens" in out["error"]["message"]
        assert (await generate(http, url, input_ids=PROMPT, sampling_params={"max_new_tokens": 8, **GREEDY}))[
            "meta_info"
        ]["completion_tokens"] == 8
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as client:
            with pytest.raises(openai.BadRequestError, match=r"max_tokens=9 is above .*--max-reply-tokens"):
                await client.completions.create(model="m", prompt="hello", max_tokens=9)
            with pytest.raises(openai.BadRequestError, match=r"max_completion_tokens=20 is above"):
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], max_completion_tokens=20
                )
            # unset, the reply may take what the limit allows (not the rest of the context)
            reply = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], temperature=0, extra_body={"ignore_eos": True}
            )
            assert reply.usage.completion_tokens == 8 and reply.choices[0].finish_reason == "length"
        status, out = await post(
            http, url, "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": CONTEXT}}
        )
        message = out["error"]["message"]  # SGLang's own words first (clients parse them), then the field
        assert status == 400 and message.startswith("Requested token count exceeds the model's maximum context length")
        assert f"{len(PROMPT)} tokens from the input messages and {CONTEXT} tokens" in message
        assert message.endswith("(field: sampling_params.max_new_tokens)")
        # unset, max_new_tokens is cut to what fits, as SGLang's scheduler does (no 400 for what a client never set)
        long_prompt = (PROMPT * CONTEXT)[: CONTEXT - 3]
        status, out = await post(
            http,
            url,
            "/generate",
            {"input_ids": long_prompt, "sampling_params": {"temperature": 0, "ignore_eos": True}},
        )
        assert status == 200 and len(out["output_ids"]) == 2 and out["meta_info"]["finish_reason"]["type"] == "length"


@pytest.mark.parametrize(
    "setting, value",
    [
        ("max_prompt_chars", 0),
        ("max_reply_tokens", -1),
        ("context_length", 1),
        ("max_prompt_chars", "100"),
        ("max_reply_tokens", True),
        ("max_running_requests", 0),
    ],
)
async def test_limit_settings_are_checked_when_given(tiny_model_dir, setting, value):
    engine = TorchEngine(tiny_model_dir)
    try:
        with pytest.raises(ValueError, match=rf"^{setting} \(--{setting.replace('_', '-')}\) must be an integer"):
            create_app(engine, ModelServerSettings(model_path="m", **{setting: value}))
    finally:
        await engine.close()
    if setting != "max_running_requests":  # run_server refuses before spending time on loading a model
        with pytest.raises(ValueError, match=rf"^{setting} "):
            settings = ModelServerSettings(model_path="/nonexistent-model", port=0, **{setting: value})
            await asyncio.to_thread(run_server, settings)


# ---- the prefix cache keeps conversations ------------------------------------------------------------------------


async def test_anonymous_requests_over_http_keep_no_prefix_and_evict_no_conversation(server, http):
    url, engine = server
    turn = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4, **GREEDY}, "rid": "conversation-1"}
    first = await generate(http, url, **turn)
    entries = len(engine.prefix_cache)
    assert "conversation-1" in engine.prefix_cache._entries and not any(  # nor does the warm-up keep one
        rid.startswith("HEALTH_CHECK") for rid in engine.prefix_cache._entries
    )
    # 400 native requests without a rid (a batch and singles, streamed too) and 40 OpenAI ones
    await generate(
        http, url, input_ids=[[i % 50 + 1, 7, 8] for i in range(300)], sampling_params={"max_new_tokens": 2, **GREEDY}
    )
    await asyncio.gather(
        *(generate(http, url, input_ids=[i + 1, 9], sampling_params={"max_new_tokens": 2}) for i in range(90))
    )
    for i in range(10):
        async with http.post(
            url + "/generate", json={"input_ids": [i + 1, 3], "stream": True, "sampling_params": {"max_new_tokens": 2}}
        ) as resp:
            assert resp.status == 200 and (await resp.read()).endswith(b"data: [DONE]\n\n")
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as client:
        await asyncio.gather(
            *(client.completions.create(model="m", prompt=f"hello {i}", max_tokens=2) for i in range(20))
        )
        await asyncio.gather(
            *(
                client.chat.completions.create(
                    model="m", max_tokens=2, messages=[{"role": "user", "content": f"hi {i}"}]
                )
                for i in range(20)
            )
        )
    assert len(engine.prefix_cache) == entries and "conversation-1" in engine.prefix_cache._entries
    reused = engine.stats()["reused_tokens"]
    prompt = PROMPT + first["output_ids"] + [12, 13]
    await generate(http, url, **{**turn, "input_ids": prompt})
    assert engine.stats()["reused_tokens"] - reused == len(PROMPT) + len(first["output_ids"]) - 1


async def test_20000_anonymous_requests_leave_the_cache_flat_and_the_conversation_in_it(tiny_model_dir):
    engine = TorchEngine(tiny_model_dir, limits=EngineLimits(max_batch_size=4096))
    once = SamplingParams(max_new_tokens=1, temperature=0.0, ignore_eos=True)
    try:
        conversation = [5, 6, 7, 8, 9, 10]
        await engine.agenerate(GenerateRequest(conversation, once, "conversation"))
        entries, nbytes, rss = len(engine.prefix_cache), engine.prefix_cache.nbytes, _rss_mb()
        for chunk in range(4):  # rid "" (in-process anonymous) and rids a server made up (keep_prefix=False)
            await asyncio.gather(
                *(
                    engine.agenerate(GenerateRequest([11, 12, i % 200 + 1], once, rid), keep_prefix=False)
                    for i in range(5000)
                    for rid in [f"made-up-{chunk}-{i}" if chunk % 2 else ""]
                )
            )
            assert (len(engine.prefix_cache), engine.prefix_cache.nbytes) == (entries, nbytes)
        print(
            f"\n20,000 anonymous requests: prefix cache {entries} entry, {nbytes} bytes before and after; "
            f"RSS {rss:.0f} -> {_rss_mb():.0f} MB"
        )
        reused = engine.stats()["reused_tokens"]
        await engine.agenerate(GenerateRequest(conversation + [3, 4], once, "conversation"))
        assert engine.stats()["reused_tokens"] - reused == len(conversation)
    finally:
        await engine.close()


def _rss_mb() -> float:
    """This process's resident memory now (not its peak)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.parametrize("path, dialect", [("/generate", b'"code": 408'), ("/v1/chat/completions", b'"type"')])
async def test_a_body_that_stalls_after_its_head_is_a_408_on_the_model_server(tiny_model_dir, http, path, dialect):
    """--body-timeout holds for the model server's routes too: a client that sends a head and part of a body cannot
    keep its connection and handler forever (4,096 of them would fill the connection cap)."""
    from searchgym.serve.http import serve_app
    from searchgym.serve.limits import ServerLimits

    engine = TorchEngine(tiny_model_dir, seed=0)
    try:
        app = create_app(engine, ModelServerSettings(model_path=str(tiny_model_dir), context_length=CONTEXT))
        async with serve_app(app, limits=ServerLimits(body_timeout=1.0), shutdown_timeout=0.5) as url:
            reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
            writer.write(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                'Content-Length: 100\r\n\r\n{"input_ids": '.encode()
            )  # then nothing more
            status, out = await post(http, url, "/generate", SMALL)  # another client, meanwhile
            assert status == 200 and len(out["output_ids"]) == 4
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            body = await asyncio.wait_for(reader.read(400), 5)
            assert head.startswith(b"HTTP/1.1 408") and b"body_timeout" in body and dialect in body, (head, body)
            writer.close()
    finally:
        await engine.close()
