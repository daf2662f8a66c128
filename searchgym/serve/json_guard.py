"""An ASGI guard in front of a JSON-RPC handler (the MCP SDK's streamable-HTTP one): a POST body that is over a size
cap, not UTF-8, not JSON, or nested deeper than a JSON-RPC message ever is gets a 4xx JSON-RPC error here, so the
handler behind never sees it (the SDK answers such bodies with a 500 and logs a traceback).

A body that passes is handed on whole, exactly as it came.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]

MAX_DEPTH = 64  # arrays and objects inside one another: an MCP message with tool arguments needs a handful
MAX_BYTES = 16 * 2**20
PARSE_ERROR, INVALID_REQUEST = -32700, -32600


def nesting_depth(value: Any) -> int:
    """How deeply lists and dicts nest in a parsed JSON value (iteratively: no recursion limit to hit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def body_error(raw: bytes, max_depth: int = MAX_DEPTH) -> str | None:
    """Why a JSON-RPC request body is refused (None: it is UTF-8 JSON no deeper than `max_depth`)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"the body is not UTF-8 ({e.reason} at byte {e.start})"
    try:
        value = json.loads(text)
    except RecursionError:
        return f"the body nests arrays and objects more than {max_depth} deep"
    except ValueError as e:
        return f"the body is not JSON ({str(e)[:120]})"
    if nesting_depth(value) > max_depth:
        return f"the body nests arrays and objects more than {max_depth} deep"
    return None


async def _send_error(send: Send, status: int, code: int, message: str) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class JsonBodyGuard:
    """ASGI middleware: a POST body is read whole (up to `max_bytes`: past it, a 413) and checked by `body_error`
    (a 400 JSON-RPC parse error naming why) before `app` sees it; other requests pass untouched."""

    def __init__(self, app: ASGIApp, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> None:
        self.app, self.max_bytes, self.max_depth = app, max_bytes, max_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        parts, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went before its body came: nothing to answer
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await _send_error(send, 413, INVALID_REQUEST, f"the body is over the {self.max_bytes}-byte cap")
                return
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        raw = b"".join(parts)
        why = body_error(raw, self.max_depth)
        if why is not None:
            await _send_error(send, 400, PARSE_ERROR, f"Parse error: {why}")
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: the client's disconnect
            replayed = True
            return {"type": "http.request", "body": raw, "more_body": False}

        await self.app(scope, replay, send)
