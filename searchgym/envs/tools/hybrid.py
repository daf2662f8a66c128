"""Hybrid search: BM25 and dense results fused by reciprocal rank fusion (RRF)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

from searchgym.envs.tools.base import BackendError, Page, PageBackend, SearchBackend, SearchHit
from searchgym.envs.tools.index_files import MAX_K


class HybridIndex:
    """BM25 and dense results fused by reciprocal rank fusion; a SearchBackend, and a PageBackend via its parts."""

    def __init__(self, bm25: SearchBackend, dense: SearchBackend, *, k_rrf: int = 60, depth: int = 50) -> None:
        """Fuse the top `depth` of each backend with score sum(1 / (k_rrf + rank))."""
        if k_rrf < 0 or depth < 1:
            raise ValueError("k_rrf must be >= 0 and depth >= 1")
        self.bm25, self.dense, self.k_rrf, self.depth = bm25, dense, k_rrf, depth

    async def search(self, query: str, k: int = 5) -> list[SearchHit]:
        """Top-k fused hits; a hit keeps the first backend's snippet (BM25's is query-focused) and the RRF score."""
        k = min(int(k), MAX_K)
        if k < 1:
            return []
        depth = max(k, self.depth)
        lists = await asyncio.gather(self.bm25.search(query, depth), self.dense.search(query, depth))
        return rrf_fuse(lists, k, k_rrf=self.k_rrf)

    async def fetch(self, url: str) -> Page:
        """PageBackend: pages from the BM25 side if it serves pages, else from the dense side."""
        for backend in (self.bm25, self.dense):
            if isinstance(backend, PageBackend):
                return await backend.fetch(url)
        raise BackendError("neither hybrid backend can fetch pages")


def rrf_fuse(ranked_lists: Sequence[Sequence[SearchHit]], k: int, *, k_rrf: int = 60) -> list[SearchHit]:
    """Reciprocal rank fusion of ranked hit lists keyed by doc id; ties go to the better best rank, then doc id."""
    scores: dict[str, float] = {}
    best: dict[str, tuple[int, int]] = {}
    first: dict[str, SearchHit] = {}
    for which, hits in enumerate(ranked_lists):
        for rank, hit in enumerate(hits, 1):
            if hit.doc_id in scores and best[hit.doc_id][1] == which:
                continue  # a backend repeating a doc counts once
            scores[hit.doc_id] = scores.get(hit.doc_id, 0.0) + 1.0 / (k_rrf + rank)
            best[hit.doc_id] = min(best.get(hit.doc_id, (rank, which)), (rank, which))
            first.setdefault(hit.doc_id, hit)
    order = sorted(scores, key=lambda d: (-scores[d], best[d][0], d))[:k]
    return [replace(first[d], score=scores[d]) for d in order]
