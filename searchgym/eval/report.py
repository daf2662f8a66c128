"""Evaluation outputs: summary.md, PNG plots and a self-contained report.html (all text escaped).

The report opens with the run's protocol card (what a score depends on) and the agreement between
its judges, then scores, behaviour, per-subset breakdowns (hops, ...), plots, and a trajectory viewer
that filters (correct / wrong / judges disagree / judge failed / no answer, stop reason, turns) and
sorts. The filter state lives in the URL fragment (`report.html#outcome=disagree&sort=turns-desc`), so a
filtered view can be linked. The page's one script is the constant `SCRIPT`; every piece of run data
is escaped text or an escaped attribute, never markup or code.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from searchgym.core.extras import needs
from searchgym.eval.agreement import calls, judge_agreement
from searchgym.eval.card import flatten

MAX_REPORT_CHARS = 4000  # per action / observation in the HTML viewer (samples.jsonl keeps everything)


def _fmt(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return "–" if math.isnan(x) else f"{x:.3f}"
    return str(x)


def _value(x: Any) -> str:
    """A card value as one line of text."""
    if isinstance(x, str):
        return x
    if x is None or isinstance(x, (bool, int, float)):
        return json.dumps(x)  # exact: a card shows 0.7, not 0.700
    return json.dumps(x, ensure_ascii=False, sort_keys=True)


def headline_judge(summary: dict[str, Any]) -> str:
    """The judge a run is quoted by, which the plots and the per-turn table draw: the env's reward judge when the run
    judged with it (the quickstart's F1), else the first judge."""
    reward = ((summary.get("card") or {}).get("protocol") or {}).get("reward_judge")
    return str(reward if reward in summary["judges"] else summary["judges"][0])


def headline(summary: dict[str, Any]) -> str:
    """One sentence with the run's headline figure, naming its judge and k: "f1 Avg@4: 0.736 over 128 questions"."""
    k, judge, m = summary["k"], headline_judge(summary), summary["metrics"]
    reward = ((summary.get("card") or {}).get("protocol") or {}).get("reward_judge")
    return (
        f"{judge} Avg@{k}: {_fmt(m.get(f'avg@{k}/{judge}', float('nan')))}, Pass@{k}: "
        f"{_fmt(m.get(f'pass@{k}/{judge}', float('nan')))} over {int(m['tasks'])} questions"
        + (" (the env's reward judge)" if judge == reward else "")
    )


def tables(summary: dict[str, Any]) -> tuple[list[str], list[list[str]], list[str], list[str]]:
    """(score header, score rows, behaviour header, behaviour row) of a summary."""
    k, m = summary["k"], summary["metrics"]
    head = ["judge", f"Avg@{k}", f"Avg@{k} correct", f"Pass@{k}", "judge failures"]
    rows = [
        [
            j,
            _fmt(m.get(f"avg@{k}/{j}", float("nan"))),
            _fmt(m.get(f"avg@{k}/{j}_correct", float("nan"))),
            _fmt(m.get(f"pass@{k}/{j}", float("nan"))),
            str(int(m.get(f"failures/{j}") or 0)),
        ]
        for j in summary["judges"]
    ]
    bhead = ["questions", "samples", "answered", "turns", "searches", "accesses", "generated tokens"]
    brow = [
        str(int(m["tasks"])),
        str(int(m["samples"])),
        _fmt(m["answered"]),
        _fmt(m["turns"]),
        _fmt(m["searches"]),
        _fmt(m["accesses"]),
        _fmt(m["generated_tokens"]),
    ]
    return head, rows, bhead, brow


def card_rows(card: dict[str, Any], parts: Sequence[str] = ("protocol", "agent", "run")) -> list[list[str]]:
    """The card as (field, value) rows: the hash, the score-relevant protocol, then agent and run fields."""
    rows = [["card hash", card.get("hash", "–")]] if "protocol" in parts else []
    for part in parts:
        rows += [[key, _value(value)] for key, value in flatten(card.get(part) or {}, part).items()]
    return rows


def breakdown_tables(summary: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(key, header, rows) per breakdown: questions, samples, each judge's Avg@k and Pass@k, turns, per group."""
    k, judges = summary["k"], summary["judges"]
    out = []
    for key, groups in (summary.get("breakdowns") or {}).items():
        head = [
            key,
            "questions",
            "samples",
            *(f"{j} Avg@{k}" for j in judges),
            *(f"{j} Pass@{k}" for j in judges),
            "turns",
            "searches",
        ]
        rows = [
            [
                group,
                str(int(m["tasks"])),
                str(int(m["samples"])),
                *(_fmt(m.get(f"avg@{k}/{j}")) for j in judges),
                *(_fmt(m.get(f"pass@{k}/{j}")) for j in judges),
                _fmt(m["turns"]),
                _fmt(m["searches"]),
            ]
            for group, m in groups.items()
        ]
        out.append((key, head, rows))
    return out


def by_turns(rows: Sequence[dict[str, Any]], primary: str) -> list[tuple[int, list[float]]]:
    """The primary judge's scores grouped by the episode's number of turns, fewest turns first."""
    groups: dict[int, list[float]] = {}
    for r in rows:
        groups.setdefault(int(r["stats"]["turns"]), []).append(
            float(r["verdicts"].get(primary, {}).get("score", 0.0) or 0.0)
        )
    return sorted(groups.items())


def turns_table(rows: Sequence[dict[str, Any]], primary: str) -> tuple[list[str], list[list[str]]]:
    """Samples and mean primary score per number of turns (what the turns plot draws)."""
    return (
        ["turns", "samples", f"mean {primary}"],
        [[str(t), str(len(g)), _fmt(sum(g) / len(g))] for t, g in by_turns(rows, primary)],
    )


def agreement_table(agreement: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Pairwise judge agreement as a table."""
    head = ["judge", "judge", "answered samples judged by both", "agreement", "Cohen's kappa"]
    return head, [[p["a"], p["b"], str(p["n"]), _fmt(p["agreement"]), _fmt(p["kappa"])] for p in agreement["pairs"]]


def labels_table(labels: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Each judge's accuracy against the human labels."""
    head = ["judge", "labelled samples", "accuracy vs humans", "Cohen's kappa vs humans"]
    return head, [[name, str(r["n"]), _fmt(r["accuracy"]), _fmt(r["kappa"])] for name, r in labels["raters"].items()]


def _md_table(h: list[str], rs: list[list[str]]) -> str:
    def cell(c: str) -> str:
        return str(c).replace("|", "\\|").replace("\n", " ")

    return "\n".join(
        [
            "| " + " | ".join(map(cell, h)) + " |",
            "|" + "|".join("---" for _ in h) + "|",
            *("| " + " | ".join(map(cell, r)) + " |" for r in rs),
        ]
    )


def markdown(summary: dict[str, Any]) -> str:
    """summary.md: the protocol card first, then scores, behaviour, breakdowns and judge agreement."""
    head, rows, bhead, brow = tables(summary)
    parts = [f"`{summary['env_id']}` with `{summary['engine']}`, k = {summary['k']}\n", f"**{headline(summary)}**\n"]
    card = summary.get("card")
    if card:
        parts.append("## Protocol card\n\n" + _md_table(["field", "value"], card_rows(card)) + "\n")
    parts.append("## Scores\n\n" + _md_table(head, rows) + "\n\n" + _md_table(bhead, [brow]) + "\n")
    pending = pending_failures(summary)
    if pending:
        parts.append("## Incomplete\n\n" + pending + "\n")
    for key, h, rs in breakdown_tables(summary):
        parts.append(f"## By {key}\n\n" + _md_table(h, rs) + "\n")
    agreement = summary.get("agreement")
    if agreement and agreement["pairs"]:
        parts.append(
            "## Judge agreement\n\n"
            + _md_table(*agreement_table(agreement))
            + f"\n\n{agreement['disagreements']} of {agreement['answered']} answered samples split the judges.\n"
        )
    if summary.get("labels"):
        parts.append("## Judges against human labels\n\n" + _md_table(*labels_table(summary["labels"])) + "\n")
    return "\n".join(parts)


def pending_failures(summary: dict[str, Any]) -> str:
    """One sentence on the samples a dependency failed (not scored, completed by a rerun), or "" when none."""
    failed = summary.get("failed_calls") or {}
    parts = []
    agent = (failed.get("agent") or {}).get("pending", 0)
    if agent:
        parts.append(f"{agent} samples whose agent failed are not stored")
    for name, counts in (failed.get("judges") or {}).items():
        if counts.get("pending"):
            parts.append(f"{counts['pending']} verdicts of judge `{name}` failed (left out of its scores)")
    return "; ".join(parts) + ". Rerun the same command to complete them." if parts else ""


# --- plots -----------------------------------------------------------------------------------------------


def _bar_means(ax: Any, labels: list[str], groups: list[list[float]], ylabel: str, title: str) -> None:
    """Mean per group with a 95% interval and the group's sample count written on each bar."""
    import numpy as np

    means = [float(np.mean(g)) for g in groups]
    half = [1.96 * float(np.std(g, ddof=1)) / math.sqrt(len(g)) if len(g) > 1 else 0.0 for g in groups]
    x = np.arange(len(labels))
    ax.bar(x, means, yerr=half, capsize=4, color="C0", alpha=0.85)
    for xi, m, h, g in zip(x, means, half, groups, strict=True):
        ax.annotate(
            f"n={len(g)}", (xi, min(1.0, m + h)), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8
        )
    ax.set_xticks(x, labels)
    ax.set_ylim(0, 1.12)
    ax.set_ylabel(ylabel)
    ax.set_title(title)


def plots(
    out: Path, rows: Sequence[dict[str, Any]], primary: str, breakdowns: dict[str, Any] | None = None
) -> dict[str, Path]:
    """score_vs_turns.png (mean score per turn count, with counts), turns_searches.png, score_by_KEY.png."""
    with needs("the eval plots"):
        import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    turns = [r["stats"]["turns"] for r in rows]
    searches = np.array([r["stats"]["searches"] for r in rows])
    scores = [float(r["verdicts"].get(primary, {}).get("score", 0.0) or 0.0) for r in rows]
    paths = {}
    groups = by_turns(rows, primary)
    fig, ax = plt.subplots(figsize=(max(4.5, 0.6 * len(groups) + 2), 3.5))
    _bar_means(
        ax,
        [str(t) for t, _ in groups],
        [g for _, g in groups],
        f"mean score ({primary})",
        f"{primary} by number of turns (bars: 95% interval)",
    )
    ax.set_xlabel("turns")
    fig.tight_layout()
    paths["score_vs_turns"] = out / "score_vs_turns.png"
    fig.savefig(paths["score_vs_turns"], dpi=100)
    plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    for ax, values, name in ((axes[0], np.array(turns), "turns"), (axes[1], searches, "searches")):
        ax.hist(values, bins=np.arange(values.min(), values.max() + 2) - 0.5, color="C0")
        ax.set_xlabel(name)
        ax.set_ylabel("samples")
        ax.set_title(f"distribution of {name}")
    fig.tight_layout()
    paths["turns_searches"] = out / "turns_searches.png"
    fig.savefig(paths["turns_searches"], dpi=100)
    plt.close(fig)
    for key, by_value in (breakdowns or {}).items():
        subset = [(r.get("subset") or {}).get(key) for r in rows]
        names = list(by_value)
        in_group = [
            [s for s, v in zip(scores, subset, strict=True) if v is not None and str(v) == name] for name in names
        ]
        fig, ax = plt.subplots(figsize=(max(4.5, 0.8 * len(names) + 2), 3.5))
        _bar_means(ax, names, in_group, f"mean score ({primary})", f"{primary} by {key}")
        ax.set_xlabel(key)
        fig.tight_layout()
        paths[f"score_by_{key}"] = out / f"score_by_{key}.png"
        fig.savefig(paths[f"score_by_{key}"], dpi=100)
        plt.close(fig)
    return paths


# --- HTML --------------------------------------------------------------------------------------------------


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _clip(text: str) -> str:
    text = str(text)
    return (
        text
        if len(text) <= MAX_REPORT_CHARS
        else text[:MAX_REPORT_CHARS] + f"\n… [{len(text) - MAX_REPORT_CHARS} more characters]"
    )


def html_table(head: list[str], rows: list[list[str]], cls: str) -> str:
    """An escaped HTML table."""
    return (
        f'<table class="{_e(cls)}"><thead><tr>'
        + "".join(f"<th>{_e(h)}</th>" for h in head)
        + "</tr></thead><tbody>"
        + "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
        + "</tbody></table>"
    )


_html_table = html_table  # the name older callers use


def outcome(row: dict[str, Any], primary: str) -> str:
    """ "correct", "wrong", "failed" (the primary judge gave no verdict) or "unanswered"."""
    v = row["verdicts"].get(primary, {})
    if row.get("prediction") is None:
        return "unanswered"
    return "failed" if v.get("error") else ("correct" if v.get("correct") else "wrong")


def _disagree(row: dict[str, Any]) -> bool:
    given = {c for c in calls(row).values() if c is not None}
    return row.get("prediction") is not None and len(given) > 1


def _sample_html(row: dict[str, Any], primary: str) -> str:
    mark = outcome(row, primary)
    score = float(row["verdicts"].get(primary, {}).get("score", 0.0) or 0.0)
    turns = row["trajectory"].get("turns", [])
    disagree = _disagree(row)
    stop = row["stats"]["stop_reason"]
    failed = any(v.get("error") for v in row["verdicts"].values())
    attrs = (
        f'data-outcome="{_e(mark)}" data-disagree="{int(disagree)}" data-failed="{int(failed)}" '
        f'data-turns="{len(turns)}" data-stop="{_e(stop)}" data-score="{score:.6f}"'
    )
    parts = [
        f'<details class="sample {_e(mark)}" {attrs}><summary>sample {_e(row["sample"])}: {_e(mark)}'
        + (" · judges disagree" if disagree else "")
        + f" · {_e(len(turns))} turns · prediction: "
        f"<code>{_e(_clip(row['prediction']) if row['prediction'] is not None else '(none)')}</code>"
        f'</summary><p class="verdicts">'
        + " · ".join(
            f"{_e(n)}: {_e(_fmt(float(x.get('score', 0))))}"
            + (f" (failed: {_e(x['error'])})" if x.get("error") else "")
            for n, x in row["verdicts"].items()
        )
        + f" · stop: {_e(stop)}</p>"
    ]
    messages = row["trajectory"].get("messages", [])
    if messages:
        parts.append(
            f'<details class="prompt"><summary>prompt</summary><pre>{_e(_clip(messages[0]["content"]))}</pre></details>'
        )
    for i, t in enumerate(turns, 1):
        parts.append(
            f'<details class="turn"><summary>turn {i}: {_e(t.get("tool", ""))}</summary>'
            f'<div class="action"><b>agent</b><pre>{_e(_clip(t.get("action", "")))}</pre></div>'
            f'<div class="observation"><b>environment</b><pre>{_e(_clip(t.get("observation", "")))}'
            f"</pre></div></details>"
        )
    parts.append("</details>")
    return "".join(parts)


def _question_html(task_id: str, group: list[dict[str, Any]], primary: str) -> str:
    scores = [float(r["verdicts"].get(primary, {}).get("score", 0.0) or 0.0) for r in group]
    solved = sum(outcome(r, primary) == "correct" for r in group)
    attrs = (
        f'data-id="{_e(task_id)}" data-score="{sum(scores) / len(scores):.6f}" '
        f'data-turns="{sum(len(r["trajectory"].get("turns", [])) for r in group) / len(group):.6f}" '
        f'data-disagree="{sum(_disagree(r) for r in group)}"'
    )
    return (
        f'<details class="question" id="q-{_e(task_id)}" {attrs}>'
        f"<summary>{_e(task_id)} ({solved}/{len(group)} correct): "
        f"{_e(_clip(group[0]['question']))}</summary><p>answers: {_e(' | '.join(group[0]['answers']))}</p>"
        + "".join(_sample_html(r, primary) for r in group)
        + "</details>"
    )


def _filters_html(stops: list[str]) -> str:
    outcomes = [
        ("all", "all samples"),
        ("correct", "correct"),
        ("wrong", "wrong"),
        ("disagree", "judges disagree"),
        ("failed", "a judge failed"),
        ("unanswered", "no answer"),
    ]
    sorts = [
        ("id", "question id"),
        ("score-asc", "score, lowest first"),
        ("score-desc", "score, highest first"),
        ("turns-asc", "turns, fewest first"),
        ("turns-desc", "turns, most first"),
        ("disagree-desc", "judge disagreements first"),
    ]

    def select(name: str, options: list[tuple[str, str]]) -> str:
        return (
            f'<select id="f-{name}" name="{name}">'
            + "".join(f'<option value="{_e(v)}">{_e(t)}</option>' for v, t in options)
            + "</select>"
        )

    return (
        '<form id="filters">'
        f"<label>show {select('outcome', outcomes)}</label> "
        f"<label>stop reason {select('stop', [('all', 'any'), *((s, s) for s in stops)])}</label> "
        '<label>turns from <input id="f-min_turns" name="min_turns" type="number" min="0" size="4"></label> '
        '<label>to <input id="f-max_turns" name="max_turns" type="number" min="0" size="4"></label> '
        f"<label>sort by {select('sort', sorts)}</label> "
        '<output id="shown"></output></form>'
    )


# The report's only script: filters and sorts the viewer from the controls (mirrored in the URL fragment).
SCRIPT = """(function () {
  var form = document.getElementById("filters"), list = document.getElementById("trajectories");
  if (!form || !list) return;
  var names = ["outcome", "stop", "min_turns", "max_turns", "sort"];
  function control(n) { return document.getElementById("f-" + n); }
  function fromHash() {
    var params = new URLSearchParams(location.hash.replace(/^#/, ""));
    names.forEach(function (n) { if (params.has(n)) control(n).value = params.get(n); });
  }
  function toHash() {
    var params = new URLSearchParams();
    names.forEach(function (n) {
      var v = control(n).value;
      if (v !== "" && v !== "all" && !(n === "sort" && v === "id")) params.set(n, v);
    });
    var hash = params.toString();
    history.replaceState(null, "", hash ? "#" + hash : location.pathname + location.search);
  }
  function keep(s) {
    var o = control("outcome").value, stop = control("stop").value, turns = Number(s.dataset.turns);
    var lo = control("min_turns").value, hi = control("max_turns").value;
    if (o === "disagree" && s.dataset.disagree !== "1") return false;
    if (o === "failed" && s.dataset.failed !== "1") return false;
    if (["correct", "wrong", "unanswered"].indexOf(o) >= 0 && s.dataset.outcome !== o) return false;
    if (stop !== "all" && s.dataset.stop !== stop) return false;
    if (lo !== "" && turns < Number(lo)) return false;
    if (hi !== "" && turns > Number(hi)) return false;
    return true;
  }
  function apply() {
    var questions = Array.prototype.slice.call(list.children), shown = 0, total = 0, qshown = 0;
    questions.forEach(function (q) {
      var visible = 0;
      q.querySelectorAll("details.sample").forEach(function (s) {
        var k = keep(s);
        s.hidden = !k;
        visible += k ? 1 : 0;
        total += 1;
      });
      q.hidden = visible === 0;
      shown += visible;
      qshown += visible ? 1 : 0;
    });
    var by = control("sort").value.split("-"), key = by[0], sign = by[1] === "desc" ? -1 : 1;
    questions.sort(function (a, b) {
      if (key === "id") return a.dataset.id < b.dataset.id ? -1 : a.dataset.id > b.dataset.id ? 1 : 0;
      var d = sign * (Number(a.dataset[key]) - Number(b.dataset[key]));
      return d !== 0 ? d : (a.dataset.id < b.dataset.id ? -1 : 1);
    });
    questions.forEach(function (q) { list.appendChild(q); });
    document.getElementById("shown").textContent =
      shown + " of " + total + " samples shown, in " + qshown + " of " + questions.length + " questions";
    list.dataset.shown = String(shown);
  }
  fromHash();
  apply();
  form.addEventListener("submit", function (e) { e.preventDefault(); });
  form.addEventListener("change", function () { apply(); toHash(); });
  form.addEventListener("input", function () { apply(); toHash(); });
  window.addEventListener("hashchange", function () { fromHash(); apply(); });
})();"""


# Nothing runs off the page at 800 px and up: a long unbroken value (a hash, a path, JSON) may wrap anywhere, so no
# table, code or pre is ever wider than the page (tests/eval/test_report.py and test_compare.py measure it in Chromium).
CSS = """body{font-family:sans-serif;margin:2em;max-width:75em}table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #bbb;padding:.3em .6em;text-align:right}td:first-child,th:first-child{text-align:left}
pre,code,summary,p{overflow-wrap:anywhere}@media (max-width:900px){body{margin:1em}td,th{padding:.2em .4em}}
table.card td,table.runs td{text-align:left;font-family:monospace;font-size:.9em;word-break:break-all}
#card{border:2px solid #446;padding:.2em 1em;background:#f7f8fc}#filters{margin:1em 0;padding:.5em;background:#eee}
#filters label{margin-right:1em}pre{white-space:pre-wrap;background:#f6f6f6;padding:.5em;margin:.2em 0}
details{margin:.3em 0 .3em 1em}.correct>summary{color:#070}.wrong>summary{color:#a00}.failed>summary{color:#a60}
.unanswered>summary{color:#666}img{max-width:100%}[hidden]{display:none!important}"""


def card_html(summary: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    """The card section: the protocol (hash first), agent and run fields, judge agreement and human labels."""
    parts = ['<section id="card"><h2>Protocol card</h2>']
    card = summary.get("card")
    if card:
        parts.append(
            "<p>The card hash is a sha256 over the <b>protocol</b> fields: runs compare safely only when "
            "their hashes are equal (<code>searchgym eval compare</code> refuses others).</p>"
            + html_table(["field", "value"], card_rows(card, ("protocol",)), "card")
            + "<details><summary>what was evaluated, and how (agent and run fields)</summary>"
            + html_table(["field", "value"], card_rows(card, ("agent", "run")), "card card-agent")
            + "</details>"
        )
    else:
        parts.append("<p>This run has no protocol card (it was summarised without one).</p>")
    agreement = summary.get("agreement") or judge_agreement(rows, summary["judges"])
    if agreement["pairs"]:
        parts.append(
            "<h3>Judge agreement</h3>"
            + html_table(*agreement_table(agreement), "agreement")
            + f"<p>{_e(agreement['disagreements'])} of {_e(agreement['answered'])} answered samples split the "
            'judges (filter the trajectories by "judges disagree").</p>'
        )
    if summary.get("labels"):
        lab = summary["labels"]
        parts.append(
            "<h3>Judges against human labels</h3>"
            + html_table(*labels_table(lab), "labels")
            + f"<p>{_e(lab['matched_labels'])} of {_e(lab['labels'])} labels matched a stored sample.</p>"
        )
    return "".join(parts) + "</section>"


def html_report(summary: dict[str, Any], rows: Sequence[dict[str, Any]], images: dict[str, bytes]) -> str:
    """The self-contained report page of one run."""
    head, trows, bhead, brow = tables(summary)
    primary, plotted = summary["judges"][0], headline_judge(summary)
    by_task: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: (str(r["task_id"]), r["sample"])):
        by_task.setdefault(str(r["task_id"]), []).append(r)
    questions = "".join(_question_html(task_id, group, primary) for task_id, group in by_task.items())
    stops = sorted({r["stats"]["stop_reason"] for r in rows})
    breakdowns = "".join(
        f"<h3>By {_e(key)}</h3>" + html_table(h, rs, f"breakdown breakdown-{key}")
        for key, h, rs in breakdown_tables(summary)
    )
    breakdowns += "<h3>By number of turns</h3>" + html_table(*turns_table(rows, plotted), "by-turns") if rows else ""
    imgs = "".join(
        f'<figure><img alt="{_e(name)}" src="data:image/png;base64,{base64.b64encode(data).decode()}"></figure>'
        for name, data in images.items()
    )
    title = f"searchgym eval: {summary['env_id']}"
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{_e(title)}</title><style>{CSS}</style></head>'
        f"<body><h1>{_e(title)}</h1><p>engine <code>{_e(summary['engine'])}</code>, k = {_e(summary['k'])}</p>"
        f'<p id="headline"><b>{_e(headline(summary))}</b></p>'
        + card_html(summary, rows)
        + f"<h2>Scores</h2>{html_table(head, trows, 'scores')}"
        f"<h2>Behaviour</h2>{html_table(bhead, [brow], 'behaviour')}"
        + f"<h2>Breakdowns</h2>{breakdowns}"
        + f"<h2>Plots</h2>{imgs}<h2>Trajectories</h2>{_filters_html(stops)}"
        f'<div id="trajectories">{questions}</div><script>{SCRIPT}</script></body></html>'
    )


def write_report(out: str | Path, summary: dict[str, Any], rows: Sequence[dict[str, Any]]) -> None:
    """summary.md, the PNG plots and report.html into `out`."""
    out = Path(out)
    (out / "summary.md").write_text(markdown(summary))
    paths = plots(out, rows, headline_judge(summary), summary.get("breakdowns")) if rows else {}
    (out / "report.html").write_text(
        html_report(summary, rows, {n: p.read_bytes() for n, p in paths.items()}), encoding="utf-8"
    )
