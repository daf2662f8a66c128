"""A sharded index's layout: the corpus split by url, each page in the shard its url hashes to and found there by its
title. Searching the shards as one is Ray Serve's (`serve ray-search`, tests/envs/test_ray_search.py): an env given a
sharded index or a list of shard lists is refused, naming the key and what to run instead."""

from __future__ import annotations

import json
import random

import gymnasium as gym
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import searchgym  # noqa: F401
from searchgym.cli import main
from searchgym.envs.tools.corpus import read_corpus
from searchgym.envs.tools.local_index import LocalIndex
from searchgym.envs.tools.shards import is_sharded, read_shards_manifest, shard_dir, shard_of, split_corpus

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


def test_each_page_is_in_its_urls_shard_and_found_there_by_title(sharded, small_bundle):
    """The layout Ray Serve's deployments serve: shards.json names the shards, and the shard a url hashes to holds
    its page and ranks it first for its title (so the merged top-k can hold it)."""
    assert is_sharded(sharded) and read_shards_manifest(sharded) == SHARDS
    manifest = json.loads((sharded / "shards.json").read_text())
    docs = list(read_corpus(small_bundle / "corpus.jsonl"))
    assert sum(manifest["shard_docs"]) == len(docs)
    shards = [LocalIndex(shard_dir(sharded, i) / "index") for i in range(SHARDS)]
    found = 0
    for doc in random.Random(0).sample(docs, 60):
        home = shards[shard_of(doc.url, SHARDS)]
        assert home.get_page(doc.url).title == doc.title
        found += doc.url in [h.url for h in home.search_sync(doc.title, 3)]
    assert found >= 57  # a title search finds its page in its shard's top 3 (as the whole index does, near ties aside)


def test_localqa_refuses_a_sharded_index_dir_saying_to_serve_it_on_ray_serve(sharded, small_bundle):
    with pytest.raises(ValueError, match=r"env kwarg 'index' is a sharded index") as refused:
        gym.make("searchgym/LocalQA-v0", tasks=small_bundle / "tasks.jsonl", index=sharded, max_turns=3)
    message = str(refused.value)
    assert f"searchgym serve ray-search --index {sharded}" in message and 'servers=["http://host:8000"]' in message


@pytest.mark.parametrize("servers", [[["http://127.0.0.1:9"], ["http://127.0.0.1:10"]], ["http://a:1", ["http://b:2"]]])
def test_localqa_refuses_shard_lists_saying_to_serve_them_as_one_address(small_bundle, servers):
    """Refused before any server is asked (nothing listens at these addresses): the error, not a connection one."""
    with pytest.raises(ValueError, match=r"env kwarg 'servers' is a list of shard lists") as refused:
        gym.make("searchgym/LocalQA-v0", tasks=small_bundle / "tasks.jsonl", servers=servers, max_turns=3)
    message = str(refused.value)
    assert "searchgym serve ray-search --index DIR" in message and 'servers=["http://host:8000"]' in message


def test_serve_search_and_open_index_refuse_a_sharded_index_naming_serve_ray_search(sharded):
    """`serve search --index OUT` (open_index) would otherwise say OUT is no index at all: it names what serves it."""
    from searchgym.envs.tools.indexes import open_index

    with pytest.raises(FileNotFoundError, match=r"is a sharded index .* `searchgym serve ray-search --index "):
        open_index(sharded)
    assert open_index(shard_dir(sharded, 0) / "index").search_sync("a", 1) is not None  # each shard is an index
