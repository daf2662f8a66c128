"""`searchgym bench judge`: the real SmolLM2 judges stored answers through the model server's OpenAI route, and
its verdicts are scored against EM and F1 with unreadable replies counted apart, never graded."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchgym.bench.judge_agreement import (
    JudgeBenchSettings,
    collect_samples,
    load_samples,
    run_judge_bench,
    summarise,
)

# under pytest-xdist, the tests of the real model share one worker, whose session fixture converts it once
pytestmark = pytest.mark.xdist_group("smollm2")

SAMPLES = [
    {"task_id": "a", "question": "What is the currency of Drigolia?", "answers": ["thaler"], "prediction": "thaler"},
    {"task_id": "b", "question": "Who is the mayor of Muskefield?", "answers": ["Bara Zorran"], "prediction": "Zorran"},
    {"task_id": "c", "question": "Which genre is The Losketh Horizon?", "answers": ["romance"], "prediction": "drama"},
]


def verdict(correct: bool, score: float | None = None, error: str | None = None) -> dict:
    return {"score": float(correct) if score is None else score, "correct": correct, "error": error, "detail": {}}


def test_the_real_model_judges_through_the_server_and_unreadable_replies_are_counted_apart(smollm2, tmp_path):
    model_dir = smollm2
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps(s) + "\n" for s in SAMPLES))
    out = tmp_path / "judge.json"
    report = run_judge_bench(
        JudgeBenchSettings(judge_model=str(model_dir), samples=str(samples), out=str(out), max_tokens=48)
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))  # the file is the report, valid JSON
    assert f"--judge-model {model_dir} " in report["command"] and "--max-tokens 48" in report["command"]  # rerunnable
    assert report["samples"] == 3 and report["valid"] + report["invalid"] == 3
    assert sum(report["invalid_reasons"].values()) == report["invalid"]
    for example in report["examples"]:  # every sample got a reply from the model, graded or set apart
        assert example["reply"] or example["invalid_because"]
        assert (example["llm"] is None) == (example["invalid_because"] is not None)
    em_f1 = next(p for p in report["pairs"] if {p["a"], p["b"]} == {"em", "f1"})
    assert em_f1["n"] == 3  # EM against F1 is over every sample; the llm pairs over its valid verdicts only
    llm_em = next(p for p in report["pairs"] if {p["a"], p["b"]} == {"em", "llm"})
    assert llm_em["n"] == report["valid"]


def test_samples_are_collected_once_per_question_and_answer_and_never_over_an_existing_file(tmp_path):
    run = tmp_path / "runs" / "eval-a"
    run.mkdir(parents=True)
    rows = [
        {**SAMPLES[0], "sample": 0, "subset": {"hops": 1}},
        {**SAMPLES[0], "sample": 1, "subset": {"hops": 1}},  # the same answer again
        {**SAMPLES[1], "sample": 0},
        {**SAMPLES[2], "prediction": None, "sample": 0},  # unanswered
    ]
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"half a li')
    collected = collect_samples([tmp_path / "runs"])
    assert [(r["task_id"], r["prediction"]) for r in collected] == [("a", "thaler"), ("b", "Zorran")]
    existing = tmp_path / "kept.jsonl"
    existing.write_text("mine\n")
    with pytest.raises(ValueError, match="exists.*nothing was overwritten"):
        run_judge_bench(JudgeBenchSettings(samples=str(existing), from_runs=[str(tmp_path / "runs")]))
    assert existing.read_text() == "mine\n"
    with pytest.raises(ValueError, match="no eval run"):
        collect_samples([tmp_path / "nothing"])


def test_a_bad_samples_line_is_named(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(SAMPLES[0]) + "\n" + json.dumps({"question": "q"}) + "\n")
    with pytest.raises(ValueError, match=r"s.jsonl:2: expected a JSON object with question, answers and prediction"):
        load_samples(path, None)


@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.one_of(st.none(), st.booleans())), min_size=1, max_size=40))
def test_invalid_verdicts_are_never_graded(calls):
    rows = [
        {
            "task_id": str(i),
            "sample": i,
            "prediction": "p",
            "answers": ["a"],
            "verdicts": {
                "em": verdict(em),
                "f1": verdict(f1, score=0.9 if f1 else 0.1),
                "llm": verdict(bool(llm), error=None if llm is not None else "no verdict in the judge's output"),
            },
        }
        for i, (em, f1, llm) in enumerate(calls)
    ]
    report = summarise(rows)
    valid = [c for c in calls if c[2] is not None]
    assert report["valid"] == len(valid) and report["invalid"] == len(calls) - len(valid)
    assert sum(report["confusion"]["llm vs em"].values()) == len(valid)
    agree = sum(em == llm for em, _, llm in valid)
    assert (
        report["confusion"]["llm vs em"].get("em=correct, llm=correct", 0)
        + report["confusion"]["llm vs em"].get("em=wrong, llm=wrong", 0)
        == agree
    )
    for pair in report["pairs"]:
        assert pair["kappa"] is None or (-1 <= pair["kappa"] <= 1 and not math.isnan(pair["kappa"]))
    json.dumps(report, allow_nan=False)  # no NaN in a results file
