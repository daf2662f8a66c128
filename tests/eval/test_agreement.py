"""Judge agreement: Cohen's kappa, the disagreeing samples of a run, and each judge against human labels."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchgym.eval.agreement import cohen_kappa, judge_agreement, label_accuracy, load_labels


def test_kappa_on_a_worked_example():
    # 10 items: both say yes on 4, both no on 3, a-yes/b-no on 2, a-no/b-yes on 1
    a = [True] * 4 + [False] * 3 + [True] * 2 + [False]
    b = [True] * 4 + [False] * 3 + [False] * 2 + [True]
    p_o, p_e = 0.7, 0.6 * 0.5 + 0.4 * 0.5
    assert cohen_kappa(a, b) == pytest.approx((p_o - p_e) / (1 - p_e))
    assert cohen_kappa(a, a) == 1.0
    assert cohen_kappa(a, [not x for x in a]) < 0  # systematic disagreement is worse than chance
    assert math.isnan(cohen_kappa([True] * 3, [True] * 3))  # one constant call: chance agreement is 1, kappa undefined
    with pytest.raises(ValueError):
        cohen_kappa([True], [True, False])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=40))
def test_kappa_matches_scikit_learn(pairs):
    metrics = pytest.importorskip("sklearn.metrics")
    a, b = [x for x, _ in pairs], [y for _, y in pairs]
    ours = cohen_kappa(a, b)
    if math.isnan(ours):
        assert len(set(a)) == len(set(b)) == 1 and a[0] == b[0]
    else:
        assert ours == pytest.approx(metrics.cohen_kappa_score(a, b, labels=[False, True]))


def row(task, sample, prediction, em, f1, llm=None):
    verdicts = {
        "em": {"score": em, "correct": em == 1.0, "error": None},
        "f1": {"score": f1, "correct": em == 1.0, "error": None},
    }
    if llm is not None:
        verdicts["llm"] = llm
    return {"task_id": task, "sample": sample, "prediction": prediction, "answers": ["Paris"], "verdicts": verdicts}


LLM_YES = {"score": 1.0, "correct": True, "error": None}
LLM_NO = {"score": 0.0, "correct": False, "error": None}
LLM_FAIL = {"score": 0.0, "correct": False, "error": "no verdict in the judge's output"}
ROWS = [
    row("q1", 0, "Paris", 1.0, 1.0, LLM_YES),  # all agree: correct
    row("q1", 1, "Paris, France", 0.0, 0.8, LLM_YES),  # em no; f1>0.5 yes; llm yes
    row("q2", 0, "Lyon", 0.0, 0.0, LLM_NO),  # all agree: wrong
    row("q2", 1, "the city of Paris", 0.0, 0.4, LLM_FAIL),  # llm failed: no call from it
    row("q3", 0, None, 0.0, 0.0, LLM_NO),  # no answer: nothing to judge, left out
]


def test_agreement_counts_pairs_on_answered_samples_and_lists_the_splits():
    result = judge_agreement(ROWS, ["llm", "em", "f1"])
    assert result["raters"] == ["llm", "em", "f1", "f1>0.5"] and result["answered"] == 4
    pairs = {(p["a"], p["b"]): p for p in result["pairs"]}
    llm_em = pairs[("llm", "em")]
    assert llm_em["n"] == 3 and llm_em["agreement"] == pytest.approx(2 / 3)  # the failed llm verdict is no call
    assert pairs[("llm", "f1>0.5")]["agreement"] == 1.0 and pairs[("llm", "f1>0.5")]["n"] == 3
    assert pairs[("em", "f1")]["agreement"] == 1.0  # F1's `correct` is an exact match
    assert result["disagreements"] == 1
    (split,) = result["disagreeing"]
    assert (split["task_id"], split["sample"]) == ("q1", 1)
    assert split["calls"] == {"llm": True, "em": False, "f1": False, "f1>0.5": True}


def test_labels_from_csv_and_jsonl_score_each_judge(tmp_path):
    csv_path = tmp_path / "labels.csv"
    csv_path.write_text(
        'question_id,prediction,human_verdict\nq1,Paris,correct\nq1,"Paris, France",yes\nq2,Lyon,0\nq9,Rome,1\n'
    )
    jsonl_path = tmp_path / "labels.jsonl"
    jsonl_path.write_text(
        "\n".join(
            json.dumps(x)
            for x in [
                {"task_id": "q1", "prediction": "Paris", "verdict": True},
                {"id": "q1", "prediction": " Paris, France ", "label": "correct"},
                {"qid": "q2", "prediction": "Lyon", "correct": False},
                {"question_id": "q9", "prediction": "Rome", "human": "yes"},
            ]
        )
        + "\n"
    )
    for path in (csv_path, jsonl_path):
        labels = load_labels(path)
        assert [(lab.task_id, lab.correct) for lab in labels] == [
            ("q1", True),
            ("q1", True),
            ("q2", False),
            ("q9", True),
        ]
        result = label_accuracy(ROWS, labels, ["llm", "em", "f1"])
        assert result["labels"] == 4 and result["matched_labels"] == 3 and result["unmatched_labels"] == 1
        raters = result["raters"]
        assert raters["llm"]["accuracy"] == 1.0 and raters["llm"]["n"] == 3
        assert raters["em"]["accuracy"] == pytest.approx(2 / 3)  # it calls "Paris, France" wrong; the human does not
        assert raters["f1>0.5"]["accuracy"] == 1.0


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("a.csv", "question_id,prediction,human_verdict\nq1,Paris,maybe\n", r"a\.csv:2: human verdict 'maybe'"),
        ("b.csv", "question,answer\nq1,Paris\n", r"b\.csv:2: needs a question id"),
        ("c.jsonl", '{"task_id": "q1", "prediction": "x", "verdict": 1}\n{"task_id": \n', r"c\.jsonl:2: not JSON"),
        ("d.jsonl", '["q1", "x", true]\n', r"d\.jsonl:1: expected an object"),
        ("e.csv", "question_id,prediction,human_verdict\n", r"holds no labels"),
        ("f.csv", "id,prediction,verdict\nq1,x,yes\nq1,x,no\n", r"conflicting human verdicts"),
    ],
)
def test_bad_label_files_are_one_clear_error(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        label_accuracy(ROWS, load_labels(path), ["em"])
