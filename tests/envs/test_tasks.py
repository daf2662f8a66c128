"""Task pools load every row form users have, and never lose a task silently."""

import json
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchgym.envs.tasks import Task, TaskFileError, TaskPool


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_asearcher_and_own_rows(tmp_path):
    path = write_jsonl(
        tmp_path / "t.jsonl",
        [
            {"question": "Who?", "answer": "Kelda Voss", "qid": 3, "source": "nq"},
            {"question": "When?", "answer": ["1873", "eighteen seventy-three"], "aug_answer": ["1873 AD"]},
            {"id": "x", "question": "Where?", "answers": ["Velmora"], "metadata": {"hops": 2, "split": "test"}},
            {"question": "How many?", "gt": 7},
        ],
    )
    pool = TaskPool.from_jsonl(path)
    assert [t.id for t in pool] == ["3", "t-1", "x", "t-3"]
    assert pool.by_id("t-1").answers == ("1873", "eighteen seventy-three")  # aug_answer is not a full alias
    assert pool.by_id("t-1").aug_answers == ("1873 AD",) == tuple(pool.by_id("t-1").metadata["aug_answer"])
    assert pool.by_id("3").aug_answers == ()
    assert pool.by_id("3").metadata == {"source": "nq"}
    assert pool.by_id("t-3").answers == ("7",)
    assert [t.id for t in pool.filter(split="test")] == ["x"]
    assert [t.id for t in pool.filter(hops=[2, 3])] == ["x"]


def test_bad_row_names_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"question": "ok?", "answer": "a"}, "{broken", {"question": "no answer"}])
    with pytest.raises(TaskFileError, match=r"t\.jsonl:2: not valid JSON"):
        TaskPool.from_jsonl(path)
    with pytest.warns(UserWarning, match="skipped 2 bad rows"):
        pool = TaskPool.from_jsonl(path, on_error="skip")
    assert len(pool) == 1
    assert [where.rsplit(":", 1)[1] for where, _ in pool.rejected] == ["2", "3"]
    assert "no answer" in pool.rejected[1][1]


def test_duplicate_ids_are_an_error(tmp_path):
    path = write_jsonl(
        tmp_path / "t.jsonl", [{"id": 1, "question": "a", "answer": "b"}, {"id": 1, "question": "c", "answer": "d"}]
    )
    with pytest.raises(TaskFileError, match="duplicate task id '1'"):
        TaskPool.from_jsonl(path)


def test_json_array_file_and_missing_file(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"question": "q", "answer": "a"}]))
    assert len(TaskPool.load(path)) == 1
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TaskPool.load(tmp_path / "nope.jsonl")


def test_datasets_round_trip(tmp_path):
    pool = TaskPool([Task("a", "q1?", ("x", "y"), {"hops": 1, "path": [{"id": "3"}]}), Task("b", "q2?", ("z",), {})])
    pool.to_dataset(tmp_path / "ds")
    loaded = TaskPool.load(tmp_path / "ds")
    assert list(loaded) == list(pool)
    pool.to_jsonl(tmp_path / "p.jsonl")
    assert list(TaskPool.load(tmp_path / "p.jsonl")) == list(pool)


def test_datasets_dict_needs_a_split(tmp_path):
    import datasets

    d = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"question": ["q"], "answer": ["a"]}),
            "test": datasets.Dataset.from_dict({"question": ["q2"], "answer": [["b", "c"]]}),
        }
    )
    d.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ValueError, match="pass split"):
        TaskPool.from_dataset(tmp_path / "dd")
    assert TaskPool.from_dataset(tmp_path / "dd", split="test")[0].answers == ("b", "c")


@given(st.integers(0, 2**32 - 1))
def test_seeded_draws_and_order(seed):
    pool = TaskPool([Task(str(i), f"q{i}", ("a",)) for i in range(50)])
    assert pool.sample(np.random.default_rng(seed)) == pool.sample(np.random.default_rng(seed))
    assert [t.id for t in pool.shuffled(seed)] == [t.id for t in pool.shuffled(seed)]
    assert sorted(t.id for t in pool.shuffled(seed)) == sorted(t.id for t in pool)


def test_empty_pool_draw_is_a_clear_error():
    with pytest.raises(ValueError, match="empty"):
        TaskPool([]).sample(np.random.default_rng(0))


def test_load_pool_parses_a_file_once_and_again_after_it_changes(tmp_path):
    from searchgym.envs.tasks import load_pool

    path = tmp_path / "tasks.jsonl"
    rows = [
        {
            "id": f"t{i}",
            "question": f"q{i}?",
            "answers": ["a"],
            "metadata": {"hops": 1 + i % 2, "split": "test" if i % 3 == 0 else "train"},
        }
        for i in range(9)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first = load_pool(path, split="train", hops=[1])
    assert load_pool(str(path), split="train", hops=1) is first  # same file, same filters: the parsed pool
    assert [t.id for t in first] == ["t2", "t4", "t8"]
    assert len(load_pool(path)) == 9 and load_pool(path, hops=2) is not first
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))  # an edited file is read again
    assert [t.id for t in load_pool(path, split="train", hops=1)] == ["t2"]
    assert [t.id for t in load_pool(list(first), hops=1)] == ["t2", "t4", "t8"]  # tasks in memory: filtered, not cached


def test_a_task_file_not_in_utf8_is_refused_naming_it_not_loaded_with_replaced_characters(tmp_path):
    """A latin-1 line is that row's error (its characters were silently replaced before), a UTF-16 file is refused
    by name; with on_error='skip' the good rows load and the bad one is reported."""
    good = '{"id": "a", "question": "Where?", "answers": ["Teslin"]}\n'
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(good.encode() + '{"id": "b", "question": "Caf\u00e9?", "answers": ["x"]}\n'.encode("latin-1"))
    with pytest.raises(TaskFileError, match=rf"{re.escape(str(path))}:2: not valid UTF-8"):
        TaskPool.from_jsonl(path)
    with pytest.warns(UserWarning, match="skipped 1 bad rows"):
        pool = TaskPool.from_jsonl(path, on_error="skip")
    assert [t.id for t in pool] == ["a"] and pool.rejected[0][0] == f"{path}:2"
    path.write_bytes(good.encode("utf-16"))
    with pytest.raises(TaskFileError, match=rf"{re.escape(str(path))}: the file is UTF-16"):
        TaskPool.from_jsonl(path)
    path.write_bytes(b"\xef\xbb\xbf" + good.encode())  # a BOM is fine
    assert [t.id for t in TaskPool.from_jsonl(path)] == ["a"]
