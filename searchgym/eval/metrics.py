"""The evaluation metrics: k sampled episodes per task reduced to Avg@k and Pass@k.

Avg@k is the mean score over all samples, Pass@k the unbiased estimator 1 - C(n - c, k) / C(n, k)
from n samples with c correct. Playing the episodes is `harness.run_eval`'s job.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k from n samples of which c are correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class Sample:
    """One evaluated episode: its score, whether the judge called it correct, and what it did."""

    task_id: str
    sample: int
    reward: float
    correct: bool
    turns: int
    searches: int
    accesses: int
    generated_tokens: int
    answered: bool
    verdicts: dict[str, dict[str, Any]] = field(default_factory=dict)  # judge name -> Verdict.to_dict()


def summarize(samples: Sequence[Sample], k: int) -> dict[str, float]:
    """Avg@k of the reward and of correctness, Pass@k, and behaviour means over all samples."""
    if not samples:
        raise ValueError("no samples to summarize")
    by_task: dict[str, list[Sample]] = {}
    for s in samples:
        by_task.setdefault(s.task_id, []).append(s)
    n = len(samples)
    return {
        "tasks": float(len(by_task)),
        "samples": float(n),
        f"avg@{k}/reward": sum(s.reward for s in samples) / n,
        f"avg@{k}/correct": sum(s.correct for s in samples) / n,
        f"pass@{k}/correct": float(
            np.mean([pass_at_k(len(g), sum(s.correct for s in g), min(k, len(g))) for g in by_task.values()])
        ),
        "answered": sum(s.answered for s in samples) / n,
        "turns": sum(s.turns for s in samples) / n,
        "searches": sum(s.searches for s in samples) / n,
        "accesses": sum(s.accesses for s in samples) / n,
        "generated_tokens": sum(s.generated_tokens for s in samples) / n,
        **judge_metrics(by_task, k),
    }


def judge_metrics(by_task: dict[str, list[Sample]], k: int) -> dict[str, float]:
    """Per judge: Avg@k of the score, Avg@k and Pass@k of correctness, and the number of judge failures.

    A failed verdict (`error` set: the LLM judge gave no parsable answer or its call failed) is left out
    of that judge's averages and counted in `failures/{judge}`, never scored as a wrong answer.
    Pass@k per question uses its n valid samples (k capped at n)."""
    names = list(dict.fromkeys(name for group in by_task.values() for s in group for name in s.verdicts))
    out: dict[str, float] = {}
    for name in names:
        valid = {
            t: [s.verdicts[name] for s in g if name in s.verdicts and not s.verdicts[name].get("error")]
            for t, g in by_task.items()
        }
        scores = [v["score"] for vs in valid.values() for v in vs]
        failures = sum(1 for g in by_task.values() for s in g if s.verdicts.get(name, {}).get("error"))
        passes = [
            pass_at_k(len(vs), sum(bool(v["correct"]) for v in vs), min(k, len(vs))) for vs in valid.values() if vs
        ]
        out[f"avg@{k}/{name}"] = float(np.mean(scores)) if scores else float("nan")
        out[f"avg@{k}/{name}_correct"] = (
            float(np.mean([bool(v["correct"]) for vs in valid.values() for v in vs])) if scores else float("nan")
        )
        out[f"pass@{k}/{name}"] = float(np.mean(passes)) if passes else float("nan")
        out[f"failures/{name}"] = float(failures)
    return out


BREAKDOWN_KEYS = ("hops", "level", "subset", "source", "difficulty")  # task metadata a report breaks scores down by


def breakdown(samples: Sequence[Sample], groups: Sequence[Any], k: int) -> dict[str, dict[str, float]]:
    """summarize() per group (e.g. per hop count): {group: metrics}, groups in natural order; None is left out."""
    by_group: dict[Any, list[Sample]] = {}
    for s, g in zip(samples, groups, strict=True):
        if g is not None:
            by_group.setdefault(g, []).append(s)

    def order(g: Any) -> tuple[int, Any]:
        return (0, g) if isinstance(g, (int, float)) and not isinstance(g, bool) else (1, str(g))

    return {str(g): summarize(by_group[g], k) for g in sorted(by_group, key=order)}
