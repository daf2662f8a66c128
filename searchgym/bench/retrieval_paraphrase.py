"""`searchgym bench retrieval-paraphrase`: where dense retrieval beats BM25, on questions worded unlike the page.

On one synthetic world (by default the 20,000 pages of `bench learning`), in one run:
- the world, its BM25 index and its dense index (all-MiniLM-L6-v2, the `dense` extra; encoded in batches into a
  memory-mapped file) are built once into a cache directory and reused by later runs;
- `paraphrase_set` (`world/paraphrase.py`) gives N one-hop questions in every kind: the original, relation
  synonyms, a misspelled name, a description instead of the name, synonyms with a misspelled name;
- BM25 (`LocalIndex.search_sync`), dense (`DenseIndex.search_sync`) and hybrid (`HybridIndex.search`, RRF over
  the top 50 of each, as an env runs it) answer every question of every kind, k=5, one query a call, interleaved
  chunk by chunk with a rotating order, on `threads` torch and faiss threads;
- per retriever per kind: n, recall@5 of the answer page with its 95% Wilson interval, MRR@5, queries/s, and
  recall@5's paired difference from BM25 on the same questions with a 95% bootstrap interval.
Numbers go to a JSON file (with the commit and machine) and a printed table, never asserted in tests.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchgym.bench.bootstrap import hierarchical_bootstrap
from searchgym.bench.provenance import git_commit, machine
from searchgym.envs.tasks import Task
from searchgym.envs.tools.hybrid import HybridIndex
from searchgym.envs.tools.index_files import has_manifest
from searchgym.envs.tools.indexes import open_index
from searchgym.envs.tools.retrievers import DENSE_ENCODER
from searchgym.settings import setting
from searchgym.world.bundle import default_cache_dir
from searchgym.world.paraphrase import KINDS, paraphrase_set
from searchgym.world.world import World

K = 5
RETRIEVERS = ("bm25", "dense", "hybrid")
DEFAULT_SIZE = 20_000  # the world of `bench learning`
WARMUP = 8  # queries per retriever before the clock starts (the encoder loads on its first query)


@dataclass
class RetrievalParaphraseSettings:
    """`searchgym bench retrieval-paraphrase`: BM25, dense and hybrid retrieval on questions and paraphrases."""

    size: int = setting(DEFAULT_SIZE, at_least=100, help="pages in the synthetic world (bench learning's: 20,000)")
    seed: int = setting(0, help="the world's seed and the questions'")
    questions: int = setting(400, at_least=1, help="questions of each kind")
    threads: int = setting(1, at_least=1, help="torch and faiss threads (encoding and search)")
    chunks: int = setting(10, at_least=1, help="interleaved chunks each retriever's queries are timed in")
    workdir: Path | None = setting(
        None,
        help="where the world and its indexes are built once and reused, or a world or SyntheticQA bundle "
        "directory (default: $SEARCHGYM_CACHE/worlds/sizeN-seedS)",
    )
    out: Path = setting(Path("results/bench_retrieval_paraphrase.json"), help="the results JSON")


def run_retrieval_paraphrase_bench(settings: RetrievalParaphraseSettings) -> dict[str, Any]:
    """Build (or reuse) the world and both indexes, then measure every retriever on every kind of question."""
    import faiss
    import torch

    started = time.perf_counter()
    torch.set_num_threads(settings.threads)
    faiss.omp_set_num_threads(settings.threads)
    load_before = os.getloadavg()
    cached = default_cache_dir() / "worlds" / f"size{settings.size}-seed{settings.seed}"
    root = Path(settings.workdir) if settings.workdir is not None else cached
    world = World(settings.size, settings.seed)
    bm25, dense, builds = _build(world, root)
    hybrid = HybridIndex(bm25, dense)
    tasks = paraphrase_set(world, settings.questions, seed=settings.seed)
    by_kind = {kind: [t for t in tasks if t.metadata["paraphrase_kind"] == kind] for kind in KINDS}
    measured = asyncio.run(_measure(bm25, dense, hybrid, by_kind, settings.chunks))
    results: dict[str, dict[str, Any]] = {}
    for retriever in RETRIEVERS:
        results[retriever] = {}
        for kind in KINDS:
            m = measured[retriever][kind]
            row = _summary(m["answer_ranks"], m["seconds"])
            if retriever != "bm25":
                row["minus_bm25"] = _paired_difference(m["answer_ranks"], measured["bm25"][kind]["answer_ranks"])
            results[retriever][kind] = row
    report = {
        "commit": git_commit(),
        "machine": machine(
            torch_threads=settings.threads,
            faiss_threads=settings.threads,
            load_before=load_before,
            load_after=os.getloadavg(),
        ),
        "config": {
            "size": settings.size,
            "seed": settings.seed,
            "questions_per_kind": settings.questions,
            "k": K,
            "kinds": list(KINDS),
            "retrievers": {
                "bm25": "LocalIndex.search_sync (hits with snippets, as the env shows them)",
                "dense": f"DenseIndex.search_sync, encoder {DENSE_ENCODER} (all-MiniLM-L6-v2), flat inner product",
                "hybrid": f"HybridIndex.search: RRF (k_rrf={hybrid.k_rrf}) of the top {hybrid.depth} of each",
            },
            "chunks": settings.chunks,
            "workdir": str(root),
        },
        "builds": builds,
        "examples": {kind: rows[0].question for kind, rows in by_kind.items() if rows},
        "results": results,
        "seconds_total": round(time.perf_counter() - started, 1),
    }
    Path(settings.out).parent.mkdir(parents=True, exist_ok=True)
    Path(settings.out).write_text(json.dumps(report, indent=2) + "\n")
    return report


def _build(world: World, root: Path) -> tuple[Any, Any, dict[str, Any]]:
    """The world's pages, BM25 index and dense index under root, each built only when missing: the two indexes
    and what each build cost."""
    out: dict[str, Any] = {}
    manifest = root / "world.json"
    if manifest.exists():
        meta = json.loads(manifest.read_text())
        if (meta.get("size"), meta.get("seed")) != (world.size, world.seed):
            raise ValueError(
                f"{root} holds a world of {meta.get('size')} pages (seed {meta.get('seed')}), not {world.size} "
                f"(seed {world.seed}); give another --workdir"
            )
        out["world_s"] = None
    else:
        t0 = time.perf_counter()
        world.write(root, progress=True)
        out["world_s"] = round(time.perf_counter() - t0, 2)
    indexes = []
    for name, dense, key in (("index", False, "bm25_index_s"), ("dense-index", DENSE_ENCODER, "dense_index_s")):
        built = not has_manifest(root / name)
        t0 = time.perf_counter()
        indexes.append(open_index(root, dense=dense, progress=True))
        out[key] = round(time.perf_counter() - t0, 2) if built else None
    dense_manifest = json.loads((root / "dense-index" / "index.json").read_text())
    out["dense_encode_s_when_built"] = dense_manifest.get("encode_seconds")
    out["dense_pages"] = dense_manifest.get("doc_count")
    out["note"] = "null seconds: reused from an earlier run"
    return indexes[0], indexes[1], out


async def _measure(
    bm25: Any, dense: Any, hybrid: HybridIndex, by_kind: dict[str, list[Task]], chunks: int
) -> dict[str, dict[str, dict[str, Any]]]:
    """Every retriever on every question, chunk by chunk, the retrievers' order rotating per chunk; the rank of the
    answer page (0 when not in the top K) and the seconds spent, per retriever per kind."""

    async def bm25_search(q: str) -> list[str]:
        return [h.doc_id for h in bm25.search_sync(q, K)]

    async def dense_search(q: str) -> list[str]:
        return [h.doc_id for h in dense.search_sync(q, K)]

    async def hybrid_search(q: str) -> list[str]:
        return [h.doc_id for h in await hybrid.search(q, K)]

    searches = {"bm25": bm25_search, "dense": dense_search, "hybrid": hybrid_search}
    ranks: dict[tuple[str, str], list[int]] = {(r, kind): [] for r in RETRIEVERS for kind in by_kind}
    seconds: dict[tuple[str, str], float] = {(r, kind): 0.0 for r in RETRIEVERS for kind in by_kind}
    warm = [t.question for rows in by_kind.values() for t in rows[:2]][:WARMUP]
    for search in searches.values():
        for q in warm:
            await search(q)
    n = max(len(rows) for rows in by_kind.values())
    step = max(1, math.ceil(n / chunks))
    for c, lo in enumerate(range(0, n, step)):
        order = RETRIEVERS[c % len(RETRIEVERS) :] + RETRIEVERS[: c % len(RETRIEVERS)]
        for kind, rows in by_kind.items():
            part = rows[lo : lo + step]
            for retriever in order:
                search = searches[retriever]
                t0 = time.perf_counter()
                found = [await search(t.question) for t in part]
                seconds[retriever, kind] += time.perf_counter() - t0
                for task, ids in zip(part, found, strict=True):
                    wanted = task.metadata["answer_doc_id"]
                    ranks[retriever, kind].append(ids.index(wanted) + 1 if wanted in ids else 0)
    return {
        r: {kind: {"answer_ranks": ranks[r, kind], "seconds": seconds[r, kind]} for kind in by_kind} for r in RETRIEVERS
    }


def _summary(ranks: list[int], seconds: float) -> dict[str, Any]:
    n = len(ranks)
    hits = sum(1 for r in ranks if r)
    low, high = wilson(hits, n)
    return {
        "n": n,
        "recall_at_5": round(hits / n, 4) if n else None,
        "recall_ci95": [round(low, 4), round(high, 4)],
        "mrr_at_5": round(sum(1 / r for r in ranks if r) / n, 4) if n else None,
        "qps": round(n / seconds, 1) if seconds else None,
        "seconds": round(seconds, 2),
    }


def _paired_difference(ranks: list[int], bm25_ranks: list[int]) -> dict[str, Any]:
    """Recall@5 minus BM25's on the same questions, with a 95% bootstrap interval over the questions."""
    diffs = [float(bool(a)) - float(bool(b)) for a, b in zip(ranks, bm25_ranks, strict=True)]
    boot = hierarchical_bootstrap({0: diffs})
    return {
        "recall_at_5": round(boot["gain"], 4),
        "ci95": [round(boot["ci95_low"], 4), round(boot["ci95_high"], 4)],
        "significant": boot["significant"],
    }


def wilson(hits: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion hits/n ((0, 1) when n is 0)."""
    if n == 0:
        return 0.0, 1.0
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def format_table(report: dict[str, Any]) -> str:
    """A markdown table: a row per retriever and kind, recall@5 with its interval, the difference from BM25, and
    queries/s."""
    lines = [
        "| retriever | questions | n | recall@5 | 95% interval | minus BM25 (95% interval) | MRR@5 | queries/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind in report["config"]["kinds"]:
        for retriever in RETRIEVERS:
            row = report["results"][retriever][kind]
            low, high = row["recall_ci95"]
            diff = row.get("minus_bm25")
            shown = f"{diff['recall_at_5']:+.3f} ({diff['ci95'][0]:+.3f}, {diff['ci95'][1]:+.3f})" if diff else ""
            lines.append(
                f"| {retriever} | {kind} | {row['n']} | {row['recall_at_5']:.3f} | {low:.3f} to {high:.3f} | "
                f"{shown} | {row['mrr_at_5']:.3f} | {row['qps']:,.1f} |"
            )
    return "\n".join(lines)


def retrieval_paraphrase_command(settings: RetrievalParaphraseSettings) -> None:
    report = run_retrieval_paraphrase_bench(settings)
    print(format_table(report))
    print(f"{report['seconds_total']:.0f} s in all; results in {settings.out}")
