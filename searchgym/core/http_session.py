"""HTTP plumbing shared by clients and servers: one aiohttp session per event loop, capped reads, Retry-After,
and BadRequest (what a server answers 400 to; engines that check request fields raise it too). Serving an app and
validating request bodies is the servers' own, in serve/http.py.

A session belongs to the loop that made it, so a client used under `asyncio.run` more than once
(LLMJudge.judge does this) needs a new session per loop; each is closed when its loop shuts down.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp


async def close_at_loop_shutdown(session: aiohttp.ClientSession) -> AsyncIterator[None]:
    """Closes `session` when its loop finalizes async generators (loop.shutdown_asyncgens, run by asyncio.run)."""
    try:
        yield
    finally:
        await session.close()


class LoopSession:
    """The running loop's session, made on first use in each loop by `make`; `fresh` tells a new one."""

    def __init__(self, make: Callable[[], aiohttp.ClientSession]) -> None:
        self._make = make
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: aiohttp.ClientSession | None = None
        self._closer: AsyncIterator[None] | None = None

    async def get(self) -> tuple[aiohttp.ClientSession, bool]:
        """(session, fresh): fresh is True when this loop just got a new session."""
        loop = asyncio.get_running_loop()
        if self._loop is loop and self._session is not None and not self._session.closed:
            return self._session, False
        self._loop, self._session = loop, self._make()
        self._closer = close_at_loop_shutdown(self._session)
        await anext(self._closer)
        return self._session, True

    async def close(self) -> None:
        """Close this loop's session now (a session of another loop closes with that loop)."""
        if self._session is not None and self._loop is asyncio.get_running_loop():
            await self._session.close()
        self._session = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickles as its factory only: a copy makes its own sessions in the loops that use it."""
        return {"_make": self._make}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["_make"])  # type: ignore[misc]


def retry_after_seconds(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """The wait a server asks for: `retry-after-ms`, or `Retry-After` in seconds or as an HTTP date."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class BadRequest(Exception):
    """Client input a server refuses; its error middleware answers 400 with this message."""


def check(condition: bool, message: str) -> None:
    """Raise BadRequest(message) unless condition holds."""
    if not condition:
        raise BadRequest(message)


class ReplyTooLarge(ValueError):
    """A server's reply past the reader's size cap (read no further than the cap)."""


async def read_capped(resp: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """A client's reply body, refused with ReplyTooLarge once it passes `max_bytes` (by its Content-Length, or as
    it streams in): a server, however broken, cannot make a client hold more than the cap."""
    declared = resp.content_length
    if declared is not None and declared > max_bytes:
        raise ReplyTooLarge(f"a {declared}-byte reply (Content-Length) is over the {max_bytes}-byte cap")
    parts, size = [], 0
    async for chunk in resp.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > max_bytes:
            raise ReplyTooLarge(f"a reply of over {max_bytes} bytes (the cap)")
        parts.append(chunk)
    return b"".join(parts)
