"""`searchgym bench reproduce CLAIM --status`: where a claim's (seed, arm) units stand, read without writing anything.

A claim on a real model is dozens of units of half an hour, run a few per session, so before starting one a user wants
to know what is done (its row is in the unit log), what was cut mid-RL and will resume (its RL folder holds a
checkpoint), and what is left, with the time the finished units took as the estimate of the rest.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from searchgym.trainers.run.checkpoint import checkpoint_step, latest_checkpoint

DONE, CUT, TODO = "done", "cut", "to run"


def unit_status(
    root: Path,
    results: Path,
    keys: Mapping[str, str],
    seeds: list[int],
    warm: str,
    warm_on_disk: Collection[int] = (),
) -> list[dict[str, Any]]:
    """One entry per (seed, arm) of `keys` (arm -> the fingerprint its rows carry; `warm` is the warm start's, which
    has no RL): its state (done, cut after a checkpoint, or to run), the seconds a finished one took (RL and
    evaluation; a warm unit's SFT apart, as `sft_seconds`), the step a cut one resumes after, and for a warm unit
    whether its seed's SFT model is on disk (`warm_on_disk` seeds: a fresh checkout has none, and retrains one per
    seed it goes on with). Rows come from ROOT/arms.jsonl and RESULTS' .arms.jsonl copy."""
    rows: dict[tuple[int, str], dict[str, Any]] = {}
    for path in (root / "arms.jsonl", results.with_suffix(".arms.jsonl")):
        for row in _rows(path):
            if keys.get(row["arm"]) == row.get("fingerprint"):
                rows.setdefault((row["seed"], row["arm"]), row)
    units = []
    for seed in seeds:
        for arm in keys:
            unit: dict[str, Any] = {"seed": seed, "arm": arm, "rl": arm != warm}
            if arm == warm:
                unit["sft_on_disk"] = seed in warm_on_disk
            done = rows.get((seed, arm))
            if done is not None:
                laps = done.get("timings", {})
                unit.update(state=DONE, seconds=sum(laps.get(f"{k} {arm}", 0.0) for k in ("rl", "evaluate")))
                if arm == warm:
                    unit["sft_seconds"] = laps.get("warm start", 0.0)
            elif unit["rl"] and (step := _checkpoint_step(root / f"seed-{seed}" / f"rl-{arm}")) is not None:
                unit.update(state=CUT, after_step=step)
            else:
                unit.update(state=TODO)
            units.append(unit)
    return units


def format_status(claim: str, units: list[dict[str, Any]], running: str | None = None) -> str:
    """The units as lines, then the count of each state and the wall time left (`hours_left`), and the process
    running in the claim's folder now (`running`: "PID WHAT"), if any."""
    lines = []
    for u in units:
        if u["state"] == DONE:
            what = f"done ({u['seconds'] / 60:.0f} min)" if u["seconds"] else "done"
        elif u["state"] == CUT:
            what = f"cut: resumes after step {u['after_step']} if its config is unchanged"
        else:
            what = TODO
        lines.append(f"seed {u['seed']}, {u['arm']}: {what}")
    counts = {state: sum(u["state"] == state for u in units) for state in (DONE, CUT, TODO)}
    summary = f"{claim}: " + ", ".join(f"{n} {state}" for state, n in counts.items())
    if left := hours_left(units):
        summary += f"; about {left}"
    if running is not None:
        pid, _, what = running.partition(" ")
        summary += f"; a {what or 'run'} is at work in this folder now (pid {pid}): its unit shows as cut or to run"
    return "\n".join([*lines, summary])


def unit_means(units: list[dict[str, Any]]) -> dict[str, float | None]:
    """The finished units' mean seconds by kind: an RL arm with its evaluation ("rl"), a warm start's evaluation
    ("warm") and a warm start's SFT ("sft"); None for a kind none of them timed."""
    return {
        "rl": _mean(units, True, "seconds"),
        "warm": _mean(units, False, "seconds"),
        "sft": _mean(units, False, "sft_seconds"),
    }


@dataclass(frozen=True)
class Deadline:
    """Start a unit only if, at the finished units' mean time (`unit_means`), it ends by `at`. Where the run folder
    does not outlive the session (a fresh checkout, a preemptible job), a unit cut midway is work lost; a kind no
    finished unit times yet is taken to fit, there being nothing to judge it by."""

    at: datetime
    means: Mapping[str, float | None]

    def fits(self, *, rl: bool, sft: bool = False) -> bool:
        """Whether a unit (an RL arm, or a warm start's evaluation, with the seed's SFT first if `sft`) ends in time."""
        need = (self.means["rl" if rl else "warm"] or 0.0) + ((self.means["sft"] or 0.0) if sft else 0.0)
        return datetime.now(self.at.tzinfo) + timedelta(seconds=need) <= self.at


def parse_stop_by(text: str) -> datetime:
    """A `--stop-by` value: an ISO 8601 date and time (local time unless it names a zone)."""
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--stop-by takes an ISO date and time such as 2026-12-08T02:55, got {text!r}") from None


def hours_left(units: list[dict[str, Any]]) -> str | None:
    """The wall time the units left need, each part at the mean of the finished units of its kind: RL arms with
    their evaluation (a cut arm counted whole), warm starts' evaluations, and one SFT per seed with units left whose
    warm start is not on disk; a kind no finished unit times yet is counted, not timed. None: nothing timed is left."""
    left = [u for u in units if u["state"] != DONE]
    retrain = {u["seed"] for u in units if not u["rl"] and not u.get("sft_on_disk")} & {u["seed"] for u in left}
    means = unit_means(units)
    parts = {
        "RL arms with their evaluation": (sum(u["rl"] for u in left), means["rl"]),
        "warm-start evaluations": (sum(not u["rl"] for u in left), means["warm"]),
        "warm starts (SFT) to train again": (len(retrain), means["sft"]),
    }
    hours = {name: n * mean / 3600 for name, (n, mean) in parts.items() if n and mean is not None}
    if not hours:
        return None
    untimed = [f"{n} {name}" for name, (n, mean) in parts.items() if n and mean is None]
    text = f"{sum(hours.values()):.1f} h left: " + ", ".join(f"{h:.1f} h of {name}" for name, h in hours.items())
    return text + (f" (and {', '.join(untimed)}, not timed yet)" if untimed else "")


def _mean(units: list[dict[str, Any]], rl: bool, key: str) -> float | None:
    times = [u[key] for u in units if u["state"] == DONE and u["rl"] == rl and u.get(key, 0.0) > 1.0]  # else reused
    return sum(times) / len(times) if times else None


def _rows(path: Path) -> list[dict[str, Any]]:
    """A unit log's parseable rows (a damaged line is skipped here; the run itself sets it aside when it opens)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("seed"), int) and isinstance(row.get("arm"), str):
            rows.append(row)
    return rows


def _checkpoint_step(run: Path) -> int | None:
    """The step of the checkpoint a cut RL arm would resume from (None: no whole one)."""
    try:
        checkpoint = latest_checkpoint(run)
        return checkpoint_step(checkpoint) if checkpoint is not None else None
    except (OSError, ValueError):  # a damaged or slimmed pointer, a name that is no step: nothing to resume
        return None
