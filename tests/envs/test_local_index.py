"""LocalIndex over real tantivy indexes built from small hand-written corpora."""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchgym.envs.tools.base import PageBackend, PageNotFound, SearchBackend
from searchgym.envs.tools.corpus import CorpusError
from searchgym.envs.tools.local_index import LocalIndex

PAGES = [
    {
        "id": "curie",
        "title": "Marie Curie",
        "url": "https://wiki.test/Marie_Curie",
        "text": "Marie Curie was a physicist and chemist who conducted pioneering research on radioactivity.\n\n"
        "She was the first woman to win a Nobel Prize.",
        "links": ["https://wiki.test/Pierre_Curie"],
    },
    {
        "id": "pierre",
        "title": "Pierre Curie",
        "url": "https://wiki.test/Pierre_Curie",
        "text": "Pierre Curie married Marie Curie. Marie Curie and Pierre Curie shared the prize. "
        "Marie Curie, Marie Curie, Marie Curie: his wife Marie Curie.",
        "links": ["https://wiki.test/Marie_Curie"],
    },
    {
        "id": "radium",
        "title": "Radium",
        "url": "https://wiki.test/Radium",
        "text": "Radium is a chemical element discovered by Marie Curie and Pierre Curie in 1898. "
        "Radium is radioactive.",
    },
    {
        "id": "paris",
        "title": "Paris",
        "url": "https://wiki.test/Paris",
        "text": "Paris is the capital of France. The Curies worked in Paris.",
    },
    {
        "id": "mystery",
        "title": "Mystery Novel",
        "url": "https://wiki.test/Mystery",
        "text": "A paris paris paris paris story set in a city, naming Paris over and over: paris paris.",
    },
    {"id": "twin-b", "title": "Twin", "url": "https://wiki.test/Twin_B", "text": "identical twin page"},
    {"id": "twin-a", "title": "Twin", "url": "https://wiki.test/Twin_A", "text": "identical twin page"},
]


def _write_corpus(path: Path, rows: list[dict]) -> Path:
    """Write rows as a JSONL corpus at path."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> LocalIndex:
    root = tmp_path_factory.mktemp("world")
    return LocalIndex.build(_write_corpus(root / "corpus.jsonl", PAGES), root / "index")


def test_satisfies_protocols(index: LocalIndex) -> None:
    assert isinstance(index, SearchBackend) and isinstance(index, PageBackend)
    assert len(index) == len(PAGES)


def test_exact_name_ranks_its_page_first(index: LocalIndex) -> None:
    hits = index.search_sync("Marie Curie", k=3)
    assert hits[0].doc_id == "curie"
    assert hits[0].url == "https://wiki.test/Marie_Curie" and hits[0].title == "Marie Curie"


def test_title_boost_beats_body_repetition(index: LocalIndex) -> None:
    assert [hit.doc_id for hit in index.search_sync("paris", k=2)] == ["paris", "mystery"]


def test_scores_descend_and_ties_break_by_corpus_order(index: LocalIndex) -> None:
    hits = index.search_sync("twin", k=2)
    assert [hit.doc_id for hit in hits] == ["twin-b", "twin-a"]  # twin-b comes first in the corpus
    assert hits[0].score == hits[1].score > 0
    assert [hit.doc_id for hit in index.search_sync("twin", k=1)] == ["twin-b"]


def test_exactly_k_of_many_tied_pages_are_the_first_in_corpus_order(tmp_path: Path) -> None:
    rows = [{"id": f"p{i:03d}", "title": f"Page {i}", "text": "the same words on every page"} for i in range(300)]
    rows[150]["text"] = "the same words on every page, and words again"  # one better page in the middle
    ix = LocalIndex.build(_write_corpus(tmp_path / "c.jsonl", rows[::-1]), tmp_path / "ix")  # corpus order: p299 first
    hits = ix.search_sync("same words", k=4)
    assert [h.doc_id for h in hits] == ["p150", "p299", "p298", "p297"]
    assert hits[0].score > hits[1].score == hits[3].score


def test_a_full_term_cache_is_emptied_and_answers_stay_the_same(
    index: LocalIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The per-word clause cache is bounded: when full it starts over, and the hits are those of a fresh index."""
    queries = ["Marie Curie", "paris", "Pierre Curie radium", "twin", "mystery novel paris"]
    fresh = LocalIndex(index.index_dir)
    expected = [fresh.search_sync(q, k=3) for q in queries]
    monkeypatch.setattr("searchgym.envs.tools.local_index._TERM_CACHE_MAX", 2)
    small = LocalIndex(index.index_dir)
    assert [small.search_sync(q, k=3) for q in queries * 2] == expected * 2
    assert 0 < len(small._terms) <= 2


def test_snippet_is_query_focused_plain_text(tmp_path: Path) -> None:
    text = "filler words here. " * 40 + "The zebrafish regenerates its heart. " + "more filler text. " * 40
    corpus = _write_corpus(tmp_path / "c.jsonl", [{"id": "z", "title": "Fish", "text": text}])
    LocalIndex.build(corpus, tmp_path / "ix")
    (hit,) = LocalIndex(tmp_path / "ix", snippet_chars=80).search_sync("zebrafish heart", k=5)
    assert "zebrafish" in hit.snippet and "<b>" not in hit.snippet and len(hit.snippet) <= 80


def test_snippet_falls_back_to_leading_text(index: LocalIndex) -> None:
    (hit, *_) = index.search_sync("mystery", k=1)
    assert hit.doc_id == "mystery" and hit.snippet.startswith("A paris paris")


def test_page_by_url_and_by_id(index: LocalIndex) -> None:
    page = index.get_page("https://wiki.test/Marie_Curie")
    assert page.title == "Marie Curie" and page.doc_id == "curie"
    assert page.links == ("https://wiki.test/Pierre_Curie",)
    assert page.text.startswith("Marie Curie was a physicist")
    assert index.get_page("radium").url == "https://wiki.test/Radium"


async def test_fetch_and_unknown_url(index: LocalIndex) -> None:
    assert (await index.fetch("https://wiki.test/Paris")).doc_id == "paris"
    with pytest.raises(PageNotFound, match="unknown url.*search results"):
        await index.fetch("https://wiki.test/Nowhere")
    with pytest.raises(PageNotFound):
        index.get_page("")


def test_iter_docs_in_corpus_order(index: LocalIndex) -> None:
    docs = list(index.iter_docs())
    assert [doc.id for doc in docs] == [row["id"] for row in PAGES]
    assert docs[0].links == ("https://wiki.test/Pierre_Curie",)


def test_search_r1_rows_load_and_search(tmp_path: Path) -> None:
    rows = [
        {"id": 0, "contents": '"Ada Lovelace"\nAda Lovelace wrote the first program.'},
        {"id": 1, "contents": '"Charles Babbage"\nBabbage designed the Analytical Engine with Ada Lovelace.'},
    ]
    ix = LocalIndex.build(_write_corpus(tmp_path / "r1.jsonl", rows), tmp_path / "ix")
    (hit, *_) = ix.search_sync("Ada Lovelace", k=2)
    assert (hit.doc_id, hit.title, hit.url) == ("0", "Ada Lovelace", "doc://0")
    assert ix.get_page("doc://1").text == "Babbage designed the Analytical Engine with Ada Lovelace."


NASTY = [
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
    "Marie\x00Curie",
    "🦄 居里夫人",
    "\u200b\ufeff",
    "a" * 1000,
    "x " * 10_000,
    "marie " * 500_000,
]


@pytest.mark.parametrize("query", NASTY + [" ", ""])
def test_nasty_queries_never_raise(index: LocalIndex, query: str) -> None:
    _check_hits(index.search_sync(query, k=5), k=5)


def test_lone_surrogates_are_replacement_characters(index: LocalIndex) -> None:
    assert index.search_sync("marie\ud800curie", 3) == index.search_sync("marie\ufffdcurie", 3) != []
    assert index.search_sync("\udfff", 3) == [] and index.search_sync(None, 3) == []  # type: ignore[arg-type]
    with pytest.raises(PageNotFound):
        index.get_page("https://wiki.test/Marie_Curie\ud800")


def test_stopwords_are_not_scored_but_count_in_the_title_phrase(tmp_path: Path) -> None:
    rows = [
        {"id": "who", "title": "The Who", "text": "A band."},
        {"id": "of", "title": "Bank of Paris", "text": "A bank in the city of Paris, of course, of all places."},
        {"id": "inparis", "title": "Paris Bank", "text": "A bank in Paris."},
    ]
    ix = LocalIndex.build(_write_corpus(tmp_path / "c.jsonl", rows), tmp_path / "ix")
    assert [h.doc_id for h in ix.search_sync("the who", 3)] == ["who"]  # only stopwords: they are all there is
    assert ix.search_sync("bank of paris", 1)[0].doc_id == "of"  # the phrase, "of" included, picks its title
    assert ix.search_sync("paris bank", 1)[0].doc_id == "inparis"
    of_page = ix.search_sync("bank of paris", 3)
    assert {h.doc_id for h in of_page} == {"of", "inparis"}  # "The Who" matches none of the words that count


def test_query_operators_are_plain_words(index: LocalIndex) -> None:
    assert index.search_sync("title:radium", k=1)[0].doc_id == "radium"
    assert index.search_sync("   ", k=5) == [] and index.search_sync("", k=5) == []


ANY_TEXT = st.text(st.characters(exclude_categories=()))  # lone surrogates included


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=st.one_of(st.text(), ANY_TEXT, st.sampled_from(NASTY)), k=st.integers(-2, 150))
def test_any_query_returns_at_most_k_descending(index: LocalIndex, query: str, k: int) -> None:
    _check_hits(index.search_sync(query, k=k), k=k)


def _check_hits(hits: list, *, k: int) -> None:
    """At most k hits (never more than 100), scores descending."""
    assert len(hits) <= max(0, min(k, 100))
    assert all(a.score >= b.score for a, b in itertools.pairwise(hits))


def test_k_bounds(index: LocalIndex) -> None:
    assert index.search_sync("curie", k=0) == [] and index.search_sync("curie", k=-1) == []
    assert len(index.search_sync("curie", k=1000)) == 3


async def test_concurrent_gather(index: LocalIndex) -> None:
    queries = ["marie curie", "paris", "radium", "twin", "((", ""] * 34
    results = await asyncio.gather(*(index.search(q, 3) for q in queries[:200]))
    assert [r[0].doc_id if r else None for r in results[:6]] == ["curie", "paris", "radium", "twin-b", None, None]
    assert results[6:12] == results[:6]


def test_manifest_written(index: LocalIndex) -> None:
    manifest = json.loads((index.index_dir / "index.json").read_text())
    assert manifest["doc_count"] == len(PAGES) and manifest["format_version"] == 1
    assert len(manifest["corpus_sha256"]) == 64 and manifest["corpus_path"].endswith("corpus.jsonl")


def test_rebuild_replaces_existing_index(tmp_path: Path) -> None:
    out = tmp_path / "ix"
    LocalIndex.build(_write_corpus(tmp_path / "a.jsonl", PAGES), out)
    rebuilt = LocalIndex.build(_write_corpus(tmp_path / "b.jsonl", PAGES[:2]), out)
    assert len(rebuilt) == 2 and len(LocalIndex(out)) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.jsonl", "ix"]


def test_failed_build_leaves_nothing(tmp_path: Path) -> None:
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text(json.dumps(PAGES[0]) + "\n" + json.dumps({"id": "x", "title": "no text"}) + "\n")
    with pytest.raises(CorpusError, match=r"bad\.jsonl:2: missing field 'text'"):
        LocalIndex.build(corpus, tmp_path / "ix")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


def test_failed_rebuild_keeps_old_index(tmp_path: Path) -> None:
    out = tmp_path / "ix"
    LocalIndex.build(_write_corpus(tmp_path / "good.jsonl", PAGES), out)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(PAGES[0]) + "\n" + json.dumps(PAGES[0]) + "\n")
    with pytest.raises(CorpusError, match=r"bad\.jsonl:2: duplicate id"):
        LocalIndex.build(bad, out)
    assert len(LocalIndex(out)) == len(PAGES)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "good.jsonl", "ix"]


def test_opening_an_incomplete_index_fails(tmp_path: Path) -> None:
    (tmp_path / "ix").mkdir()
    with pytest.raises(FileNotFoundError, match="index.json"):
        LocalIndex(tmp_path / "ix")


def test_empty_corpus(tmp_path: Path) -> None:
    ix = LocalIndex.build(_write_corpus(tmp_path / "e.jsonl", []), tmp_path / "ix")
    assert len(ix) == 0 and ix.search_sync("anything") == []


class _YieldsTheGil:
    """Cyclic garbage whose finalizer lets another thread run, as any finalizer doing I/O or sleeping does."""

    def __init__(self) -> None:
        self.cycle = self

    def __del__(self) -> None:
        time.sleep(0)


def test_threads_mixing_bad_and_good_queries_share_the_index_safely(index: LocalIndex) -> None:
    """A collection can start inside any tantivy call (here: while a lone surrogate's error is made) and run a
    finalizer that switches threads; no object a call borrows mutably may be shared, or a concurrent well-formed
    query fails with PyO3's RuntimeError("Already borrowed") (tantivy-py's TextAnalyzer.analyze takes &mut self)."""
    good = {"marie curie": "curie", "radium": "radium", "paris": "paris"}
    bad = ["marie \ud800 curie", "\udfff", "radium \udc80\ud800"]
    failures: list[str] = []

    def worker(seed: int) -> None:
        search = index.search_sync  # bound once: the next allocation is the one inside the call
        for i in range(400):
            for _ in range(3):
                _YieldsTheGil()
            query = bad[i % 3] if (i + seed) % 2 else list(good)[i % 3]
            try:
                hits = search(query, 3)
            except Exception as e:  # noqa: BLE001 (any exception is the failure under test)
                failures.append(f"{query!r}: {type(e).__name__}: {e}")
                continue
            if query in good and (not hits or hits[0].doc_id != good[query]):
                failures.append(f"{query!r}: wrong hits {[h.doc_id for h in hits]}")

    threshold = gc.get_threshold()
    gc.set_threshold(5)  # collections at random allocations, so the race shows within a few hundred queries
    try:
        threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        gc.set_threshold(*threshold)
        gc.collect()
    assert not failures, f"{len(failures)} failures, e.g. {failures[:3]}"
