"""`OpenAIEngine`: text in, text out over any OpenAI-compatible chat completions endpoint.

For evaluation, LLM judges (it satisfies `searchgym.core.llm_calls.ChatModel`) and QA synthesis. It
retries what is worth retrying (429, 408, 409, 5xx, connection errors, timeouts) with exponential
backoff and jitter, honouring the server's Retry-After (a 200 whose body is not a chat completion is
retried too), and fails fast with the server's message on any other 4xx. Retries and backoff default to
$SEARCHGYM_LLM_RETRIES (5) and $SEARCHGYM_LLM_BACKOFF (0.5 s). Without an API key in the environment it sends no
Authorization header, as local
servers (SGLang, vLLM, `searchgym serve model`) need none.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
from typing import Any

import aiohttp

from searchgym.core.http_session import LoopSession, ReplyTooLarge, read_capped, retry_after_seconds
from searchgym.core.llm_calls import llm_backoff, llm_retries

MAX_REPLY_BYTES = 64 * 2**20  # a chat completion past this is a broken server's, read no further

RETRYABLE_STATUSES = frozenset({408, 409, 429})  # plus every 5xx


class OpenAIError(RuntimeError):
    """A chat completion failed: the server refused it, or it kept failing after every retry."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class _Retryable(Exception):
    """A transient failure, with the wait the server asked for (if any)."""

    def __init__(self, error: OpenAIError, wait: float | None) -> None:
        super().__init__(str(error))
        self.error = error
        self.wait = wait


def parse_openai_spec(spec: str) -> tuple[str, str]:
    """'openai:http://host:8000/v1:qwen/QwQ-32B' -> ('http://host:8000/v1', 'qwen/QwQ-32B'); model defaults to
    'default'.

    The model is whatever follows the first ':' after the URL's path begins, so ports, slashes and
    colons in model names ('llama3:8b') all parse. The path (usually /v1) is required: the API's routes
    hang off it, and a bare host is the usual mistake.
    """
    m = re.fullmatch(r"openai:(https?://[^/\s]+)(/[^:\s]*?)/?(?::(\S+))?", spec)
    if not m or m.group(2) in ("", "/"):
        raise ValueError(f"engine {spec!r}: expected openai:http(s)://host[:port]/v1[:model]")
    return m.group(1) + m.group(2), m.group(3) or "default"


def _error_message(text: str) -> str:
    """The message of an error body: OpenAI's {"error": {"message"}}, SGLang's {"message"}, or the raw text."""
    try:
        body = json.loads(text)
    except ValueError:
        return text[:500]
    error = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    return str(error)[:500]


def _parse_completion(text: str) -> dict[str, Any]:
    """A chat.completion body -> {content, finish_reason, usage, model, id}."""
    try:
        body = json.loads(text)
        choice = body["choices"][0]
        content = choice["message"].get("content")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
        raise OpenAIError(f"malformed chat completion ({type(e).__name__}: {e}): {text[:300]}") from None
    return {
        "content": content or "",
        "finish_reason": choice.get("finish_reason"),
        "usage": body.get("usage") or {},
        "model": body.get("model"),
        "id": body.get("id"),
    }


class OpenAIEngine:
    """Chat completions from an OpenAI-compatible server, with bounded concurrency and patient retries."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str = "OPENAI_API_KEY",
        max_concurrency: int = 16,
        max_retries: int | None = None,
        timeout: float = 600,
        backoff_base: float | None = None,
        backoff_max: float = 30.0,
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"  # base_url ends in /v1, as with the OpenAI SDK
        self.model = model
        self.max_concurrency = max_concurrency
        self.max_retries = llm_retries() if max_retries is None else max_retries
        self.timeout = timeout
        self.backoff_base = llm_backoff() if backoff_base is None else backoff_base
        self.backoff_max = backoff_max
        api_key = os.environ.get(api_key_env)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._sessions = LoopSession(lambda: aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout)))
        self._slots = asyncio.Semaphore(self.max_concurrency)  # replaced with the running loop's own in _http

    async def _http(self) -> aiohttp.ClientSession:
        """The running loop's HTTP session, with a concurrency limit that belongs to the same loop."""
        session, fresh = await self._sessions.get()
        if fresh:
            self._slots = asyncio.Semaphore(self.max_concurrency)
        return session

    async def achat(self, messages: list[dict[str, str]], **sampling: Any) -> str:
        """The assistant's reply to `messages`; `sampling` holds OpenAI fields (temperature, max_tokens, stop, ...)."""
        return (await self.achat_full(messages, **sampling))["content"]

    async def achat_full(self, messages: list[dict[str, str]], **sampling: Any) -> dict[str, Any]:
        """{content, finish_reason, usage, model, id} of one chat completion, retried on transient failures."""
        body = {"model": self.model, "messages": messages, **sampling}
        http = await self._http()
        async with self._slots:
            attempt = 0
            while True:
                try:
                    return await self._attempt(http, body)
                except _Retryable as retry:
                    if attempt >= self.max_retries:
                        raise OpenAIError(
                            f"{self.url}: gave up after {attempt + 1} attempts: {retry.error}", retry.error.status
                        ) from None
                    await asyncio.sleep(self._delay(attempt, retry.wait))
                attempt += 1

    async def _attempt(self, http: aiohttp.ClientSession, body: dict) -> dict[str, Any]:
        """One POST: the parsed completion; raises _Retryable for transient failures, OpenAIError for the rest."""
        try:
            async with http.post(self.url, json=body, headers=self._headers) as resp:
                try:
                    text = (await read_capped(resp, MAX_REPLY_BYTES)).decode("utf-8", "replace")
                except ReplyTooLarge as e:  # the same request would get the same answer: not retried
                    raise OpenAIError(f"{self.url}: {e}", resp.status) from None
                if resp.status == 200:
                    try:
                        return _parse_completion(text)
                    except OpenAIError as e:  # a proxy's error page or a cut body: worth another try
                        raise _Retryable(e, None) from None
                error = OpenAIError(f"HTTP {resp.status}: {_error_message(text)}", resp.status)
                if resp.status < 500 and resp.status not in RETRYABLE_STATUSES:
                    raise error
                raise _Retryable(error, retry_after_seconds(resp.headers))
        except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
            raise _Retryable(OpenAIError(f"{type(e).__name__}: {e}"), None) from None

    def _delay(self, attempt: int, requested: float | None) -> float:
        """The server's Retry-After when given (up to the timeout), else capped exponential backoff with jitter."""
        if requested is not None:
            return min(requested, self.timeout)
        return min(self.backoff_max, self.backoff_base * 2**attempt) * random.uniform(0.5, 1.0)

    async def close(self) -> None:
        """Close the HTTP session."""
        await self._sessions.close()
