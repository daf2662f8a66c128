"""What a retrieval server sends is checked before it is ranked: a score that is not a finite number (NaN, inf) fails
the search (a shard that sends one to Ray Serve's ingress is a failed shard, never one that takes the whole top-k),
and a reply past `max_reply_bytes` is a failed try, read no further."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from searchgym.envs.tools.base import BackendError, SearchHit
from searchgym.envs.tools.remote_search import RemoteOptions, RemoteSearch
from searchgym.serve.ray_search import ShardCallFailed, merge_shards


def reply_with(body: bytes) -> web.Application:
    """A retrieval server whose /retrieve answers `body`, whatever is asked."""

    async def retrieve(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_post("/retrieve", retrieve)
    return app


def hits(*scores: str) -> bytes:
    """A /retrieve reply to one query whose hits carry these scores, as raw JSON tokens (NaN, Infinity, ...)."""
    items = [
        f'{{"document": {{"id": "d{i}", "contents": "x", "url": "u{i}"}}, "score": {s}}}' for i, s in enumerate(scores)
    ]
    return f'{{"result": [[{", ".join(items)}]]}}'.encode()


async def search_on(body: bytes, **options) -> list[SearchHit]:
    async with TestServer(reply_with(body)) as server:
        remote = RemoteSearch(str(server.make_url("")), RemoteOptions(retries=0, max_batch=1, **options))
        try:
            return await remote.search("q", 3)
        finally:
            await remote.close()


@pytest.mark.parametrize("score", ["NaN", "Infinity", "-Infinity", '"7"', "true"])
def test_a_score_that_is_not_a_finite_number_fails_the_search(score):
    with pytest.raises(BackendError, match="not a finite number"):
        asyncio.run(search_on(hits("1.5", score)))
    assert [h.score for h in asyncio.run(search_on(hits("1.5", "0.5")))] == [1.5, 0.5]


def test_a_reply_past_the_cap_is_refused_without_reading_it_whole():
    big = json.dumps({"result": [[{"document": {"id": "d", "contents": "x" * 300_000}, "score": 1.0}]]}).encode()
    with pytest.raises(BackendError, match="over the 100000-byte cap"):
        asyncio.run(search_on(big, max_reply_bytes=100_000))
    assert len(asyncio.run(search_on(big))) == 1  # under the default cap (64 MiB) it is a result


def test_a_shard_sending_inf_or_nan_is_a_failed_shard():
    """The ingress's merge of each shard's (doc, score) pairs (`serve ray-search`): a non-finite score fails the
    request naming the shard (a 503 clients retry), finite ones are ranked by score, ties by shard then rank."""

    def shard(*scores: float) -> list[list[tuple[dict[str, str], float]]]:
        return [[({"id": f"d{s}"}, s) for s in scores]]  # one query's pairs

    for bad in (float("inf"), float("nan"), -float("inf")):
        with pytest.raises(ShardCallFailed, match="shard 1 of 2 failed: it sent a score that is not finite"):
            merge_shards([shard(2.0, 1.0), shard(bad)], 3)
    assert [s for _, s in merge_shards([shard(2.0, 1.0), shard(1.5)], 3)[0]] == [2, 1.5, 1]
