"""LocalIndex over real tantivy indexes built from small hand-written corpora."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchgym.envs.tools.base import PageBackend, PageNotFound, SearchBackend
from searchgym.envs.tools.corpus import CorpusError
from searchgym.envs.tools.local_index import LocalIndex

PAGES = [
    {"id": "curie", "title": "Marie Curie", "url": "https://wiki.test/Marie_Curie",
     "text": "Marie Curie was a physicist and chemist who conducted pioneering research on radioactivity.\n\n"
             "She was the first woman to win a Nobel Prize.", "links": ["https://wiki.test/Pierre_Curie"]},
    {"id": "pierre", "title": "Pierre Curie", "url": "https://wiki.test/Pierre_Curie",
     "text": "Pierre Curie married Marie Curie. Marie Curie and Pierre Curie shared the prize. "
             "Marie Curie, Marie Curie, Marie Curie: his wife Marie Curie.", "links": ["https://wiki.test/Marie_Curie"]},
    {"id": "radium", "title": "Radium", "url": "https://wiki.test/Radium",
     "text": "Radium is a chemical element discovered by Marie Curie and Pierre Curie in 1898. Radium is radioactive."},
    {"id": "paris", "title": "Paris", "url": "https://wiki.test/Paris",
     "text": "Paris is the capital of France. The Curies worked in Paris."},
    {"id": "mystery", "title": "Mystery Novel", "url": "https://wiki.test/Mystery",
     "text": "A paris paris paris paris story set in a city, naming Paris over and over: paris paris."},
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


def test_scores_descend_and_ties_break_by_doc_id(index: LocalIndex) -> None:
    hits = index.search_sync("twin", k=2)
    assert [hit.doc_id for hit in hits] == ["twin-a", "twin-b"]
    assert hits[0].score == hits[1].score > 0
    assert [hit.doc_id for hit in index.search_sync("twin", k=1)] == ["twin-a"]


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
    rows = [{"id": 0, "contents": '"Ada Lovelace"\nAda Lovelace wrote the first program.'},
            {"id": 1, "contents": '"Charles Babbage"\nBabbage designed the Analytical Engine with Ada Lovelace.'}]
    ix = LocalIndex.build(_write_corpus(tmp_path / "r1.jsonl", rows), tmp_path / "ix")
    (hit, *_) = ix.search_sync("Ada Lovelace", k=2)
    assert (hit.doc_id, hit.title, hit.url) == ("0", "Ada Lovelace", "doc://0")
    assert ix.get_page("doc://1").text == "Babbage designed the Analytical Engine with Ada Lovelace."


NASTY = ['"', "title:", "title:foo", "((", "a AND", "AND OR NOT", "+-*~^", "*", "\x00", "curie~2^3", "[a TO",
         "Marie\x00Curie", "🦄 居里夫人", "\u200b\ufeff", "a" * 1000, "x " * 10_000, "marie " * 500_000]


@pytest.mark.parametrize("query", NASTY + [" ", ""])
def test_nasty_queries_never_raise(index: LocalIndex, query: str) -> None:
    _check_hits(index.search_sync(query, k=5), k=5)


def test_query_operators_are_plain_words(index: LocalIndex) -> None:
    assert index.search_sync("title:radium", k=1)[0].doc_id == "radium"
    assert index.search_sync("   ", k=5) == [] and index.search_sync("", k=5) == []


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=st.one_of(st.text(), st.sampled_from(NASTY)), k=st.integers(-2, 150))
def test_any_query_returns_at_most_k_descending(index: LocalIndex, query: str, k: int) -> None:
    _check_hits(index.search_sync(query, k=k), k=k)


def _check_hits(hits: list, *, k: int) -> None:
    """At most k hits (never more than 100), scores descending."""
    assert len(hits) <= max(0, min(k, 100))
    assert all(a.score >= b.score for a, b in zip(hits, hits[1:]))


def test_k_bounds(index: LocalIndex) -> None:
    assert index.search_sync("curie", k=0) == [] and index.search_sync("curie", k=-1) == []
    assert len(index.search_sync("curie", k=1000)) == 3


async def test_concurrent_gather(index: LocalIndex) -> None:
    queries = ["marie curie", "paris", "radium", "twin", "((", ""] * 34
    results = await asyncio.gather(*(index.search(q, 3) for q in queries[:200]))
    assert [r[0].doc_id if r else None for r in results[:6]] == ["curie", "paris", "radium", "twin-a", None, None]
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
