"""WebSearch: the search tool on the live web, through the Serper API, behind the SearchBackend protocol.

Serper wire format: ``POST https://google.serper.dev/search`` with headers ``X-API-KEY`` and
``Content-Type: application/json`` and body ``{"q": query, "num": k}``; the answer's ``organic``
list holds ``{"title", "link", "snippet", "position"}``. Requests are concurrency-limited, time-
bounded and retried with exponential backoff on 429, 5xx, timeouts and dropped connections.
Other providers plug in by implementing `SearchBackend`; `PROVIDERS` names the built-in ones.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any

import aiohttp

from searchgym.core.cost_meter import charge
from searchgym.core.http_session import LoopSession, read_capped, retry_after_seconds
from searchgym.envs.tools.base import BackendError, SearchHit
from searchgym.envs.tools.url_safety import UrlPolicy

SERPER_ENDPOINT = "https://google.serper.dev/search"
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
MAX_REPLY_BYTES = 8 * 2**20  # a provider's answer past this is a bad answer, read no further (100 hits are ~100 kB)


class MissingAPIKey(ValueError):
    """No API key was given for a web search provider that needs one."""


@dataclass
class WebSearchOptions:
    """How `WebSearch` asks its provider: WebQA-v0's `search_options` env kwarg, by field name."""

    endpoint: str = SERPER_ENDPOINT
    block: tuple[str, ...] | list[str] = ()  # domains dropped from the results (benchmark answer pages)
    timeout: float = 15.0
    connect_timeout: float = 5.0
    retries: int = 3
    backoff: float = 0.5
    max_backoff: float = 8.0
    max_concurrency: int = 8
    require_key: bool = True  # False: a replay-only cache answers, no key needed
    extra_params: dict[str, Any] | None = None  # sent with every query


class WebSearch:
    """SearchBackend for the Serper Google-search API (or anything speaking its wire format).

    `policy` (shared with the page tool) replaces the one `options.block` would make."""

    def __init__(
        self, api_key: str | None = None, options: WebSearchOptions | None = None, *, policy: UrlPolicy | None = None
    ):
        o = self.options = options or WebSearchOptions()
        self.api_key = api_key if api_key is not None else os.environ.get("SERPER_API_KEY")
        if o.require_key and not self.api_key:
            raise MissingAPIKey(
                "web search needs a Serper API key: set SERPER_API_KEY or pass api_key=... "
                "(get one at https://serper.dev)"
            )
        self.endpoint = o.endpoint
        self.policy = policy or UrlPolicy(block=o.block)
        self.timeout, self.connect_timeout = o.timeout, o.connect_timeout
        self.retries, self.backoff, self.max_backoff = o.retries, o.backoff, o.max_backoff
        self.max_concurrency = o.max_concurrency
        self.extra_params = dict(o.extra_params or {})
        self.counters: Counter[str] = Counter()
        self._sessions = LoopSession(self._new_session)
        self._sem: asyncio.Semaphore | None = None

    async def search(self, query: str, k: int) -> list[SearchHit]:
        """The top-k organic results for query, blocklisted domains removed."""
        query = query.strip()
        if not query:
            return []
        if not self.api_key:
            raise BackendError("web search has no API key: set SERPER_API_KEY")
        session, fresh = await self._sessions.get()
        if fresh or self._sem is None:  # a semaphore belongs to one loop, like the session
            self._sem = asyncio.Semaphore(self.max_concurrency)
        self.counters["requests"] += 1
        body = {"q": query, "num": int(k), **self.extra_params}
        headers = {"X-API-KEY": self.api_key, "Content-Type": "application/json"}
        timeout = aiohttp.ClientTimeout(total=self.timeout, sock_connect=self.connect_timeout)
        last = "no attempt made"
        async with self._sem:
            for attempt in range(self.retries + 1):
                if attempt:
                    self.counters["retries"] += 1
                try:
                    charge(api_calls=1)  # providers bill each request, a retried one included
                    async with session.post(self.endpoint, json=body, headers=headers, timeout=timeout) as resp:
                        if resp.status in RETRY_STATUS:
                            last = f"the search provider answered HTTP {resp.status}"
                            await self._sleep(attempt, retry_after_seconds(resp.headers))
                            continue
                        if resp.status in (401, 403):
                            self.counters["errors"] += 1
                            raise BackendError(f"the search provider refused the API key (HTTP {resp.status})")
                        if resp.status >= 400:
                            self.counters["errors"] += 1
                            raise BackendError(f"the search provider answered HTTP {resp.status}")
                        data = json.loads(await read_capped(resp, MAX_REPLY_BYTES))
                except (TimeoutError, aiohttp.ClientConnectionError) as e:
                    last = (
                        "the search provider timed out"
                        if isinstance(e, asyncio.TimeoutError)
                        else f"could not reach the search provider ({type(e).__name__})"
                    )
                    await self._sleep(attempt, None)
                    continue
                except (aiohttp.ClientError, ValueError, RecursionError) as e:  # ReplyTooLarge is a ValueError
                    self.counters["errors"] += 1
                    raise BackendError(f"bad answer from the search provider: {type(e).__name__}") from None
                return self._hits(data, k)
        self.counters["errors"] += 1
        raise BackendError(f"{last} (after {self.retries + 1} attempts)")

    def stats(self) -> dict[str, Any]:
        """Cumulative search counters (requests, retries, seconds waited before retries, errors, blocked results)."""
        return {"search": dict(self.counters)}

    async def close(self) -> None:
        """Close this loop's HTTP session."""
        await self._sessions.close()

    def __getstate__(self) -> dict[str, Any]:
        """Pickles without its loop-bound semaphore (a copy makes its own)."""
        return {**self.__dict__, "_sem": None}

    def _hits(self, data: Any, k: int) -> list[SearchHit]:
        """SearchHits from a Serper answer; unusable rows and blocklisted urls are dropped."""
        if not isinstance(data, dict):
            self.counters["errors"] += 1
            raise BackendError("bad answer from the search provider: not a JSON object")
        hits: list[SearchHit] = []
        for i, row in enumerate(data.get("organic") or []):
            if not isinstance(row, dict) or not isinstance(row.get("link"), str):
                continue
            link = row["link"]
            if self.policy.is_blocked(link):
                self.counters["blocked_results"] += 1
                continue
            position = row.get("position")
            position = position if isinstance(position, (int, float)) else i + 1
            hits.append(
                SearchHit(
                    doc_id=link,
                    title=str(row.get("title") or link),
                    url=link,
                    snippet=str(row.get("snippet") or ""),
                    score=1.0 / max(float(position), 1.0),
                )
            )
            if len(hits) >= k:
                break
        self.counters["ok"] += 1
        return hits

    async def _sleep(self, attempt: int, retry_after: float | None) -> None:
        """Exponential backoff before the next attempt (honouring Retry-After, capped); none after the last."""
        if attempt >= self.retries:
            return
        delay = min(self.max_backoff, self.backoff * (2**attempt))
        if retry_after is not None:  # seconds, HTTP date or retry-after-ms, as the provider sent it
            delay = min(self.max_backoff, max(delay, retry_after))
        self.counters["retry_wait_s"] += delay
        await asyncio.sleep(delay)

    def _new_session(self) -> aiohttp.ClientSession:
        """A pooled session for the running loop (LoopSession makes one per loop)."""
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self.max_concurrency), trust_env=False)


PROVIDERS = {"serper": WebSearch}
