"""One aiohttp session per event loop, for HTTP clients that may be driven from several loops.

A session belongs to the loop that made it, so a client used under `asyncio.run` more than once
(LLMJudge.judge does this) needs a new session per loop; each is closed when its loop shuts down.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

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
