"""Limits for an ASGI server under abuse (`serve env`: FastAPI on uvicorn): a body cap, an idle timeout for
WebSocket sessions, and a header timeout for uvicorn's HTTP protocol.

- `BodyLimit` answers 413 to a body over `max_bytes` before reading it: at once when Content-Length says so,
  else as soon as the streamed bytes pass the cap (uvicorn then drops the rest as it arrives, in constant memory).
- `WebSocketIdleTimeout` closes a WebSocket whose client has sent nothing for `idle_s` seconds while the app
  waits for it (code 1001, the reason naming the setting); the app hears a disconnect and frees the session.
  Time the server spends answering does not count.
- `guarded_http_protocol(header_timeout, idle_timeout)` is uvicorn's HTTP protocol with a header timeout: uvicorn
  never times out a connection that sends nothing, or only part of a request head (its keep-alive timer stops at
  the first byte); this one answers 408 and closes it, and closes an idle keep-alive connection.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def _send_json(send: Send, status: int, detail: str) -> None:
    """A whole JSON response {"detail": ...}, FastAPI's error shape."""
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` is a 413 naming the setting, never read whole; one not
    whole `timeout_s` seconds after its head is a 408 (a client that stalls mid-body holds nothing for long)."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float = 60.0) -> None:
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s

    def _too_large(self, size: str) -> str:
        return f"request body of {size} bytes is over the {self.max_bytes:,}-byte cap (max_body_bytes)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None:
            if not length.isdigit():
                await _send_json(send, 400, f"Content-Length must be a whole number, got {length[:40]!r}")
                return
            if int(length) > self.max_bytes:
                await _send_json(send, 413, self._too_large(f"{int(length):,}"))
                return
        seen, refused, started, whole = 0, False, False, False
        deadline = asyncio.get_running_loop().time() + self.timeout_s

        async def counted() -> Message:
            nonlocal seen, refused, whole
            if refused:
                return {"type": "http.disconnect"}
            if whole:  # after the body: a wait for the client's disconnect, however long
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
            except TimeoutError:
                refused = True
                if not started:
                    await _send_json(
                        send, 408, f"the request body did not arrive whole within {self.timeout_s:g} s (body_timeout)"
                    )
                return {"type": "http.disconnect"}
            whole = message["type"] != "http.request" or not message.get("more_body", False)
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    refused = True
                    if not started:
                        await _send_json(send, 413, self._too_large(f"more than {self.max_bytes:,}"))
                    return {"type": "http.disconnect"}  # the app stops reading; nothing more is kept
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if refused:
                return  # the 413 or 408 is the answer
            started = True
            await send(message)

        try:
            await self.app(scope, counted, guarded_send)
        except Exception:
            if not refused:
                raise  # the app's own failure; a refused body's disconnect is expected to end it


class WebSocketIdleTimeout:
    """ASGI middleware: a WebSocket idle for `idle_s` seconds while the app awaits its next message is closed."""

    def __init__(self, app: ASGIApp, idle_s: float) -> None:
        self.app, self.idle_s = app, idle_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        closed, accepted = False, False
        pending: asyncio.Future[Message] | None = None  # a receive outlives a timeout: never cancelled midway

        async def timed() -> Message:
            nonlocal closed, pending
            if closed:
                return {"type": "websocket.disconnect", "code": 1001}
            if pending is None:
                pending = asyncio.ensure_future(receive())
            while True:
                done, _ = await asyncio.wait({pending}, timeout=self.idle_s)
                if done:
                    message, pending = pending.result(), None
                    return message
                if accepted:  # before the handshake there is no session to time out
                    closed = True
                    await send(
                        {
                            "type": "websocket.close",
                            "code": 1001,
                            "reason": f"idle for {self.idle_s:g} s (session_idle_timeout)",
                        }
                    )
                    return {"type": "websocket.disconnect", "code": 1001}

        async def guarded_send(message: Message) -> None:
            nonlocal accepted
            accepted = accepted or message["type"] == "websocket.accept"
            if not closed:
                await send(message)

        try:
            await self.app(scope, timed, guarded_send)
        finally:
            if pending is not None and not pending.done():
                pending.cancel()


def guarded_http_protocol(header_timeout: float, idle_timeout: float | None = None) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class (h11 or httptools, as uvicorn picks) with a header timeout: a new connection's
    first head must be whole within `header_timeout` s, a later one within `idle_timeout` s (default the same) of
    the last answer, bytes or no bytes."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    later = header_timeout if idle_timeout is None else idle_timeout

    class GuardedHTTPProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        """Each request head must be whole in time; see guarded_http_protocol."""

        _header_timer: asyncio.TimerHandle | None = None
        _head_tail = b""
        _head_started = False

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self._arm(header_timeout)

        def data_received(self, data: bytes) -> None:
            if self._header_timer is not None:
                seen = self._head_tail + data
                self._head_started = True
                if b"\r\n\r\n" in seen or b"\n\n" in seen:
                    self._disarm()
                else:
                    self._head_tail = seen[-3:]
            super().data_received(data)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm(later)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self, delay: float) -> None:
            self._disarm()
            self._head_tail, self._head_started = b"", False
            self._header_timer = asyncio.get_running_loop().call_later(delay, self._too_slow, delay)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _too_slow(self, delay: float) -> None:
            self._header_timer = None
            cycle = getattr(self, "cycle", None)
            if cycle is not None and not cycle.response_complete:
                return  # a request is being answered (its head came pipelined): not ours to cut
            if self.transport.is_closing():
                return
            if self._head_started or cycle is None:  # part of a head, or nothing since connecting: say why
                setting = "header_timeout" if cycle is None else "idle_timeout"
                body = json.dumps({"detail": f"no whole request head within {delay:g} s ({setting})"}).encode()
                self.transport.write(
                    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
                )
            self.transport.close()  # an idle keep-alive connection just closes, as aiohttp's does

    return GuardedHTTPProtocol
