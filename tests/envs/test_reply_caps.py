"""A chat model's reply has a size cap: a simulated search engine that answers 30 MB is a failed call, dropped before
any parser splits it, and the search fails with a BackendError naming the cap."""

from __future__ import annotations

import asyncio
import tracemalloc

import pytest

from searchgym.core.llm_calls import MAX_REPLY_CHARS, ReplyRetry
from searchgym.envs.tools.base import BackendError
from searchgym.envs.tools.simulated_search import SimulatedSearch, SimulatorOptions


class Flood:
    """A chat model whose every reply is `size` characters of documents."""

    def __init__(self, size: int) -> None:
        self.size = size

    async def achat(self, messages, **sampling) -> str:
        doc = "Title: A page\nURL: https://x.test/a\nText: words words words\n"
        return doc * (self.size // len(doc) + 1)


def test_a_30_mb_simulator_reply_is_refused_without_being_parsed():
    search = SimulatedSearch(Flood(30_000_000), SimulatorOptions(retry=ReplyRetry(attempts=2, backoff=0)))
    tracemalloc.start()
    try:
        with pytest.raises(BackendError, match=f"over the {MAX_REPLY_CHARS:,} cap"):
            asyncio.run(search.search("q", 2))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 100 * 2**20  # the reply itself (30 MB), never its parse (it took 213 MiB)
    assert len(asyncio.run(SimulatedSearch(Flood(2_000)).search("q", 2))) == 2  # a reply under the cap is served


def test_a_search_providers_reply_past_its_cap_is_a_bad_answer_read_no_further():
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from searchgym.envs.tools.web_search import MAX_REPLY_BYTES, WebSearch, WebSearchOptions

    organic = [{"title": "t", "link": "https://example.org/a", "snippet": "s" * 1000}]

    async def run(hits: int):
        async def serper(request: web.Request) -> web.Response:
            return web.json_response({"organic": organic * hits})

        app = web.Application()
        app.router.add_post("/search", serper)
        async with TestServer(app) as server:
            search = WebSearch("key", WebSearchOptions(endpoint=str(server.make_url("/search")), retries=0))
            try:
                return await search.search("q", 5)
            finally:
                await search.close()

    with pytest.raises(BackendError, match="bad answer from the search provider: ReplyTooLarge"):
        asyncio.run(run(MAX_REPLY_BYTES // 1000 + 1))
    assert len(asyncio.run(run(3))) >= 1
