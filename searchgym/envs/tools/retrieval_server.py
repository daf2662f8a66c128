"""`searchgym serve search`: a search and page backend behind the Search-R1 / ASearcher retrieval API.

Search-R1 and ASearcher rollouts talk to a local retrieval server with `POST /retrieve`; ASearcher adds
`POST /access` for whole pages. This server speaks exactly that wire format over any SearchBackend +
PageBackend (normally a LocalIndex), so their clients and our RemoteSearch are interchangeable:

- `POST /retrieve` {"queries": [str], "topk": int|null, "return_scores": bool} ->
  {"result": [[doc, ...] per query]}; doc = {"id", "contents", "title", "url"} where `contents` is
  Search-R1's corpus row form, the quoted title on the first line and the text (here the hit's
  query-focused snippet) after it; with return_scores each item is {"document": doc, "score": s}.
- `POST /access` {"urls": [str]} -> {"result": [page or null, ...]}; page = {"id", "url", "title",
  "contents", "links"} with the page's plain text in `contents`; null for an unknown url.
- `GET /health` -> {"status": "ok", "docs": n}.

Queries of a batch run concurrently on a thread pool, so a slow batch never blocks the event loop.
Bad input (malformed JSON, wrong types, too many queries, topk out of range) is a 400 with a JSON
{"error": message}, never a 500; bodies over `client_max_size` are a 413.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import reprlib
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from aiohttp import web

from searchgym.envs.tools.base import Page, PageBackend, PageNotFound, SearchBackend, SearchHit
from searchgym.envs.tools.http_session import check, error_middleware, json_body, serve_app, wait_for_signal

logger = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 4 * 2**20
MAX_QUERIES = 512  # per /retrieve request
MAX_URLS = 64  # per /access request
MAX_TOPK = 100
DEFAULT_TOPK = 3  # Search-R1's retrieval_topk default, used when topk is null or missing
DEFAULT_THREADS = 8
_show = reprlib.repr  # short reprs of client values for error messages
T = TypeVar("T")


def doc_row(hit: SearchHit) -> dict[str, str]:
    """A hit as a Search-R1 corpus row (quoted title, newline, text) plus ASearcher's title and url."""
    return {"id": hit.doc_id, "contents": f'"{hit.title}"\n{hit.snippet}', "title": hit.title, "url": hit.url}


def page_row(page: Page) -> dict[str, Any]:
    """A page as an /access row: its plain text in `contents`, plus id, url, title and out-links."""
    return {"id": page.doc_id, "url": page.url, "title": page.title, "contents": page.text, "links": list(page.links)}


def _strings(body: dict, key: str, cap: int) -> list[str]:
    """body[key] as a list of at most cap strings."""
    value = body.get(key)
    check(isinstance(value, list) and all(isinstance(v, str) for v in value),
           f"{key} must be a list of strings, got {_show(value)}")
    check(len(value) <= cap, f"at most {cap} {key} per request, got {len(value)}; split the batch")
    return value


def _error(request: web.Request, status: int, message: str) -> web.Response:
    """Errors as {"error": message}."""
    return web.json_response({"error": message}, status=status)


class _RetrievalServer:
    """The handlers and what they share: the backend, its thread pool and the request caps."""

    def __init__(self, backend: SearchBackend, pages: PageBackend | None, *, threads: int, max_queries: int,
                 max_urls: int, max_topk: int, default_topk: int) -> None:
        self.backend, self.pages = backend, pages
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="retrieval")
        self.max_queries, self.max_urls, self.max_topk, self.default_topk = max_queries, max_urls, max_topk, default_topk

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking backend call on the thread pool, so the event loop stays responsive."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def search_one(self, query: str, k: int) -> list[SearchHit]:
        """One query: the backend's blocking search_sync on a thread when it has one, else its async search."""
        sync = getattr(self.backend, "search_sync", None)
        if callable(sync):
            return await self._off_loop(sync, query, k)
        return await self.backend.search(query, k)

    async def page_one(self, url: str) -> Page | None:
        """One page, or None for an unknown url (PageNotFound)."""
        try:
            sync = getattr(self.pages, "get_page", None)
            if callable(sync):
                return await self._off_loop(sync, url)
            return await self.pages.fetch(url)  # type: ignore[union-attr]
        except PageNotFound:
            return None

    async def handle_retrieve(self, request: web.Request) -> web.Response:
        """POST /retrieve: a batch of queries answered concurrently, in order."""
        body = await json_body(request)
        queries = _strings(body, "queries", self.max_queries)
        topk = body.get("topk")
        topk = self.default_topk if topk is None else topk
        check(isinstance(topk, int) and not isinstance(topk, bool) and 1 <= topk <= self.max_topk,
               f"topk must be an integer in [1, {self.max_topk}] or null, got {_show(body.get('topk'))}")
        scores = body.get("return_scores", False)
        scores = False if scores is None else scores
        check(isinstance(scores, bool), f"return_scores must be true or false, got {_show(scores)}")
        results = await asyncio.gather(*(self.search_one(q, topk) for q in queries))
        if scores:
            rows: list[list[Any]] = [[{"document": doc_row(h), "score": h.score} for h in hits] for hits in results]
        else:
            rows = [[doc_row(h) for h in hits] for hits in results]
        return web.json_response({"result": rows})

    async def handle_access(self, request: web.Request) -> web.Response:
        """POST /access: pages by url (or doc id), null where there is no such page."""
        if self.pages is None:
            raise web.HTTPNotFound(text="this server has no page backend")
        urls = _strings(await json_body(request), "urls", self.max_urls)
        pages = await asyncio.gather(*(self.page_one(u) for u in urls))
        return web.json_response({"result": [None if p is None else page_row(p) for p in pages]})

    async def handle_health(self, request: web.Request) -> web.Response:
        """GET /health: up, with the number of documents when the backend knows it."""
        try:
            docs: int | None = len(self.backend)  # type: ignore[arg-type]
        except TypeError:
            docs = None
        return web.json_response({"status": "ok", "docs": docs, "access": self.pages is not None})


def create_app(backend: SearchBackend, pages: PageBackend | None = None, *, threads: int = DEFAULT_THREADS,
               max_queries: int = MAX_QUERIES, max_urls: int = MAX_URLS, max_topk: int = MAX_TOPK,
               default_topk: int = DEFAULT_TOPK, client_max_size: int = MAX_REQUEST_BYTES) -> web.Application:
    """The aiohttp app serving `backend` (pages default to the backend itself when it is a PageBackend)."""
    if pages is None and isinstance(backend, PageBackend):
        pages = backend
    server = _RetrievalServer(backend, pages, threads=threads, max_queries=max_queries, max_urls=max_urls,
                              max_topk=max_topk, default_topk=default_topk)
    app = web.Application(client_max_size=client_max_size, middlewares=[error_middleware(_error)])
    app.router.add_post("/retrieve", server.handle_retrieve)
    app.router.add_post("/access", server.handle_access)
    app.router.add_get("/health", server.handle_health)

    async def _stop_threads(_: web.Application) -> None:
        server.executor.shutdown(wait=False, cancel_futures=True)

    app.on_cleanup.append(_stop_threads)
    return app


@contextlib.asynccontextmanager
async def serving(backend: SearchBackend, pages: PageBackend | None = None, *, host: str = "127.0.0.1",
                  port: int = 0, shutdown_timeout: float = 5.0, **app_kwargs: Any) -> AsyncIterator[str]:
    """Serve `backend` (see create_app) on host:port (0: a free port) for the block; yields the base URL."""
    async with serve_app(create_app(backend, pages, **app_kwargs), host, port, shutdown_timeout) as url:
        yield url


def run_server(index_dir: str | os.PathLike, host: str = "127.0.0.1", port: int = 8000, **app_kwargs: Any) -> None:
    """Open a LocalIndex and serve it until SIGINT or SIGTERM (blocking), then shut down gracefully."""
    from searchgym.envs.tools.local_index import LocalIndex

    index = LocalIndex(index_dir)
    asyncio.run(_serve_until_signal(index, host, port, app_kwargs))


async def _serve_until_signal(index: Any, host: str, port: int, app_kwargs: dict) -> None:
    """The body of run_server: signal handlers, serve until a signal."""
    async with serving(index, host=host, port=port, **app_kwargs) as url:
        print(f"serving {len(index)} documents at {url} (POST /retrieve, POST /access, GET /health)", flush=True)
        await wait_for_signal()
        logger.info("shutting down")


def main(argv: list[str] | None = None) -> None:
    """`python -m searchgym.envs.tools.retrieval_server --index DIR`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    run_server(args.index, args.host, args.port)


if __name__ == "__main__":
    main()
