"""Every aiohttp server (serve search, serve model) holds under abuse: sockets that connect and say nothing, or
half a request head, are closed after the header timeout; idle keep-alive connections after the idle timeout;
past the connection cap new connections get a 503 while established clients keep being served. Loopback only."""

import asyncio
import os
import resource
import time

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from searchgym.serve.http import json_body, serve_app
from searchgym.serve.limits import ServerLimits


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def hello_app() -> web.Application:
    async def hello(request: web.Request) -> web.Response:
        return web.json_response({"hello": "world"})

    app = web.Application()
    app.router.add_get("/hello", hello)
    return app


def raise_fd_limit(want: int) -> int:
    """Raise the soft descriptor limit towards `want` (within the hard limit); the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want and (hard == resource.RLIM_INFINITY or hard > soft):
        soft = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


async def read_until_eof(reader: asyncio.StreamReader, within: float) -> bytes:
    """Everything the server sends until it closes the connection (a TimeoutError if it has not within `within`)."""
    return await asyncio.wait_for(reader.read(), within)


async def test_a_thousand_idle_and_half_open_sockets_are_closed_while_normal_clients_are_served():
    n = min(1000, (raise_fd_limit(4096) - 300) // 2)  # each socket costs two descriptors here: both ends
    assert n >= 200, "the descriptor limit leaves too few sockets for this test"
    limits = ServerLimits(header_timeout=3.0, idle_timeout=30.0, max_connections=n + 100)
    baseline = open_fds()
    async with serve_app(hello_app(), limits=limits, shutdown_timeout=0.5) as url:
        port = int(url.rsplit(":", 1)[1])
        conns = []
        for start in range(0, n, 100):
            conns += await asyncio.gather(
                *(asyncio.open_connection("127.0.0.1", port) for _ in range(start, min(n, start + 100)))
            )
        for i, (_, writer) in enumerate(conns):
            if i % 2:  # half send part of a request head, half send nothing at all
                writer.write(b"GET /hello HTTP/1.1\r\nHost: x\r\n")
        held = open_fds()
        for _ in range(40):  # the server accepts them at its own pace (a busy CI box is slow)
            if held >= baseline + 2 * n - 10:
                break
            await asyncio.sleep(0.05)
            held = max(held, open_fds())
        assert held >= baseline + 2 * n - 10  # both ends of every socket are open

        async def normal_client(http: aiohttp.ClientSession) -> int:
            served = 0
            deadline = time.monotonic() + 2.0  # while the sockets are held
            while time.monotonic() < deadline:
                async with http.get(url + "/hello") as resp:
                    assert resp.status == 200 and await resp.json() == {"hello": "world"}
                    served += 1
                await asyncio.sleep(0.05)
            return served

        async with aiohttp.ClientSession() as http:
            served = await asyncio.gather(*(normal_client(http) for _ in range(10)))
        assert all(s >= 10 for s in served), served

        replies = await asyncio.gather(*(read_until_eof(reader, 10.0) for reader, _ in conns))
        for i, reply in enumerate(replies):  # every socket was closed by the server, with a 408 saying why
            assert reply.startswith(b"HTTP/1.1 408 ") and b"header_timeout" in reply, (i, reply[:80])
        assert open_fds() <= baseline + n + 10  # the server's ends are gone while ours are still open
        for _, writer in conns:
            writer.close()
        await asyncio.sleep(0.2)
    assert open_fds() <= baseline + 2


async def test_a_slowloris_head_is_cut_at_the_header_timeout_even_while_bytes_keep_coming():
    async with serve_app(hello_app(), limits=ServerLimits(header_timeout=1.0), shutdown_timeout=0.5) as url:
        reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
        started = time.monotonic()
        with pytest.raises((ConnectionError, BrokenPipeError)):
            for byte in b"GET /hello HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 1000:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.05)
                if reader.at_eof() or time.monotonic() - started > 10:
                    raise ConnectionError("closed")
        assert time.monotonic() - started < 8  # closed near 1 s, long before the 50 s the trickle would take
        writer.close()


async def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout_and_not_before():
    limits = ServerLimits(header_timeout=30.0, idle_timeout=1.5)
    async with serve_app(hello_app(), limits=limits, shutdown_timeout=0.5) as url:
        reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
        writer.write(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        length = int(
            next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        )
        await reader.readexactly(length)
        writer.write(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive: a second request on the same socket
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        await reader.readexactly(length)
        writer.write(b"GET /hello HTTP/1.1\r\n")  # then half a head, and silence
        started = time.monotonic()
        assert await read_until_eof(reader, 10.0) == b""
        assert 1.0 < time.monotonic() - started < 8  # the idle timeout, not the 30 s header timeout
        writer.close()


async def test_past_the_connection_cap_new_clients_get_503_and_established_ones_are_still_served():
    limits = ServerLimits(header_timeout=30.0, max_connections=20)
    async with serve_app(hello_app(), limits=limits, shutdown_timeout=0.5) as url:
        port = int(url.rsplit(":", 1)[1])
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as established:
            async with established.get(url + "/hello") as resp:  # its pooled connection is one of the 20
                assert resp.status == 200
            idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(19)]
            await asyncio.sleep(0.1)
            async with aiohttp.ClientSession() as newcomer:
                async with newcomer.get(url + "/hello") as resp:
                    assert resp.status == 503 and resp.headers["Retry-After"] == "1"
                    assert "max_connections" in (await resp.json())["error"]
                for _ in range(5):  # the established client's keep-alive connection is untouched by the refusals
                    async with established.get(url + "/hello") as resp:
                        assert resp.status == 200
                idle[0][1].close()  # one slot frees: the next newcomer is served
                await asyncio.sleep(0.2)
                async with newcomer.get(url + "/hello") as resp:
                    assert resp.status == 200
            for _, writer in idle[1:]:
                writer.close()


async def test_a_body_that_stalls_after_its_head_is_a_408_and_others_are_served():
    async def echo(request: web.Request) -> web.Response:  # json_body reads through read_body, as every route does
        return web.json_response(await json_body(request))

    app = hello_app()
    app.router.add_post("/echo", echo)
    async with serve_app(app, limits=ServerLimits(body_timeout=1.0), shutdown_timeout=0.5) as url:
        reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
        writer.write(
            b'POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"a": '
        )  # then nothing more
        started = time.monotonic()
        async with aiohttp.ClientSession() as http:
            async with http.post(url + "/echo", json={"a": 1}) as resp:  # another client, meanwhile
                assert resp.status == 200 and await resp.json() == {"a": 1}
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 408") and time.monotonic() - started < 8
        assert b"body_timeout" in await asyncio.wait_for(reader.read(200), 5)
        writer.close()


bad_seconds = st.one_of(
    st.floats(max_value=0), st.just(float("inf")), st.just(float("nan")), st.booleans(), st.text(max_size=3), st.none()
)


@given(key=st.sampled_from(["header_timeout", "idle_timeout", "body_timeout"]), value=bad_seconds)
def test_bad_timeouts_are_refused_naming_the_setting(key, value):
    with pytest.raises(ValueError, match=key):
        ServerLimits(**{key: value})


@given(value=st.one_of(st.integers(max_value=0), st.floats(), st.booleans(), st.text(max_size=3)))
def test_a_bad_connection_cap_is_refused_naming_the_setting(value):
    with pytest.raises(ValueError, match="max_connections"):
        ServerLimits(max_connections=value)
