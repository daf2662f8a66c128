"""The finished units of a resumable bench, in its run folder and in the copy committed beside its results."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchgym.bench.unit_log import UnitLog


def rows_of(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def check(row):
    return row["seed"], row["fingerprint"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["run", "kept", "both"]), max_size=8))
def test_opening_carries_each_side_the_rows_it_lacks(tmp_path_factory, where):
    root = tmp_path_factory.mktemp("units")
    rows = [{"seed": i, "fingerprint": "k", "gain": i / 10} for i in range(len(where))]
    write(root / "run.jsonl", [r for r, w in zip(rows, where, strict=True) if w in ("run", "both")])
    write(root / "kept.jsonl", [r for r, w in zip(rows, where, strict=True) if w in ("kept", "both")])
    log = UnitLog(root / "run.jsonl", root / "kept.jsonl", fingerprint="k", check=check)
    key = lambda r: r["seed"]  # noqa: E731
    assert sorted(log.rows, key=key) == sorted(rows_of(root / "kept.jsonl"), key=key) == rows
    log.append({"seed": 99, "fingerprint": "k"})
    assert rows_of(root / "run.jsonl")[-1] == rows_of(root / "kept.jsonl")[-1] == {"seed": 99, "fingerprint": "k"}
    again = UnitLog(root / "run.jsonl", root / "kept.jsonl", fingerprint="k", check=check)  # nothing new to carry
    assert len(again.rows) == len(rows) + 1 == len(rows_of(root / "kept.jsonl"))


def test_rows_of_another_configuration_are_refused_before_anything_is_carried(tmp_path):
    write(tmp_path / "run.jsonl", [{"seed": 0, "fingerprint": "mine"}])
    write(tmp_path / "kept.jsonl", [{"seed": 1, "fingerprint": "theirs"}])
    before = (tmp_path / "run.jsonl").read_text(), (tmp_path / "kept.jsonl").read_text()
    with pytest.raises(ValueError, match=r"kept\.jsonl holds runs of another configuration"):
        UnitLog(tmp_path / "run.jsonl", tmp_path / "kept.jsonl", fingerprint="mine", check=check)
    assert ((tmp_path / "run.jsonl").read_text(), (tmp_path / "kept.jsonl").read_text()) == before


def test_one_file_for_both_is_written_once(tmp_path):
    log = UnitLog(tmp_path / "a.jsonl", tmp_path / "a.jsonl", fingerprint="k", check=check)
    log.append({"seed": 0, "fingerprint": "k"})
    assert rows_of(tmp_path / "a.jsonl") == [{"seed": 0, "fingerprint": "k"}]
