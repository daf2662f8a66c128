"""A local BM25 search and page backend over a JSONL corpus, backed by a tantivy index on disk.

How a query is scored: BM25 of its words over titles (boosted) and text, plus a bonus where all its
words appear in a title in order. Stopwords (Lucene's English list, bm25s's "en" list too) are left out
of the bag of words but kept in the title phrase; a word in the text of more than 5% of pages (and of
over 1,000; "year", "city" in the synthetic world) is scored in titles only, unless the query has no
rarer word. tantivy-py collects every search with a MultiCollector, which scores every page matching
any clause (no block-max pruning), so the clauses left out are the work saved. The top k come from one search of
exactly k: ties at equal score
go by index order (tantivy's tie-break), which is corpus order for an index built by one thread (one
segment), so no page beyond the k-th is read.

Thread safety, by construction: the shared tantivy Searcher is a PyO3 object whose methods all borrow it
immutably (`&self`), so any number of threads may use it at once; tantivy-py's `TextAnalyzer.analyze`
takes `&mut self` and raises RuntimeError("Already borrowed") when a second thread calls it while a
garbage collection inside the first call lets that thread run, so each thread analyses with its own.
tantivy releases the GIL inside a search, so a batch (search_many_sync, rank_many_sync) is answered in one
slice per thread of a small shared pool (one thread per core this process may run on, at most MAX_THREADS).

Fork safety: a child forked after the pool exists inherits it without its threads, and the pool's and the id
table's locks perhaps held, so a fork hook drops the pool and renews both locks in the child (the index itself is
a read-only searcher over files and answers in the child as in the parent).
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tantivy
from tantivy import (
    Document,
    FieldType,
    Filter,
    Occur,
    Query,
    SchemaBuilder,
    SnippetGenerator,
    TextAnalyzerBuilder,
    Tokenizer,
)

from searchgym.envs.tools.base import SearchHit
from searchgym.envs.tools.corpus import CorpusDoc, read_corpus
from searchgym.envs.tools.index_files import (
    MAX_K,
    PagesByUrl,
    atomic_build,
    corpus_fields,
    read_manifest,
    write_manifest,
)

KIND = "bm25"
TITLE_BOOST = 2.5  # a title match outweighs the same word in body text, so a page's own name ranks it first
TITLE_PHRASE_BOOST = 2.0  # extra credit when the query's words appear in a title in order ("New York")
MAX_QUERY_CHARS = 8192  # only the head of a huge query is analysed
MAX_QUERY_TERMS = 64
# Lucene's English stop set (EnglishAnalyzer.ENGLISH_STOP_WORDS_SET; bm25s's stopwords="en" is the same list).
STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then "
    "there these they this to was will with".split()
)
COMMON_TEXT_FRACTION = 0.05  # a word in the text of more pages than this share (and ...) is scored in titles only
COMMON_TEXT_MIN_PAGES = 1000  # (... than this many pages) once the query has rarer words
_TERM_CACHE_MAX = 100_000
_ITER_BATCH = 10_000
_PROGRESS_EVERY = 100_000
_SURROGATE = re.compile("[\ud800-\udfff]")
DOC_IDS_FILE = "doc_ids.json"  # every page's id in corpus order, so ranking reads no stored document
ID_SPOT_CHECKS = 16  # ids of DOC_IDS_FILE compared with the stored pages (first, last, spread between) before use
MAX_THREADS = 8  # the most pool threads a batch is spread over
_per_thread = threading.local()
_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_ids_lock = threading.Lock()  # guards making any index's id table (rare: once per index)


def _after_fork_in_child() -> None:
    """In a forked child: forget the parent's pool (its threads did not come along) and renew the locks a parent's
    thread may have held at the fork, so a batch or a first rank_sync in the child never waits forever."""
    global _pool, _pool_lock, _ids_lock
    _pool = None
    _pool_lock = threading.Lock()
    _ids_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _analyzer() -> tantivy.TextAnalyzer:
    """This thread's analyzer: the same analysis as tantivy's "default" tokenizer used for title and text (split
    on non-alphanumerics, drop tokens over 40 bytes, lower-case); one per thread, as analyze borrows it mutably."""
    analyzer = getattr(_per_thread, "analyzer", None)
    if analyzer is None:
        analyzer = _per_thread.analyzer = (
            TextAnalyzerBuilder(Tokenizer.simple()).filter(Filter.remove_long(40)).filter(Filter.lowercase()).build()
        )
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
    ) -> LocalIndex:
        """Index a JSONL corpus into out_dir atomically: built beside it, then renamed into place.

        One indexing thread writes one segment in corpus order while the corpus fits its budget (a 100,000-page world
        does), so equal scores rank in corpus order; more threads build a little faster, in several segments."""
        with atomic_build(out_dir) as tmp:
            ids = _write_index(Path(corpus), tmp, threads=threads, heap_mb=heap_mb, progress=progress)
            (tmp / DOC_IDS_FILE).write_text(json.dumps(ids))
            write_manifest(tmp, KIND, len(ids), **corpus_fields(Path(corpus)), tantivy_version=tantivy.__version__)
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
        self._ids: list[list[str]] | None = None  # doc id by [segment][doc in segment], made on the first rank_sync

    def __getstate__(self) -> dict[str, Any]:
        """Pickles as its directory: a copy (another process, a deepcopy) opens the index again."""
        return {"index_dir": self.index_dir, "snippet_chars": self.snippet_chars}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["index_dir"], snippet_chars=state["snippet_chars"])  # type: ignore[misc]

    def __len__(self) -> int:
        """Number of pages in the index."""
        return self._searcher.num_docs

    def search_sync(self, query: str, k: int = 5, *, whole_text: bool = False) -> list[SearchHit]:
        """Top-k pages for any query string (see the module docstring for the scoring); never raises on odd input,
        lone surrogates and non-strings included. whole_text: each hit's snippet is its page's whole text, no
        snippet made (a server answering Search-R1's whole documents reads each page once)."""
        plan, hits = self._top(query, k)
        if not hits:
            return []
        searcher = self._searcher
        if whole_text:
            return [
                SearchHit(
                    doc.get_first("id"),
                    doc.get_first("title"),
                    doc.get_first("url"),
                    doc.get_first("text"),
                    float(score),
                )
                for score, doc in ((score, searcher.doc(address)) for score, address in hits)
            ]
        snippets = SnippetGenerator.create(searcher, plan.words(), self._schema, "text")  # type: ignore[union-attr]
        snippets.set_max_num_chars(self.snippet_chars)
        snippet_from_doc, hit = snippets.snippet_from_doc, self._hit
        return [
            hit(score, doc, snippet_from_doc(doc).fragment())
            for score, doc in ((score, searcher.doc(address)) for score, address in hits)
        ]

    def rank_sync(self, query: str, k: int = 5) -> list[tuple[str, float]]:
        """(doc id, score) of the top-k pages: search_sync's ranking, order and scores without reading the pages or
        making snippets (for retrieval evals and rerankers, and the like-for-like peer of rankers returning ids)."""
        _, hits = self._top(query, k)
        if not hits:
            return []
        ids = self._ids or self._load_ids()  # a list lookup: reading the `ord` fast field is 5x slower a call
        return [(ids[address.segment_ord][address.doc], float(score)) for score, address in hits]

    def search_many_sync(
        self, queries: Sequence[str], k: int = 5, *, whole_text: bool = False
    ) -> list[list[SearchHit]]:
        """search_sync of each query, in order, the batch spread over a thread pool (tantivy searches without the
        GIL); the same hits as one call per query."""
        return _in_slices(lambda part: [self.search_sync(q, k, whole_text=whole_text) for q in part], queries)

    def rank_many_sync(self, queries: Sequence[str], k: int = 5) -> list[list[tuple[str, float]]]:
        """rank_sync of each query, in order, the batch spread over a thread pool like search_many_sync."""
        return _in_slices(lambda part: [self.rank_sync(q, k) for q in part], queries)

    def _top(self, query: str, k: int) -> tuple[_Plan | None, list[tuple[float, tantivy.DocAddress]]]:
        """The query's plan and its top-k (score, address) pairs from one search of exactly k (ties in index order);
        (None, []) for a query with no terms or k below 1."""
        k = min(k, MAX_K)
        terms = query_terms(query)
        if k < 1 or not terms:
            return None, []
        plan = self._plan(terms)
        return plan, self._searcher.search(plan.ranking, k, count=False).hits

    def _load_ids(self) -> list[list[str]]:
        """Every page's id by its address, made once: the ids in corpus order from the file the build wrote when it
        checks out (else, and for an index built before there was one, from the stored pages), placed by `ord`."""
        with _ids_lock:
            if self._ids is None:
                addresses = [address for batch in self._ordered_addresses() for address in batch]
                ids = self._ids_from_file(addresses)
                if ids is None:
                    ids = [self._searcher.doc(address).get_first("id") for address in addresses]
                table: list[list[str]] = [[] for _ in range(self._searcher.num_segments)]
                for address, doc_id in zip(addresses, ids, strict=True):
                    row = table[address.segment_ord]
                    row.extend([""] * (address.doc + 1 - len(row)))
                    row[address.doc] = doc_id
                self._ids = table
            return self._ids

    def _ids_from_file(self, addresses: list[tantivy.DocAddress]) -> list[str] | None:
        """The ids DOC_IDS_FILE lists, if it is a list of strings, one per page, whose first, last and spread ids match
        the stored pages' (an index rebuilt in place or a copied file must not rank with wrong ids); else None, with
        a warning naming the file when there is one."""
        path = self.index_dir / DOC_IDS_FILE
        if not path.is_file():
            return None  # built before the file existed: the stored pages are the only source
        try:
            ids = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            return _distrust(path, f"cannot be read ({exc})")
        if not isinstance(ids, list) or not all(isinstance(doc_id, str) for doc_id in ids):
            return _distrust(path, "is not a JSON list of id strings")
        if len(ids) != len(addresses):
            return _distrust(path, f"lists {len(ids)} ids for {len(addresses)} pages")
        n = len(ids)
        for i in sorted({0, n - 1, *(j * n // ID_SPOT_CHECKS for j in range(ID_SPOT_CHECKS))} if n else set()):
            stored = self._searcher.doc(addresses[i]).get_first("id")
            if ids[i] != stored:
                return _distrust(path, f"says page {i} is {ids[i]!r} but the index holds {stored!r}")
        return ids

    async def search(self, query: str, k: int = 5) -> list[SearchHit]:
        """SearchBackend: the same as search_sync (BM25 here is fast and CPU-bound)."""
        return self.search_sync(query, k)

    def iter_docs(self) -> Iterator[CorpusDoc]:
        """Every indexed page, in corpus order, read back from the index's store."""
        for batch in self._ordered_addresses():
            for address in batch:
                yield _corpus_doc(self._searcher.doc(address))

    def _ordered_addresses(self) -> Iterator[list[tantivy.DocAddress]]:
        """Every page's address in corpus (`ord`) order, in batches of _ITER_BATCH."""
        for lo in range(0, len(self), _ITER_BATCH):
            batch = Query.range_query(self._schema, "ord", FieldType.Unsigned, lo, lo + _ITER_BATCH - 1)
            addresses = [address for _, address in self._searcher.search(batch, _ITER_BATCH, count=False).hits]
            ords = self._searcher.fast_field_values("ord", addresses)
            yield [address for _, address in sorted(zip(ords, addresses, strict=True), key=lambda pair: pair[0])]

    def _term(self, term: str) -> _Term:
        """A word's page counts and ready-made clauses (cached: the index never changes while open, and building
        them anew is a third of a query's Python-side time)."""
        info = self._terms.get(term)
        if info is None:
            if len(self._terms) >= _TERM_CACHE_MAX:
                self._terms.clear()
            title = Query.boost_query(Query.term_query(self._schema, "title", term, index_option="freq"), TITLE_BOOST)
            text = Query.term_query(self._schema, "text", term, index_option="freq")
            info = self._terms[term] = _Term(
                self._searcher.doc_freq("text", term),
                self._searcher.doc_freq("title", term) > 0,
                (Occur.Should, title),
                (Occur.Should, text),
            )
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
        if len(terms) > 1 and all(self._term(t).in_titles for t in set(terms)):  # else no title can hold it
            phrase = Query.boost_query(Query.phrase_query(self._schema, "title", terms), TITLE_PHRASE_BOOST)
            return _Plan(Query.boolean_query([*clauses, (Occur.Should, phrase)]), clauses)  # flat: one union
        return _Plan(Query.boolean_query(clauses), None)

    def _hit(self, score: float, doc: tantivy.Document, fragment: str) -> SearchHit:
        """A SearchHit with the query-focused fragment as its snippet, or the page's opening when it is empty.

        tantivy keeps a fragment only where it highlights a word, so an empty one means nothing is highlighted (and
        reading just the fragment skips building the highlight ranges as Python objects)."""
        n = self.snippet_chars
        text = fragment or doc.get_first("text")
        return SearchHit(
            doc.get_first("id"),
            doc.get_first("title"),
            doc.get_first("url"),
            " ".join(text[: 4 * n].split())[:n],
            float(score),
        )  # one_line, inlined: it runs k times a query

    def _lookup(self, field: str, value: str) -> CorpusDoc | None:
        """The doc whose raw field equals value exactly, or None (no stored url or id holds a lone surrogate)."""
        if not value or not isinstance(value, str) or _SURROGATE.search(value):
            return None
        hits = self._searcher.search(
            Query.term_query(self._schema, field, value, index_option="basic"), 1, count=False
        ).hits
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
    """One query's tantivy query that ranks pages (its words' BM25 over title and text, plus the title-phrase bonus
    where there is one), and its words' clauses apart when the phrase is in it (ranking alone never needs them)."""

    ranking: Query
    word_clauses: list[tuple[Occur, Query]] | None  # None: ranking is the words alone

    def words(self) -> Query:
        """The words' query without the phrase: what snippets highlight."""
        return self.ranking if self.word_clauses is None else Query.boolean_query(self.word_clauses)


def _in_slices(answer: Callable[[Sequence[str]], list[Any]], queries: Sequence[str]) -> list[Any]:
    """answer() over the queries in one contiguous slice per pool thread, the first slice on the calling thread
    (a thread hop per query costs about what a query does); the answers in query order."""
    if isinstance(queries, str):
        raise TypeError("queries must be a sequence of query strings, not one string")
    queries = list(queries)
    threads = batch_threads()
    size = -(-len(queries) // threads)  # the caller answers a slice too
    if threads == 1 or size < 2:  # one core, or too few queries to be worth a thread hop
        return answer(queries)
    pool = _shared_pool()
    slices = [queries[i : i + size] for i in range(0, len(queries), size)]
    futures = [pool.submit(answer, part) for part in slices[1:]]
    out = answer(slices[0])
    for future in futures:
        out.extend(future.result())
    return out


def _distrust(path: Path, why: str) -> None:
    """Warn that an id file is not used (the ids come from the stored pages instead); None, for the caller to return."""
    warnings.warn(
        f"{path} {why}; reading ids from the stored pages instead (slower to open; rebuild the index to "
        "restore the file)",
        RuntimeWarning,
        stacklevel=5,
    )
    return None


def batch_threads() -> int:
    """Threads a batch (search_many_sync, rank_many_sync) is spread over, the caller's included: one per core this
    process may run on (its CPU affinity, which cgroup cpusets narrow), at most MAX_THREADS."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(MAX_THREADS, cores or 1))


def _shared_pool() -> ThreadPoolExecutor:
    """The pool that answers all but the caller's slice of a batch, made on first use and shared by every index."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=max(1, batch_threads() - 1), thread_name_prefix="local-index")
        return _pool


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


def _write_index(corpus: Path, out: Path, *, threads: int, heap_mb: int, progress: bool) -> list[str]:
    """Stream the corpus into a new tantivy index in out; returns the docs' ids in corpus order."""
    index = tantivy.Index(_schema(), path=str(out), reuse=False)
    writer = index.writer(heap_size=heap_mb * 1_000_000, num_threads=threads)
    started = time.monotonic()
    ids: list[str] = []
    try:
        for doc in read_corpus(corpus):
            writer.add_document(_tantivy_doc(doc, len(ids)))
            ids.append(doc.id)
            if progress and len(ids) % _PROGRESS_EVERY == 0:
                print(f"indexed {len(ids):,} pages in {time.monotonic() - started:.0f}s", file=sys.stderr)
    except BaseException:
        writer.rollback()  # stop the indexing threads before the caller deletes their directory
        raise
    writer.commit()
    writer.wait_merging_threads()
    return ids


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
