"""A rerun over `samples.jsonl` rows whose fields hold the wrong type (a reward that is text, a verdict score that
is null, a count that is a list): each such row is set aside naming its line and field, the good rows replay, and
the summary is computed; never a TypeError out of the summary's arithmetic."""

from __future__ import annotations

import json
import math
import tempfile
import warnings
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from searchgym.bench.reliability_sources import good_sample_row
from searchgym.eval.harness import SampleStore, summarize_rows

FIELDS = [
    ("reward",),
    ("env_correct",),
    ("verdicts", "em", "score"),
    ("verdicts", "em", "correct"),
    ("stats", "turns"),
    ("stats", "searches"),
    ("stats", "generated_tokens"),
    ("stats", "answered"),
    ("stats", "stop_reason"),
    ("stats", "tool_cost"),
    ("stats", "evidence_recall_opened"),
    ("subset",),
    ("task_id",),
    ("sample",),
]
JUNK = st.one_of(
    st.text(max_size=5),
    st.none(),
    st.booleans(),
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(
        st.text(max_size=3), st.one_of(st.integers(), st.text(max_size=3), st.lists(st.none())), max_size=2
    ),
)


def good_row(i: int) -> dict:
    """A row as a run writes it (the reliability bench's, plus an evidence figure)."""
    row = good_sample_row(i)
    row["stats"]["evidence_recall_opened"] = 0.5
    return row


def test_a_reward_that_is_text_is_set_aside_naming_its_line_and_the_good_rows_summarise(tmp_path):
    path = tmp_path / "samples.jsonl"
    rows = [good_row(0), {**good_row(1), "reward": "1.0"}, good_row(2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = SampleStore(path)
    assert "line 2: damaged (field 'reward' is '1.0' (str), not a finite number)" in str(caught[0].message)
    assert set(store.rows) == {("t", 0), ("t", 2)}  # sample 1 is played again by the rerun
    assert summarize_rows(list(store.rows.values()), 3)["metrics"]["samples"] == 2
    assert "1.0" in (tmp_path / "samples.damaged.jsonl").read_text()


@settings(max_examples=150, deadline=None)
@given(field=st.sampled_from(FIELDS), junk=JUNK)
def test_any_junk_field_is_set_aside_naming_line_and_field_or_summarises(field, junk):
    """Property: a row with any field replaced by junk is either set aside (reported with line 2 and the field) or
    summarised with the others; the summary never raises."""
    row = good_row(1)
    *parents, leaf = field
    target = row
    for key in parents:
        target = target[key]
    target[leaf] = junk
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "samples.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in (good_row(0), row, good_row(2))))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            store = SampleStore(path)
        summary = summarize_rows(list(store.rows.values()), 3)
    if caught:
        message = str(caught[0].message)
        assert "line 2: damaged" in message and (field[-1] in message or field[0] in message), message
        assert len(store.rows) == 2
    else:  # kept: a row whose key repeats another's keeps the first, as for any repeated key
        keys = {(str(r["task_id"]), int(r["sample"])) for r in (good_row(0), row, good_row(2))}
        assert len(store.rows) == len(keys) and math.isfinite(summary["metrics"]["avg@3/reward"])
