"""`serve env` holds under abuse: silent WebSocket sessions time out and free their slots, bodies over the cap are
a 413 before they are read, every bad reset or step field is a 422 (an error frame over the WebSocket) naming it,
and uvicorn's connections get a header timeout. Real clients: OpenEnv's own, websockets, requests, raw sockets."""

from __future__ import annotations

import contextlib
import json
import socket
import time

import gymnasium as gym
import pytest

pytest.importorskip("openenv")
import requests  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from searchgym.integrations.openenv import SearchAction, SearchGymClient  # noqa: E402
from searchgym.serve.env_host import make_app, open_sessions, uvicorn_options  # noqa: E402
from searchgym.serve.limits import ServerLimits  # noqa: E402
from searchgym.serve.settings import EnvHostSettings, server_settings  # noqa: E402
from tests.integrations.conftest import ENV_KWARGS, uvicorn_in_thread, wait_until  # noqa: E402

ENV_ID = "searchgym/SyntheticQA-v0"
IDLE_S = 1.5
MAX_BODY = 64 * 2**10
CAP = 50  # connections


@pytest.fixture(scope="module")
def n_tasks():
    env = gym.make(ENV_ID, **ENV_KWARGS)
    try:
        return len(env.unwrapped.tasks)
    finally:
        env.close()


@pytest.fixture(scope="module")
def limited_url():
    """The env served as `serve env` serves it (our uvicorn options), with small limits, on 127.0.0.1."""
    settings = EnvHostSettings(
        env_id=ENV_ID,
        env_kwargs=ENV_KWARGS,
        max_sessions=4,
        max_body_bytes=MAX_BODY,
        session_idle_timeout=IDLE_S,
        limits=ServerLimits(body_timeout=1.0),
    )
    app = make_app(settings)
    limits = ServerLimits(header_timeout=1.0, idle_timeout=2.0, max_connections=CAP)
    with uvicorn_in_thread(app, **uvicorn_options(limits, MAX_BODY)) as url:
        yield url


def ws_url(url: str) -> str:
    return url.replace("http", "ws") + "/ws"


def test_silent_sessions_time_out_and_a_fifth_client_gets_in(limited_url):
    """The issue's case: with --max-sessions 4, four clients that never send a message locked out a fifth forever."""
    before = open_sessions()
    with contextlib.ExitStack() as stack:
        silent = [stack.enter_context(connect(ws_url(limited_url))) for _ in range(4)]
        wait_until(lambda: open_sessions() == before + 4, "four sessions to open")
        with pytest.raises(RuntimeError, match="(?i)capacity|sessions"):  # full: the fifth is refused, for now
            with SearchGymClient(base_url=limited_url).sync() as client:
                client.reset(seed=0)
        for ws in silent:  # each is closed by the server, saying why
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=IDLE_S + 10)
            assert closed.value.rcvd.code == 1001 and "session_idle_timeout" in closed.value.rcvd.reason
        wait_until(lambda: open_sessions() == before, "the silent sessions' slots to free")
        with SearchGymClient(base_url=limited_url).sync() as client:  # a client that talks is never cut off
            assert client.reset(seed=0).observation.text
            for _ in range(3):
                time.sleep(IDLE_S * 0.6)  # together longer than the idle timeout, but never silent that long
                client.state()
            assert client.step(SearchAction(tool="search", argument="x")).observation.turn == 1


def test_a_body_over_the_cap_is_refused_before_it_is_read(limited_url):
    """The issue's case: a 100 MB POST /step was read whole (peak 506 MB). The head alone gets the 413."""
    with socket.create_connection(("127.0.0.1", int(limited_url.rsplit(":", 1)[1])), timeout=10) as sock:
        sock.sendall(
            b"POST /step HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000000\r\n\r\n" + b"{" * 1000
        )  # 1 kB of the 100 MB promised
        reply = sock.recv(65536)
        while b"max_body_bytes" not in reply and (chunk := sock.recv(65536)):  # head and body may come apart
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 413") and b"max_body_bytes" in reply

    def chunks():  # no Content-Length: the streamed bytes are counted, and the cap still holds
        for _ in range(200):
            yield b" " * 2**16

    response = requests.post(
        f"{limited_url}/reset", data=chunks(), headers={"Content-Type": "application/json"}, timeout=60
    )
    assert response.status_code == 413 and "max_body_bytes" in response.json()["detail"]
    ok = requests.post(f"{limited_url}/step", json={"action": {"text": "x" * (MAX_BODY // 2)}}, timeout=30)
    assert ok.status_code == 200  # under the cap: served as before
    with connect(ws_url(limited_url)) as ws:  # a WebSocket message over the cap closes that session (1009)
        ws.send(json.dumps({"type": "step", "data": {"text": "x" * (2 * MAX_BODY)}}))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd.code == 1009


def test_a_body_that_stalls_after_its_head_is_a_408(limited_url):
    with socket.create_connection(("127.0.0.1", int(limited_url.rsplit(":", 1)[1])), timeout=15) as sock:
        sock.sendall(
            b"POST /step HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"action": '
        )  # then nothing more
        started, reply = time.monotonic(), b""
        while b"body_timeout" not in reply and (chunk := sock.recv(65536)):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 408") and b"body_timeout" in reply
    assert time.monotonic() - started < 8  # the 1 s body timeout, not never


def test_reset_indices_at_the_edges(limited_url, n_tasks):
    for index in (0, n_tasks - 1):
        response = requests.post(f"{limited_url}/reset", json={"index": index}, timeout=30)
        assert response.status_code == 200 and response.json()["observation"]["task_id"]
    for index in (n_tasks, -1, 2.5, "abc", [1], {}, True, "3"):  # wrap-around, truncation and 500s, all gone
        response = requests.post(f"{limited_url}/reset", json={"index": index}, timeout=30)
        assert response.status_code == 422, (index, response.text)
        assert response.json()["detail"][0]["loc"] == ["body", "index"]


JSON_FLOATS = st.floats(allow_nan=False, allow_infinity=False)  # what a JSON client can send
BAD_RESET = {
    "index": st.one_of(
        st.integers(max_value=-1),
        st.integers(min_value=10**6),
        JSON_FLOATS,
        st.text(max_size=4),
        st.booleans(),
        st.lists(st.integers(), max_size=2),
        st.dictionaries(st.text(max_size=2), st.none()),
    ),
    "seed": st.one_of(
        JSON_FLOATS,
        st.text(min_size=1, max_size=4),
        st.booleans(),
        st.lists(st.integers(), max_size=2),
        st.integers(max_value=-1),
    ),
    "task_id": st.one_of(st.integers(), JSON_FLOATS, st.booleans(), st.lists(st.text(max_size=3), max_size=2)),
    "episode_id": st.one_of(
        st.integers(), st.lists(st.text(max_size=3), max_size=2), st.text(min_size=256, max_size=300)
    ),
    "unknown": st.one_of(st.integers(), st.text(max_size=4), st.none()),
}


def pydantic_reads_as_a_seed(value) -> bool:
    """Over HTTP, OpenEnv's ResetRequest (pydantic, lax) reads 3.0, "3" and true as whole seeds, losing nothing;
    2.5, "abc", lists and negatives are its 422. Over the WebSocket our reset sees the raw value and is strict."""
    if isinstance(value, bool):
        return True
    if isinstance(value, float):
        return value.is_integer() and value >= 0
    if isinstance(value, str):
        try:
            return int(value) >= 0
        except ValueError:
            return False
    return False


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(sorted(BAD_RESET)), data=st.data())
def test_every_bad_reset_field_is_named_over_http_and_the_websocket(limited_url, field, data):
    value = data.draw(BAD_RESET[field])
    name = data.draw(st.sampled_from(["difficulty", "options", "index_", "Seed"])) if field == "unknown" else field
    response = requests.post(f"{limited_url}/reset", json={name: value}, timeout=30)
    if not (field == "seed" and response.status_code == 200 and pydantic_reads_as_a_seed(value)):
        assert response.status_code == 422, (name, value, response.text)
        detail = response.json()["detail"]
        assert name in json.dumps(detail), detail  # OpenEnv's own model checks seed and episode_id first; ours the rest
    with SearchGymClient(base_url=limited_url).sync() as client:
        with pytest.raises(RuntimeError, match=name):
            client.reset(**{name: value})


def test_an_unknown_step_field_is_named(limited_url):
    response = requests.post(f"{limited_url}/step", json={"action": {"text": "x"}, "verbose": True}, timeout=30)
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "verbose"]
    ok = requests.post(f"{limited_url}/step", json={"action": {"text": "x"}, "request_id": "r1"}, timeout=30)
    assert ok.status_code == 200


def test_uvicorn_closes_silent_and_half_sent_connections_after_the_header_timeout(limited_url):
    port = int(limited_url.rsplit(":", 1)[1])
    held = [socket.create_connection(("127.0.0.1", port), timeout=15) for _ in range(CAP - 10)]
    try:
        for sock in held[::2]:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # half a head; the others send nothing
        assert requests.get(f"{limited_url}/health", timeout=10).status_code == 200  # served meanwhile
        started = time.monotonic()
        for sock in held:
            reply = b""
            while chunk := sock.recv(4096):
                reply += chunk
            assert reply.startswith(b"HTTP/1.1 408") and b"header_timeout" in reply
        assert time.monotonic() - started < 10  # the 1 s header timeout, not never
    finally:
        for sock in held:
            sock.close()


def test_past_the_connection_cap_uvicorn_answers_503_until_held_sockets_time_out(limited_url):
    port = int(limited_url.rsplit(":", 1)[1])
    held = [socket.create_connection(("127.0.0.1", port), timeout=15) for _ in range(CAP)]
    try:
        response = requests.get(f"{limited_url}/health", timeout=10)
        assert response.status_code == 503  # full: refused cleanly, not queued
        wait_until(
            lambda: requests.get(f"{limited_url}/health", timeout=10).status_code == 200,
            "the held sockets' header timeout to free the server",
            limit=15,
        )
    finally:
        for sock in held:
            sock.close()


def test_an_idle_http_mcp_session_is_reaped_too(limited_url):
    """OpenEnv's HTTP MCP sessions hold a slot as a WebSocket does; its reaper frees them after the idle timeout."""
    before = open_sessions()
    created = requests.post(
        f"{limited_url}/mcp",
        json={"jsonrpc": "2.0", "method": "openenv/session/create", "params": {}, "id": 1},
        timeout=30,
    )
    assert created.status_code == 200 and created.json()["result"]["session_id"]
    assert open_sessions() == before + 1
    wait_until(lambda: open_sessions() == before, "the idle MCP session to be reaped", limit=30)  # checked every 5 s


def test_uvicorn_closes_an_idle_keep_alive_connection_and_a_late_half_head_after_the_idle_timeout(limited_url):
    port = int(limited_url.rsplit(":", 1)[1])
    replies = []
    for then in (b"", b"GET /health HTTP/1.1\r\n"):  # after one answer: silence, or half of the next head
        with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            first = sock.recv(65536)
            while not first.endswith(b"}"):  # the head and the JSON body may come apart
                first += sock.recv(65536)
            assert first.startswith(b"HTTP/1.1 200")
            sock.sendall(then)
            started, reply = time.monotonic(), b""
            while chunk := sock.recv(4096):
                reply += chunk
            assert 1.5 < time.monotonic() - started < 10  # the fixture's 2 s idle timeout, not the 1 s header one
            replies.append(reply)
    assert replies[0] == b"" and replies[1].startswith(b"HTTP/1.1 408") and b"idle_timeout" in replies[1]


def test_serve_env_flags_are_checked():
    from searchgym.cli import build_parser

    settings = server_settings(build_parser().parse_args(["serve", "env", ENV_ID]), EnvHostSettings)
    limits = settings.limits
    assert (settings.session_idle_timeout, settings.max_body_bytes, limits.header_timeout, limits.body_timeout) == (
        600.0,
        2**20,
        15.0,
        60.0,
    )
    for flag, value in (
        ("--session-idle-timeout", "0"),
        ("--max-body-bytes", "-5"),
        ("--max-sessions", "0"),
        ("--max-connections", "x"),
        ("--header-timeout", "nan"),
    ):
        with pytest.raises((SystemExit, ValueError)):  # argparse's type (exit 2), or the settings' check
            server_settings(build_parser().parse_args(["serve", "env", ENV_ID, flag, value]), EnvHostSettings)
    for key, value in (("max_sessions", 0), ("max_body_bytes", 1.5), ("session_idle_timeout", -1), ("body_timeout", 0)):
        with pytest.raises(ValueError, match=key):
            if key == "body_timeout":  # a socket limit: ServerLimits'
                make_app(EnvHostSettings(env_id=ENV_ID, env_kwargs=ENV_KWARGS, limits=ServerLimits(body_timeout=value)))
            else:
                make_app(EnvHostSettings(env_id=ENV_ID, env_kwargs=ENV_KWARGS, **{key: value}))
