"""The viewer's charts, drawn by matplotlib as SVG: what people would rather look at than read.

    CHARTS["turns"](run)   # turns per episode, one bar series per outcome
    CHARTS["hops"](run)    # tool calls per episode against the question's hops (mean and 95% interval)
    CHARTS["steps"](run)   # a training run: reward and tool calls per step, from metrics.jsonl

Each returns SVG bytes, or raises NoChart saying why the run has nothing to draw.
"""

from __future__ import annotations

import io
import math
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from searchgym.core.extras import needs
from searchgym.view.runs import OUTCOMES, Run

COLOURS = {"correct": "#2e7d32", "wrong": "#c62828", "unanswered": "#9e9e9e", "failed": "#ef6c00"}


class NoChart(Exception):
    """The run has nothing this chart draws (no episodes, no hop counts, no metrics)."""


def _figure() -> tuple[Any, Any]:
    """A figure of its own (no pyplot state, so the server's threads can draw at once) and its axes."""
    with needs("the viewer's charts"):
        from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.0), dpi=100)
    return fig, fig.subplots()


def _svg(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight")
    return buffer.getvalue()


def turns_by_outcome(run: Run, judge: str = "") -> bytes:
    """How many episodes took each number of turns, one bar series per outcome (by `judge`, else the first)."""
    index = run.index()
    if not index.episodes:
        raise NoChart("no episodes")
    judge = judge or (index.judges[0] if index.judges else "")
    counts = {o: Counter(e.turns for e in index.episodes if e.outcome(judge) == o) for o in OUTCOMES}
    shown = [o for o in OUTCOMES if counts[o]]
    turns = sorted({t for c in counts.values() for t in c})
    fig, ax = _figure()
    width = 0.8 / len(shown)
    for i, outcome in enumerate(shown):
        xs = [t + (i - (len(shown) - 1) / 2) * width for t in turns]
        ax.bar(xs, [counts[outcome][t] for t in turns], width, label=outcome, color=COLOURS[outcome])
    ax.set_xlabel("turns in the episode")
    ax.set_ylabel("episodes")
    ax.set_title(f"Turns per episode by outcome ({judge or 'reward'})", fontsize=10)
    ax.set_xticks(turns)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _svg(fig)


def calls_by_hops(run: Run) -> bytes:
    """Tool calls per episode against the hops its question needs: mean and normal 95% interval per hop count."""
    by_hops: dict[int, list[int]] = defaultdict(list)
    for episode in run.index().episodes:
        if episode.hops is not None:
            by_hops[episode.hops].append(episode.tool_calls)
    if not by_hops:
        raise NoChart("no episode names its question's hops")
    hops = sorted(by_hops)
    means, halves = [], []
    for h in hops:
        values = by_hops[h]
        mean = sum(values) / len(values)
        var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
        means.append(mean)
        halves.append(1.96 * math.sqrt(var / len(values)))
    fig, ax = _figure()
    ax.errorbar(hops, means, yerr=halves, marker="o", capsize=4, label="mean, 95% interval")
    ax.plot(hops, hops, linestyle=":", color="#757575", label="one call per hop")
    ax.set_xlabel("hops the question needs")
    ax.set_ylabel("tool calls per episode")
    ax.set_xticks(hops)
    ax.set_ylim(bottom=0)
    ax.set_title("Tool calls against hops", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _svg(fig)


def per_step(run: Run) -> bytes:
    """A training run's mean reward and tool calls per episode at each step (metrics.jsonl)."""
    rows = [r for r in run.metrics() if isinstance(r.get("step"), int)]
    if not rows:
        raise NoChart("no metrics.jsonl rows with a step")

    def series(row: dict[str, Any], *names: str) -> float | None:
        values = [row.get(n) for n in names]
        if any(not isinstance(v, (int, float)) for v in values):
            return None
        return float(sum(values))  # type: ignore[arg-type]

    steps = [r["step"] for r in rows]
    reward = [series(r, "episode/reward") if "episode/reward" in r else series(r, "reward_mean") for r in rows]
    tools = [series(r, "episode/searches", "episode/accesses") for r in rows]
    fig, ax = _figure()
    ax.plot(steps, [math.nan if v is None else v for v in reward], color="#1565c0", label="reward")
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward", color="#1565c0")
    lines, labels = ax.get_legend_handles_labels()
    if any(v is not None for v in tools):
        right = ax.twinx()
        right.plot(steps, [math.nan if v is None else v for v in tools], color="#6a1b9a", label="tool calls")
        right.set_ylabel("tool calls per episode", color="#6a1b9a")
        more = right.get_legend_handles_labels()
        lines, labels = lines + more[0], labels + more[1]
    ax.set_title("Reward and tool calls per step", fontsize=10)
    ax.legend(lines, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.12, 1.0), borderaxespad=0)
    return _svg(fig)


CHARTS: dict[str, Callable[[Run], bytes]] = {
    "turns": turns_by_outcome,
    "hops": calls_by_hops,
    "steps": per_step,
}


def charts_for(run: Run) -> list[str]:
    """The charts that fit the run's kind (a training run has steps; hops only where questions carry them)."""
    names = ["turns"]
    if any(e.hops is not None for e in run.index().episodes):
        names.append("hops")
    if run.kind == "train":
        names.append("steps")
    return names
