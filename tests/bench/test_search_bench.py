"""`searchgym bench search`'s peers answer like their libraries, and the race scores them by the answer page."""

import json
from pathlib import Path

import pytest

from searchgym.bench.search import _like_for_like, _threads_over_one
from searchgym.bench.search_peers import (
    Peer,
    bm25s_peers,
    local_index_peers,
    race,
    rank_bm25_peer,
    read_corpus_texts,
    tantivy_default_peer,
)
from searchgym.envs.tools.local_index import LocalIndex

PAGES = [
    {"id": "curie", "title": "Marie Curie", "text": "Marie Curie was a physicist who studied radioactivity."},
    {"id": "pierre", "title": "Pierre Curie", "text": "Pierre Curie married Marie Curie."},
    {"id": "radium", "title": "Radium", "text": "Radium was discovered by the Curies in 1898."},
    {"id": "paris", "title": "Paris", "text": "Paris is the capital of France, where the Curies worked."},
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("peers")
    (root / "corpus.jsonl").write_text("".join(json.dumps(row) + "\n" for row in PAGES))
    LocalIndex.build(root / "corpus.jsonl", root / "index")
    return root


def test_every_peer_finds_the_named_page_first(corpus: Path) -> None:
    ids, texts = read_corpus_texts(corpus / "corpus.jsonl")
    assert ids == [row["id"] for row in PAGES] and texts[0].startswith("Marie Curie\n")
    bm25s, built = bm25s_peers(ids, texts, 2, backend="numpy", threads=2)  # numba's first compile takes a minute
    rank, built_rank = rank_bm25_peer(ids, texts, 2, per_chunk=10)
    peers = [
        *local_index_peers(LocalIndex(corpus / "index"), 2, threads=2),
        tantivy_default_peer(corpus / "index", 2),
        *bm25s,
        *rank,
    ]
    assert [p.name for p in peers] == [
        "LocalIndex with snippets",
        "LocalIndex rank",
        "LocalIndex rank batched, 2 threads",
        "tantivy default",
        "bm25s",
        "bm25s batched, 1 thread",
        "bm25s batched, 2 threads",
        "rank-bm25",
    ]
    assert built["bm25s"]["backend"] == "numpy" and "version" in built_rank["rank_bm25"]
    queries = [(0, "Radium"), (1, "Paris, the capital"), (2, "Marie Curie"), (3, "Pierre"), (4, "radioactivity")]
    for peer in peers:
        peer.run(queries)
        assert peer.answers[0][0] == "radium" and peer.answers[1][0] == "paris", peer.name
        assert peer.answers[2][0] == "curie" and peer.answers[3][0] == "pierre", peer.name
        assert len(peer.answers[0]) <= 2
    assert all(peer.answers == peers[0].answers for peer in peers[1:3])  # LocalIndex's three ways rank alike


def test_race_reports_every_row_and_the_like_for_like_ratios(corpus: Path) -> None:
    ids, texts = read_corpus_texts(corpus / "corpus.jsonl")
    bm25s, _ = bm25s_peers(ids, texts, 2, backend="numpy", threads=2)
    peers = [
        *local_index_peers(LocalIndex(corpus / "index"), 2, threads=2),
        tantivy_default_peer(corpus / "index", 2),
        *bm25s,
    ]
    systems = race(
        peers,
        ["Radium", "Paris", "Marie Curie", "Pierre Curie"] * 3,
        ["radium", "paris", "curie", "pierre"] * 3,
        chunks=3,
    )
    assert set(systems) == {p.name for p in peers}
    assert all(r["queries"] == 12 and r["qps"] > 0 and r["recall_at_k"] == 1.0 for r in systems.values())
    ratios = _like_for_like(systems, 2)
    assert set(ratios) == {
        "LocalIndex rank / bm25s",
        "LocalIndex rank batched, 2 threads / bm25s batched, 2 threads",
        "LocalIndex rank batched, 2 threads / bm25s batched, 1 thread",
        "LocalIndex with snippets / tantivy default",
        "LocalIndex rank / tantivy default",
    }
    rank_over_bm25s = systems["LocalIndex rank"]["qps"] / systems["bm25s"]["qps"]
    assert ratios["LocalIndex rank / bm25s"] == pytest.approx(rank_over_bm25s, abs=0.006)
    assert set(_threads_over_one(systems, 2)) == {"LocalIndex", "bm25s"} and _threads_over_one(systems, 1) == {}


def test_race_reports_rate_recall_and_mrr_of_the_answer_page() -> None:
    ranking = {"a": ["x", "y"], "b": ["y", "x"], "c": ["z", "w"], "d": ["w", "z"]}
    slow = Peer("slow", search=lambda q: ranking[q], max_per_chunk=1)
    fast = Peer("fast", search_many=lambda qs: [ranking[q] for q in qs])
    out = race([slow, fast], ["a", "b", "c", "d"], ["x", "x", "x", "z"], chunks=2)
    assert out["fast"]["queries"] == 4 and out["fast"]["recall_at_k"] == 0.75
    assert out["fast"]["mrr"] == pytest.approx((1 + 1 / 2 + 0 + 1 / 2) / 4, abs=1e-4)
    assert out["slow"]["queries"] == 2  # the head of each of the two chunks: "a" and "c"
    assert out["slow"]["recall_at_k"] == 0.5 and out["slow"]["qps"] > 0
