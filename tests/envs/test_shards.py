"""A sharded index searched as one: the corpus split by url, every page reachable from its shard, title searches
finding their page as the whole index does, shards behind retrieval servers with replicas failed over, and a
shard that is down failing the search instead of silently losing its documents."""

from __future__ import annotations

import asyncio
import json
import random

import gymnasium as gym
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import searchgym  # noqa: F401
from searchgym.cli import main
from searchgym.envs.tools.base import BackendError, PageNotFound
from searchgym.envs.tools.corpus import read_corpus
from searchgym.envs.tools.remote_search import RemoteOptions
from searchgym.envs.tools.shards import ShardedSearch, is_sharded, open_sharded, shard_of, split_corpus
from searchgym.serve.retrieval import serving

SHARDS = 3


@pytest.fixture(scope="module")
def sharded(small_bundle, tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded") / "index"
    assert main(
        ["index", "build", "--corpus", str(small_bundle / "corpus.jsonl"), "--out", str(out), "--shards", str(SHARDS)]
    ) in (0, None)
    return out


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80), st.integers(1, 64))
def test_a_url_always_hashes_to_the_same_shard(url, shards):
    assert 0 <= shard_of(url, shards) < shards and shard_of(url, shards) == shard_of(url, shards)


def test_the_split_puts_each_document_in_exactly_one_shard(small_bundle, tmp_path):
    docs = {d.url: d.id for d in read_corpus(small_bundle / "corpus.jsonl")}
    paths = split_corpus(small_bundle / "corpus.jsonl", tmp_path, SHARDS)
    seen = {}
    for i, path in enumerate(paths):
        for doc in read_corpus(path):
            assert shard_of(doc.url, SHARDS) == i and doc.url not in seen
            seen[doc.url] = doc.id
    assert seen == docs


def test_local_shards_search_as_one_index(sharded, small_bundle, small_index):
    assert is_sharded(sharded)
    index = open_sharded(sharded)
    docs = list(read_corpus(small_bundle / "corpus.jsonl"))
    sample = random.Random(0).sample(docs, 60)

    async def top(backend, query, k):
        return [h.url for h in await backend.search(query, k)]

    async def run():
        whole = sharded_found = 0
        for doc in sample:
            whole += (await top(small_index, doc.title, 1)) == [doc.url]
            sharded_found += doc.url in await top(index, doc.title, 3)
            page = await index.fetch(doc.url)  # every page from the shard its url names
            assert page.title == doc.title
        with pytest.raises(PageNotFound):
            await index.fetch("https://nowhere.test/none")
        hits = await index.search(sample[0].title, 5)
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True) and len(hits) == 5
        return whole, sharded_found

    whole, sharded_found = asyncio.run(run())
    assert sharded_found >= whole  # a title search finds its page in the top 3 wherever the whole index ranks it 1st


def test_an_env_over_shard_servers_with_replicas_plays_and_a_dead_shard_fails_the_search(sharded, small_bundle):
    from searchgym.envs.tools.local_index import LocalIndex

    async def run():
        shards = [LocalIndex(sharded / f"shard-{i:02d}" / "index") for i in range(SHARDS)]
        async with serving(shards[0]) as s0, serving(shards[1]) as s1, serving(shards[2]) as s2:
            dead = "http://127.0.0.1:9"  # nothing listens: the first replica of shard 0 is down
            remote = ShardedSearch.remote([[dead, s0], [s1], [s2]], RemoteOptions(retries=1, backoff=0.01))
            docs = list(read_corpus(small_bundle / "corpus.jsonl"))[:20]
            for doc in docs:
                hits = await remote.search(doc.title, 3)
                assert doc.url in [h.url for h in hits]
                assert (await remote.fetch(doc.url)).title == doc.title
            failing = ShardedSearch.remote([[s0], [dead], [s2]], RemoteOptions(retries=0, backoff=0.01))
            with pytest.raises(BackendError, match="shard 1 of 3"):
                await failing.search(docs[0].title, 3)
            await remote.close()
            await failing.close()
            return [s0, s1, s2]

    urls = asyncio.run(run())
    assert len(urls) == 3


def test_localqa_takes_a_sharded_index_dir_and_shard_servers(sharded, small_bundle):
    env = gym.make("searchgym/LocalQA-v0", tasks=small_bundle / "tasks.jsonl", index=sharded, max_turns=3)
    obs, _ = env.reset(seed=0)
    task = env.unwrapped.task
    obs, *_, info = env.step(f"<search>{task.question}</search>")
    assert info["hits"] and "search failed" not in obs
    env.close()
    manifest = json.loads((sharded / "shards.json").read_text())
    assert manifest["shards"] == SHARDS


def test_localqa_over_shard_servers_given_as_lists_of_replicas(sharded, small_bundle):
    import contextlib

    from searchgym.envs.tools.local_index import LocalIndex
    from searchgym.serve.retrieval import create_app
    from searchgym.testing.stand_in_llm import serve_in_thread

    with contextlib.ExitStack() as stack:
        urls = [
            stack.enter_context(serve_in_thread(create_app(LocalIndex(sharded / f"shard-{i:02d}" / "index"))))
            for i in range(SHARDS)
        ]
        env = gym.make(
            "searchgym/LocalQA-v0", tasks=small_bundle / "tasks.jsonl", servers=[[u] for u in urls], max_turns=3
        )
        doc = next(read_corpus(small_bundle / "corpus.jsonl"))
        env.reset(seed=0)
        obs, *_, info = env.step(f"<search>{doc.title}</search>")
        assert doc.url in [h["url"] for h in info["hits"]]
        obs, *_, info = env.step(f"<access>{doc.url}</access>")
        assert info["page"]["url"] == doc.url and "error" not in info
        assert info["backend"]["shards"] == SHARDS
        env.close()
