"""`serve search` as a Ray Serve application: shards and their replicas as Ray Serve deployments.

The retrieval server (`retrieval.py`) is one process over one index. This is how an index past one machine, split by
`index build --shards N` (`envs/tools/shards.py`: the layout and its checked `shards.json`), or one needing more
replicas, is served: inside the Ray cluster a trainer already has, where Ray Serve places each shard's replicas,
routes each call to a live replica, checks their health and replaces one that dies. It is the only place shards are
searched as one (envs do not fan out to shards themselves: `LocalQA-v0` refuses a sharded index and shard lists,
pointing here), and clients reach it at one address as they reach one server.

The application (`build_app`), for an index of N shards (a plain index is one shard):

- `shard-00` ... `shard-NN`: one deployment per shard, `replicas` replicas each. A replica opens its shard's index
  (the path must be readable on every node: a shared filesystem or the same copy on each) and answers the batch calls
  `retrieve(queries, k, snippet)` (each query's (doc row, score) pairs, made by the retrieval server's own code) and
  `access(urls)` (page rows or None).
- `ingress`: the only deployment reached over HTTP, `ingress_replicas` replicas. It keeps the Search-R1 `/retrieve`
  and ASearcher `/access` contracts of `serve search` byte for byte (the same request checks and error messages, the
  same JSON, 400s with {"error": ...} for bad input, never a 500): a `/retrieve` batch goes to every shard through
  its deployment handle, and each query's hits are merged by score (`merge_shards`: ties to the lower shard, then to
  each shard's order; a score that is not finite fails the request); an `/access` url goes to the shard its url
  hashes to (`shard_of`), and a url that shard does not know is asked of the others (a doc id, which `serve search`
  also accepts, hashes anywhere). `GET /health` sums the shards' documents.

A shard call whose replica dies under it (RayActorError) is sent again, to a live replica as Ray Serve routes it,
up to `shard_retries` times; a call still failing, or unanswered within `shard_timeout_s`, fails the request with a
503 naming the shard, so a client (RemoteSearch retries 5xx) retries it or gets a clear error: a replica's death
loses no query. A request is never answered from fewer than all the shards.

`deploy(layout)` starts the application on a running Ray (the trainer's cluster: `ray.init(address=...)` first);
`serve_local(layout)` starts a small local Ray and Serve on a free port for the block (tests, one machine);
`searchgym serve ray-search --index DIR --replicas 2` serves until SIGINT or SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from searchgym.core.extras import MissingExtra, hint
from searchgym.core.http_session import BadRequest
from searchgym.envs.tools.base import PageBackend
from searchgym.envs.tools.shards import is_sharded, read_shards_manifest, shard_dir, shard_of
from searchgym.serve.retrieval import (
    DEFAULT_TOPK,
    MAX_DOCS,
    MAX_QUERIES,
    MAX_REPLY_BYTES,
    MAX_REQUEST_BYTES,
    MAX_TOPK,
    MAX_URLS,
    _RetrievalServer,
    _strings,
    create_app,
    page_row,
    parse_body,
)
from searchgym.serve.settings import RaySearchSettings, SearchServerSettings

logger = logging.getLogger(__name__)
serve_log = logging.getLogger("ray.serve")  # a replica's own log file (logs/serve/replica_*.log), where operators look

APP_NAME = "searchgym-retrieval"
Rows = list[list[tuple[dict[str, str], float]]]  # each query's (doc row, score) pairs, as the shards send them


@dataclass(frozen=True)
class RayServeLayout:
    """What to deploy: the index (a plain index directory, or a sharded one with `shards.json`), replicas per shard,
    the ingress's replicas, the CPUs each replica reserves (0 lets a small test cluster hold them all), the request
    caps of `serve search`, and how a shard call is retried."""

    index: str
    replicas: int = 1
    ingress_replicas: int = 1
    shard_cpus: float = 1.0
    ingress_cpus: float = 0.5
    threads: int = 4  # each shard replica's thread pool (the retrieval server's `threads`)
    max_ongoing_requests: int = 64  # per replica: Ray Serve queues the rest at the caller
    max_queries: int = MAX_QUERIES
    max_urls: int = MAX_URLS
    max_topk: int = MAX_TOPK
    default_topk: int = DEFAULT_TOPK
    snippets: bool = False
    max_docs: int = MAX_DOCS
    max_reply_bytes: int = MAX_REPLY_BYTES
    client_max_size: int = MAX_REQUEST_BYTES
    shard_retries: int = 3
    shard_timeout_s: float = 30.0
    health_check_period_s: float = 2.0

    def shard_indexes(self) -> list[str]:
        """Each shard's index directory: the shards `shards.json` names (checked), or the index itself."""
        if is_sharded(self.index):
            return [str(shard_dir(self.index, i) / "index") for i in range(read_shards_manifest(self.index))]
        return [str(Path(self.index))]

    def server_settings(self, threads: int | None = None) -> SearchServerSettings:
        """The request caps as `serve search`'s settings (threads: each shard replica's pool)."""
        caps = ("max_queries", "max_urls", "max_topk", "default_topk", "snippets", "max_docs", "max_reply_bytes")
        return SearchServerSettings(
            index=self.index,
            threads=self.threads if threads is None else threads,
            client_max_size=self.client_max_size,
            **{key: getattr(self, key) for key in caps},
        )

    def checker(self) -> _RetrievalServer:
        """A retrieval server with no backend, for its request checks (the very ones `serve search` makes)."""
        return _RetrievalServer(
            None,  # type: ignore[arg-type]  # only its checks are used, never its backend
            None,
            self.server_settings(threads=1),
        )


class ShardReplica:
    """One replica of one shard: its index, answered by the retrieval server's own search and page code."""

    def __init__(self, index_dir: str, threads: int) -> None:
        from searchgym.envs.tools.indexes import open_index

        index = open_index(index_dir)
        self.index_dir = index_dir
        self.server = _RetrievalServer(
            index, index if isinstance(index, PageBackend) else None, SearchServerSettings(threads=threads)
        )

    async def retrieve(self, queries: list[str], k: int, snippet: bool) -> Rows:
        """Each query's top-k (doc row, score) pairs from this shard (the ingress has checked the request)."""
        return await self.server.docs_all(queries, k, snippet)

    async def access(self, urls: list[str]) -> list[dict[str, Any] | None]:
        """Each url's page row, None where this shard has no such page."""
        if self.server.pages is None:
            return [None] * len(urls)
        pages = await asyncio.gather(*(self.server.page_one(url) for url in urls))
        return [None if page is None else page_row(page) for page in pages]

    def count(self) -> int | None:
        """The shard's document count (None when its backend does not know it)."""
        try:
            return len(self.server.backend)  # type: ignore[arg-type]
        except TypeError:
            return None

    def check_health(self) -> None:
        """Ray Serve's health check: a replica whose thread pool is gone can answer nothing (Serve replaces it)."""
        if self.server.executor._shutdown:  # noqa: SLF001 -- the pool has no public "alive" flag
            raise RuntimeError(f"shard replica of {self.index_dir}: its thread pool is shut down")


class ShardCallFailed(Exception):
    """A shard call that failed after its retries, or did not answer in time: the request is a 503 naming it."""


class _HTTPError(Exception):
    """An HTTP error other than a 400 (413 body too large, 404 unknown route, 405 wrong method)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


_ROUTES = {"/retrieve": "POST", "/access": "POST", "/health": "GET"}


class RetrievalIngress:
    """The HTTP face of the application: `serve search`'s routes and replies over the shard deployments."""

    def __init__(self, shards: list[Any], layout: RayServeLayout) -> None:
        self.shards, self.layout = shards, layout  # shards: one DeploymentHandle per shard, in shard order
        self.checks = layout.checker()
        self.counts = {"requests": 0, "shard_calls": 0, "shard_retries": 0, "shard_failures": 0}

    def stats(self) -> dict[str, int]:
        """This replica's counters (through its handle: `serve.get_app_handle(name).stats.remote()`): requests,
        shard calls, calls sent again after their replica died, and calls that failed the request."""
        return dict(self.counts)

    async def __call__(self, request: Any) -> Any:
        """Route a Starlette request (Ray Serve's HTTP proxy hands it over) and answer it; errors as {"error": ...}."""
        from starlette.responses import Response

        status, body = 200, b""
        self.counts["requests"] += 1
        try:
            body = await self._route(request)
        except BadRequest as e:
            status, body = 400, _error(str(e))
        except _HTTPError as e:
            status, body = e.status, _error(str(e))
        except ShardCallFailed as e:  # clients retry a 503 (RemoteSearch does)
            status, body = 503, _error(str(e))
        except Exception as e:  # the last line of defence, as `serve search`'s error middleware: logged, never dropped
            logger.exception("%s %s failed", request.method, request.url.path)
            status, body = 500, _error(f"internal error: {type(e).__name__}: {e}")
        return Response(content=body, status_code=status, media_type="application/json")

    async def _route(self, request: Any) -> bytes:
        """The reply body of a request to one of the three routes (a 404 or 405 for anything else)."""
        path = request.url.path
        root = request.scope.get("root_path", "")
        if root and path.startswith(root):  # an application under a route prefix sees its own paths
            path = path[len(root) :] or "/"
        method = _ROUTES.get(path)
        if method is None:
            raise _HTTPError(404, "404: Not Found")
        if request.method != method and not (method == "GET" and request.method == "HEAD"):
            raise _HTTPError(405, "405: Method Not Allowed")
        if path == "/health":
            return await self._health()
        raw = await _read_body(request, self.layout.client_max_size)
        return await (self._retrieve(raw) if path == "/retrieve" else self._access(raw))

    async def _retrieve(self, raw: bytes) -> bytes:
        """POST /retrieve: checked as `serve search` checks it, searched on every shard, merged by score."""
        queries, k, scores, snippet = await asyncio.to_thread(self.checks._retrieve_args, raw)
        if queries:
            parts = await asyncio.gather(
                *(self._call(i, "retrieve", queries, k, snippet) for i in range(len(self.shards)))
            )
            results = merge_shards(parts, k)
        else:
            results = []
        at_least = sum(len(doc["contents"]) + len(doc["text"]) for docs in results for doc, _ in docs)
        advice = 'send fewer queries, a smaller topk or "snippet": true'
        if at_least > self.layout.max_reply_bytes:  # the words of `serve search`'s own refusal
            raise BadRequest(
                f"the reply would be more than {at_least:,} bytes, more than the {self.layout.max_reply_bytes:,} one "
                f"reply may hold (max_reply_bytes): {advice}, or start the server with a higher --max-reply-bytes"
            )
        if scores:
            rows: list[list[Any]] = [[{"document": doc, "score": s} for doc, s in docs] for docs in results]
        else:
            rows = [[doc for doc, _ in docs] for docs in results]
        return await asyncio.to_thread(self._encode, {"result": rows}, advice)

    async def _access(self, raw: bytes) -> bytes:
        """POST /access: each url from the shard it hashes to; a url that shard lacks from the others."""
        urls = await asyncio.to_thread(lambda: _strings(parse_body(raw), "urls", self.layout.max_urls))
        n = len(self.shards)
        rows: list[dict[str, Any] | None] = [None] * len(urls)
        home: dict[int, list[int]] = {}
        for j, url in enumerate(urls):
            home.setdefault(shard_of(url, n), []).append(j)
        await self._fill(rows, urls, home)
        missing = [j for j, row in enumerate(rows) if row is None]
        if missing and n > 1:  # a doc id, or a url no shard holds: asked of the shards it did not hash to
            await self._fill(rows, urls, {i: [j for j in missing if shard_of(urls[j], n) != i] for i in range(n)})
        return await asyncio.to_thread(self._encode, {"result": rows}, "ask for fewer urls")

    def _encode(self, payload: dict[str, Any], advice: str) -> bytes:
        """The reply's JSON as `serve search` encodes it, or its 400 when longer than max_reply_bytes (on a thread)."""
        return cast(bytes, self.checks._reply(payload, advice).body)

    async def _fill(self, rows: list[dict[str, Any] | None], urls: list[str], asks: dict[int, list[int]]) -> None:
        """Ask shard i for the urls at positions asks[i], every shard at once; fill the rows still empty."""
        asks = {i: js for i, js in asks.items() if js}
        answers = await asyncio.gather(*(self._call(i, "access", [urls[j] for j in js]) for i, js in asks.items()))
        for js, pages in zip(asks.values(), answers, strict=True):
            for j, page in zip(js, pages, strict=True):
                if rows[j] is None:
                    rows[j] = page

    async def _health(self) -> bytes:
        """GET /health: up when every shard answers, with the documents of all of them."""
        counts = await asyncio.gather(*(self._call(i, "count") for i in range(len(self.shards))))
        docs = sum(counts) if all(isinstance(c, int) for c in counts) else None
        return json.dumps({"status": "ok", "docs": docs, "access": True}).encode()

    async def _call(self, shard: int, method: str, *args: Any) -> Any:
        """One call to a shard deployment through its handle (Ray Serve picks the replica); a call whose replica
        died under it is sent again, and one that still fails, or is not answered in time, is ShardCallFailed."""
        from ray.exceptions import RayActorError
        from ray.serve.exceptions import BackPressureError

        n, layout = len(self.shards), self.layout
        last: BaseException | None = None
        for attempt in range(layout.shard_retries + 1):
            if attempt:
                await asyncio.sleep(min(0.05 * 2 ** (attempt - 1), 1.0))
            self.counts["shard_calls"] += 1
            response = getattr(self.shards[shard], method).remote(*args)
            try:
                return await asyncio.wait_for(_resolve(response), layout.shard_timeout_s)
            except TimeoutError:
                response.cancel()
                self.counts["shard_failures"] += 1
                raise ShardCallFailed(
                    f"shard {shard} of {n} did not answer within {layout.shard_timeout_s:g} s (shard_timeout_s)"
                ) from None
            except (RayActorError, BackPressureError) as e:  # a replica that died mid-call, or a full queue
                last = e
                self.counts["shard_retries"] += 1
                serve_log.warning(
                    "shard %d: %s; trying again (%d/%d)", shard, type(e).__name__, attempt + 1, layout.shard_retries
                )
        self.counts["shard_failures"] += 1
        raise ShardCallFailed(
            f"shard {shard} of {n} failed after {layout.shard_retries + 1} tries: {type(last).__name__}: {last}"
        )


async def _resolve(response: Any) -> Any:
    """A DeploymentResponse's result (a coroutine, for asyncio.wait_for)."""
    return await response


def _error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


async def _read_body(request: Any, cap: int) -> bytes:
    """The request body, or a 413 once it passes `cap` bytes (by Content-Length, or as it streams in)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise _HTTPError(413, f"Maximum request body size {cap} exceeded, actual body size {declared}")
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise _HTTPError(413, f"Maximum request body size {cap} exceeded, actual body size {size}")
        parts.append(chunk)
    return b"".join(parts)


def merge_shards(parts: list[Rows], k: int) -> Rows:
    """Each query's top-k over every shard's top-k, by score; ties to the lower shard, then to each shard's own order
    (so a reply is the same whichever replicas answered). A score that is not a finite number fails the request
    (ShardCallFailed, a 503 naming the shard): a NaN would sort anywhere and an inf would take the whole top-k.

    BM25 scores from different shards are merged as they are: each shard computes IDF over its own documents, which
    for a hash split of a large corpus is close to the whole corpus's (the usual trade of sharded BM25; the merged
    ranking can differ from one index's near ties)."""
    merged: Rows = []
    for q in range(len(parts[0])):
        ranked = []
        for i, rows in enumerate(parts):
            for rank, (doc, score) in enumerate(rows[q]):
                if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
                    raise ShardCallFailed(f"shard {i} of {len(parts)} failed: it sent a score that is not finite")
                ranked.append((-score, i, rank, doc, score))
        ranked.sort(key=lambda item: item[:3])
        merged.append([(doc, score) for *_, doc, score in ranked[:k]])
    return merged


def ray_serve() -> Any:
    """The `ray.serve` module, or MissingExtra naming `searchgym[serve-ray]` (Ray without its Serve dependencies
    imports, and `ray.serve` then fails on starlette or fastapi, which no other extra should be blamed for)."""
    try:
        from ray import serve
    except ModuleNotFoundError as e:
        raise MissingExtra(
            f"serving retrieval on Ray Serve needs searchgym[serve-ray] ({e.name} is not installed): "
            f"{hint('serve-ray')}",
            name=e.name,
        ) from e
    return serve


def build_app(layout: RayServeLayout) -> Any:
    """The Ray Serve application (unstarted): one deployment per shard, `layout.replicas` replicas each, behind
    the ingress deployment that holds their handles."""
    serve = ray_serve()
    for key in ("replicas", "ingress_replicas", "threads", "max_ongoing_requests", "shard_retries"):
        value = getattr(layout, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if key == "shard_retries" else 1):
            raise ValueError(
                f"{key} must be a whole number of at least {0 if key == 'shard_retries' else 1}, got {value!r}"
            )
    create_app(  # the request caps, checked as `serve search` checks them (ValueError naming the bad one)
        None,  # type: ignore[arg-type]  # only the checks run: the app is never served
        layout.server_settings(),
    )
    shards = [
        serve.deployment(ShardReplica)
        .options(
            name=f"shard-{i:02d}",
            num_replicas=layout.replicas,
            ray_actor_options={"num_cpus": layout.shard_cpus},
            max_ongoing_requests=layout.max_ongoing_requests,
            health_check_period_s=layout.health_check_period_s,
        )
        .bind(index_dir, layout.threads)
        for i, index_dir in enumerate(layout.shard_indexes())
    ]
    return (
        serve.deployment(RetrievalIngress)
        .options(
            name="ingress",
            num_replicas=layout.ingress_replicas,
            ray_actor_options={"num_cpus": layout.ingress_cpus},
            max_ongoing_requests=4 * layout.max_ongoing_requests,
            health_check_period_s=layout.health_check_period_s,
        )
        .bind(shards, layout)
    )


def deploy(layout: RayServeLayout, *, name: str = APP_NAME, route_prefix: str = "/") -> Any:
    """Start the application on the running Ray (a trainer's cluster: `ray.init(address=...)` first) and Serve
    (`start_serve`, or Serve's defaults: port 8000 on the head node); its ingress's DeploymentHandle. Returns once
    every replica is up; clients reach it at Serve's HTTP address plus `route_prefix`."""
    return ray_serve().run(build_app(layout), name=name, route_prefix=route_prefix, blocking=False)


def start_serve(host: str = "127.0.0.1", port: int = 0) -> str:
    """Start Ray Serve's HTTP proxy on the running Ray at host:port (0: a free port); its base URL."""
    from searchgym.core.ports import free_port

    serve = ray_serve()
    port = port or free_port(host)
    serve.start(http_options={"host": host, "port": port})
    return f"http://{host}:{port}"


@contextlib.contextmanager
def serve_local(
    layout: RayServeLayout, *, port: int = 0, num_cpus: int = 2, object_store_mb: int = 128
) -> Iterator[str]:
    """The application on a local Ray (started here unless one runs) for the block; yields its base URL. Replicas
    that reserve no CPU (`shard_cpus=0`, `ingress_cpus=0`) let a 2-CPU Ray hold any number of them."""
    serve = ray_serve()
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(
            num_cpus=num_cpus,
            include_dashboard=False,
            object_store_memory=object_store_mb * 2**20,
            log_to_driver=False,
        )
    try:
        url = start_serve(port=port)
        deploy(layout)
        yield url
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        if started:
            ray.shutdown()


def run_ray_search(settings: RaySearchSettings) -> None:
    """Serve until SIGINT or SIGTERM, on the Ray at `settings.address` or on a local one."""
    if not settings.index:
        raise ValueError("serve ray-search needs --index DIR")
    logging.basicConfig(level=logging.INFO)
    layout = RayServeLayout(
        settings.index,
        replicas=settings.replicas,
        ingress_replicas=settings.ingress_replicas,
        shard_cpus=settings.shard_cpus,
        snippets=settings.snippets,
    )
    ray_serve()
    import ray

    if settings.address is not None:
        ray.init(address=settings.address)
    on_cluster = settings.address is not None
    with _on_cluster(layout, settings) if on_cluster else serve_local(layout, port=settings.port) as url:
        print(f"serving {settings.index} on Ray Serve at {url} (POST /retrieve, POST /access, GET /health)", flush=True)
        _wait_for_signal()


@contextlib.contextmanager
def _on_cluster(layout: RayServeLayout, args: RaySearchSettings) -> Iterator[str]:
    """The application on the connected cluster for the block (deleted after it, Serve left running)."""
    from ray import serve

    url = start_serve(args.host, args.port)
    deploy(layout)
    try:
        yield url
    finally:
        serve.delete(APP_NAME)


def _wait_for_signal() -> None:
    """Block until SIGINT or SIGTERM."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
