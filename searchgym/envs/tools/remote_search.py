"""RemoteSearch: a SearchBackend + PageBackend over the Search-R1 / ASearcher retrieval API.

Talks to `searchgym serve search` or to an existing Search-R1 retrieval server (which has `/retrieve`
but no `/access`). One pooled aiohttp session per event loop; every request has a timeout; connection
errors, timeouts, 5xx and unreadable bodies are retried with exponential backoff, failing over across
several server addresses (a failed server is skipped for `dead_s` seconds, then tried again). Whatever
still fails is raised as BackendError, which SearchEnv turns into an observation and a counter.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

import aiohttp

from searchgym.envs.tools.base import BackendError, Page, PageNotFound, SearchHit
from searchgym.envs.tools.http_session import LoopSession

_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


class _Retryable(Exception):
    """A failure worth another try (on this or another server); `dead` marks the server as down."""

    def __init__(self, message: str, *, dead: bool) -> None:
        super().__init__(message)
        self.dead = dead


class RemoteSearch:
    """Search and page access against one or more retrieval servers, with retries and failover."""

    def __init__(self, servers: str | Sequence[str], *, timeout: float = 10.0, connect_timeout: float | None = None,
                 retries: int = 2, backoff: float = 0.1, max_backoff: float = 2.0, dead_s: float = 10.0,
                 max_connections: int = 256) -> None:
        urls = [servers] if isinstance(servers, str) else list(servers)
        if not urls or not all(isinstance(u, str) and u.strip() for u in urls):
            raise ValueError(f"RemoteSearch needs at least one server url, got {servers!r}")
        if timeout <= 0 or retries < 0:
            raise ValueError("timeout must be positive and retries at least 0")
        self.servers = [u.strip().rstrip("/") for u in urls]
        self.timeout, self.retries, self.backoff, self.max_backoff = timeout, retries, backoff, max_backoff
        self.dead_s = dead_s
        self._dead_until = {s: 0.0 for s in self.servers}
        self._next = 0  # round-robin start among live servers
        self._stats = {"requests": 0, "retries": 0, "failovers": 0, "errors": 0}
        client_timeout = aiohttp.ClientTimeout(total=timeout, connect=connect_timeout or timeout)
        self._sessions = LoopSession(lambda: aiohttp.ClientSession(
            timeout=client_timeout, connector=aiohttp.TCPConnector(limit=max_connections)))

    # ---- SearchBackend / PageBackend ----------------------------------------------------------------

    async def search(self, query: str, k: int = 5) -> list[SearchHit]:
        """SearchBackend: the top-k hits for one query."""
        return (await self.search_batch([query], k))[0]

    async def search_batch(self, queries: Sequence[str], k: int = 5) -> list[list[SearchHit]]:
        """Top-k hits for each query, in one /retrieve call."""
        if not queries:
            return []
        body = await self._post("/retrieve", {"queries": list(queries), "topk": k, "return_scores": True})
        result = body.get("result") if isinstance(body, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            raise BackendError(f"retrieval server sent a malformed /retrieve response: {str(body)[:200]}")
        return [[_hit(item, rank) for rank, item in enumerate(items or [])][:k] for items in result]

    async def fetch(self, url: str) -> Page:
        """PageBackend: the page at url via /access; PageNotFound for a null row."""
        body = await self._post("/access", {"urls": [url]})
        result = body.get("result") if isinstance(body, dict) else None
        if not isinstance(result, list) or len(result) != 1:
            raise BackendError(f"retrieval server sent a malformed /access response: {str(body)[:200]}")
        row = result[0]
        if row is None:
            raise PageNotFound(f"unknown url {url!r}: there is no such page; access a url taken from search results")
        if not isinstance(row, dict):
            raise BackendError(f"retrieval server sent a malformed page row: {str(row)[:200]}")
        return _page(row, url)

    def stats(self) -> dict[str, int]:
        """Counters for info (SearchEnv merges every backend's stats() into info["backend"])."""
        return {f"remote_{key}": value for key, value in self._stats.items()}

    async def health(self) -> dict[str, Any]:
        """GET /health of the first live server (raises BackendError when none answers)."""
        return await self._request("GET", "/health", None)

    async def close(self) -> None:
        """Close this loop's session (others close with their loops)."""
        await self._sessions.close()

    # ---- transport ------------------------------------------------------------------------------------

    async def _post(self, path: str, payload: dict) -> Any:
        """POST a JSON payload with retries and failover; the parsed JSON reply."""
        return await self._request("POST", path, payload)

    def _order(self) -> list[str]:
        """Servers to try: live ones round-robin first, then those marked dead (soonest back first)."""
        now = time.monotonic()
        n = len(self.servers)
        rotated = [self.servers[(self._next + i) % n] for i in range(n)]
        self._next = (self._next + 1) % n
        live = [s for s in rotated if self._dead_until[s] <= now]
        dead = sorted((s for s in rotated if self._dead_until[s] > now), key=self._dead_until.__getitem__)
        return live + dead

    async def _request(self, method: str, path: str, payload: dict | None) -> Any:
        """One call with retries: every try goes to the next server in order; backoff between rounds."""
        self._stats["requests"] += 1
        session, _ = await self._sessions.get()
        errors: list[str] = []
        order = self._order()
        n = len(order)
        for attempt in range((self.retries + 1) * n):  # worst case (retries + 1) * servers * timeout, plus backoff
            if attempt and attempt % n == 0:  # a full round failed: back off before the next
                self._stats["retries"] += 1
                await asyncio.sleep(min(self.backoff * 2 ** (attempt // n - 1), self.max_backoff))
            elif attempt:
                self._stats["failovers"] += 1
            server = order[attempt % n]
            try:
                return await self._once(session, method, server + path, payload)
            except _Retryable as e:
                errors.append(f"{server}: {e}")
                if e.dead:
                    self._dead_until[server] = time.monotonic() + self.dead_s
        self._stats["errors"] += 1
        raise BackendError(f"retrieval server unavailable after {len(errors)} tries ({errors[-1]})")

    async def _once(self, session: aiohttp.ClientSession, method: str, url: str, payload: dict | None) -> Any:
        """One HTTP exchange: JSON back, _Retryable for transient failures, BackendError for final ones."""
        try:
            async with session.request(method, url, json=payload) as resp:
                raw = await resp.read()
                status = resp.status
        except asyncio.TimeoutError:
            raise _Retryable(f"no answer within {self.timeout:g} s", dead=True) from None
        except aiohttp.ClientConnectorError as e:
            raise _Retryable(f"cannot connect: {e.os_error or e}", dead=True) from None
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as e:
            raise _Retryable(f"connection dropped mid-response: {type(e).__name__}", dead=False) from None
        except aiohttp.ClientError as e:
            raise _Retryable(f"{type(e).__name__}: {e}", dead=True) from None
        if status in _RETRY_STATUS:
            raise _Retryable(f"HTTP {status}: {_error_text(raw)}", dead=status != 429)
        if status == 404 and url.endswith("/access"):
            self._stats["errors"] += 1
            raise BackendError("page access unsupported: this retrieval server has no /access endpoint "
                               "(a Search-R1 server only retrieves); use the search results' text instead")
        if status >= 400:
            self._stats["errors"] += 1
            raise BackendError(f"retrieval server refused the request: HTTP {status}: {_error_text(raw)}")
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):  # truncated, non-JSON or non-UTF-8 body
            raise _Retryable(f"unreadable response body ({len(raw)} bytes, not JSON)", dead=False) from None


def _error_text(raw: bytes) -> str:
    """The server's error message: {"error": ...} or {"detail": ...} (FastAPI) or the body's head."""
    try:
        body = json.loads(raw)
        if isinstance(body, dict):
            message = body.get("error") or body.get("detail") or body.get("message")
            if message:
                return str(message)[:300]
    except (ValueError, RecursionError):
        pass
    return raw[:300].decode("utf-8", "replace").strip() or "(empty body)"


def _split_contents(contents: str) -> tuple[str, str]:
    """Search-R1's corpus row form: the (quoted) title on the first line, the text after it."""
    title, _, text = contents.partition("\n")
    return title.strip().strip('"'), text


def _hit(item: Any, rank: int) -> SearchHit:
    """A /retrieve item ({"document": doc, "score": s} or a bare doc) as a SearchHit."""
    if not isinstance(item, dict):
        raise BackendError(f"retrieval server sent a malformed hit: {str(item)[:200]}")
    doc = item.get("document", item)
    if not isinstance(doc, dict):
        raise BackendError(f"retrieval server sent a malformed document: {str(doc)[:200]}")
    title, text = _split_contents(str(doc.get("contents") or ""))
    title = str(doc.get("title") or title)
    doc_id = str(doc.get("id", ""))
    score = item.get("score")
    return SearchHit(doc_id=doc_id, title=title, url=str(doc.get("url") or doc_id),
                     snippet=" ".join(str(doc.get("text") or text).split()),
                     score=float(score) if isinstance(score, (int, float)) else -float(rank))


def _page(row: dict, requested: str) -> Page:
    """An /access row as a Page: text in `contents` (a Search-R1-style quoted title line is dropped)."""
    contents = str(row.get("contents") or row.get("text") or "")
    title = row.get("title")
    if not title:
        title, contents = _split_contents(contents) if "\n" in contents else ("", contents)
    links = row.get("links") or ()
    doc_id = row.get("id")
    return Page(url=str(row.get("url") or requested), title=str(title), text=contents,
                links=tuple(str(link) for link in links) if isinstance(links, list) else (),
                doc_id=None if doc_id is None else str(doc_id))
