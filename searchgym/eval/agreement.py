"""How far a run's judges agree with each other, and with human labels when there are any.

Each judge is a *rater* of every answered sample: its `correct` call (a failed verdict is no call),
plus `f1>T` (token F1 above a threshold, a softer call than F1's exact-match `correct`) when F1 ran.
Pairs of raters get percent agreement and Cohen's kappa (agreement beyond chance:
(p_o - p_e) / (1 - p_e); undefined, NaN, when both raters give one constant call). The samples where
they disagree are listed. A labels file (`question id, prediction, human verdict`; CSV with a
header, or JSON lines) gives each rater's accuracy against the humans, on the stored samples whose
question and prediction match a label.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

F1_THRESHOLD = 0.5
MAX_LISTED = 200  # disagreeing samples kept in the summary (the count is always exact)
ID_KEYS = ("question_id", "task_id", "id", "qid")
VERDICT_KEYS = ("human_verdict", "verdict", "label", "correct", "human")
TRUE = {"1", "true", "yes", "y", "correct", "right"}
FALSE = {"0", "false", "no", "n", "incorrect", "wrong"}


def cohen_kappa(a: Sequence[bool], b: Sequence[bool]) -> float:
    """Cohen's kappa of two raters' binary calls on the same items; NaN when chance agreement is 1."""
    if len(a) != len(b) or not a:
        raise ValueError("cohen_kappa needs two equally long, non-empty sequences")
    n = len(a)
    observed = sum(x == y for x, y in zip(a, b, strict=True)) / n
    pa, pb = sum(map(bool, a)) / n, sum(map(bool, b)) / n
    expected = pa * pb + (1 - pa) * (1 - pb)
    return float("nan") if expected >= 1.0 else (observed - expected) / (1 - expected)


def rater_names(judges: Sequence[str], f1_threshold: float = F1_THRESHOLD) -> list[str]:
    """The raters of a run with these judges: each judge, plus `f1>T` when F1 ran."""
    return [*judges, *([f"f1>{f1_threshold:g}"] if "f1" in judges else [])]


def calls(row: dict[str, Any], f1_threshold: float = F1_THRESHOLD) -> dict[str, bool | None]:
    """Each rater's call on one stored sample: True/False, or None where that judge failed or did not run."""
    out: dict[str, bool | None] = {}
    for name, verdict in row.get("verdicts", {}).items():
        out[name] = None if verdict.get("error") else bool(verdict.get("correct"))
    f1 = row.get("verdicts", {}).get("f1")
    if f1 is not None:
        out[f"f1>{f1_threshold:g}"] = None if f1.get("error") else float(f1.get("score", 0.0)) > f1_threshold
    return out


def _pair_stats(a: list[bool], b: list[bool]) -> dict[str, Any]:
    n = len(a)
    if not n:
        return {"n": 0, "agreement": float("nan"), "kappa": float("nan")}
    return {"n": n, "agreement": sum(x == y for x, y in zip(a, b, strict=True)) / n, "kappa": cohen_kappa(a, b)}


def judge_agreement(
    rows: Sequence[dict[str, Any]],
    judges: Sequence[str],
    *,
    f1_threshold: float = F1_THRESHOLD,
    max_listed: int = MAX_LISTED,
) -> dict[str, Any]:
    """Pairwise agreement and kappa of the raters on answered samples, and the samples where they split."""
    names = rater_names(judges, f1_threshold)
    answered = [r for r in rows if r.get("prediction") is not None]
    table = [calls(r, f1_threshold) for r in answered]
    pairs = []
    for x, y in itertools.combinations(names, 2):
        both = [(p, q) for c in table if (p := c.get(x)) is not None and (q := c.get(y)) is not None]
        pairs.append({"a": x, "b": y, **_pair_stats([p for p, _ in both], [q for _, q in both])})
    split = []
    for row, c in zip(answered, table, strict=True):
        given = {n: c[n] for n in names if c.get(n) is not None}
        if len(set(given.values())) > 1:
            split.append(
                {
                    "task_id": row["task_id"],
                    "sample": row["sample"],
                    "prediction": row["prediction"],
                    "answers": row.get("answers", []),
                    "calls": given,
                }
            )
    split.sort(key=lambda d: (str(d["task_id"]), d["sample"]))
    return {
        "raters": names,
        "f1_threshold": f1_threshold,
        "answered": len(answered),
        "pairs": pairs,
        "disagreements": len(split),
        "disagreeing": split[:max_listed],
    }


# --- human labels -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Label:
    """A human's verdict on one prediction to one question."""

    task_id: str
    prediction: str
    correct: bool


def _verdict(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    text = str(value).strip().lower()
    if text in TRUE:
        return True
    if text in FALSE:
        return False
    raise ValueError(f"{where}: human verdict {value!r} is not one of {sorted(TRUE)} / {sorted(FALSE)}")


def _label(row: Any, where: str) -> Label:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected an object with question id, prediction and human verdict")
    lowered = {str(k).strip().lower(): v for k, v in row.items()}
    task_id = next((lowered[k] for k in ID_KEYS if lowered.get(k) not in (None, "")), None)
    verdict = next((lowered[k] for k in VERDICT_KEYS if lowered.get(k) not in (None, "")), None)
    if task_id is None or "prediction" not in lowered or verdict is None:
        raise ValueError(
            f"{where}: needs a question id ({'/'.join(ID_KEYS)}), 'prediction' and a human verdict "
            f"({'/'.join(VERDICT_KEYS)}); got columns {sorted(lowered)}"
        )
    return Label(
        str(task_id), str(lowered["prediction"] if lowered["prediction"] is not None else ""), _verdict(verdict, where)
    )


def load_labels(path: str | os.PathLike) -> list[Label]:
    """Human labels from a CSV file with a header row, or from JSON lines (`.jsonl`/`.json`); clear errors by line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text ({e})") from None
    labels: list[Label] = []
    if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except ValueError as e:
                    raise ValueError(f"{path}:{number}: not JSON ({e})") from None
                labels.append(_label(row, f"{path}:{number}"))
    else:
        try:
            for number, row in enumerate(csv.DictReader(text.splitlines()), 2):
                labels.append(_label(row, f"{path}:{number}"))
        except csv.Error as e:
            raise ValueError(f"{path}: not CSV ({e})") from None
    if not labels:
        raise ValueError(f"{path} holds no labels")
    return labels


def label_accuracy(
    rows: Sequence[dict[str, Any]],
    labels: Sequence[Label],
    judges: Sequence[str],
    *,
    f1_threshold: float = F1_THRESHOLD,
) -> dict[str, Any]:
    """Each rater's accuracy and kappa against human labels, on the stored samples that a label matches.

    A label matches the samples of its question whose prediction is the labelled one (surrounding
    whitespace aside); labels that match no stored sample are counted, not scored."""
    wanted: dict[tuple[str, str], bool] = {}
    for lab in labels:
        key = (lab.task_id, lab.prediction.strip())
        if wanted.setdefault(key, lab.correct) != lab.correct:
            raise ValueError(f"conflicting human verdicts for question {lab.task_id!r}, prediction {lab.prediction!r}")
    names = rater_names(judges, f1_threshold)
    matched: list[tuple[bool, dict[str, bool | None]]] = []
    hit: set[tuple[str, str]] = set()
    for row in rows:
        if row.get("prediction") is None:
            continue
        key = (str(row["task_id"]), str(row["prediction"]).strip())
        if key in wanted:
            hit.add(key)
            matched.append((wanted[key], calls(row, f1_threshold)))
    per_rater = {}
    for name in names:
        pairs = [(human, j) for human, c in matched if (j := c.get(name)) is not None]
        if not pairs:
            per_rater[name] = {"n": 0, "accuracy": float("nan"), "kappa": float("nan")}
            continue
        human, judged = [h for h, _ in pairs], [j for _, j in pairs]
        per_rater[name] = {
            "n": len(pairs),
            "accuracy": sum(h == j for h, j in pairs) / len(pairs),
            "kappa": cohen_kappa(human, judged),
        }
    return {
        "labels": len(wanted),
        "matched_labels": len(hit),
        "unmatched_labels": len(wanted) - len(hit),
        "matched_samples": len(matched),
        "raters": per_rater,
    }
