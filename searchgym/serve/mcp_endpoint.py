"""An agent program's episode over MCP: `task.mcp_url` is a streamable-HTTP MCP endpoint whose tools `search`,
`access` and `answer` act on the env the workflow plays, so an agent that reaches its tools over MCP is played,
judged, recorded and trained exactly as one that calls `task.call_tool`.

- One endpoint server per workflow (uvicorn on 127.0.0.1, a port of its own), started and stopped with the
  recording proxy; each episode has its own path, `/episodes/<key>/mcp`, and its own MCP session manager for
  the episode's lifetime: a session reaches only its episode's env, and an ended episode's path answers 404.
- A tool call's arguments are checked against the tool's schema (agents/mcp_tools.py): a bad one is a tool
  error naming the field; calls on one episode run one at a time.
- On loopback, requests with another Host or Origin header are refused (DNS rebinding), as `serve mcp` does.
- A body over 16 MiB, not UTF-8, not JSON or nested past 64 levels is a 4xx JSON-RPC error before the SDK's
  handler sees it (serve/json_guard.py), as in `serve mcp`.

Needs the `mcp` extra (`pip install 'searchgym[mcp]'`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from searchgym.agents.mcp_tools import DESCRIPTIONS, ENV_TOOLS, ToolError, argument_error, input_schema
from searchgym.core.extras import needs
from searchgym.serve.json_guard import JsonBodyGuard

FEATURE = "an agent program's MCP endpoint (task.mcp_url)"
EPISODE_PATH = re.compile(r"^/episodes/([0-9a-f]{1,64})/mcp/?$")
STARTUP_TIMEOUT = 30.0  # seconds for uvicorn to listen

ToolCall = Callable[[str, dict[str, Any]], Awaitable[str]]  # (tool, its checked arguments) -> the observation


def mcp_available() -> bool:
    """Whether the `mcp` SDK (and so uvicorn, its dependency) is installed."""
    import importlib.util

    return importlib.util.find_spec("mcp") is not None and importlib.util.find_spec("uvicorn") is not None


class _ClosedStreamFilter(logging.Filter):
    """Drops the SDK's "Error in standalone SSE writer" record when its error is the stream closed by the session's
    own end (a client's DELETE, an episode ending): the SDK (1.x) logs that normal close as an error with a
    traceback, once per session. Any other error in that writer is still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        import anyio

        error = record.exc_info[1] if record.exc_info else None
        return not (
            record.getMessage() == "Error in standalone SSE writer" and isinstance(error, anyio.ClosedResourceError)
        )


def quiet_closed_streams() -> None:
    """Install `_ClosedStreamFilter` on the SDK's streamable-HTTP logger (once)."""
    logger = logging.getLogger("mcp.server.streamable_http")
    if not any(isinstance(f, _ClosedStreamFilter) for f in logger.filters):
        logger.addFilter(_ClosedStreamFilter())


def loopback_security(host: str) -> Any:
    """The SDK's DNS-rebinding protection for a loopback `host` (Host and Origin must be loopback), else None."""
    from mcp.server.transport_security import TransportSecuritySettings

    if host not in ("127.0.0.1", "localhost", "::1"):
        return None
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
    )


def episode_server(call: ToolCall) -> Any:
    """The SDK's low-level MCP server for one episode: the env's tools, each run through `call`, one at a time."""
    from mcp import types
    from mcp.server.lowlevel import Server

    import searchgym

    server: Any = Server("searchgym episode", version=searchgym.__version__)
    tools = [
        types.Tool(name=name, description=DESCRIPTIONS[name], inputSchema=input_schema(name, 1)) for name in ENV_TOOLS
    ]
    lock = asyncio.Lock()

    @server.list_tools()  # type: ignore[untyped-decorator]
    async def list_tools() -> list[types.Tool]:
        return tools

    @server.call_tool(validate_input=False)  # type: ignore[untyped-decorator]
    async def call_tool(name: str, arguments: dict[str, Any]) -> list[types.TextContent]:
        if name not in ENV_TOOLS:
            raise ToolError(f"unknown tool {str(name)[:40]!r}; the tools are {', '.join(ENV_TOOLS)}")
        error = argument_error(name, arguments, 1)
        if error:
            raise ToolError(error)
        async with lock:
            return [types.TextContent(type="text", text=await call(name, arguments))]

    return server


class EpisodeToolServer:
    """The endpoint server of one workflow: `async with` it, then `async with server.episode(key, call) as url`."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port: int | None = None
        self._managers: dict[str, Any] = {}
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> EpisodeToolServer:
        with needs(FEATURE):
            import mcp  # noqa: F401 -- named first, so a missing SDK names the `mcp` extra
            import uvicorn

        class Server(uvicorn.Server):  # the run's own signal handling stays in charge (Ctrl-C stops the eval)
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield

        quiet_closed_streams()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((self.host, 0))
        self.port = sock.getsockname()[1]
        app = JsonBodyGuard(self.app)  # a body the SDK would answer with a 500 and a traceback is a 4xx here
        self._server = Server(uvicorn.Config(app, log_level="warning", lifespan="off", interface="asgi3"))
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STARTUP_TIMEOUT
        while not self._server.started:
            if self._task.done() or loop.time() > deadline:
                await self.__aexit__(None, None, None)
                raise RuntimeError(f"the MCP endpoint server did not start on {self.host} within {STARTUP_TIMEOUT} s")
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                await self._task
            self._task = None

    def url(self, key: str) -> str:
        """The endpoint of episode `key`."""
        return f"http://{self.host}:{self.port}/episodes/{key}/mcp"

    @contextlib.asynccontextmanager
    async def episode(self, key: str, call: ToolCall) -> AsyncIterator[str]:
        """Serve episode `key`'s tools (through `call`) while the block runs; its url. Sessions end with the block."""
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

        if not EPISODE_PATH.match(f"/episodes/{key}/mcp"):
            raise ValueError(f"an episode key is 1 to 64 lowercase hex digits, got {key[:80]!r}")
        manager = StreamableHTTPSessionManager(app=episode_server(call), security_settings=loopback_security(self.host))
        async with manager.run():
            self._managers[key] = manager
            try:
                yield self.url(key)
            finally:
                self._managers.pop(key, None)

    def open_episodes(self) -> int:
        """Episodes whose endpoint is being served now."""
        return len(self._managers)

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The ASGI app: an episode's path goes to its session manager; anything else is a 404."""
        match = EPISODE_PATH.match(scope.get("path", "")) if scope.get("type") == "http" else None
        manager = self._managers.get(match.group(1)) if match else None
        if manager is None:
            body = b"no such episode (it ended, or the path is not /episodes/<key>/mcp)"
            await send({"type": "http.response.start", "status": 404, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": body})
            return
        await manager.handle_request(scope, receive, send)
