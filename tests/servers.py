"""Servers for tests, on 127.0.0.1 only: a free port, and any server run from a thread with its own event loop.

A server in the test's own event loop needs nothing from here: `async with serve_app(app) as url` (or a
module's `serving(...)`). A test that blocks its loop (sync `env.step`, `gym.make`, a CLI `main`) needs the
server in another thread: `with ThreadServer.app(app) as url`, or `ThreadServer(lambda: serving(...))` for
any async context manager that yields a base URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable
from typing import Any

from aiohttp import web
from hypothesis import strategies as st

from searchgym.serve.http import serve_app

# any JSON value, small and nested: what the property tests put where a server expects a field
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released): connections to it are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ThreadServer:
    """Runs `serving()` (an async context manager yielding a base URL) in a thread of its own until stop()."""

    def __init__(self, serving: Callable[[], contextlib.AbstractAsyncContextManager[str]]) -> None:
        self._serving = serving
        self.url = ""
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def app(cls, app: web.Application, port: int = 0) -> ThreadServer:
        """An aiohttp app on 127.0.0.1:port (0: a free one)."""
        return cls(lambda: serve_app(app, "127.0.0.1", port, shutdown_timeout=0.1))

    def start(self, timeout: float = 60) -> str:
        """Start serving; returns the base URL once it answers (or raises what kept it from starting)."""
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the server did not start within {timeout} s")
        if self._error is not None:
            raise self._error
        return self.url

    def stop(self, timeout: float = 30) -> None:
        """Stop serving (in-flight requests finish first); its port then refuses connections."""
        if self._loop is not None and self._stop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # noqa: BLE001  (handed to start() instead of a silent dead thread)
            self._error = e
            self._ready.set()

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with self._serving() as url:
            self.url = url
            self._ready.set()
            await self._stop.wait()
