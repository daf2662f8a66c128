"""A local BM25 search and page backend over a JSONL corpus, backed by a tantivy index on disk.

How a query is scored: BM25 of its words over titles (boosted) and text, plus a bonus where all its
words appear in a title in order. Stopwords (Lucene's English list, bm25s's "en" list too) are left out
of the bag of words but kept in the title phrase; a word in the text of more than 5% of pages (and of
over 1,000; "year", "city" in the synthetic world) is scored in titles only, unless the query has no
rarer word. tantivy-py collects every search with a MultiCollector, which scores every page matching
any clause (no block-max pruning), so the clauses left out are the work saved. The top k come from one search of exactly k: ties at equal score
go by index order (tantivy's tie-break), which is corpus order for an index built by one thread (one
segment), so no page beyond the k-th is read.

Thread safety, by construction: the shared tantivy Searcher is a PyO3 object whose methods all borrow it
immutably (`&self`), so any number of threads may use it at once; tantivy-py's `TextAnalyzer.analyze`
takes `&mut self` and raises RuntimeError("Already borrowed") when a second thread calls it while a
garbage collection inside the first call lets that thread run, so each thread analyses with its own.
"""
from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tantivy
from tantivy import Document, FieldType, Filter, Occur, Query, SchemaBuilder, SnippetGenerator, TextAnalyzerBuilder, Tokenizer

from searchgym.envs.tools.base import SearchHit
from searchgym.envs.tools.corpus import CorpusDoc, read_corpus
from searchgym.envs.tools.index_files import MAX_K, PagesByUrl, atomic_build, corpus_fields, read_manifest, write_manifest

KIND = "bm25"
TITLE_BOOST = 2.5  # a title match outweighs the same word in body text, so a page's own name ranks it first
TITLE_PHRASE_BOOST = 2.0  # extra credit when the query's words appear in a title in order ("New York")
MAX_QUERY_CHARS = 8192  # only the head of a huge query is analysed
MAX_QUERY_TERMS = 64
# Lucene's English stop set (EnglishAnalyzer.ENGLISH_STOP_WORDS_SET; bm25s's stopwords="en" is the same list).
STOPWORDS = frozenset("a an and are as at be but by for if in into is it no not of on or such that the their then "
                      "there these they this to was will with".split())
COMMON_TEXT_FRACTION = 0.05  # a word in the text of more pages than this share (and ...) is scored in titles only
COMMON_TEXT_MIN_PAGES = 1000  # (... than this many pages) once the query has rarer words
_TERM_CACHE_MAX = 100_000
_ITER_BATCH = 10_000
_PROGRESS_EVERY = 100_000
_SURROGATE = re.compile("[\ud800-\udfff]")
_per_thread = threading.local()


def _analyzer() -> tantivy.TextAnalyzer:
    """This thread's analyzer: the same analysis as tantivy's "default" tokenizer used for title and text (split
    on non-alphanumerics, drop tokens over 40 bytes, lower-case); one per thread, as analyze borrows it mutably."""
    analyzer = getattr(_per_thread, "analyzer", None)
    if analyzer is None:
        analyzer = _per_thread.analyzer = (
            TextAnalyzerBuilder(Tokenizer.simple()).filter(Filter.remove_long(40)).filter(Filter.lowercase()).build())
    return analyzer


def _schema() -> tantivy.Schema:
    """id and url for exact lookup, title and text for BM25, links stored, ord for corpus-order iteration."""
    builder = SchemaBuilder()
    builder.add_text_field("id", stored=True, tokenizer_name="raw", index_option="basic")
    builder.add_text_field("url", stored=True, tokenizer_name="raw", index_option="basic")
    builder.add_text_field("title", stored=True)
    builder.add_text_field("text", stored=True)
    builder.add_text_field("links", stored=True, tokenizer_name="raw", index_option="basic")
    builder.add_unsigned_field("ord", indexed=True, fast=True)
    return builder.build()


class LocalIndex(PagesByUrl):
    """BM25 search over titles and text plus page lookup by url or id; satisfies SearchBackend and PageBackend."""

    @classmethod
    def build(
        cls,
        corpus: str | os.PathLike,
        out_dir: str | os.PathLike,
        *,
        threads: int = 1,
        heap_mb: int = 1024,
        progress: bool = False,
    ) -> "LocalIndex":
        """Index a JSONL corpus into out_dir atomically: built beside it, then renamed into place.

        One indexing thread writes one segment in corpus order while the corpus fits its budget (a 100,000-page world
        does), so equal scores rank in corpus order; more threads build a little faster, in several segments."""
        with atomic_build(out_dir) as tmp:
            count = _write_index(Path(corpus), tmp, threads=threads, heap_mb=heap_mb, progress=progress)
            write_manifest(tmp, KIND, count, **corpus_fields(Path(corpus)), tantivy_version=tantivy.__version__)
        return cls(Path(out_dir).absolute())

    def __init__(self, index_dir: str | os.PathLike, *, snippet_chars: int = 300) -> None:
        """Open a complete index (one with a manifest) and load its searcher once."""
        self.index_dir = Path(index_dir)
        self.manifest = read_manifest(self.index_dir, KIND, "LocalIndex.build")
        self.snippet_chars = snippet_chars
        self._index = tantivy.Index.open(str(self.index_dir))
        self._index.reload()
        self._schema = self._index.schema
        self._searcher = self._index.searcher()
        self._common_text_pages = max(COMMON_TEXT_MIN_PAGES, COMMON_TEXT_FRACTION * self._searcher.num_docs)
        self._terms: dict[str, _Term] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Pickles as its directory: a copy (another process, a deepcopy) opens the index again."""
        return {"index_dir": self.index_dir, "snippet_chars": self.snippet_chars}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["index_dir"], snippet_chars=state["snippet_chars"])  # type: ignore[misc]

    def __len__(self) -> int:
        """Number of pages in the index."""
        return self._searcher.num_docs

    def search_sync(self, query: str, k: int = 5) -> list[SearchHit]:
        """Top-k pages for any query string (see the module docstring for the scoring); never raises on odd input,
        lone surrogates and non-strings included."""
        k = min(k, MAX_K)
        terms = query_terms(query)
        if k < 1 or not terms:
            return []
        plan = self._plan(terms)
        searcher = self._searcher
        hits = searcher.search(plan.ranking, k, count=False).hits  # exactly k; ties in index order
        if not hits:
            return []
        snippets = SnippetGenerator.create(searcher, plan.words, self._schema, "text")
        snippets.set_max_num_chars(self.snippet_chars)
        snippet_from_doc, hit = snippets.snippet_from_doc, self._hit
        return [hit(score, doc, snippet_from_doc(doc).fragment()) for score, doc in
                ((score, searcher.doc(address)) for score, address in hits)]

    async def search(self, query: str, k: int = 5) -> list[SearchHit]:
        """SearchBackend: the same as search_sync (BM25 here is fast and CPU-bound)."""
        return self.search_sync(query, k)

    def iter_docs(self) -> Iterator[CorpusDoc]:
        """Every indexed page, in corpus order, read back from the index's store."""
        for lo in range(0, len(self), _ITER_BATCH):
            batch = Query.range_query(self._schema, "ord", FieldType.Unsigned, lo, lo + _ITER_BATCH - 1)
            addresses = [address for _, address in self._searcher.search(batch, _ITER_BATCH, count=False).hits]
            ords = self._searcher.fast_field_values("ord", addresses)
            for _, address in sorted(zip(ords, addresses), key=lambda pair: pair[0]):
                yield _corpus_doc(self._searcher.doc(address))

    def _term(self, term: str) -> _Term:
        """A word's page counts and ready-made clauses (cached: the index never changes while open, and building
        them anew is a third of a query's Python-side time)."""
        info = self._terms.get(term)
        if info is None:
            if len(self._terms) >= _TERM_CACHE_MAX:
                self._terms.clear()
            title = Query.boost_query(Query.term_query(self._schema, "title", term, index_option="freq"), TITLE_BOOST)
            text = Query.term_query(self._schema, "text", term, index_option="freq")
            info = self._terms[term] = _Term(self._searcher.doc_freq("text", term),
                                             self._searcher.doc_freq("title", term) > 0,
                                             (Occur.Should, title), (Occur.Should, text))
        return info

    def _plan(self, terms: list[str]) -> _Plan:
        """The clauses worth scoring for these terms: every non-stopword in titles, and in text all but the words
        too common there to tell pages apart (unless nothing rarer is left); the title phrase when titles hold
        every term."""
        words = list(dict.fromkeys(t for t in terms if t not in STOPWORDS)) or list(dict.fromkeys(terms))
        infos = [self._term(t) for t in words]
        common = self._common_text_pages
        in_text = [i for i in infos if 0 < i.text_pages <= common] or [i for i in infos if i.text_pages]
        clauses = [i.title_clause for i in infos] + [i.text_clause for i in in_text]
        words_query = Query.boolean_query(clauses)
        if len(terms) > 1 and all(self._term(t).in_titles for t in set(terms)):  # else no title can hold it
            phrase = Query.boost_query(Query.phrase_query(self._schema, "title", terms), TITLE_PHRASE_BOOST)
            return _Plan(words_query, Query.boolean_query([*clauses, (Occur.Should, phrase)]))  # flat: one union
        return _Plan(words_query, words_query)

    def _hit(self, score: float, doc: tantivy.Document, fragment: str) -> SearchHit:
        """A SearchHit with the query-focused fragment as its snippet, or the page's opening when it is empty.

        tantivy keeps a fragment only where it highlights a word, so an empty one means nothing is highlighted (and
        reading just the fragment skips building the highlight ranges as Python objects)."""
        n = self.snippet_chars
        text = fragment or doc.get_first("text")
        return SearchHit(doc.get_first("id"), doc.get_first("title"), doc.get_first("url"),
                         " ".join(text[: 4 * n].split())[:n], float(score))  # one_line, inlined: it runs k times a query

    def _lookup(self, field: str, value: str) -> CorpusDoc | None:
        """The doc whose raw field equals value exactly, or None (no stored url or id holds a lone surrogate)."""
        if not value or not isinstance(value, str) or _SURROGATE.search(value):
            return None
        hits = self._searcher.search(Query.term_query(self._schema, field, value, index_option="basic"), 1, count=False).hits
        return _corpus_doc(self._searcher.doc(hits[0][1])) if hits else None


@dataclass(frozen=True, slots=True)
class _Term:
    """One word's pages with it in their text, whether any title holds it, and its title and text clauses."""

    text_pages: int
    in_titles: bool
    title_clause: tuple[Occur, Query]
    text_clause: tuple[Occur, Query]


@dataclass(frozen=True)
class _Plan:
    """One query's tantivy queries: its words (BM25 over title and text, what snippets highlight) and the whole
    query that ranks pages (the words plus the title-phrase bonus)."""

    words: Query
    ranking: Query


def query_terms(query: str) -> list[str]:
    """The query's terms as the index analyses them, capped in length and count; operators are just text, lone
    surrogates are U+FFFD (which splits words like any other non-alphanumeric), a non-string has no terms."""
    if not isinstance(query, str):
        return []
    head = query[:MAX_QUERY_CHARS]
    if _SURROGATE.search(head):
        head = _SURROGATE.sub("\ufffd", head)
    return _analyzer().analyze(head)[:MAX_QUERY_TERMS]



def one_line(text: str, max_chars: int) -> str:
    """Text on one line with runs of whitespace collapsed, at most max_chars characters."""
    return " ".join(text[: 4 * max_chars].split())[:max_chars]


def _corpus_doc(doc: tantivy.Document) -> CorpusDoc:
    """A stored tantivy document back as a CorpusDoc."""
    return CorpusDoc(
        id=doc.get_first("id"),
        title=doc.get_first("title"),
        url=doc.get_first("url"),
        text=doc.get_first("text"),
        links=tuple(doc.get_all("links")),
    )


def _write_index(corpus: Path, out: Path, *, threads: int, heap_mb: int, progress: bool) -> int:
    """Stream the corpus into a new tantivy index in out; returns the number of docs."""
    index = tantivy.Index(_schema(), path=str(out), reuse=False)
    writer = index.writer(heap_size=heap_mb * 1_000_000, num_threads=threads)
    started = time.monotonic()
    count = 0
    try:
        for count, doc in enumerate(read_corpus(corpus), 1):
            writer.add_document(_tantivy_doc(doc, count - 1))
            if progress and count % _PROGRESS_EVERY == 0:
                print(f"indexed {count:,} pages in {time.monotonic() - started:.0f}s", file=sys.stderr)
    except BaseException:
        writer.rollback()  # stop the indexing threads before the caller deletes their directory
        raise
    writer.commit()
    writer.wait_merging_threads()
    return count


def _tantivy_doc(doc: CorpusDoc, ord_: int) -> Document:
    """The tantivy document for a corpus page at position ord_ in the corpus."""
    out = Document()
    out.add_text("id", doc.id)
    out.add_text("url", doc.url)
    out.add_text("title", doc.title)
    out.add_text("text", doc.text)
    for link in doc.links:
        out.add_text("links", link)
    out.add_unsigned("ord", ord_)
    return out
