"""The search systems `searchgym bench search` races, each answering a query with the ids of its top k pages.

LocalIndex three ways: `search_sync` (hits with titles, urls and query-focused snippets: what an env shows),
`rank_sync` (ids and scores only, one query a call: the like-for-like peer of bm25s) and `rank_many_sync`
(a chunk of queries a call over `threads` threads); tantivy's default query path (`Index.parse_query` over
title and text, the top k's stored ids); bm25s (its English stopwords, numba backend when installed; one
query a call, and a chunk of queries a call with n_threads=0 and with `threads`); rank-bm25 (BM25Okapi over
the same tokens); all over the same corpus. bm25s and rank-bm25 come with the `bench` extra; a missing one
is reported, not raised.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tantivy

from searchgym.envs.tools.local_index import LocalIndex

_WORD = re.compile(r"(?u)\b\w\w+\b")  # bm25s's default token pattern, used for rank-bm25 too


@dataclass
class Peer:
    """One system: `search(query) -> ids` (or `search_many(queries) -> ids per query`), and how long it took."""

    name: str
    search: Callable[[str], list[str]] | None = None
    search_many: Callable[[Sequence[str]], list[list[str]]] | None = None
    max_per_chunk: int | None = None  # slow systems answer only the head of each chunk
    seconds: float = 0.0
    answers: dict[int, list[str]] = field(default_factory=dict)  # query number -> ids

    def run(self, numbered: Sequence[tuple[int, str]]) -> None:
        """Answer these (number, query) pairs, adding the time taken to `seconds`."""
        numbered = numbered[: self.max_per_chunk]
        t0 = time.perf_counter()
        if self.search_many is not None:
            results = self.search_many([q for _, q in numbered])
        else:
            results = [self.search(q) for _, q in numbered]  # type: ignore[misc]
        self.seconds += time.perf_counter() - t0
        self.answers.update((i, ids) for (i, _), ids in zip(numbered, results, strict=True))


SNIPPETS = "LocalIndex with snippets"  # the peers' names, which the bench's ratios refer to
RANK = "LocalIndex rank"
BM25S = "bm25s"


def batched(name: str, threads: int) -> str:
    """A batched peer's name: "<name> batched, <threads> thread(s)"."""
    return f"{name} batched, {threads} thread{'s' if threads != 1 else ''}"


def local_index_peers(index: LocalIndex, k: int, threads: int) -> list[Peer]:
    """LocalIndex.search_sync (the env's search, snippets included), rank_sync (ids only, one query a call) and
    rank_many_sync (a chunk a call, spread over `threads` threads: LocalIndex's own choice, one per core)."""
    return [
        Peer(SNIPPETS, search=lambda q: [hit.doc_id for hit in index.search_sync(q, k)]),
        Peer(RANK, search=lambda q: [doc_id for doc_id, _ in index.rank_sync(q, k)]),
        Peer(batched(RANK, threads), search_many=lambda qs: [[d for d, _ in r] for r in index.rank_many_sync(qs, k)]),
    ]


def tantivy_default_peer(index_dir: Path, k: int) -> Peer:
    """tantivy-py as its README shows it: parse_query over the text fields, search, read the hits' stored ids."""
    index = tantivy.Index.open(str(index_dir))
    index.reload()
    searcher = index.searcher()

    def search(query: str) -> list[str]:
        try:
            parsed = index.parse_query(query, ["title", "text"])
        except ValueError:  # query syntax the parser refuses: its lenient mode
            parsed = index.parse_query_lenient(query, ["title", "text"])[0]
        return [searcher.doc(address).get_first("id") for _, address in searcher.search(parsed, k, count=False).hits]

    return Peer("tantivy default", search=search)


def read_corpus_texts(corpus: Path) -> tuple[list[str], list[str]]:
    """(ids, title + newline + text) of every page, for the systems that index raw strings."""
    ids, texts = [], []
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            ids.append(str(row["id"]))
            texts.append(f"{row.get('title', '')}\n{row['text']}")
    return ids, texts


def bm25s_peers(
    ids: list[str], texts: list[str], k: int, backend: str | None = None, threads: int = 1
) -> tuple[list[Peer], dict[str, Any]]:
    """bm25s one query a call, a chunk of queries a call with its default n_threads=0 (one thread) and, when
    `threads` > 1, with n_threads=threads; plus what was built (or why not). `backend` None is numba (bm25s's
    fast one) when installed, else numpy."""
    try:
        import bm25s
    except ImportError:
        return [], {"bm25s": "not installed (pip install -e '.[bench]')"}
    if backend is None:
        try:
            import numba  # noqa: F401

            backend = "numba"
        except ImportError:
            backend = "numpy"
    t0 = time.perf_counter()
    retriever = bm25s.BM25(backend=backend)
    retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
    built = {"bm25s": {"version": bm25s.__version__, "backend": backend, "index_s": round(time.perf_counter() - t0, 1)}}

    def many(queries: Sequence[str], n_threads: int = 0) -> list[list[str]]:
        tokens = bm25s.tokenize(list(queries), stopwords="en", show_progress=False)
        docs, _ = retriever.retrieve(tokens, k=k, show_progress=False, n_threads=n_threads)
        return [[ids[i] for i in row] for row in docs.tolist()]

    peers = [Peer(BM25S, search=lambda q: many([q])[0]), Peer(batched(BM25S, 1), search_many=many)]
    if threads > 1:
        peers.append(Peer(batched(BM25S, threads), search_many=lambda qs: many(qs, threads)))
    return peers, built


def rank_bm25_peer(ids: list[str], texts: list[str], k: int, per_chunk: int) -> tuple[list[Peer], dict[str, Any]]:
    """rank-bm25's BM25Okapi over bm25s's tokens (lower-cased words, English stopwords out); slow, so it answers
    `per_chunk` queries of each chunk."""
    try:
        import numpy as np
        from rank_bm25 import BM25Okapi
    except ImportError:
        return [], {"rank_bm25": "not installed (pip install -e '.[bench]')"}
    from importlib.metadata import version

    from searchgym.envs.tools.local_index import STOPWORDS

    def tokens(text: str) -> list[str]:
        return [w for w in _WORD.findall(text.lower()) if w not in STOPWORDS]

    t0 = time.perf_counter()
    model = BM25Okapi([tokens(t) for t in texts])
    built = {"rank_bm25": {"version": version("rank-bm25"), "index_s": round(time.perf_counter() - t0, 1)}}

    def search(query: str) -> list[str]:
        scores = model.get_scores(tokens(query))
        top = np.argpartition(-scores, min(k, len(scores) - 1))[:k]
        return [ids[i] for i in sorted(top, key=lambda i: -scores[i])]

    return [Peer("rank-bm25", search=search, max_per_chunk=per_chunk)], built


def race(peers: list[Peer], queries: list[str], answers: list[str], *, chunks: int = 10) -> dict[str, Any]:
    """Interleave the peers chunk by chunk (a rotating order, so load drifts hit all alike); queries/s, recall@k
    and MRR of the answer page for each, over the queries it answered."""
    numbered = list(enumerate(queries))
    size = -(-len(numbered) // chunks)
    for peer in peers:  # warm-up (JIT compiles, page cache), not counted
        peer.run(numbered[:3])
        peer.seconds, peer.answers = 0.0, {}
    for c in range(chunks):
        chunk = numbered[c * size : (c + 1) * size]
        for peer in peers[c % len(peers) :] + peers[: c % len(peers)]:
            peer.run(chunk)
    out = {}
    for peer in peers:
        n = len(peer.answers)
        ranks = [peer.answers[i].index(answers[i]) + 1 for i in peer.answers if answers[i] in peer.answers[i]]
        out[peer.name] = {
            "queries": n,
            "qps": round(n / peer.seconds, 1) if peer.seconds else None,
            "recall_at_k": round(len(ranks) / n, 4) if n else None,
            "mrr": round(sum(1 / r for r in ranks) / n, 4) if n else None,
        }
    return out
