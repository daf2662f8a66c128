"""`searchgym eval compare RUN_DIR...`: runs side by side, paired per-question deltas, or a loud refusal.

Runs compare only when their protocol cards agree (`card.py`: same question set, judges, k, sampling,
budgets and tool stack); otherwise `compare_runs` raises `ProtocolMismatch` naming every differing
field, unless `allow_different=True`, which compares anyway and lists those fields at the top of the
comparison. The first run is the baseline; for every other run and every score (the env's reward
and each judge's score), the per-question mean is paired with the baseline's and the mean delta gets
a percentile-bootstrap interval over questions (`paired_delta`; questions are resampled, so
question difficulty cancels out). Outputs: a markdown table (`comparison_markdown`) and, with
`write_comparison`, compare.json, compare.md and a self-contained compare.html.
"""

from __future__ import annotations

import json
import os
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from searchgym.eval.card import differences
from searchgym.eval.harness import SAMPLES, SUMMARY, SampleStore, _finite
from searchgym.eval.report import CSS, _e, _fmt, _md_table, html_table

RESAMPLES = 10_000
MAX_QUESTIONS_LISTED = 100  # per-question deltas shown in compare.html (compare.json keeps them all)
K = TypeVar("K", bound=Hashable)  # a question's key, or a (seed, question) pair


class ProtocolMismatch(ValueError):
    """The runs were measured under different protocols; `differences` maps each card field to each run's value."""

    def __init__(self, message: str, differences: dict[str, list[Any]]):
        super().__init__(message)
        self.differences = differences


@dataclass
class Run:
    """A finished evaluation as `eval compare` reads it: its summary (with the card) and its stored samples."""

    path: Path
    name: str
    summary: dict[str, Any]
    rows: list[dict[str, Any]]

    @property
    def card(self) -> dict[str, Any]:
        return self.summary["card"]

    @property
    def k(self) -> int:
        return int(self.summary["k"])

    @property
    def judges(self) -> list[str]:
        return list(self.summary["judges"])


def load_run(path: str | os.PathLike, name: str | None = None) -> Run:
    """A run directory of `searchgym eval`; a clear error when it is not one, or predates protocol cards."""
    path = Path(path)
    summary_path = path / SUMMARY
    if not summary_path.is_file():
        raise FileNotFoundError(f"{path} is not a finished `searchgym eval` run (no {SUMMARY}); evaluate into it first")
    try:
        summary = json.loads(summary_path.read_text())
        if not isinstance(summary, dict) or not isinstance(summary.get("judges"), list) or "k" not in summary:
            raise ValueError("not a summary object")
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(
            f"{summary_path} is damaged ({e}); rerun the same `searchgym eval` command into {path} to "
            "rewrite it (finished samples are not played again)"
        ) from None
    if not isinstance(summary.get("card"), dict) or "protocol" not in summary["card"]:
        raise ValueError(
            f"{path} has no protocol card (it was evaluated before cards existed); rerun the same "
            f"`searchgym eval` command into it to write one (finished samples are not played again)"
        )
    if not (path / SAMPLES).is_file():
        raise FileNotFoundError(
            f"{path} has a summary but no {SAMPLES}: the per-question samples are needed to pair runs"
        )
    k = int(summary["k"])
    rows = [row for (_, sample), row in SampleStore(path / SAMPLES).rows.items() if sample < k]
    return Run(path, name or path.name, summary, rows)


def per_question(rows: Sequence[dict[str, Any]], metric: str) -> dict[str, float]:
    """Mean per question of `metric`: "reward" (the env's), or a judge's score (its failed verdicts left out)."""
    values: dict[str, list[float]] = {}
    for row in rows:
        if metric == "reward":
            value = row["reward"]
        else:
            verdict = row["verdicts"].get(metric)
            if verdict is None or verdict.get("error"):
                continue
            value = verdict["score"]
        values.setdefault(str(row["task_id"]), []).append(float(value))
    return {task: float(np.mean(v)) for task, v in values.items()}


def paired_delta(
    before: Mapping[K, float], after: Mapping[K, float], *, seed: int = 0, resamples: int = RESAMPLES
) -> dict[str, Any]:
    """Mean of after - before over the shared keys (questions, or (seed, question) pairs) with a 95% bootstrap interval.

    Pairing removes what both runs share (question difficulty); resampling the keys says whether the
    mean delta is more than luck: `significant` when the interval excludes zero."""
    keys = sorted(set(before) & set(after), key=str)
    if not keys:
        raise ValueError("the runs share no question to pair")
    diff = np.array([after[k] - before[k] for k in keys], dtype=float)
    means = np.random.default_rng(seed).choice(diff, size=(resamples, len(diff))).mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {
        "tasks": len(keys),
        "before": float(np.mean([before[k] for k in keys])),
        "after": float(np.mean([after[k] for k in keys])),
        "gain": float(diff.mean()),
        "ci95_low": float(low),
        "ci95_high": float(high),
        "significant": bool(low > 0 or high < 0),
        "tasks_better": int((diff > 0).sum()),
        "tasks_worse": int((diff < 0).sum()),
    }


def _mismatch_message(runs: Sequence[Run], diffs: dict[str, list[Any]]) -> str:
    lines = [
        f"refusing to compare: these runs were measured under different protocols, so their scores are not "
        f"comparable. {len(diffs)} score-relevant card field(s) differ:"
    ]
    for field, values in diffs.items():
        lines.append(
            f"  {field}: "
            + "; ".join(f"{run.name} = {json.dumps(v, default=str)}" for run, v in zip(runs, values, strict=True))
        )
    lines.append(
        "Evaluate them under one protocol, or pass --allow-different (allow_different=True) to compare "
        "anyway with these fields listed in the comparison."
    )
    return "\n".join(lines)


def _unique_names(paths: Sequence[Path], names: Sequence[str] | None) -> list[str]:
    if names is not None:
        if len(names) != len(paths) or len(set(names)) != len(names):
            raise ValueError("names must be distinct and one per run")
        return list(names)
    short = [p.name or str(p) for p in paths]
    return short if len(set(short)) == len(short) else [str(p) for p in paths]


def compare_runs(
    paths: Sequence[str | os.PathLike],
    *,
    names: Sequence[str] | None = None,
    allow_different: bool = False,
    seed: int = 0,
    resamples: int = RESAMPLES,
) -> dict[str, Any]:
    """Compare finished runs (the first is the baseline); ProtocolMismatch unless their protocols agree or allowed."""
    if len(paths) < 2:
        raise ValueError("eval compare needs at least two run directories")
    run_dirs = [Path(p) for p in paths]
    runs = [load_run(p, n) for p, n in zip(run_dirs, _unique_names(run_dirs, names), strict=True)]
    cards = [run.card for run in runs]
    diffs = differences(cards, "protocol")
    if diffs and not allow_different:
        raise ProtocolMismatch(_mismatch_message(runs, diffs), diffs)
    shared_judges = [j for j in runs[0].judges if all(j in run.judges for run in runs)]
    metrics = ["reward", *shared_judges]
    base = runs[0]
    deltas, questions = [], []
    for run in runs[1:]:
        for metric in metrics:
            deltas.append(
                {
                    "run": run.name,
                    "baseline": base.name,
                    "metric": metric,
                    **paired_delta(
                        per_question(base.rows, metric), per_question(run.rows, metric), seed=seed, resamples=resamples
                    ),
                }
            )
        primary = shared_judges[0] if shared_judges else "reward"
        before, after = per_question(base.rows, primary), per_question(run.rows, primary)
        text = {str(r["task_id"]): r["question"] for r in base.rows}
        changed = sorted(
            ((t, before[t], after[t]) for t in set(before) & set(after)), key=lambda x: (-abs(x[2] - x[1]), x[0])
        )
        questions.append(
            {
                "run": run.name,
                "metric": primary,
                "questions": [
                    {"task_id": t, "question": text.get(t, ""), "before": b, "after": a, "delta": a - b}
                    for t, b, a in changed
                ],
            }
        )
    return {
        "baseline": base.name,
        "metrics": metrics,
        "seed": seed,
        "resamples": resamples,
        "protocol_differences": diffs,
        "allowed_different": bool(diffs),
        "other_differences": {**differences(cards, "agent"), **differences(cards, "run")},
        "runs": [
            {
                "name": run.name,
                "path": str(run.path),
                "k": run.k,
                "judges": run.judges,
                "card_hash": run.card["hash"],
                "model": ((run.card.get("agent") or {}).get("model") or {}).get("identity"),
                "engine": (run.card.get("agent") or {}).get("engine"),
                "metrics": run.summary["metrics"],
                "breakdowns": run.summary.get("breakdowns") or {},
                "stop_reasons": run.summary.get("stop_reasons") or {},
            }
            for run in runs
        ],
        "deltas": deltas,
        "questions": questions,
    }


# --- presentation ---------------------------------------------------------------------------------------


def _k(runs: Sequence[dict[str, Any]]) -> str:
    """The runs' k as the @k headers say it: the number when they share it (as one protocol does), else "k" (each
    run's own is then in the "k" row)."""
    ks = {r["k"] for r in runs}
    return str(ks.pop()) if len(ks) == 1 else "k"


def score_rows(comparison: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Scores and behaviour side by side: one row per measure, one column per run (each at its own k)."""
    runs = comparison["runs"]
    k = _k(runs)
    head = ["measure", *(r["name"] for r in runs)]
    measures: list[tuple[str, Any]] = [(f"reward Avg@{k}", lambda r: r["metrics"].get(f"avg@{r['k']}/reward"))]
    for judge in dict.fromkeys(j for r in runs for j in r["judges"]):
        measures += [
            (f"{judge} Avg@{k}", lambda r, j=judge: r["metrics"].get(f"avg@{r['k']}/{j}")),
            (f"{judge} Pass@{k}", lambda r, j=judge: r["metrics"].get(f"pass@{r['k']}/{j}")),
            (
                f"{judge} judge failures",
                lambda r, j=judge: (
                    None if r["metrics"].get(f"failures/{j}") is None else int(r["metrics"][f"failures/{j}"])
                ),
            ),
        ]
    for key in ("answered", "turns", "searches", "accesses", "generated_tokens"):
        measures.append((key.replace("_", " "), lambda r, key=key: r["metrics"].get(key)))
    for key in ("tasks", "samples"):
        measures.append((key, lambda r, key=key: int(r["metrics"][key]) if key in r["metrics"] else None))
    measures.append(("k", lambda r: r["k"]))
    return head, [[label, *(_fmt(get(r)) for r in runs)] for label, get in measures]


def breakdown_rows(comparison: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """Per breakdown key every run has (hops, ...): each group's primary Avg@k and sample count per run."""
    runs = comparison["runs"]
    keys = [k for k in runs[0]["breakdowns"] if all(k in r["breakdowns"] for r in runs)]
    judge = comparison["metrics"][1] if len(comparison["metrics"]) > 1 else "reward"
    out = []
    for key in keys:
        groups = list(dict.fromkeys(g for r in runs for g in r["breakdowns"][key]))
        head = [key, *(f"{r['name']} {judge} Avg@{r['k']} (samples)" for r in runs)]
        rows = []
        for g in groups:
            cells = []
            for r in runs:
                m = r["breakdowns"][key].get(g)
                score = None if m is None else m.get(f"avg@{r['k']}/{judge}")
                cells.append("–" if m is None else f"{_fmt(score)} ({int(m['samples'])})")
            rows.append([g, *cells])
        out.append((key, head, rows))
    return out


def delta_rows(comparison: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The paired deltas with their intervals."""
    head = [
        "run",
        "vs",
        "score",
        "questions",
        "baseline",
        "run's",
        "mean delta",
        "95% interval",
        "significant",
        "better / worse",
    ]
    rows = [
        [
            d["run"],
            d["baseline"],
            d["metric"],
            str(d["tasks"]),
            _fmt(d["before"]),
            _fmt(d["after"]),
            f"{d['gain']:+.3f}",
            f"{d['ci95_low']:+.3f} to {d['ci95_high']:+.3f}",
            "yes" if d["significant"] else "no",
            f"{d['tasks_better']} / {d['tasks_worse']}",
        ]
        for d in comparison["deltas"]
    ]
    return head, rows


def _differences_rows(diffs: dict[str, list[Any]], runs: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    return ["card field", *(r["name"] for r in runs)], [
        [field, *(json.dumps(v, default=str, ensure_ascii=False) for v in values)] for field, values in diffs.items()
    ]


def comparison_markdown(comparison: dict[str, Any]) -> str:
    """The comparison as markdown: a warning naming differing protocol fields first, then the tables."""
    runs = comparison["runs"]
    parts = []
    if comparison["protocol_differences"]:
        parts.append(
            "## WARNING: the protocols differ (compared with --allow-different)\n\nThese scores are not "
            "comparable as they stand; the score-relevant card fields that differ:\n\n"
            + _md_table(*_differences_rows(comparison["protocol_differences"], runs))
            + "\n"
        )
    parts.append(
        "## Runs\n\n"
        + _md_table(
            ["run", "path", "model", "card hash"],
            [[r["name"], r["path"], str(r["model"]), r["card_hash"][:16]] for r in runs],
        )
        + "\n"
    )
    parts.append("## Scores\n\n" + _md_table(*score_rows(comparison)) + "\n")
    for key, head, rows in breakdown_rows(comparison):
        parts.append(f"## By {key}\n\n" + _md_table(head, rows) + "\n")
    parts.append(
        f"## Paired deltas against {comparison['baseline']}\n\n"
        + _md_table(*delta_rows(comparison))
        + f"\n\nPer-question means paired by question; 95% percentile-bootstrap interval over questions "
        f"({comparison['resamples']} resamples, seed {comparison['seed']}).\n"
    )
    return "\n".join(parts)


# Text reads from the left: the card fields' values (JSON, wrapped anywhere) and the questions; numbers stay right.
COMPARE_CSS = """.warning{border:3px solid #b00;padding:0 1em;background:#fee}
table.differences td,table.other-differences td,table.differences th,table.other-differences th{text-align:left}
table.differences td,table.other-differences td{font-family:monospace;font-size:.9em}
table.differences td+td,table.other-differences td+td,table.questions td:nth-child(2){overflow-wrap:anywhere}
table.questions td:nth-child(2),table.questions th:nth-child(2){text-align:left}"""


def comparison_html(comparison: dict[str, Any]) -> str:
    """compare.html: self-contained, every value escaped, no script."""
    runs = comparison["runs"]
    parts = []
    if comparison["protocol_differences"]:
        parts.append(
            '<section id="protocol-differences" class="warning"><h2>The protocols differ</h2><p>Compared with '
            "<code>--allow-different</code>: these scores are not comparable as they stand. Score-relevant card "
            "fields that differ:</p>"
            + html_table(*_differences_rows(comparison["protocol_differences"], runs), "differences")
            + "</section>"
        )
    parts.append(
        "<h2>Runs</h2>"
        + html_table(
            ["run", "path", "engine", "model", "card hash"],
            [[r["name"], r["path"], str(r["engine"]), str(r["model"]), r["card_hash"]] for r in runs],
            "runs",
        )
    )
    if comparison["other_differences"]:
        parts.append(
            "<h3>Other differences (not score-relevant)</h3>"
            + html_table(*_differences_rows(comparison["other_differences"], runs), "other-differences")
        )
    parts.append("<h2>Scores</h2>" + html_table(*score_rows(comparison), "scores"))
    for key, head, rows in breakdown_rows(comparison):
        parts.append(f"<h2>By {_e(key)}</h2>" + html_table(head, rows, f"breakdown breakdown-{key}"))
    parts.append(
        f"<h2>Paired deltas against {_e(comparison['baseline'])}</h2>"
        + html_table(*delta_rows(comparison), "deltas")
        + f"<p>Per-question means paired by question; 95% percentile-bootstrap interval over questions "
        f"({_e(comparison['resamples'])} resamples, seed {_e(comparison['seed'])}).</p>"
    )
    for block in comparison["questions"]:
        listed = block["questions"][:MAX_QUESTIONS_LISTED]
        parts.append(
            f"<h3>{_e(block['run'])}: questions that moved most ({_e(block['metric'])})</h3>"
            + html_table(
                ["question id", "question", comparison["baseline"], block["run"], "delta"],
                [
                    [q["task_id"], q["question"], _fmt(q["before"]), _fmt(q["after"]), f"{q['delta']:+.3f}"]
                    for q in listed
                ],
                "questions",
            )
        )
    title = "searchgym eval compare: " + " vs ".join(r["name"] for r in runs)
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<style>{CSS}{COMPARE_CSS}</style></head>"
        f"<body><h1>{_e(title)}</h1>{''.join(parts)}</body></html>"
    )


def write_comparison(comparison: dict[str, Any], out: str | os.PathLike) -> Path:
    """compare.json, compare.md and compare.html into `out`; returns the HTML's path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(_finite(comparison), indent=2, default=str) + "\n")
    (out / "compare.md").write_text(comparison_markdown(comparison))
    page = out / "compare.html"
    page.write_text(comparison_html(comparison), encoding="utf-8")
    return page
