"""What a stored `samples.jsonl` row must hold for the summary to read it: every field the scores add up, typed.

A rerun reads the rows an earlier run (or a hand edit) left; a row whose reward is text, or whose verdict score is
`null`, would crash the summary's arithmetic (`int + str`) long after the file was opened. `check_row` refuses such
a row as `BadRow` when the file is opened, so `JsonlLog` sets it aside in `samples.damaged.jsonl`, reports its line,
and the sample is played again: the good rows replay, the bad ones are named.
"""

from __future__ import annotations

import math
from typing import Any

from searchgym.core.jsonl_log import BadRow

ROW_FIELDS = ("task_id", "sample", "reward", "verdicts", "stats")
STATS_FIELDS = ("turns", "searches", "accesses", "generated_tokens", "answered", "stop_reason")
COUNT_FIELDS = ("turns", "searches", "accesses", "generated_tokens")
RECALL_FIELDS = ("evidence_recall_retrieved", "evidence_recall_opened")


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def sample_key(row: dict[str, Any]) -> tuple[str, int]:
    """(task_id, sample) of a stored row; KeyError/TypeError/ValueError for a row that has none."""
    return str(row["task_id"]), int(row["sample"])


def _field(name: str, value: Any, want: str) -> BadRow:
    return BadRow(f"field {name!r} is {str(value)[:60]!r} ({type(value).__name__}), not {want}")


def check_row(row: Any) -> None:
    """BadRow naming what a stored sample row lacks or holds of the wrong type (the fields the summary reads), so it
    is set aside and its sample played again, not a crash."""
    if not isinstance(row, dict):
        raise BadRow(f"not a JSON object but {type(row).__name__}")
    missing = [k for k in ROW_FIELDS if k not in row]
    stats = row.get("stats")
    if "stats" in row:
        if not isinstance(stats, dict):
            raise BadRow("field 'stats' is not an object")
        missing += [f"stats.{k}" for k in STATS_FIELDS if k not in stats]
    if missing:
        raise BadRow(f"missing field{'s' if len(missing) > 1 else ''} {', '.join(repr(m) for m in missing)}")
    if not isinstance(row["verdicts"], dict) or not all(isinstance(v, dict) for v in row["verdicts"].values()):
        raise BadRow("field 'verdicts' is not an object of verdicts")
    if not isinstance(row["task_id"], (str, int)) or isinstance(row["sample"], bool):
        raise BadRow(f"fields 'task_id'/'sample' are not an id and an integer: {row['task_id']!r}, {row['sample']!r}")
    try:
        sample_key(row)
    except (TypeError, ValueError, OverflowError):
        raise BadRow(
            f"fields 'task_id'/'sample' are not an id and an integer: {row['task_id']!r}, {row['sample']!r}"
        ) from None
    _check_values(row, row["stats"])


def _check_values(row: dict[str, Any], stats: dict[str, Any]) -> None:
    """The types of the fields the summary computes with."""
    if not is_number(row["reward"]):
        raise _field("reward", row["reward"], "a finite number")
    if "env_correct" in row and not isinstance(row["env_correct"], bool):
        raise _field("env_correct", row["env_correct"], "true or false")
    for name, verdict in row["verdicts"].items():
        if verdict.get("error"):
            continue  # a failed judge's verdict: left out of the scores, judged again
        if not is_number(verdict.get("score")):
            raise _field(f"verdicts.{name}.score", verdict.get("score"), "a finite number")
        if not isinstance(verdict.get("correct"), (bool, int)):
            raise _field(f"verdicts.{name}.correct", verdict.get("correct"), "true or false")
    for key in COUNT_FIELDS:
        if not is_number(stats[key]) or stats[key] < 0:
            raise _field(f"stats.{key}", stats[key], "a count")
    if not isinstance(stats["answered"], (bool, int)):
        raise _field("stats.answered", stats["answered"], "true or false")
    if not isinstance(stats["stop_reason"], str):
        raise _field("stats.stop_reason", stats["stop_reason"], "text")
    for key in RECALL_FIELDS:
        if key in stats and not is_number(stats[key]):
            raise _field(f"stats.{key}", stats[key], "a finite number")
    cost = stats.get("tool_cost")
    if cost is not None and not (isinstance(cost, dict) and all(is_number(v) for v in cost.values())):
        raise _field("stats.tool_cost", cost, "an object of unit -> number")
    subset = row.get("subset")
    if subset is not None and not (
        isinstance(subset, dict) and all(v is None or isinstance(v, (str, int, float)) for v in subset.values())
    ):
        raise _field("subset", subset, "an object of key -> text or number")
