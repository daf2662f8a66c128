"""OpenAIEngine against the real model server's /v1/chat/completions, and against a loopback test double of an
OpenAI-compatible endpoint that fails on purpose (429, 5xx, 4xx) to exercise retries."""

import asyncio
import contextlib
import email.utils
import queue
import threading
import time

import pytest
import pytest_asyncio
from aiohttp import web

from searchgym.agents.engines.openai_engine import OpenAIEngine, OpenAIError
from searchgym.core.http_session import retry_after_seconds
from searchgym.envs.llm_judge import LLMJudge
from searchgym.serve.http import serve_app
from tests.agents.servers import model_server

in_module_loop = pytest.mark.asyncio(loop_scope="module")  # shares the loop of the module's server
MESSAGES = [{"role": "user", "content": "Who wrote the report?"}]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server_url(tiny_model_dir):
    async with model_server(tiny_model_dir) as (url, _):
        yield url


def completion(content):
    """A chat.completion body exactly as OpenAI sends it."""
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "gpt-test",
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
    }


def openai_error(message, kind, status, headers=None):
    """An error response exactly as OpenAI sends it."""
    return web.json_response(
        {"error": {"message": message, "type": kind, "param": None, "code": None}}, status=status, headers=headers
    )


class OpenAITestDouble:
    """A test double of an OpenAI-compatible /v1/chat/completions on loopback. It answers from `answers`
    (response factories, used in turn, the last one repeating) after `delay` seconds, and records each
    request's headers and body and the peak number of requests it held at once."""

    def __init__(self, answers, delay=0.0):
        self.answers, self.delay = answers, delay
        self.requests, self.active, self.peak = [], 0, 0

    async def chat(self, request):
        self.requests.append((dict(request.headers), await request.json()))
        self.active += 1
        self.peak = max(self.peak, self.active)
        await asyncio.sleep(self.delay)
        self.active -= 1
        return self.answers[min(len(self.requests), len(self.answers)) - 1]()

    @contextlib.asynccontextmanager
    async def serving(self):
        """Listen on a free loopback port for the block; yields the base URL (ending in /v1)."""
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        async with serve_app(app) as url:
            yield url + "/v1"


@in_module_loop
async def test_chat_through_the_model_server(server_url):
    engine = OpenAIEngine(server_url + "/v1", "tiny", api_key_env="SEARCHGYM_TEST_NO_SUCH_KEY")
    full = await engine.achat_full(MESSAGES, temperature=0.0, max_tokens=12)
    assert full["finish_reason"] == "length" and full["usage"]["completion_tokens"] == 12 and full["model"] == "tiny"
    assert await engine.achat(MESSAGES, temperature=0.0, max_tokens=12) == full["content"]
    word = full["content"][len(full["content"]) // 2 :].split()[0]
    stopped = await engine.achat_full(MESSAGES, temperature=0.0, max_tokens=12, stop=[word])
    assert stopped["finish_reason"] == "stop"
    assert stopped["content"] == full["content"][: full["content"].find(word)]  # the stop string is not included
    with pytest.raises(OpenAIError, match="n must be 1") as error:
        await engine.achat(MESSAGES, n=2)
    assert error.value.status == 400
    await engine.close()


@in_module_loop
async def test_retries_429_then_500_then_succeeds_honouring_retry_after(monkeypatch):
    monkeypatch.setenv("SEARCHGYM_TEST_KEY", "sk-test")
    double = OpenAITestDouble(
        [
            lambda: openai_error("Rate limit reached", "requests", 429, headers={"retry-after-ms": "300"}),
            lambda: openai_error("The server had an error", "server_error", 500),
            lambda: web.json_response(completion("Paris")),
        ]
    )
    async with double.serving() as url:
        engine = OpenAIEngine(url, "gpt-test", api_key_env="SEARCHGYM_TEST_KEY", backoff_base=0.01)
        start = time.monotonic()
        full = await engine.achat_full(MESSAGES, temperature=0.0, max_tokens=5)
        elapsed = time.monotonic() - start
        await engine.close()
    assert full == {
        "content": "Paris",
        "finish_reason": "stop",
        "id": "chatcmpl-test",
        "model": "gpt-test",
        "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
    }
    assert len(double.requests) == 3 and elapsed >= 0.3
    headers, body = double.requests[0]
    assert headers["Authorization"] == "Bearer sk-test"
    assert body == {"model": "gpt-test", "messages": MESSAGES, "temperature": 0.0, "max_tokens": 5}


@in_module_loop
async def test_client_errors_fail_fast_without_an_authorization_header(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    double = OpenAITestDouble([lambda: openai_error("Invalid value for 'temperature'", "invalid_request_error", 400)])
    async with double.serving() as url:
        engine = OpenAIEngine(url, "gpt-test", backoff_base=0.01)
        with pytest.raises(OpenAIError, match="HTTP 400: Invalid value for 'temperature'") as error:
            await engine.achat(MESSAGES, temperature=9)
        await engine.close()
    assert error.value.status == 400 and len(double.requests) == 1 and "Authorization" not in double.requests[0][0]


@in_module_loop
async def test_gives_up_after_max_retries():
    double = OpenAITestDouble([lambda: openai_error("overloaded", "server_error", 503)])
    async with double.serving() as url:
        engine = OpenAIEngine(url, "gpt-test", max_retries=2, backoff_base=0.01)
        with pytest.raises(OpenAIError, match="gave up after 3 attempts: HTTP 503: overloaded") as error:
            await engine.achat(MESSAGES)
        await engine.close()
    assert error.value.status == 503 and len(double.requests) == 3


@in_module_loop
async def test_a_malformed_200_body_is_retried_and_a_cut_reply_reports_its_finish_reason():
    """A proxy's HTML page with status 200 is retried like a 5xx; a reply cut at max_tokens comes back with
    finish_reason "length", which the callers that need a whole reply (judges, synthesis) treat as a failure."""
    cut = completion("The answer is Par")
    cut["choices"][0]["finish_reason"] = "length"
    double = OpenAITestDouble(
        [
            lambda: web.Response(text="<html>502 Bad Gateway</html>", content_type="text/html"),
            lambda: web.json_response(cut),
        ]
    )
    async with double.serving() as url:
        engine = OpenAIEngine(url, "gpt-test", backoff_base=0.01)
        full = await engine.achat_full(MESSAGES, max_tokens=4)
        await engine.close()
    assert len(double.requests) == 2 and (full["content"], full["finish_reason"]) == ("The answer is Par", "length")


def test_retry_settings_come_from_the_environment_and_are_checked(monkeypatch):
    monkeypatch.setenv("SEARCHGYM_LLM_RETRIES", "2")
    monkeypatch.setenv("SEARCHGYM_LLM_BACKOFF", "0.001")
    engine = OpenAIEngine("http://127.0.0.1:9/v1", "m")
    assert (engine.max_retries, engine.backoff_base) == (2, 0.001)
    assert OpenAIEngine("http://127.0.0.1:9/v1", "m", max_retries=0).max_retries == 0  # an argument wins
    for name, bad in [
        ("SEARCHGYM_LLM_RETRIES", "-1"),
        ("SEARCHGYM_LLM_RETRIES", "two"),
        ("SEARCHGYM_LLM_BACKOFF", "nan"),
        ("SEARCHGYM_LLM_BACKOFF", "-0.5"),
    ]:
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=name):
            OpenAIEngine("http://127.0.0.1:9/v1", "m")
        monkeypatch.delenv(name)


@in_module_loop
async def test_connection_errors_are_retried_then_reported():
    async with OpenAITestDouble([]).serving() as url:
        pass  # the double is gone: its port refuses connections now
    engine = OpenAIEngine(url, "gpt-test", max_retries=1, backoff_base=0.01)
    with pytest.raises(OpenAIError, match="gave up after 2 attempts: ClientConnectorError"):
        await engine.achat(MESSAGES)
    await engine.close()


@in_module_loop
async def test_bounded_concurrency_and_llm_judge_as_chat_model():
    verdict = 'Same city.\n```json\n{"rationale": "same", "judgement": "Correct"}\n```'
    double = OpenAITestDouble([lambda: web.json_response(completion(verdict))], delay=0.05)
    async with double.serving() as url:
        engine = OpenAIEngine(url, "judge", max_concurrency=2)
        judge = LLMJudge(engine)
        verdicts = await asyncio.gather(*(judge.ajudge(f"Paris {i}", ["Paris"], question="Capital?") for i in range(6)))
        await engine.close()
    assert all(v.correct for v in verdicts) and len(double.requests) == 6 and double.peak == 2


def test_retry_after_parsing():
    now = time.time()
    assert retry_after_seconds({"retry-after": "2"}) == 2.0
    assert retry_after_seconds({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert retry_after_seconds(
        {"retry-after": email.utils.formatdate(now + 30, usegmt=True)}, now=now
    ) == pytest.approx(30, abs=1)
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({}) is None


def test_sync_judge_calls_each_in_a_new_event_loop():
    verdict = '```json\n{"rationale": "ok", "judgement": "Incorrect"}\n```'
    double = OpenAITestDouble([lambda: web.json_response(completion(verdict))])

    async def serve_in_background(ready, stop):
        async with double.serving() as url:
            ready.put(url)
            while not stop.is_set():
                await asyncio.sleep(0.01)

    ready, stop = queue.Queue(), threading.Event()
    thread = threading.Thread(target=asyncio.run, args=(serve_in_background(ready, stop),))
    thread.start()
    try:
        judge = LLMJudge(OpenAIEngine(ready.get(timeout=10), "judge"))
        assert [judge.judge(f"Lyon {i}", ["Paris"]).correct for i in range(2)] == [False, False]
        assert judge.stats["failures"] == 0 and len(double.requests) == 2
    finally:
        stop.set()
        thread.join()


@in_module_loop
async def test_a_reply_past_the_size_cap_is_refused_read_no_further_and_not_retried(monkeypatch):
    import searchgym.agents.engines.openai_engine as openai_engine

    monkeypatch.setattr(openai_engine, "MAX_REPLY_BYTES", 4096)
    huge = completion("x" * 10_000)
    double = OpenAITestDouble([lambda: web.json_response(huge), lambda: web.json_response(completion("ok"))])
    async with double.serving() as url:
        engine = OpenAIEngine(url, "gpt-test", backoff_base=0.01)
        with pytest.raises(OpenAIError, match="over the 4096-byte cap"):
            await engine.achat(MESSAGES)
        assert await engine.achat(MESSAGES) == "ok"  # a reply within the cap reads as ever
        await engine.close()
    assert len(double.requests) == 2
