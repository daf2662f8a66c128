"""RemoteSearch: a SearchBackend + PageBackend over the Search-R1 / ASearcher retrieval API.

Talks to `searchgym serve search` or to an existing Search-R1 retrieval server (which has `/retrieve`
but no `/access`); a server is named by its base URL or by its full `/retrieve` URL, as Search-R1's
configs name it. One pooled aiohttp session per event loop; every request has a timeout; connection
errors, timeouts, 5xx and unreadable bodies are retried with exponential backoff, failing over across
several server addresses (a failed server is skipped for `dead_s` seconds, then tried again). Whatever
still fails is raised as BackendError, which SearchEnv turns into an observation and a counter. A reply past
`max_reply_bytes` (64 MiB, the server's own cap) is a failed try, read no further; a score that is not a finite
number (NaN, inf) is a BackendError: junk from a server is never ranked.
Searches ask for snippets (`"snippet": true`, ignored by Search-R1's servers, which send whole
documents), so an env over our server sees what it sees over the index in process.

Envs that share one RemoteSearch share its requests: the queries their `search` calls make in one turn
of the event loop (plus `batch_window` seconds, 0 by default) go out as one /retrieve request of up to
`max_batch` queries, as Search-R1's own rollouts batch them, and their `fetch` calls as one /access
request, so 32 envs stepping together pay for one HTTP exchange instead of 32. A lone env waits for
nothing: its query leaves on the loop's next turn.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from searchgym.core.http_session import LoopSession, ReplyTooLarge, read_capped
from searchgym.envs.tools.base import BackendError, Page, PageNotFound, SearchHit
from searchgym.envs.tools.corpus import split_contents

_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


MAX_REPLY_BYTES = 64 * 2**20  # as `serve search` caps its replies


class _Retryable(Exception):
    """A failure worth another try (on this or another server); `dead` marks the server as down."""

    def __init__(self, message: str, *, dead: bool) -> None:
        super().__init__(message)
        self.dead = dead


@dataclass
class RemoteOptions:
    """How `RemoteSearch` talks to its servers: LocalQA-v0's `server_options` env kwarg, by field name.

    `check=True` asks each server one query at construction (see `RemoteSearch.check`); concurrent searches are
    sent together, up to `max_batch` a request (1: one request each), waiting `batch_window` seconds for company
    after the loop's current turn; a server that failed is skipped for `dead_s` seconds."""

    timeout: float = 10.0
    connect_timeout: float | None = None  # None: timeout
    retries: int = 2
    backoff: float = 0.1
    max_backoff: float = 2.0
    dead_s: float = 10.0
    max_connections: int = 256
    check: bool = False
    max_batch: int = 64
    batch_window: float = 0.0
    max_reply_bytes: int = MAX_REPLY_BYTES  # a reply past this is a failed try, read no further


class RemoteSearch:
    """Search and page access against one or more retrieval servers, with retries and failover."""

    def __init__(self, servers: str | Sequence[str], options: RemoteOptions | None = None) -> None:
        """`servers`: base URLs (http://host:port) or /retrieve URLs; `options`: see `RemoteOptions`."""
        o = self.options = options or RemoteOptions()
        urls = [servers] if isinstance(servers, str) else list(servers)
        if not urls or not all(isinstance(u, str) and u.strip() for u in urls):
            raise ValueError(f"RemoteSearch needs at least one server url, got {servers!r}")
        if o.timeout <= 0 or o.retries < 0:
            raise ValueError("timeout must be positive and retries at least 0")
        if o.max_batch < 1 or o.batch_window < 0:
            raise ValueError("max_batch must be at least 1 and batch_window at least 0")
        self.max_batch, self.batch_window = o.max_batch, o.batch_window
        if o.max_reply_bytes < 1:
            raise ValueError(f"max_reply_bytes must be at least 1, got {o.max_reply_bytes!r}")
        self.max_reply_bytes = o.max_reply_bytes  # a reply past this is a failed try, read no further
        self.servers = [base_url(u) for u in urls]
        self.timeout, self.retries, self.backoff, self.max_backoff = o.timeout, o.retries, o.backoff, o.max_backoff
        self.connect_timeout, self.dead_s, self.max_connections = (
            o.connect_timeout or o.timeout,
            o.dead_s,
            o.max_connections,
        )
        self._dead_until = {s: 0.0 for s in self.servers}
        self._next = 0  # round-robin start among live servers
        self._stats = {"requests": 0, "queries": 0, "retries": 0, "failovers": 0, "errors": 0}
        self._sessions = LoopSession(self._new_session)
        self._reset_batching()
        if o.check:
            self.check()

    def _reset_batching(self) -> None:
        """No queries waiting (batching state belongs to one event loop and never pickles)."""
        self._batch_loop: asyncio.AbstractEventLoop | None = None
        self._waiting: list[tuple[tuple[str, int], str, asyncio.Future]] = []
        self._flush: asyncio.Handle | None = None
        self._sending: set[asyncio.Task] = set()

    def __getstate__(self) -> dict[str, Any]:
        """Pickles without its sessions' loop state and waiting queries: a copy batches in its own loops."""
        state = dict(self.__dict__)
        for key in ("_batch_loop", "_waiting", "_flush", "_sending"):
            state.pop(key)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_batching()

    # ---- SearchBackend / PageBackend ----------------------------------------------------------------

    async def search(self, query: str, k: int = 5) -> list[SearchHit]:
        """SearchBackend: the top-k hits for one query, sent with the other searches of this loop turn."""
        if self.max_batch == 1:
            return (await self.search_batch([query], k))[0]
        return await self._join(("/retrieve", k), query)

    async def _join(self, key: tuple[str, int], item: str) -> Any:
        """Wait for item's answer from the next request of its kind (`key`: path and k), which leaves on the loop's
        next turn (after `batch_window`) or as soon as max_batch items wait."""
        loop = asyncio.get_running_loop()
        if self._batch_loop is not loop:  # first use, or a new loop (asyncio.run again): nothing of the old one waits
            self._reset_batching()
            self._batch_loop = loop
        answer = loop.create_future()
        self._waiting.append((key, item, answer))
        if len(self._waiting) >= self.max_batch:
            self._send_waiting()
        elif self._flush is None:
            self._flush = (
                loop.call_later(self.batch_window, self._send_waiting)
                if self.batch_window
                else loop.call_soon(self._send_waiting)
            )
        return await answer

    def _send_waiting(self) -> None:
        """Send the waiting items, one request per kind, and answer each caller from it."""
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        waiting, self._waiting = self._waiting, []
        by_key: dict[tuple[str, int], list[tuple[str, asyncio.Future]]] = defaultdict(list)
        for key, item, answer in waiting:
            if not answer.done():  # a cancelled caller's item is not sent
                by_key[key].append((item, answer))
        for key, items in by_key.items():
            task = asyncio.get_running_loop().create_task(self._answer(key, items))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _answer(self, key: tuple[str, int], items: list[tuple[str, asyncio.Future]]) -> None:
        """One request for items; each caller gets its answer (hits, a page, PageNotFound) or the request's error."""
        path, k = key
        try:
            if path == "/retrieve":
                results: list[Any] = await self.search_batch([item for item, _ in items], k)
            else:
                results = await self.fetch_batch([item for item, _ in items])
        except Exception as e:  # every caller learns why (SearchEnv turns a BackendError into an observation)
            for _, answer in items:
                if not answer.done():
                    answer.set_exception(BackendError(str(e)) if isinstance(e, BackendError) else e)
            return
        for (item, answer), result in zip(items, results, strict=True):
            if answer.done():
                continue
            if result is None:
                answer.set_exception(
                    PageNotFound(f"unknown url {item!r}: there is no such page; access a url taken from search results")
                )
            else:
                answer.set_result(result)

    async def search_batch(self, queries: Sequence[str], k: int = 5) -> list[list[SearchHit]]:
        """Top-k hits for each query, in one /retrieve call."""
        if not queries:
            return []
        self._stats["queries"] += len(queries)
        body = await self._post(
            "/retrieve", {"queries": list(queries), "topk": k, "return_scores": True, "snippet": True}
        )
        result = body.get("result") if isinstance(body, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            raise BackendError(f"retrieval server sent a malformed /retrieve response: {str(body)[:200]}")
        return [[_hit(item, rank) for rank, item in enumerate(items or [])][:k] for items in result]

    async def fetch(self, url: str) -> Page:
        """PageBackend: the page at url via /access (sent with the other fetches of this loop turn); PageNotFound
        for a null row."""
        if self.max_batch == 1:
            page = (await self.fetch_batch([url]))[0]
            if page is None:
                raise PageNotFound(
                    f"unknown url {url!r}: there is no such page; access a url taken from search results"
                )
            return page
        return await self._join(("/access", 0), url)

    async def fetch_batch(self, urls: Sequence[str]) -> list[Page | None]:
        """The pages at urls in one /access call, None where the server has no such page."""
        if not urls:
            return []
        body = await self._post("/access", {"urls": list(urls)})
        result = body.get("result") if isinstance(body, dict) else None
        if not isinstance(result, list) or len(result) != len(urls):
            raise BackendError(f"retrieval server sent a malformed /access response: {str(body)[:200]}")
        pages: list[Page | None] = []
        for row, url in zip(result, urls, strict=True):
            if row is not None and not isinstance(row, dict):
                raise BackendError(f"retrieval server sent a malformed page row: {str(row)[:200]}")
            pages.append(None if row is None else _page(row, url))
        return pages

    def stats(self) -> dict[str, int]:
        """Counters for info (SearchEnv merges every backend's stats() into info["backend"])."""
        return {f"remote_{key}": value for key, value in self._stats.items()}

    async def health(self) -> dict[str, Any]:
        """GET /health of the first live server (raises BackendError when none answers)."""
        return await self._request("GET", "/health", None)

    async def close(self) -> None:
        """Close this loop's session (others close with their loops)."""
        await self._sessions.close()

    def check(self) -> None:
        """Ask every server one query, synchronously (no event loop needed): ValueError naming a server that
        answers but is no retrieval server, ConnectionError when none answers. An unreachable server among
        answering ones is left to failover."""
        unreachable = []
        for server in self.servers:
            try:
                probe(server, self.connect_timeout)
            except OSError as e:
                unreachable.append(f"{server}: {e}")
        if len(unreachable) == len(self.servers):
            raise ConnectionError(
                f"no retrieval server answered ({'; '.join(unreachable)}); start one with "
                "`searchgym serve search --index DIR` or check the URL"
            )

    def _new_session(self) -> aiohttp.ClientSession:
        """A pooled session for the running loop (LoopSession makes one per loop)."""
        timeout = aiohttp.ClientTimeout(total=self.timeout, connect=self.connect_timeout)
        return aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=self.max_connections))

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
                raw = await read_capped(resp, self.max_reply_bytes)
                status = resp.status
        except TimeoutError:
            raise _Retryable(f"no answer within {self.timeout:g} s", dead=True) from None
        except ReplyTooLarge as e:
            raise _Retryable(f"{e} (max_reply_bytes)", dead=False) from None
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
            raise BackendError(
                "page access unsupported: this retrieval server has no /access endpoint "
                "(a Search-R1 server only retrieves); use the search results' text instead"
            )
        if status >= 400:
            self._stats["errors"] += 1
            raise BackendError(f"retrieval server refused the request: HTTP {status}: {_error_text(raw)}")
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):  # truncated, non-JSON or non-UTF-8 body
            raise _Retryable(f"unreadable response body ({len(raw)} bytes, not JSON)", dead=False) from None


def base_url(url: str) -> str:
    """A server's base URL from its base or its /retrieve URL (Search-R1's configs name the latter)."""
    return url.strip().rstrip("/").removesuffix("/retrieve").rstrip("/")


def probe(server: str, timeout: float) -> None:
    """POST one query to server's /retrieve (blocking): ValueError if the answer is not Search-R1's shape,
    OSError if the server cannot be reached or fails (5xx)."""
    body = json.dumps({"queries": ["searchgym probe"], "topk": 1, "return_scores": True}).encode()
    request = urllib.request.Request(
        server + "/retrieve", data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    hint = "give a retrieval server's base URL (http://host:port) or its /retrieve URL"
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=timeout) as resp:
            raw = resp.read(MAX_REPLY_BYTES + 1)
    except urllib.error.HTTPError as e:
        if e.code >= 500:
            raise OSError(f"HTTP {e.code}: {_error_text(e.read())}") from None
        raise ValueError(
            f"{server} is not a retrieval server: POST {server}/retrieve answered HTTP {e.code} "
            f"({_error_text(e.read())}); {hint}"
        ) from None
    except urllib.error.URLError as e:
        raise OSError(str(e.reason)) from None
    try:
        answer = json.loads(raw)
    except (ValueError, RecursionError):
        raise ValueError(
            f"{server} is not a retrieval server: POST {server}/retrieve answered {len(raw)} bytes "
            f"that are not JSON; {hint}"
        ) from None
    result = answer.get("result") if isinstance(answer, dict) else None
    if not (isinstance(result, list) and len(result) == 1 and isinstance(result[0], list)):
        raise ValueError(
            f"{server} is not a retrieval server: POST {server}/retrieve answered {str(answer)[:200]}, "
            f'not {{"result": [[...]]}}; {hint}'
        )


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


def _hit(item: Any, rank: int) -> SearchHit:
    """A /retrieve item ({"document": doc, "score": s} or a bare doc) as a SearchHit."""
    if not isinstance(item, dict):
        raise BackendError(f"retrieval server sent a malformed hit: {str(item)[:200]}")
    doc = item.get("document", item)
    if not isinstance(doc, dict):
        raise BackendError(f"retrieval server sent a malformed document: {str(doc)[:200]}")
    title, text = split_contents(str(doc.get("contents") or ""))
    title = str(doc.get("title") or title)
    doc_id = (
        str(doc["id"]) if doc.get("id") is not None else str(doc.get("url") or title)
    )  # Search-R1's BM25 rows have no id
    score = item.get("score")
    if score is not None and not (
        isinstance(score, (int, float)) and not isinstance(score, bool) and math.isfinite(score)
    ):
        raise BackendError(f"retrieval server sent a score that is not a finite number: {str(score)[:40]}")
    return SearchHit(
        doc_id=doc_id,
        title=title,
        url=str(doc.get("url") or doc_id),
        snippet=" ".join(str(doc.get("text") or text).split()),
        score=float(score) if isinstance(score, (int, float)) else -float(rank),
    )


def _page(row: dict, requested: str) -> Page:
    """An /access row as a Page: text in `contents` (a Search-R1-style quoted title line is dropped)."""
    contents = str(row.get("contents") or row.get("text") or "")
    title = row.get("title")
    if not title:
        title, contents = split_contents(contents)
    links = row.get("links") or ()
    doc_id = row.get("id")
    return Page(
        url=str(row.get("url") or requested),
        title=str(title),
        text=contents,
        links=tuple(str(link) for link in links) if isinstance(links, list) else (),
        doc_id=None if doc_id is None else str(doc_id),
    )
