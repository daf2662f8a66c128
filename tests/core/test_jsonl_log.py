"""The one append-only JSONL reader/writer behind every resumable file: a kill or a damaged line loses nothing
that was whole, and everything set aside is reported by line."""

import json
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchgym.core.jsonl_log import JsonlLog

rows = st.lists(
    st.fixed_dictionaries({"id": st.integers(0, 10**6), "text": st.text(max_size=40)}), min_size=1, max_size=12
)


def check(row):
    if not isinstance(row, dict) or not isinstance(row["id"], int):
        raise TypeError("not a row")


@settings(max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=rows, cut=st.floats(0, 1))
def test_a_kill_at_any_byte_loses_only_the_line_being_written(tmp_path_factory, rows, cut):
    path = tmp_path_factory.mktemp("log") / "items.jsonl"
    log = JsonlLog(path, check=check)
    for row in rows:
        log.append(row)
    data = path.read_bytes()
    cut_at = int(len(data) * cut)
    path.write_bytes(data[:cut_at])  # the process died while writing
    whole = data[:cut_at].count(b"\n")
    with warnings.catch_warnings():  # a cut on a line end leaves nothing to repair (no warning): either is fine
        warnings.simplefilter("ignore")
        again = JsonlLog(path, check=check)
    assert again.rows == rows[:whole] or (again.rows == rows[: whole + 1] and data[:cut_at].endswith(b"}"))
    again.append({"id": -1, "text": "after"})
    reread = JsonlLog(path, check=check)
    assert reread.rows[-1] == {"id": -1, "text": "after"} and reread.rows[:-1] == again.rows[:-1]
    assert not reread.damaged and not path.with_name("items.damaged.jsonl").exists()


def test_damaged_middle_lines_are_set_aside_by_line_and_never_lost(tmp_path):
    path = tmp_path / "pool.jsonl"
    lines = [
        json.dumps({"id": 1, "text": "a"}),
        "{glued to the next",
        json.dumps({"id": "x"}),
        json.dumps({"id": 4}),
        json.dumps({"id": 5, "text": "e"}),
    ]
    path.write_text("\n".join(lines) + "\n")
    with pytest.warns(UserWarning, match="set aside 2 unusable line"):
        log = JsonlLog(path, check=check)
    assert [r["id"] for r in log.rows] == [1, 4, 5]
    assert [(d.line, d.reason) for d in log.damaged] == [(2, "damaged (JSONDecodeError)"), (3, "damaged (TypeError)")]
    sidecar = [json.loads(line) for line in (tmp_path / "pool.damaged.jsonl").read_text().splitlines()]
    assert [(s["line"], s["text"]) for s in sidecar] == [(2, lines[1]), (3, lines[2])]
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == [1, 4, 5]
