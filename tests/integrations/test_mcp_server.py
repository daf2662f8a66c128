"""`searchgym serve mcp` against the official MCP client (`mcp.ClientSession`) over streamable HTTP and stdio."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("mcp")
import anyio.from_thread  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from searchgym.core.extras import MissingExtra  # noqa: E402
from searchgym.envs.actions import MAX_ARGUMENT_CHARS  # noqa: E402
from searchgym.envs.factory import make_unwrapped  # noqa: E402
from searchgym.serve.limits import ServerLimits  # noqa: E402
from searchgym.serve.mcp import Episode, McpEnvServer, ToolError, serve, uvicorn_options  # noqa: E402
from searchgym.serve.settings import McpHostSettings, server_settings  # noqa: E402
from tests.integrations.conftest import BrokenJudge, uvicorn_in_thread  # noqa: E402

ENV_ID = "searchgym/SyntheticQA-v0"
KWARGS = {"size": 300, "seed": 0, "n_tasks": 40, "max_turns": 4}
IDLE_S = 1.0  # the HTTP session idle timeout here: how soon a vanished client's session (and env) is closed


@pytest.fixture(scope="module")
def tasks():
    env = make_unwrapped(ENV_ID, **KWARGS)
    try:
        return list(env.tasks)
    finally:
        env.close()


@pytest.fixture(scope="module")
def served():
    """(McpEnvServer, its /mcp URL): served by uvicorn in this process, so a test can count its open envs; with the
    connection limits `serve mcp` runs under."""
    server = McpEnvServer(ENV_ID, KWARGS, max_sessions=16)
    with uvicorn_in_thread(server.http_app(session_idle_timeout=IDLE_S), **uvicorn_options(ServerLimits())) as url:
        yield server, f"{url}/mcp"


@contextlib.asynccontextmanager
async def http_session(url: str):
    async with streamable_http_client(url) as (read, write, _), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def stdio_params() -> StdioServerParameters:
    """The CLI as a subprocess speaking MCP over its stdin/stdout."""
    return StdioServerParameters(
        command=sys.executable,
        env=dict(os.environ),
        args=[
            "-m",
            "searchgym.cli",
            "serve",
            "mcp",
            ENV_ID,
            "--transport",
            "stdio",
            "--env-kwargs",
            json.dumps(KWARGS),
        ],
    )


@contextlib.asynccontextmanager
async def stdio_session():
    async with stdio_client(stdio_params()) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def wait_for(condition, what: str, limit: float = 30.0) -> None:
    """Poll `condition` without blocking the loop (a bounded wait for an event, not a timing assertion)."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.05)


def text(result) -> str:
    return "\n".join(block.text for block in result.content)


async def play_oracle(session: ClientSession, task) -> None:
    """start on `task`, search its question, open the top hit, answer the gold answer: reward 1 and the verdict;
    then any call is an error saying the episode is over."""
    tools = {t.name: t for t in (await session.list_tools()).tools}
    assert set(tools) == {"start", "search", "access", "answer"}
    assert tools["search"].inputSchema["required"] == ["query"]
    assert tools["access"].inputSchema["required"] == ["url"]
    assert tools["answer"].inputSchema["required"] == ["answer"]
    assert set(tools["start"].inputSchema["properties"]) == {"seed", "task_id", "index"}
    assert all(t.outputSchema and t.description for t in tools.values())

    started = await session.call_tool("start", {"task_id": task.id})
    assert not started.isError and task.question in text(started)
    assert started.structuredContent == {"task_id": task.id, "turn": 0, "max_turns": KWARGS["max_turns"]}
    found = await session.call_tool("search", {"query": task.question})
    assert not found.isError and found.structuredContent["tool"] == "search"
    url = re.search(r"\[Doc 1\]\((.*?)\):", text(found)).group(1)
    page = await session.call_tool("access", {"url": url})
    assert not page.isError and ">>>> Page 1 >>>>" in text(page)
    answered = await session.call_tool("answer", {"answer": task.answers[0]})
    assert not answered.isError
    result = answered.structuredContent
    assert result["reward"] == 1.0 and result["done"] and result["terminated"] and result["turn"] == 3
    assert result["verdict"]["correct"] and result["verdict"]["judge"] == "f1" and result["judge_error"] is None
    assert "Your answer was recorded" in text(answered)
    after = await session.call_tool("search", {"query": task.question})
    assert after.isError and "episode is over" in text(after) and "new session" in text(after)


async def test_an_oracle_episode_over_streamable_http_closes_its_env_with_the_session(served, tasks):
    server, url = served
    async with http_session(url) as session:
        await play_oracle(session, tasks[0])
        assert server.open_envs() == 1
    await wait_for(lambda: server.open_envs() == 0, "the session's env to close after the client left")


async def test_an_oracle_episode_over_stdio(tasks):
    async with stdio_session() as session:
        await play_oracle(session, tasks[1])


def test_a_stdio_server_whose_client_goes_mid_episode_exits_cleanly():
    """stdin closing mid-episode ends the one session and the server process with it: exit 0, no orphan env."""
    params = stdio_params()
    server = subprocess.Popen(
        [params.command, *params.args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        for message in (
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "test", "version": "0"},
                },
            },
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "start", "arguments": {"index": 0}}},
        ):
            server.stdin.write((json.dumps(message) + "\n").encode())
        server.stdin.flush()
        replies = [json.loads(server.stdout.readline()) for _ in range(2)]
        assert replies[1]["id"] == 2 and not replies[1]["result"]["isError"]
        assert replies[1]["result"]["structuredContent"]["turn"] == 0
        server.stdin.close()
        assert server.wait(timeout=30) == 0, server.stderr.read()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        server.stdout.close()
        server.stderr.close()


async def test_calls_before_start_twice_started_and_past_the_turn_budget_are_tool_errors(served, tasks):
    server, url = served
    async with http_session(url) as session:
        early = await session.call_tool("answer", {"answer": "x"})
        assert early.isError and "call start first" in text(early)
        assert server.open_envs() == 0  # nothing is built before start
        assert not (await session.call_tool("start", {"index": 2})).isError
        again = await session.call_tool("start", {"index": 3})
        assert again.isError and "one MCP session is one episode" in text(again)
        results = [await session.call_tool("search", {"query": f"q{i}"}) for i in range(KWARGS["max_turns"])]
        assert [r.structuredContent["done"] for r in results] == [False, False, False, True]
        last = results[-1].structuredContent
        assert last["truncated"] and last["truncation"] == "turn budget" and last["reward"] == 0
        assert "the turn budget ran out" in text(results[-1])
        late = await session.call_tool("answer", {"answer": tasks[2].answers[0]})
        assert late.isError and "the turn budget ran out" in text(late)
        unknown = await session.call_tool("browse", {"url": "x"})
        assert unknown.isError and "unknown tool 'browse'" in text(unknown)


BAD_ARGUMENTS = [  # (tool, arguments, what the error says)
    ("search", {}, "search needs the argument 'query' (a string)"),
    ("search", {"query": 5}, "search: query must be a string, got int"),
    ("search", {"query": ""}, "search: query must not be empty"),
    ("search", {"query": "q" * (MAX_ARGUMENT_CHARS + 1)}, f"query must be at most {MAX_ARGUMENT_CHARS} characters"),
    ("search", {"query": "q", "top_k": 50}, "search has no argument 'top_k'; it takes 'query'"),
    ("access", {"link": "http://x"}, "access has no argument 'link'; it takes 'url'"),
    ("answer", {"answer": ["1105"]}, "answer: answer must be a string, got list"),
    ("start", {"index": 40}, "start: index must be at most 39"),
    ("start", {"seed": -1}, "start: seed must be at least 0"),
    ("start", {"seed": True}, "start: seed must be a whole number, got bool"),
    ("start", {"task_id": "t", "index": 1}, "start takes task_id or index, not both"),
    ("start", {"task_id": "nonesuch"}, "no task 'nonesuch' in this env's pool"),
]


async def test_bad_arguments_are_tool_errors_naming_the_field_and_spend_no_turn(served, tasks):
    server, url = served
    async with http_session(url) as session:
        for tool, arguments, message in [b for b in BAD_ARGUMENTS if b[0] == "start"]:
            result = await session.call_tool(tool, arguments)
            assert result.isError and message in text(result), (arguments, text(result))
        assert server.open_envs() == 0  # a refused start holds no env
        assert not (await session.call_tool("start", {"task_id": tasks[3].id})).isError
        for tool, arguments, message in [b for b in BAD_ARGUMENTS if b[0] != "start"]:
            result = await session.call_tool(tool, arguments)
            assert result.isError and message in text(result) and len(text(result)) < 300, (arguments, text(result))
        played = await session.call_tool("search", {"query": tasks[3].question})
        assert played.structuredContent["turn"] == 1


async def test_concurrent_sessions_each_play_their_own_task(served, tasks):
    """8 sessions at once, all started before any answers; odd ones answer the next task's gold answer (wrong for
    theirs): each is judged against its own task only."""
    server, url = served
    chosen = [t for t in tasks if t.answers[0] not in {u.answers[0] for u in tasks if u is not t}][:9]
    assert len(chosen) == 9
    started, all_started = [], asyncio.Event()

    async def one(i: int) -> dict:
        async with http_session(url) as session:
            start = await session.call_tool("start", {"task_id": chosen[i].id})
            started.append(i)
            if len(started) == 8:
                all_started.set()
            await all_started.wait()  # all 8 envs open at once
            assert server.open_envs() == 8
            await session.call_tool("search", {"query": chosen[i].question})
            given = chosen[i + 1] if i % 2 else chosen[i]
            answered = await session.call_tool("answer", {"answer": given.answers[0]})
            return {"start": start.structuredContent, **answered.structuredContent}

    results = await asyncio.gather(*(one(i) for i in range(8)))
    for i, result in enumerate(results):
        assert result["start"]["task_id"] == result["task_id"] == chosen[i].id
        if i % 2 == 0:
            assert result["verdict"]["correct"] and result["reward"] == 1.0, (i, result)
        else:
            assert not result["verdict"]["correct"] and result["reward"] < 1.0, (i, result)
    await wait_for(lambda: server.open_envs() == 0, "every session's env to close")


async def test_calls_sent_at_once_in_one_session_run_one_at_a_time(served, monkeypatch):
    """The SDK serves a session's requests concurrently; the episode runs them in turn, so six searches sent at once
    with a slow backend play the 4-turn budget and no more: four results (turns 1 to 4, the last truncated), then
    two errors saying the episode is over."""
    from searchgym.envs.tools.local_index import LocalIndex

    search = LocalIndex.search

    async def slow_search(self, query, k):
        await asyncio.sleep(0.05)  # a remote backend: the step yields mid-turn
        return await search(self, query, k)

    monkeypatch.setattr(LocalIndex, "search", slow_search)
    server, url = served
    async with http_session(url) as session:
        await session.call_tool("start", {"index": 4})
        results = await asyncio.gather(*(session.call_tool("search", {"query": f"q{i}"}) for i in range(6)))
    played = sorted((r.structuredContent["turn"], r.structuredContent["truncated"]) for r in results if not r.isError)
    assert played == [(1, False), (2, False), (3, False), (4, True)]
    assert [text(r) for r in results if r.isError] == [text(results[-1])] * 2 and "episode is over" in text(results[-1])


KILLED_CLIENT = """
import asyncio, sys
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

async def main():
    async with streamable_http_client(sys.argv[1]) as (r, w, _), ClientSession(r, w) as s:
        await s.initialize()
        await s.call_tool("start", {"index": 5})
        await s.call_tool("search", {"query": "mount"})
        print("READY", flush=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_a_killed_client_frees_its_env_and_the_server_serves_on(served, tasks):
    """SIGKILL a client process mid-episode (no goodbye on the wire): its session idles out, its env closes, and a
    new session plays as before."""
    server, url = served
    client = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, url], stdout=subprocess.PIPE, text=True)
    try:
        line = await asyncio.to_thread(client.stdout.readline)
        assert line.strip() == "READY"
        assert server.open_envs() == 1
        client.send_signal(signal.SIGKILL)
        client.wait(timeout=30)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
        client.stdout.close()
    await wait_for(lambda: server.open_envs() == 0, "the killed client's env to close")
    async with http_session(url) as session:
        await play_oracle(session, tasks[6])


async def test_a_cancelled_client_task_frees_its_env(served):
    """Cancel a client's task mid-episode (its transport torn down as it stands): the env closes too."""
    server, url = served
    started = asyncio.Event()

    async def client() -> None:
        async with http_session(url) as session:
            await session.call_tool("start", {"index": 7})
            started.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(client())
    await asyncio.wait_for(started.wait(), 30)
    assert server.open_envs() == 1
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await wait_for(lambda: server.open_envs() == 0, "the cancelled client's env to close")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
VALUES = JSON | st.just("x" * (MAX_ARGUMENT_CHARS + 1)) | st.just("y" * 2**20) | st.just("")
KEYS = st.sampled_from(["query", "url", "answer", "seed", "task_id", "index"]) | st.text(max_size=8)


def test_junk_arguments_are_tool_errors_or_observations_and_the_server_stays_up(served, tasks):
    """Random JSON for each tool's arguments, each call in a fresh started session: a short tool error or a valid
    result, never a crash; afterwards the server still plays an episode."""
    server, url = served

    async def call(tool: str, arguments: dict):
        async with http_session(url) as session:
            if tool != "start":
                assert not (await session.call_tool("start", {"index": 0})).isError
            result = await session.call_tool(tool, arguments)
            follow = await session.call_tool("search", {"query": "mount"})  # the session still answers
            return result, follow

    with anyio.from_thread.start_blocking_portal() as portal:

        @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(
            tool=st.sampled_from(["start", "search", "access", "answer"]),
            arguments=st.dictionaries(KEYS, VALUES, max_size=3),
        )
        def check(tool, arguments):
            result, follow = portal.call(call, tool, arguments)
            assert result.content and text(result).strip() and len(text(result)) < 2000
            if not result.isError:
                assert result.structuredContent["turn"] == (0 if tool == "start" else 1)
            if tool == "start" and result.isError:  # no episode began: the session says to start
                assert follow.isError and "call start first" in text(follow)
            elif tool == "answer" and not result.isError:  # the episode ended: the session says so
                assert follow.isError and "episode is over" in text(follow)
            else:
                assert not follow.isError and follow.structuredContent["tool"] == "search"

        check()
        portal.call(wait_for, lambda: server.open_envs() == 0, "every junk session's env to close")

        async def oracle():
            async with http_session(url) as session:
                await play_oracle(session, tasks[8])

        portal.call(oracle)


async def test_past_max_sessions_a_start_is_refused_until_one_closes():
    server = McpEnvServer(ENV_ID, KWARGS, max_sessions=1)
    first, second = Episode(server), Episode(server)
    await server.call(first, "start", {"seed": 1})
    with pytest.raises(ToolError, match=r"the server is full \(1 episodes open\)"):
        await server.call(second, "start", {"seed": 2})
    assert server.open_envs() == 1
    first.close()
    content, result = await server.call(second, "start", {"seed": 2})
    assert result["turn"] == 0 and server.open_envs() == 1
    second.close()


async def test_a_judge_failure_is_no_reward_not_a_zero(tasks):
    server = McpEnvServer(ENV_ID, {**KWARGS, "judge": BrokenJudge()})
    episode = Episode(server)
    await server.call(episode, "start", {"task_id": tasks[0].id})
    content, result = await server.call(episode, "answer", {"answer": tasks[0].answers[0]})
    assert result["done"] and result["reward"] is None and result["judge_error"] == "judge endpoint timed out"
    assert (
        result["verdict"]["error"] == "judge endpoint timed out"
        and "No reward: the judge could not score" in content[-1].text
    )
    episode.close()
    episode.close()  # the session's end after an explicit close: nothing more to close
    assert server.open_envs() == 0


def test_serve_mcp_settings_are_checked_naming_them():
    from searchgym.cli import build_parser

    args = server_settings(build_parser().parse_args(["serve", "mcp", ENV_ID]), McpHostSettings)
    assert (args.transport, args.host, args.max_sessions, args.session_idle_timeout) == (
        "streamable-http",
        "127.0.0.1",
        64,
        600.0,
    )
    for flag, value in (
        ("--transport", "sse"),
        ("--session-idle-timeout", "0"),
        ("--max-sessions", "0"),
        ("--header-timeout", "nan"),
    ):
        with pytest.raises((SystemExit, ValueError)):  # argparse's type or choices (exit 2), or the settings' check
            server_settings(build_parser().parse_args(["serve", "mcp", ENV_ID, flag, value]), McpHostSettings)
    with pytest.raises(ValueError, match="max_sessions"):
        McpEnvServer(ENV_ID, KWARGS, max_sessions=0)
    with pytest.raises(ValueError, match="session_idle_timeout"):
        McpEnvServer(ENV_ID, KWARGS).http_app(session_idle_timeout=-1)
    with pytest.raises(ValueError, match="transport"):
        serve(McpHostSettings(env_id=ENV_ID, env_kwargs=KWARGS, transport="sse"))
    with pytest.raises(ValueError, match="unknown env id"):
        McpEnvServer("searchgym/Nonesuch-v0")


def test_bad_env_kwargs_fail_at_start_naming_the_key(capsys):
    from searchgym.cli import main

    assert main(["serve", "mcp", ENV_ID, "--transport", "stdio", "--env-kwargs", '{"sise": 300}']) == 2
    assert "sise" in capsys.readouterr().err


def test_without_the_extra_the_error_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "mcp", None)
    monkeypatch.delitem(sys.modules, "searchgym.serve.mcp")
    with pytest.raises(MissingExtra, match=r"searchgym\[mcp\].*pip install 'searchgym\[mcp\]'"):
        importlib.import_module("searchgym.serve.mcp")
