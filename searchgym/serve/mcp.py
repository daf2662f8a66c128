"""MCP: a registered searchgym env's tools as an MCP server, on the official `mcp` SDK's low-level server.

`searchgym serve mcp searchgym/SyntheticQA-v0` serves, over streamable HTTP (`/mcp`) or stdio:

- one MCP session is one episode, played on an env of its own, built by `start` and closed when the session
  ends however it ends (the client closes it, its process dies and its session idles out, stdin closes);
- tools `start(seed?, task_id?, index?)` (the opening prompt), `search(query)`, `access(url)` and
  `answer(answer)` (verdict and reward; ends the episode), each returning the env's observation text and a
  structured result; the env's own budgets (`max_turns`, `max_obs_tokens`) end an episode as they do in Gymnasium;
- a call before `start`, after the end, with bad arguments or to an unknown tool is a tool error (`isError`)
  saying what to do; the server never crashes on one.

Needs `pip install 'searchgym[mcp]'` (mcp>=1.27,<2: the 2.x SDK makes the streamable-HTTP lifespan server-wide,
which is how a session gets an env of its own here, and openenv 0.10 needs mcp<2).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sys
from collections.abc import AsyncIterator
from typing import Any, TextIO

import gymnasium as gym

import searchgym
from searchgym.agents.mcp_tools import (
    DESCRIPTIONS,
    ENV_TOOLS,
    MCP_INSTRUCTIONS,
    START,
    ToolError,
    argument_error,
    input_schema,
    output_schema,
)
from searchgym.core.extras import needs
from searchgym.envs.actions import tool_call_action
from searchgym.envs.factory import make_unwrapped
from searchgym.envs.rewards import judge_error
from searchgym.serve.limits import ServerLimits
from searchgym.serve.mcp_endpoint import loopback_security, quiet_closed_streams
from searchgym.serve.settings import MAX_SESSIONS, SESSION_IDLE_TIMEOUT, TRANSPORTS, McpHostSettings, checked

with needs("searchgym serve mcp"):
    from mcp import types
    from mcp.server.lowlevel import Server

__all__ = ["MAX_SESSIONS", "SESSION_IDLE_TIMEOUT", "TRANSPORTS", "McpEnvServer", "McpHostSettings", "serve"]
MAX_BODY_BYTES = 4 * 2**20  # an HTTP request body (the SDK's own cap from 1.29): room for a 1 MiB junk argument,
#                             which gets a tool error naming the field rather than a 413

NOT_STARTED = "No episode has started in this session: call start first (optionally with seed, task_id or index)."
ONE_EPISODE = (
    "This session's episode has already started (task {task_id}); one MCP session is one episode: "
    "open a new session for another."
)
OVER = (
    "The episode is over ({how}); no tool changes it now. One MCP session is one episode: open a new session "
    "for another."
)


class Episode:
    """One session's episode: its env (built at `start`), the lock that runs its calls one at a time, how it ended."""

    def __init__(self, host: McpEnvServer) -> None:
        self.host = host
        self.env: Any = None
        self.task_id: str | None = None
        self.ended: str | None = None  # why the episode is over, once it is
        self.infos: list[dict[str, Any]] = []
        self.lock = asyncio.Lock()

    async def start(
        self, seed: int | None = None, task_id: str | None = None, index: int | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Build the session's env and reset it to the task asked for; the opening prompt and the task id."""
        async with self.lock:
            if self.env is not None:
                raise ToolError(ONE_EPISODE.format(task_id=self.task_id))
            env = self.host.open_env()
            try:
                if task_id is not None:
                    try:
                        env.tasks.by_id(task_id)
                    except KeyError as e:
                        raise ToolError(f"no task {task_id[:80]!r} in this env's pool ({e.args[0]})"[:400]) from None
                options = (
                    {"task_id": task_id} if task_id is not None else {"index": index} if index is not None else None
                )
                obs, info = await env.areset(seed=seed, options=options)
            except BaseException:
                self.host.close_env(env)
                raise
            self.env, self.task_id = env, info["task_id"]
            return obs, {"task_id": self.task_id, "turn": 0, "max_turns": env.max_turns}

    async def step(self, tool: str, argument: str) -> tuple[str, dict[str, Any]]:
        """Run one tool call on the env: its observation and the structured result (reward and verdict at the end)."""
        async with self.lock:
            if self.env is None:
                raise ToolError(NOT_STARTED)
            if self.ended is not None:
                raise ToolError(OVER.format(how=self.ended))
            obs, reward, terminated, truncated, info = await self.env.astep(tool_call_action(tool, argument))
            self.infos.append(info)
            result: dict[str, Any] = {
                "task_id": self.task_id,
                "turn": info.get("turn", 0),
                "tool": info.get("tool", "invalid"),
                "done": terminated or truncated,
                "terminated": terminated,
                "truncated": truncated,
                "reward": float(reward),
                "format_errors": list(info.get("format_errors", [])),
            }
            if "verdict" in info:
                result["verdict"] = json.loads(json.dumps(info["verdict"], default=str))
                result["judge_error"] = judge_error(self.infos)
                if result["judge_error"]:  # the judge could not score: no reward rather than a 0
                    result["reward"] = None
            if truncated:
                result["truncation"] = info.get("truncation", "budget")
            if terminated:
                self.ended = f"answered; reward {result['reward']}"
            elif truncated:
                self.ended = f"the {result['truncation']} ran out"
            return obs, result

    def close(self) -> None:
        """Close the env (the session ended)."""
        if self.env is not None:
            self.host.close_env(self.env)


class McpEnvServer:
    """An env id and its kwargs served over MCP: builds the SDK server, counts and caps the envs its sessions hold."""

    def __init__(
        self, env_id: str, env_kwargs: dict[str, Any] | None = None, *, max_sessions: int = MAX_SESSIONS
    ) -> None:
        if env_id not in gym.registry:
            raise ValueError(
                f"unknown env id {env_id!r}; registered searchgym ids: "
                f"{sorted(i for i in gym.registry if i.startswith('searchgym/'))}"
            )
        if not (isinstance(max_sessions, int) and not isinstance(max_sessions, bool) and max_sessions > 0):
            raise ValueError(f"max_sessions must be a positive whole number, got {max_sessions!r}")
        self.env_id, self.max_sessions = env_id, max_sessions
        self.env_kwargs = {"instructions": MCP_INSTRUCTIONS, **(env_kwargs or {})}
        probe = make_unwrapped(env_id, **self.env_kwargs)  # fail now, not at the first client, on bad kwargs
        self.n_tasks, self.max_turns = len(probe.tasks), probe.max_turns
        probe.close()
        self._open: set[Any] = set()  # the envs sessions hold now

    def open_envs(self) -> int:
        """How many envs are open: one per session whose episode has started and whose client is still there."""
        return len(self._open)

    def open_env(self) -> Any:
        """A new env for a session, or a ToolError when `max_sessions` episodes are already open."""
        if len(self._open) >= self.max_sessions:
            raise ToolError(f"the server is full ({self.max_sessions} episodes open); try again later")
        env = make_unwrapped(self.env_id, **self.env_kwargs)
        self._open.add(env)
        return env

    def close_env(self, env: Any) -> None:
        """Close a session's env (once: a second call does nothing)."""
        if env in self._open:
            self._open.discard(env)
            env.close()

    def tools(self) -> list[types.Tool]:
        """The tool list with input and output schemas."""
        return [
            types.Tool(
                name=name,
                description=DESCRIPTIONS[name],
                inputSchema=input_schema(name, self.n_tasks),
                outputSchema=output_schema(name),
            )
            for name in (START, *ENV_TOOLS)
        ]

    def server(self) -> Server:
        """The SDK's low-level server; its lifespan runs once per session (per `Server.run`), holding the Episode."""

        @contextlib.asynccontextmanager
        async def session(_: Server) -> AsyncIterator[Episode]:
            episode = Episode(self)
            try:
                yield episode
            finally:
                episode.close()

        server: Server = Server(
            f"searchgym {self.env_id}",
            version=searchgym.__version__,
            lifespan=session,
            instructions="One session is one episode: call start, then search, access and answer.",
        )
        tools = self.tools()

        @server.list_tools()
        async def list_tools() -> list[types.Tool]:
            return tools

        @server.call_tool(validate_input=False)  # checked by argument_error: short messages naming the field
        async def call_tool(name: str, arguments: dict[str, Any]) -> Any:
            episode: Episode = server.request_context.lifespan_context
            return await self.call(episode, name, arguments)

        return server

    async def call(self, episode: Episode, name: str, arguments: Any) -> tuple[list[types.TextContent], dict[str, Any]]:
        """Run one tool call for `episode`: (content, structured content), or a ToolError saying what was wrong."""
        if name != START and name not in ENV_TOOLS:
            raise ToolError(f"unknown tool {str(name)[:40]!r}; the tools are {', '.join((START, *ENV_TOOLS))}")
        error = argument_error(name, arguments, self.n_tasks)
        if error:
            raise ToolError(error)
        if name == START:
            seed, index = arguments.get("seed"), arguments.get("index")
            obs, result = await episode.start(
                None if seed is None else int(seed), arguments.get("task_id"), None if index is None else int(index)
            )
            return [types.TextContent(type="text", text=obs)], result
        obs, result = await episode.step(name, next(iter(arguments.values())))
        content = [types.TextContent(type="text", text=obs)]
        if result["truncated"]:
            content.append(
                types.TextContent(type="text", text=f"The episode is over: the {result['truncation']} ran out.")
            )
        elif result["terminated"] and result.get("judge_error"):
            content.append(
                types.TextContent(
                    type="text", text=f"No reward: the judge could not score the answer ({result['judge_error']})."
                )
            )
        elif result["terminated"]:
            content.append(
                types.TextContent(
                    type="text", text=f"Reward: {result['reward']}. Verdict: {json.dumps(result.get('verdict'))}"
                )
            )
        return content, result

    def http_app(
        self,
        *,
        session_idle_timeout: float = SESSION_IDLE_TIMEOUT,
        host: str = "127.0.0.1",
        max_body_bytes: int = MAX_BODY_BYTES,
        body_timeout: float = 60.0,
    ) -> Any:
        """A Starlette app serving the MCP endpoint at /mcp (streamable HTTP, one server session per MCP session);
        on a loopback host it refuses other Host and Origin headers (DNS rebinding), as the SDK's FastMCP does;
        a body over `max_body_bytes`, or not whole `body_timeout` s after its head, is a 413 or 408; one that is not
        UTF-8, not JSON or nested past 64 levels a 400 JSON-RPC parse error (the SDK's handler would answer 500)."""
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
        from starlette.applications import Starlette
        from starlette.routing import Route

        from searchgym.serve.asgi_limits import BodyLimit
        from searchgym.serve.json_guard import JsonBodyGuard

        if not (isinstance(session_idle_timeout, (int, float)) and 0 < session_idle_timeout < float("inf")):
            raise ValueError(f"session_idle_timeout must be a positive number of seconds, got {session_idle_timeout!r}")
        quiet_closed_streams()
        manager = StreamableHTTPSessionManager(
            app=self.server(), security_settings=loopback_security(host), session_idle_timeout=session_idle_timeout
        )

        class Endpoint:  # an ASGI endpoint (a class, so Starlette's Route passes it the raw scope)
            async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
                await manager.handle_request(scope, receive, send)

        @contextlib.asynccontextmanager
        async def lifespan(_: Any) -> AsyncIterator[None]:
            async with manager.run():
                yield

        return BodyLimit(
            JsonBodyGuard(
                Starlette(routes=[Route("/mcp", endpoint=Endpoint())], lifespan=lifespan), max_bytes=max_body_bytes
            ),
            max_bytes=max_body_bytes,
            timeout_s=body_timeout,
        )

    async def serve_stdio(self, protocol_out: TextIO) -> None:
        """Serve one session over stdin and `protocol_out` (the process's stdout) until stdin closes."""
        import anyio
        from mcp.server.stdio import stdio_server

        protocol = anyio.wrap_file(io.TextIOWrapper(protocol_out.buffer, encoding="utf-8"))
        server = self.server()
        async with stdio_server(stdout=protocol) as (read, write):
            await server.run(read, write, server.create_initialization_options())


def serve(settings: McpHostSettings) -> None:
    """Serve `settings.env_id`'s tools over MCP until interrupted (stdio: until the client closes stdin); HTTP
    connections under `settings.limits` (header, idle and body timeouts, the connection cap)."""
    checked(settings)
    env_id, env_kwargs = settings.env_id, settings.env_kwargs
    if settings.transport == "stdio":  # stdout carries the protocol: anything else printed goes to stderr
        import anyio

        protocol_out = sys.stdout
        with contextlib.redirect_stdout(sys.stderr):
            anyio.run(McpEnvServer(env_id, env_kwargs, max_sessions=1).serve_stdio, protocol_out)
        return
    import uvicorn

    host, port, limits = settings.host, settings.port, settings.limits
    app = McpEnvServer(env_id, env_kwargs, max_sessions=settings.max_sessions).http_app(
        session_idle_timeout=settings.session_idle_timeout, host=host, body_timeout=limits.body_timeout
    )
    print(
        f"serving {env_id}'s tools over MCP on http://{host}:{port}/mcp (streamable HTTP)", file=sys.stderr, flush=True
    )
    uvicorn.run(app, host=host, port=port, log_level="warning", **uvicorn_options(limits))


def uvicorn_options(limits: ServerLimits) -> dict[str, Any]:
    """uvicorn.Config options that enforce `limits`: header and keep-alive timeouts, the connection cap (503 past
    it), the request-head size."""
    from searchgym.serve.asgi_limits import guarded_http_protocol

    return {
        "http": guarded_http_protocol(limits.header_timeout, limits.idle_timeout),
        "timeout_keep_alive": limits.idle_timeout,
        "limit_concurrency": limits.connection_cap,
        "h11_max_incomplete_event_size": 64 * 2**10,
    }
