"""Evidence recall of an episode, for tasks that list the documents needed to answer them (BrowseComp-Plus).

Two recalls over a task's evidence docids: among the documents any search returned (BrowseComp-Plus's own
"Recall": the union of retrieved docids, scripts_evaluation/evaluate_run.py at commit 97c637c) and among the
pages the agent opened. Averaged, as there, over the samples whose task has evidence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

KEYS = ("evidence_recall_retrieved", "evidence_recall_opened")


def evidence_stats(turns: Sequence[Any], metadata: dict[str, Any]) -> dict[str, float]:
    """The episode's two recalls of `metadata["evidence_docids"]` ({} when the task lists none)."""
    evidence = {str(d) for d in metadata.get("evidence_docids") or ()}
    if not evidence:
        return {}
    retrieved, opened = set(), set()
    for turn in turns:
        info = turn.info if hasattr(turn, "info") else turn.get("info", {})
        for hit in info.get("hits") or ():
            if isinstance(hit, dict) and hit.get("doc_id") is not None:
                retrieved.add(str(hit["doc_id"]))
        page = info.get("page")
        if isinstance(page, dict) and page.get("doc_id") is not None:
            opened.add(str(page["doc_id"]))
    return {
        "evidence_recall_retrieved": len(evidence & retrieved) / len(evidence),
        "evidence_recall_opened": len(evidence & opened) / len(evidence),
    }


def evidence_metrics(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Each recall's mean over the stored rows that have it (none: {})."""
    out = {}
    for key in KEYS:
        values = [r["stats"][key] for r in rows if key in r.get("stats", {})]
        if values:
            out[key] = sum(values) / len(values)
    return out
