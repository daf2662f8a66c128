"""Small BrowseComp-Plus files written in exactly the layout its repository documents (texttron/BrowseComp-Plus
at commit 97c637c: data/browsecomp_plus_decrypted.jsonl from scripts_build_index/decrypt_dataset.py, TREC qrels
in topics-qrels/, corpus rows of Tevatron/browsecomp-plus-corpus: docid, text, url)."""

from __future__ import annotations

import json
from pathlib import Path

DOCS = [
    (
        "101",
        "Orrin Vale Observatory\nThe Orrin Vale Observatory was founded in 1931 by the astronomer Mirela Kost.",
        "https://example.org/orrin-vale",
    ),
    (
        "102",
        "Mirela Kost\nMirela Kost, astronomer, was born in the harbour town of Teslin Bay.",
        "https://example.org/mirela-kost",
    ),
    (
        "103",
        "Teslin Bay\nTeslin Bay is a harbour town whose lighthouse is painted green.",
        "https://example.org/teslin-bay",
    ),
    (
        "104",
        "Green lighthouses\nA list of lighthouses painted green, none of them in Teslin Bay.",
        "https://example.org/teslin-bay",
    ),  # the same url as 103: the loader tells them apart
    ("105", "Unrelated\nA page about cheese making in the valley.", ""),
]
QUERIES = [
    {
        "query_id": "1",
        "query": "In which harbour town was the founder of the Orrin Vale Observatory born?",
        "answer": "Teslin Bay",
        "evidence_docs": [{"docid": "999", "text": "ignored: the qrels list this query"}],
        "gold_docs": [],
        "negative_docs": [{"docid": "104", "text": "..."}],
    },
    {
        "query_id": "2",
        "query": "What colour is the lighthouse of Teslin Bay?",
        "answer": "green",
        "evidence_docs": [{"docid": "103", "text": "..."}],
        "gold_docs": [{"docid": "103", "text": "..."}],
        "negative_docs": [],
    },
    {
        "query_id": "3",
        "query": "Who founded the Orrin Vale Observatory?",
        "answer": "Mirela Kost",
        "evidence_docs": [{"docid": "101", "text": "..."}],
        "gold_docs": [{"docid": "101", "text": "..."}],
        "negative_docs": [],
    },
]
EVIDENCE_QRELS = "1 Q0 101 1\n1 Q0 102 1\n"  # query 1 only: the others fall back to their rows' evidence_docs
GOLD_QRELS = "1 Q0 102 1\n"


def write_layout(root: Path, *, corpus_as: str = "jsonl") -> Path:
    """ROOT with the decrypted queries, the qrels and the corpus (JSONL, or a saved `datasets` directory)."""
    (root / "data").mkdir(parents=True)
    (root / "data" / "browsecomp_plus_decrypted.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUERIES))
    (root / "topics-qrels").mkdir()
    (root / "topics-qrels" / "qrel_evidence.txt").write_text(EVIDENCE_QRELS)
    (root / "topics-qrels" / "qrel_golds.txt").write_text(GOLD_QRELS)
    rows = [{"docid": d, "text": t, "url": u} for d, t, u in DOCS]
    if corpus_as == "jsonl":
        (root / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        from datasets import Dataset

        Dataset.from_list(rows).save_to_disk(str(root / "corpus"))
    return root
