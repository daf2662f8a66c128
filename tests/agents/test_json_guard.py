"""Bodies the MCP SDK's handler answers with a 500 and a traceback (not UTF-8, nested 100k deep) are a 4xx JSON-RPC
error from the guard in front of it, on an agent's episode endpoint and on `serve mcp`; any bytes at all get a 4xx or
a 2xx, never a 5xx."""

from __future__ import annotations

import asyncio
import json
import random

import aiohttp
import pytest

pytest.importorskip("mcp")

from searchgym.serve.json_guard import body_error  # noqa: E402
from searchgym.serve.mcp_endpoint import EpisodeToolServer  # noqa: E402

HEAD = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
DEEP = b"[" * 100_000 + b"]" * 100_000
NOT_UTF8 = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"x": "\xff"}}'
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}


async def post_all(bodies: list[bytes]) -> list[tuple[int, str]]:
    """(status, body) of each POST to a fresh episode endpoint."""

    async def call(name: str, arguments: dict) -> str:
        return "observation"

    async with EpisodeToolServer() as server, server.episode("ab", call) as url, aiohttp.ClientSession() as http:
        out = []
        for body in bodies:
            async with http.post(url, data=body, headers=HEAD) as resp:
                out.append((resp.status, await resp.text()))
        return out


def test_a_deep_or_non_utf8_body_is_a_parse_error_and_a_good_one_is_served():
    (deep, deep_text), (bad, bad_text), (good, _) = asyncio.run(
        post_all([DEEP, NOT_UTF8, json.dumps(INITIALIZE).encode()])
    )
    assert deep == 400 and "more than 64 deep" in json.loads(deep_text)["error"]["message"]
    assert bad == 400 and "not UTF-8" in json.loads(bad_text)["error"]["message"]
    assert good == 200


def junk_bodies(n: int, seed: int = 44) -> list[bytes]:
    """Seeded junk: random bytes, and JSON-RPC messages whose params nest lists 0 to 200 deep."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        if rng.random() < 0.5:
            out.append(bytes(rng.randrange(256) for _ in range(rng.randrange(200))))
        else:
            depth = rng.randrange(200)
            params = "[" * depth + "]" * depth or "null"
            out.append(f'{{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {{"v": {params}}}}}'.encode())
    return out


def test_any_body_is_answered_without_a_5xx():
    assert all(status < 500 for status, _ in asyncio.run(post_all(junk_bodies(30))))


def test_serve_mcp_answers_the_same_bodies_with_a_parse_error():
    from starlette.testclient import TestClient

    from searchgym.serve.mcp import McpEnvServer

    app = McpEnvServer("searchgym/SyntheticQA-v0", {"size": 300, "seed": 0, "n_tasks": 40}).http_app()
    with TestClient(app, base_url="http://127.0.0.1:8000") as client:
        for body in (DEEP, NOT_UTF8):
            resp = client.post("/mcp", content=body, headers=HEAD)
            assert resp.status_code == 400 and resp.json()["error"]["code"] == -32700


def test_the_guard_reads_json_as_the_sdk_would():
    assert body_error(json.dumps(INITIALIZE).encode()) is None
    assert "not JSON" in body_error(b"{") and "64 deep" in body_error(b"[" * 65 + b"]" * 65)
    assert body_error(b"[" * 64 + b"]" * 64) is None
