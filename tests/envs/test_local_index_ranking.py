"""LocalIndex's ranking-only and batched paths over a real small world: the same pages, order and scores as
search_sync, for any query."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import shutil
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchgym.envs.tools import local_index
from searchgym.envs.tools.local_index import DOC_IDS_FILE, MAX_THREADS, LocalIndex, batch_threads
from searchgym.world.world import World

SIZE = 1_500
OPERATORS = [
    '"',
    "title:",
    "title:foo",
    "((",
    "a AND",
    "AND OR NOT",
    "+-*~^",
    "*",
    "\x00",
    "curie~2^3",
    "[a TO",
    "\u200b\ufeff",
    "the of in",
    "a" * 1000,
    "x " * 10_000,
    "and " * 200_000,
]


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
    return st.one_of(
        names,
        names.map(lambda n: f"Who founded {n}?"),
        st.text(),
        st.text(st.characters(exclude_categories=())),  # lone surrogates included
        st.sampled_from(OPERATORS),
        st.lists(names, min_size=2, max_size=40).map(" ".join),
    )


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
def test_batches_answer_as_one_call_per_query_in_order(
    index: LocalIndex, world: World, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
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


def _shuffled_ids(index: LocalIndex) -> bytes:
    ids = json.loads((index.index_dir / DOC_IDS_FILE).read_text())
    random.Random(7).shuffle(ids)  # another corpus's ids, or this one's rebuilt in another order: same count
    return json.dumps(ids).encode()


BAD_ID_FILES = {
    "corrupt JSON": (lambda index: b'["doc-0", "doc-', "cannot be read"),
    "a dict": (lambda index: json.dumps({str(i): f"doc-{i}" for i in range(SIZE)}).encode(), "not a JSON list of id"),
    "numbers": (lambda index: json.dumps(list(range(SIZE))).encode(), "not a JSON list of id strings"),
    "too few ids": (lambda index: b'["only-one"]', "lists 1 ids for 1500 pages"),
    "not UTF-8": (lambda index: b"\xff\xfe[", "cannot be read"),
    "shuffled ids": (_shuffled_ids, "says page"),
}


@pytest.mark.parametrize("case", list(BAD_ID_FILES))
def test_a_wrong_id_file_is_replaced_by_the_stored_ids_with_one_warning(
    index: LocalIndex, world: World, tmp_path: Path, case: str
) -> None:
    content, why = BAD_ID_FILES[case]
    bad = tmp_path / "bad"
    shutil.copytree(index.index_dir, bad)
    path = bad / DOC_IDS_FILE
    path.write_bytes(content(index))
    reopened = LocalIndex(bad)
    queries = _names(world, 40, seed=8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rankings = [reopened.rank_sync(q, 5) for q in queries] + reopened.rank_many_sync(queries, 5)
    assert rankings == [_as_ranking(index.search_sync(q, 5)) for q in queries] * 2
    warned = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(warned) == 1  # once, however many calls
    message = warned[0]
    assert str(path) in message and why in message and "stored pages" in message


def test_the_spot_check_accepts_the_file_the_build_wrote(index: LocalIndex, world: World) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a good file must not warn
        assert LocalIndex(index.index_dir).rank_sync(world.name(3), 1)[0][0] == world.entity(3).doc_id


def test_batch_threads_follow_the_cpus_this_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # the host's cores, of which a cgroup or taskset grants a few
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 5, 7}, raising=False)
    assert batch_threads() == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert batch_threads() == MAX_THREADS
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # macOS, Windows: no affinity to ask
    assert batch_threads() == MAX_THREADS
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert batch_threads() == 1


def test_a_forked_child_answers_batches_like_its_parent(
    index: LocalIndex, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork after the pool exists (its threads do not survive) and while the pool's and id table's locks are held
    (by a parent's thread, say) still answers in the child, and the same as the parent."""
    monkeypatch.setattr(local_index, "batch_threads", lambda: 3)  # the pool is used on any machine
    queries = _names(world, 30, seed=9)
    expected = index.search_many_sync(queries, 4)  # makes the pool and its threads in the parent
    fresh = LocalIndex(index.index_dir)  # its id table is made only in the child, under the id lock
    assert local_index._pool is not None
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)

    def child() -> None:
        send.send((fresh.search_many_sync(queries, 4), fresh.rank_many_sync(queries, 4)))

    process = context.Process(target=child, daemon=True)
    with local_index._pool_lock, local_index._ids_lock:  # held at the fork: copied locked into the child
        process.start()
    try:
        assert receive.poll(60), "the forked child did not answer its batch (a dead pool or a held lock)"
        hits, rankings = receive.recv()
    finally:
        process.kill()
        process.join(10)
    assert hits == expected and rankings == [_as_ranking(h) for h in expected]


def test_several_segments_rank_like_search(world: World, tmp_path: Path) -> None:
    world.write(tmp_path)
    index = LocalIndex.build(tmp_path / "corpus.jsonl", tmp_path / "index", threads=3)  # a segment per thread
    assert index._searcher.num_segments > 1
    queries = _names(world, 100, seed=5)
    assert index.rank_many_sync(queries, 5) == [_as_ranking(index.search_sync(q, 5)) for q in queries]


def test_whole_text_hits_carry_each_page_whole(index: LocalIndex, world: World) -> None:
    queries = _names(world, 40, seed=6) + ["", "(("]
    for query, hits in zip(queries, index.search_many_sync(queries, 3, whole_text=True), strict=True):
        expected = index.search_sync(query, 3)
        assert [(h.doc_id, h.title, h.url, h.score) for h in hits] == [
            (h.doc_id, h.title, h.url, h.score) for h in expected
        ]
        assert [h.snippet for h in hits] == [index.get_page(h.url).text for h in expected]
