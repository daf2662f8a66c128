"""`searchgym bench retrieval-paraphrase` on a small world: every retriever answers every kind of question, the
figures are recomputable from the recorded ranks' rules (recall within its Wilson interval, hybrid's paired
difference against BM25), a misspelled name costs BM25 more than it costs dense retrieval, and a rerun reuses the
built indexes."""

from __future__ import annotations

import json

from searchgym.bench.retrieval_paraphrase import (
    RETRIEVERS,
    RetrievalParaphraseSettings,
    format_table,
    run_retrieval_paraphrase_bench,
    wilson,
)
from searchgym.world.paraphrase import KINDS


def test_the_bench_measures_every_retriever_on_every_kind_and_reuses_its_indexes(tmp_path):
    out = tmp_path / "paraphrase.json"
    report = run_retrieval_paraphrase_bench(
        RetrievalParaphraseSettings(size=300, questions=30, chunks=2, workdir=tmp_path / "world", out=out)
    )
    assert json.loads(out.read_text())["results"] == report["results"]
    results = report["results"]
    assert set(results) == set(RETRIEVERS) and all(set(results[r]) == set(KINDS) for r in RETRIEVERS)
    for retriever in RETRIEVERS:
        for kind in KINDS:
            row = results[retriever][kind]
            assert row["n"] == 30 and row["qps"] > 0 and 0 <= row["mrr_at_5"] <= row["recall_at_5"]
            low, high = row["recall_ci95"]
            assert low <= row["recall_at_5"] <= high
            assert [low, high] == [round(x, 4) for x in wilson(round(row["recall_at_5"] * 30), 30)]
    assert results["bm25"]["original"]["recall_at_5"] == 1.0  # the world's questions repeat the page's words
    assert results["bm25"]["misspelled"]["recall_at_5"] < results["dense"]["misspelled"]["recall_at_5"]
    assert "minus_bm25" in results["hybrid"]["misspelled"] and "minus_bm25" not in results["bm25"]["misspelled"]
    assert "misspelled" in format_table(report)
    assert report["builds"]["dense_index_s"] is not None and report["builds"]["dense_pages"] == 300
    again = run_retrieval_paraphrase_bench(
        RetrievalParaphraseSettings(size=300, questions=30, chunks=2, workdir=tmp_path / "world", out=out)
    )
    assert again["builds"]["world_s"] is None and again["builds"]["dense_index_s"] is None  # built once, reused
