"""Serving an aiohttp AppRunner under ServerLimits: a protocol factory that wraps or refuses each connection.

- The first request head must be whole within `header_timeout` seconds of connecting, or the connection is
  answered 408 and closed, however slowly its bytes keep coming. Later heads are bounded by aiohttp's
  keep-alive timeout (`idle_timeout`), which closes a connection idle, or holding part of a head, that long
  after its last response.
- Past `max_connections` open connections a new one is answered 503 with `Retry-After` and closed, so the
  clients already connected keep being served and the process never meets its descriptor limit.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from searchgym.serve.limits import ServerLimits

REFUSED_LINGER_S = 1.0  # a refused connection reads (and drops) what the client sends this long, then closes


def _response(status: str, message: str, extra: str = "") -> bytes:
    """A whole HTTP/1.1 response that closes the connection, with a JSON {"error": message} body."""
    body = json.dumps({"error": message}).encode()
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"{extra}Connection: close\r\n\r\n"
    ).encode() + body


class _Guarded(asyncio.Protocol):
    """One connection: forwards everything to aiohttp's handler, and closes it if no request head is whole in time."""

    def __init__(self, guard: _Guard, handler: asyncio.Protocol) -> None:
        self._guard, self._handler = guard, handler
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._tail = b""  # the last bytes seen while the first head is still coming (it may end across reads)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._timer = asyncio.get_running_loop().call_later(self._guard.limits.header_timeout, self._too_slow)
        self._handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._timer is not None:
            seen = self._tail + data
            if b"\r\n\r\n" in seen or b"\n\n" in seen:
                self._timer.cancel()
                self._timer = None
            else:
                self._tail = seen[-3:]
        self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self._handler.eof_received()

    def pause_writing(self) -> None:
        self._handler.pause_writing()

    def resume_writing(self) -> None:
        self._handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._guard.open -= 1
        self._handler.connection_lost(exc)

    def _too_slow(self) -> None:
        """The header timeout: answer 408 and close (aiohttp's handler hears connection_lost and cleans up)."""
        self._timer = None
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(
                _response(
                    "408 Request Timeout",
                    f"no whole request head within {self._guard.limits.header_timeout:g} s (header_timeout)",
                )
            )
            transport.close()


class _Refused(asyncio.Protocol):
    """A connection past the cap: answered 503 at once; what the client sends meanwhile is read and dropped
    (closing on unread bytes would reset the connection before the client reads the answer)."""

    def __init__(self, guard: _Guard) -> None:
        self._guard = guard
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._guard.refused_open.add(self)
        self._guard.refused += 1
        cap = self._guard.limits.connection_cap
        transport.write(  # type: ignore[attr-defined]
            _response(
                "503 Service Unavailable",
                f"the server holds its most connections ({cap}, max_connections); retry later",
                "Retry-After: 1\r\n",
            )
        )
        self._timer = asyncio.get_running_loop().call_later(REFUSED_LINGER_S, self.close)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False  # the client has sent all it will: close

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._guard.refused_open.discard(self)


class _Guard:
    """The protocol factory: counts open connections and wraps or refuses each new one."""

    def __init__(self, server: Any, limits: ServerLimits) -> None:
        self.server, self.limits = server, limits
        self.cap = limits.connection_cap
        self.open = 0  # connections served and not yet lost
        self.refused = 0  # connections refused so far
        self.refused_open: set[_Refused] = set()  # refused ones not yet closed

    def __call__(self) -> asyncio.Protocol:
        if self.open >= self.cap:
            return _Refused(self)
        self.open += 1  # counted here, not in connection_made: asyncio accepts a burst before any is made
        return _Guarded(self, self.server())

    def close_refused(self) -> None:
        for refused in list(self.refused_open):
            refused.close()


class GuardedSite(web.TCPSite):
    """A TCPSite whose connections obey `limits` (see the module docstring)."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, limits: ServerLimits, **kwargs: Any) -> None:
        super().__init__(runner, host, port, **kwargs)
        self.limits = limits
        self.guard: _Guard | None = None

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        server = self._runner.server
        assert server is not None
        self.guard = _Guard(server, self.limits)
        self._server = await asyncio.get_running_loop().create_server(
            self.guard,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
        self._bound_port = self._server.sockets[0].getsockname()[1] if self._server.sockets else self._port

    async def stop(self) -> None:
        await super().stop()
        if self.guard is not None:
            self.guard.close_refused()
