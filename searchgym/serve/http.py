"""The server half of our HTTP plumbing: serving an aiohttp app under ServerLimits, reading and validating request
bodies into clear 400s (BadRequest, core/http_session.py: engines raise it too), rendering errors in a server's
dialect, and running until a signal. The client half (one session per loop, capped reads, Retry-After) stays in
core/http_session.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from searchgym.core.http_session import BadRequest, check
from searchgym.serve.guarded_site import GuardedSite
from searchgym.serve.limits import DEFAULT_BODY_TIMEOUT, ServerLimits

logger = logging.getLogger(__name__)

BODY_TIMEOUT = web.AppKey("body_timeout", float)  # set by serve_app from ServerLimits.body_timeout


@contextlib.asynccontextmanager
async def serve_app(
    app: web.Application,
    host: str = "127.0.0.1",
    port: int = 0,
    shutdown_timeout: float = 60.0,
    limits: ServerLimits | None = None,
) -> AsyncIterator[str]:
    """Serve an aiohttp app on host:port (0 picks a free port) for the block; yields the base URL.

    Connections obey `limits` (header and idle timeouts, a connection cap; ServerLimits() by default).
    On exit it stops accepting and lets in-flight requests finish (up to `shutdown_timeout`).
    """
    limits = limits or ServerLimits()
    if BODY_TIMEOUT not in app:
        app[BODY_TIMEOUT] = limits.body_timeout
    runner = web.AppRunner(
        app, access_log=None, shutdown_timeout=shutdown_timeout, keepalive_timeout=limits.idle_timeout
    )
    await runner.setup()
    try:
        await GuardedSite(runner, host, port, limits).start()
        bound_host, bound_port = runner.addresses[0][:2]
        yield f"http://{bound_host}:{bound_port}"
    finally:
        await runner.cleanup()


async def read_body(request: web.Request) -> bytes:
    """The whole request body, or a 408 when it has not all come within the app's body timeout (a client that
    sends a head and then stalls would hold its connection and handler forever); over client_max_size is a 413."""
    timeout = request.app.get(BODY_TIMEOUT, DEFAULT_BODY_TIMEOUT)
    try:
        return await asyncio.wait_for(request.read(), timeout)
    except TimeoutError:
        raise web.HTTPRequestTimeout(
            text=f"the request body did not arrive whole within {timeout:g} s (body_timeout)"
        ) from None


async def json_body(request: web.Request, *, empty_ok: bool = False) -> dict:
    """The request's JSON object; malformed JSON, non-UTF-8 bytes, text no encoder accepts or a non-object is a 400."""
    return parse_json(await read_body(request), empty_ok=empty_ok)


def parse_json(raw: bytes, *, empty_ok: bool = False) -> dict:
    """A request body's JSON object, or BadRequest saying why not (plain work: callable from a thread)."""
    if empty_ok and not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise BadRequest(f"request body is not valid JSON: {e}") from None
    check(isinstance(body, dict), f"request body must be a JSON object, got {type(body).__name__}")
    where = lone_surrogate(body)
    check(
        where is None,
        f"request body holds a lone surrogate escape (\\ud800-\\udfff) in {where}: it is not valid Unicode text",
    )
    return body


_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(value: Any, path: str = "the body") -> str | None:
    """Where a JSON value holds a lone surrogate (JSON escapes allow them; tokenizers and indexes refuse them)."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return where
        elif isinstance(item, dict):
            if any(_SURROGATE.search(k) for k in item):
                return f"a key of {where}"
            stack.extend((v, f"{where}.{k}") for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(item))
    return None


def error_middleware(render: Callable[[web.Request, int, str], web.StreamResponse], *, http_errors: bool = True) -> Any:
    """BadRequest -> 400 and unexpected failures -> 500 (logged), each rendered in the server's dialect.

    With `http_errors`, aiohttp's own 4xx/5xx (unknown route, wrong method, body too large) are rendered
    the same way; otherwise they pass through as aiohttp makes them.
    """

    @web.middleware
    async def errors(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except BadRequest as e:
            return render(request, 400, str(e))
        except web.HTTPException as e:
            if not http_errors or e.status < 400:
                raise
            return render(request, e.status, e.text or e.reason)
        except Exception as e:  # the last line of defence: a server bug, reported (clients retry 5xx), never dropped
            logger.exception("%s %s failed", request.method, request.path)
            return render(request, 500, f"internal error: {type(e).__name__}: {e}")

    return errors


async def wait_for_signal(*signals: int) -> None:
    """Return when the process gets one of `signals` (default SIGINT, SIGTERM): a server's graceful stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in signals or (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
