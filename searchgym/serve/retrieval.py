"""`searchgym serve search`: a search and page backend behind the Search-R1 / ASearcher retrieval API.

Search-R1 and ASearcher rollouts talk to a local retrieval server with `POST /retrieve`; ASearcher adds
`POST /access` for whole pages. This server speaks exactly that wire format over any SearchBackend +
PageBackend (normally a LocalIndex), so their clients and our RemoteSearch are interchangeable:

- `POST /retrieve` {"queries": [str], "topk": int|null, "return_scores": bool, "snippet": bool} ->
  {"result": [[doc, ...] per query]}; doc = {"id", "contents", "title", "text", "url"} where `contents`
  is the stored document as a Search-R1 corpus row has it, the quoted title on the first line and the
  whole text after it (clients cut it themselves: ASearcher keeps `doc[:5000]`), and `text` is that
  text (as Search-R1's BM25 hits carry it). With `"snippet": true` (or the server's `snippets=True`)
  both hold the hit's query-focused snippet instead. With return_scores each item is
  {"document": doc, "score": s}. As in Search-R1, a `topk` of 0 or null means the server's default
  and `return_scores` / `snippet` accept what pydantic reads as a bool (true, 1, "yes", ...).
- `POST /access` {"urls": [str]} -> {"result": [page or null, ...]}; page = {"id", "url", "title",
  "contents", "links"} with the page's plain text in `contents`; null for an unknown url.
- `GET /health` -> {"status": "ok", "docs": n}.

Bodies are parsed and checked, queries searched and answers encoded on a thread pool, so neither a big
request (10 MB) nor a slow batch keeps the event loop from answering `/health`. Bad input (malformed
JSON, bytes that are not UTF-8, strings holding lone surrogates, wrong types, more queries than `max_queries`
(`--max-queries`, 4,096 by default: Search-R1's training sends up to 2,560 in one request), topk out of range)
is a 400 with a JSON {"error": message}, never a 500; bodies over `client_max_size` (16 MiB by
default) are a 413. A reply is bounded too: more than `max_docs` documents (queries x topk, 16,384 by default) is
a 400 before any search, and an encoded reply over `max_reply_bytes` (64 MiB) a 400 naming what to shrink.
Connections obey ServerLimits (header and idle timeouts, a connection cap; see serve/limits.py). Unknown request
fields are ignored, as Search-R1's server (pydantic) ignores them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import reprlib
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from aiohttp import web

from searchgym.core.http_session import BadRequest, check
from searchgym.envs.tools.base import Page, PageBackend, PageNotFound, SearchBackend, SearchHit
from searchgym.envs.tools.corpus import join_contents
from searchgym.serve.http import error_middleware, read_body, serve_app, wait_for_signal
from searchgym.serve.settings import (
    DEFAULT_THREADS,
    DEFAULT_TOPK,
    MAX_DOCS,
    MAX_QUERIES,
    MAX_REPLY_BYTES,
    MAX_SEARCH_REQUEST_BYTES,
    MAX_TOPK,
    MAX_URLS,
    SearchServerSettings,
    checked,
)

__all__ = [
    "DEFAULT_THREADS",
    "DEFAULT_TOPK",
    "MAX_DOCS",
    "MAX_QUERIES",
    "MAX_REPLY_BYTES",
    "MAX_REQUEST_BYTES",
    "MAX_TOPK",
    "MAX_URLS",
    "SearchServerSettings",
    "create_app",
    "run_server",
    "serving",
]

logger = logging.getLogger(__name__)

MAX_REQUEST_BYTES = MAX_SEARCH_REQUEST_BYTES
_TRUE, _FALSE = {"1", "true", "t", "yes", "y", "on"}, {"0", "false", "f", "no", "n", "off"}  # pydantic's bool strings
_show = reprlib.repr  # short reprs of client values for error messages
_SURROGATE = re.compile("[\ud800-\udfff]")
T = TypeVar("T")


def doc_row(hit: SearchHit, text: str) -> dict[str, str]:
    """A hit with its text as a Search-R1 corpus row (`contents`: quoted title, newline, text) plus `text`,
    ASearcher's `url` and the title on its own."""
    return {
        "id": hit.doc_id,
        "contents": join_contents(hit.title, text),
        "title": hit.title,
        "text": text,
        "url": hit.url,
    }


def page_row(page: Page) -> dict[str, Any]:
    """A page as an /access row: its plain text in `contents`, plus id, url, title and out-links."""
    return {"id": page.doc_id, "url": page.url, "title": page.title, "contents": page.text, "links": list(page.links)}


def parse_body(raw: bytes) -> dict:
    """The request's JSON object (blocking: the server calls it on a pool thread); a 400 for malformed JSON,
    bytes that are not UTF-8 or anything but an object."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise BadRequest(f"request body is not valid JSON: {e}") from None
    check(isinstance(body, dict), f"request body must be a JSON object, got {type(body).__name__}")
    return body


def _strings(body: dict, key: str, cap: int, raise_cap: str = "") -> list[str]:
    """body[key] as a list of at most cap strings of valid Unicode (JSON's \\ud800 escapes can make lone surrogates,
    which no UTF-8 text holds); `raise_cap` tells the client how the server's cap is raised, when it can be."""
    value: Any = body.get(key)
    check(
        isinstance(value, list) and all(isinstance(v, str) for v in value),
        f"{key} must be a list of strings, got {_show(value)}",
    )
    check(len(value) <= cap, f"at most {cap} {key} per request, got {len(value)}; split the batch{raise_cap}")
    for i, text in enumerate(value):
        bad = _SURROGATE.search(text)
        if bad is not None:
            raise BadRequest(
                f"{key}[{i}] is not valid Unicode: a lone surrogate U+{ord(bad.group()):04X} at character "
                f"{bad.start()}; send text that encodes as UTF-8"
            )
    return value


def lax_bool(body: dict, key: str, default: bool) -> bool:
    """body[key] read the way Search-R1's server (pydantic) reads a bool: true/false, 0/1 or their usual strings."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise BadRequest(f"{key} must be true or false, got {_show(value)}")


def _error(request: web.Request, status: int, message: str) -> web.Response:
    """Errors as {"error": message}."""
    return web.json_response({"error": message}, status=status)


class _RetrievalServer:
    """The handlers and what they share: the backend, its thread pool and the request caps."""

    def __init__(self, backend: SearchBackend, pages: PageBackend | None, settings: SearchServerSettings) -> None:
        self.backend, self.pages = backend, pages
        self.executor = ThreadPoolExecutor(max_workers=settings.threads, thread_name_prefix="retrieval")
        self.threads = settings.threads
        self.max_queries, self.max_urls = settings.max_queries, settings.max_urls
        self.max_topk, self.default_topk = settings.max_topk, settings.default_topk
        self.snippets = settings.snippets
        self.max_docs, self.max_reply_bytes = settings.max_docs, settings.max_reply_bytes

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking backend call on the thread pool, so the event loop stays responsive."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def page_one(self, url: str) -> Page | None:
        """One page, or None for an unknown url (PageNotFound)."""
        try:
            sync = getattr(self.pages, "get_page", None)
            if callable(sync):
                return await self._off_loop(sync, url)
            return await self.pages.fetch(url)  # type: ignore[union-attr]
        except PageNotFound:
            return None

    async def docs_all(self, queries: list[str], k: int, snippet: bool) -> list[list[tuple[dict[str, str], float]]]:
        """Each query's (doc row, score) pairs: the whole stored text of each hit, or its snippet.

        A backend with a batch method (LocalIndex.search_many_sync, which spreads the batch over the cores itself
        and reads each hit's whole text with it) answers it in one call off the loop; another blocking backend
        (search_sync, get_page) in one slice per pool thread, pages included (a thread hop per query costs more
        than a query); an async one answers each query concurrently."""
        full = not snippet and self.pages is not None
        many = getattr(self.backend, "search_many_sync", None)
        if callable(many) and (not full or self.pages is self.backend):  # whole texts from the backend's own pages
            return await self._off_loop(
                lambda: [[(doc_row(h, h.snippet), h.score) for h in hits] for hits in many(queries, k, whole_text=full)]
            )
        if callable(getattr(self.backend, "search_sync", None)) and (
            not full or callable(getattr(self.pages, "get_page", None))
        ):
            size = -(-len(queries) // self.threads) or 1
            slices = [queries[i : i + size] for i in range(0, len(queries), size)]
            done = await asyncio.gather(
                *(self._off_loop(lambda part=part: [self._docs_sync(q, k, full) for q in part]) for part in slices)
            )
            return [docs for part in done for docs in part]
        return list(await asyncio.gather(*(self.docs_one(q, k, full) for q in queries)))

    async def docs_one(self, query: str, k: int, full: bool) -> list[tuple[dict[str, str], float]]:
        """docs_all for one query of an async backend."""
        hits = await self.backend.search(query, k)
        pages = await asyncio.gather(*(self.page_one(h.url) for h in hits)) if full else [None] * len(hits)
        return [(doc_row(h, h.snippet if p is None else p.text), h.score) for h, p in zip(hits, pages, strict=True)]

    def _docs_sync(self, query: str, k: int, full: bool) -> list[tuple[dict[str, str], float]]:
        """docs_one for a blocking backend, on a pool thread."""
        out = []
        for hit in self.backend.search_sync(query, k):  # type: ignore[attr-defined]
            text = hit.snippet
            if full:
                with contextlib.suppress(PageNotFound):
                    text = self.pages.get_page(hit.url).text  # type: ignore[union-attr]
            out.append((doc_row(hit, text), hit.score))
        return out

    def _retrieve_args(self, raw: bytes) -> tuple[list[str], int, bool, bool]:
        """(queries, topk, return_scores, snippet) of a /retrieve body, checked (on a pool thread)."""
        body = parse_body(raw)
        queries = _strings(
            body, "queries", self.max_queries, " or start the server with a higher --max-queries (max_queries=)"
        )
        topk = body.get("topk")
        check(
            topk is None or (isinstance(topk, int) and not isinstance(topk, bool) and 0 <= topk <= self.max_topk),
            f"topk must be an integer in [1, {self.max_topk}], or 0 or null for the default ({self.default_topk}), "
            f"got {_show(topk)}",
        )
        k = topk or self.default_topk
        check(
            len(queries) * k <= self.max_docs,
            f"{len(queries)} queries x topk {k} asks for {len(queries) * k} documents, more than the {self.max_docs} "
            "one reply may hold (max_docs): send fewer queries or a smaller topk, or start the server with a higher "
            "--max-docs",
        )
        return queries, k, lax_bool(body, "return_scores", False), lax_bool(body, "snippet", self.snippets)

    async def handle_retrieve(self, request: web.Request) -> web.Response:
        """POST /retrieve: a batch of queries answered concurrently, in order."""
        queries, topk, scores, snippet = await self._off_loop(self._retrieve_args, await read_body(request))
        results = await self.docs_all(queries, topk, snippet)
        at_least = sum(len(doc["contents"]) + len(doc["text"]) for docs in results for doc, _ in docs)
        advice = 'send fewer queries, a smaller topk or "snippet": true'
        check(
            at_least <= self.max_reply_bytes,  # refused before encoding: no second copy of an oversized reply
            f"the reply would be more than {at_least:,} bytes, more than the {self.max_reply_bytes:,} one reply "
            f"may hold (max_reply_bytes): {advice}, or start the server with a higher --max-reply-bytes",
        )
        if scores:
            rows: list[list[Any]] = [[{"document": doc, "score": s} for doc, s in docs] for docs in results]
        else:
            rows = [[doc for doc, _ in docs] for docs in results]
        return await self._off_loop(self._reply, {"result": rows}, advice)

    def _reply(self, payload: Any, advice: str) -> web.Response:
        """The JSON response (encoded on a pool thread), or a 400 when it is longer than max_reply_bytes."""
        body = json.dumps(payload).encode()
        check(
            len(body) <= self.max_reply_bytes,
            f"the reply would be {len(body):,} bytes, more than the {self.max_reply_bytes:,} one reply may hold "
            f"(max_reply_bytes): {advice}, or start the server with a higher --max-reply-bytes",
        )
        return web.Response(body=body, content_type="application/json")

    async def handle_access(self, request: web.Request) -> web.Response:
        """POST /access: pages by url (or doc id), null where there is no such page."""
        if self.pages is None:
            raise web.HTTPNotFound(text="this server has no page backend")
        raw = await read_body(request)
        urls = await self._off_loop(lambda: _strings(parse_body(raw), "urls", self.max_urls))
        if callable(getattr(self.pages, "get_page", None)):  # blocking lookups: the whole batch in one pool call
            rows = await self._off_loop(
                lambda: [None if p is None else page_row(p) for p in map(self._page_sync, urls)]
            )
        else:
            rows = [None if p is None else page_row(p) for p in await asyncio.gather(*map(self.page_one, urls))]
        return await self._off_loop(self._reply, {"result": rows}, "ask for fewer urls")

    def _page_sync(self, url: str) -> Page | None:
        """One page from a blocking page backend, or None for an unknown url."""
        try:
            return self.pages.get_page(url)  # type: ignore[union-attr]
        except PageNotFound:
            return None

    async def handle_health(self, request: web.Request) -> web.Response:
        """GET /health: up, with the number of documents when the backend knows it."""
        try:
            docs: int | None = len(self.backend)  # type: ignore[arg-type]
        except TypeError:
            docs = None
        return web.json_response({"status": "ok", "docs": docs, "access": self.pages is not None})


_WHOLE_SETTINGS = (
    "threads",
    "max_queries",
    "max_urls",
    "max_topk",
    "default_topk",
    "client_max_size",
    "max_docs",
    "max_reply_bytes",
)


def create_app(
    backend: SearchBackend, settings: SearchServerSettings | None = None, pages: PageBackend | None = None
) -> web.Application:
    """The aiohttp app serving `backend` (pages default to the backend itself when it is a PageBackend);
    `settings.snippets` answers hits with their snippets unless a request asks otherwise; a /retrieve request of
    more than `max_queries` queries, or of more than `max_docs` documents (queries x topk), is a 400, as is a reply
    longer than `max_reply_bytes` (`serve search --max-queries / --max-docs / --max-reply-bytes`). A setting out
    of range is a ValueError naming it."""
    settings = settings or SearchServerSettings()
    for key in _WHOLE_SETTINGS:
        value = getattr(settings, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be an integer of at least 1, got {value!r}")
    checked(settings)
    if pages is None and isinstance(backend, PageBackend):
        pages = backend
    server = _RetrievalServer(backend, pages, settings)
    app = web.Application(client_max_size=settings.client_max_size, middlewares=[error_middleware(_error)])
    app.router.add_post("/retrieve", server.handle_retrieve)
    app.router.add_post("/access", server.handle_access)
    app.router.add_get("/health", server.handle_health)

    async def _stop_threads(_: web.Application) -> None:
        server.executor.shutdown(wait=False, cancel_futures=True)

    app.on_cleanup.append(_stop_threads)
    return app


@contextlib.asynccontextmanager
async def serving(
    backend: SearchBackend,
    settings: SearchServerSettings | None = None,
    pages: PageBackend | None = None,
    shutdown_timeout: float = 5.0,
) -> AsyncIterator[str]:
    """Serve `backend` (see create_app) on the settings' host:port (0: a free port; the default settings' port
    here is 0) for the block, its connections under `settings.limits`; yields the base URL."""
    settings = settings or SearchServerSettings(port=0)
    app = create_app(backend, settings, pages)
    async with serve_app(app, settings.host, settings.port, shutdown_timeout, settings.limits) as url:
        yield url


def run_server(settings: SearchServerSettings) -> None:
    """Open `settings.index` (BM25 or dense; see open_index) and serve it until SIGINT or SIGTERM, then shut down
    gracefully."""
    from searchgym.envs.tools.indexes import open_index

    index = open_index(checked(settings).index)
    asyncio.run(_serve_until_signal(index, settings))


async def _serve_until_signal(index: Any, settings: SearchServerSettings) -> None:
    """The body of run_server: signal handlers, serve until a signal."""
    async with serving(index, settings) as url:
        print(f"serving {len(index)} documents at {url} (POST /retrieve, POST /access, GET /health)", flush=True)
        await wait_for_signal()
        logger.info("shutting down")
