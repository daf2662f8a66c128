"""LocalIndex's ranking-only and batched paths over a real small world: the same pages, order and scores as
search_sync, for any query."""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchgym.envs.tools.local_index import DOC_IDS_FILE, LocalIndex
from searchgym.world.world import World

SIZE = 1_500
OPERATORS = ['"', "title:", "title:foo", "((", "a AND", "AND OR NOT", "+-*~^", "*", "\x00", "curie~2^3", "[a TO",
             "\u200b\ufeff", "the of in", "a" * 1000, "x " * 10_000, "and " * 200_000]


@pytest.fixture(scope="module")
def world() -> World:
    return World(SIZE, seed=3)


@pytest.fixture(scope="module")
def index(world: World, tmp_path_factory: pytest.TempPathFactory) -> LocalIndex:
    root = tmp_path_factory.mktemp("world")
    world.write(root)
    return LocalIndex.build(root / "corpus.jsonl", root / "index")


def _names(world: World, n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [world.name(rng.randrange(world.size)) for _ in range(n)]


def _as_ranking(hits: list) -> list[tuple[str, float]]:
    return [(hit.doc_id, hit.score) for hit in hits]


def _queries(world: World) -> st.SearchStrategy[str]:
    names = st.sampled_from(_names(world, 200))
    return st.one_of(names, names.map(lambda n: f"Who founded {n}?"), st.text(),
                     st.text(st.characters(exclude_categories=())),  # lone surrogates included
                     st.sampled_from(OPERATORS), st.lists(names, min_size=2, max_size=40).map(" ".join))


def test_rank_sync_finds_an_entity_by_its_name(index: LocalIndex, world: World) -> None:
    eid = 17
    ranking = index.rank_sync(world.name(eid), 3)
    assert ranking[0][0] == world.entity(eid).doc_id and 1 <= len(ranking) <= 3
    assert all(isinstance(doc_id, str) and isinstance(score, float) for doc_id, score in ranking)


def test_rank_sync_is_search_sync_without_the_pages(index: LocalIndex, world: World) -> None:
    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(query=_queries(world), k=st.integers(-2, 150))
    def check(query: str, k: int) -> None:
        assert index.rank_sync(query, k) == _as_ranking(index.search_sync(query, k))

    check()


def test_non_string_query_ranks_nothing(index: LocalIndex) -> None:
    assert index.rank_sync(None, 5) == [] and index.rank_many_sync([None, ""], 5) == [[], []]  # type: ignore[list-item]


@pytest.mark.parametrize("threads", [1, 2, 5])
def test_batches_answer_as_one_call_per_query_in_order(index: LocalIndex, world: World, threads: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("searchgym.envs.tools.local_index.batch_threads", lambda: threads)  # any machine's cores
    queries = _names(world, 150, seed=1) + OPERATORS + ["", "\ud800"] + [f"Who founded {n}?" for n in _names(world, 50)]
    random.Random(2).shuffle(queries)
    assert index.search_many_sync(queries, 4) == [index.search_sync(q, 4) for q in queries]
    assert index.rank_many_sync(queries, 4) == [index.rank_sync(q, 4) for q in queries]
    assert index.rank_many_sync(queries[:1], 2) == [index.rank_sync(queries[0], 2)]
    assert index.search_many_sync([], 5) == [] and index.rank_many_sync((), 5) == []


def test_a_batch_must_be_a_sequence_of_queries(index: LocalIndex) -> None:
    with pytest.raises(TypeError, match="not one string"):
        index.rank_many_sync("Marie Curie", 5)  # type: ignore[arg-type]


def test_an_index_built_before_the_id_file_ranks_alike(index: LocalIndex, world: World, tmp_path: Path) -> None:
    old = tmp_path / "old"
    shutil.copytree(index.index_dir, old)
    (old / DOC_IDS_FILE).unlink()  # ids are read from the stored pages instead
    queries = _names(world, 30, seed=4)
    assert [LocalIndex(old).rank_sync(q, 5) for q in queries] == [index.rank_sync(q, 5) for q in queries]


def test_a_wrong_id_file_is_a_clear_error(index: LocalIndex, world: World, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(index.index_dir, bad)
    (bad / DOC_IDS_FILE).write_text('["only-one"]')
    with pytest.raises(ValueError, match="lists 1 ids for 1500 pages; rebuild"):
        LocalIndex(bad).rank_sync(world.name(0), 5)


def test_several_segments_rank_like_search(world: World, tmp_path: Path) -> None:
    world.write(tmp_path)
    index = LocalIndex.build(tmp_path / "corpus.jsonl", tmp_path / "index", threads=3)  # a segment per thread
    assert index._searcher.num_segments > 1
    queries = _names(world, 100, seed=5)
    assert index.rank_many_sync(queries, 5) == [_as_ranking(index.search_sync(q, 5)) for q in queries]


def test_whole_text_hits_carry_each_page_whole(index: LocalIndex, world: World) -> None:
    queries = _names(world, 40, seed=6) + ["", "(("]
    for query, hits in zip(queries, index.search_many_sync(queries, 3, whole_text=True)):
        expected = index.search_sync(query, 3)
        assert [(h.doc_id, h.title, h.url, h.score) for h in hits] == [(h.doc_id, h.title, h.url, h.score) for h in expected]
        assert [h.snippet for h in hits] == [index.get_page(h.url).text for h in expected]
