"""`searchgym bench simulated-search`: documents a local model writes as the simulated engine, under each packaged
prompt set, counted by kind and by whether they hold the answer; a failed search is counted, never a result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchgym.bench.simulated_search import (
    SimulatedSearchBenchSettings,
    format_report,
    holds_answer,
    run_simulated_search_bench,
)
from searchgym.settings import load_settings


def test_every_prompt_set_meets_the_same_questions_and_each_document_is_counted_once(tiny_model_dir, tmp_path):
    out = tmp_path / "sim.json"
    report = run_simulated_search_bench(
        SimulatedSearchBenchSettings(
            simulator=str(tiny_model_dir), questions=3, world_size=100, k=2, max_tokens=24, out=str(out)
        )
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert set(report["results"]) == {"base/blind", "base/answer_aware"} and report["sft"] is None
    for arm in report["results"].values():
        assert arm["searches"] == 3
        written = arm["useful"]["documents"] + arm["noisy"]["documents"]
        assert written == 2 * (3 - arm["failed_searches"])  # k documents a search, none from a failed one
        if arm["failed_searches"] < 3:
            assert arm["useful"]["documents"] == arm["noisy"]["documents"]  # noise 0.5 of k=2: one each
        for kind in ("useful", "noisy"):
            low, high = arm[kind]["rate_95"]
            assert 0 <= low <= high <= 1
        assert len(arm["failures"]) <= 5 and (arm["failed_searches"] == 0) == (not arm["failures"])


def test_an_unknown_prompt_set_is_refused_naming_the_key():
    with pytest.raises(ValueError, match="prompt_sets has 'loud'"):
        load_settings(SimulatedSearchBenchSettings, values={"prompt_sets": ["blind", "loud"]})
    with pytest.raises(ValueError, match="sft_prompt_sets has 'loud'"):
        load_settings(SimulatedSearchBenchSettings, values={"sft_prompt_sets": ["loud"]})
    with pytest.raises(ValueError, match="sft_demos"):
        load_settings(SimulatedSearchBenchSettings, values={"sft_demos": -1})


def test_the_fine_tune_is_measured_beside_the_base_model_and_reused_on_a_rerun(tiny_model_dir, tmp_path):
    out = tmp_path / "sim.json"
    settings = SimulatedSearchBenchSettings(
        simulator=str(tiny_model_dir),
        questions=2,
        world_size=100,
        k=2,
        max_tokens=16,
        out=str(out),
        sft_demos=4,
        sft_epochs=1,
        sft_batch_tokens=512,
        work=str(tmp_path / "work"),
    )
    report = run_simulated_search_bench(settings)
    assert set(report["results"]) == {f"{m}/{p}" for m in ("base", "tuned") for p in ("blind", "answer_aware")}
    sft = report["sft"]
    assert sft["demos"] == 4 and sft["useful_demos"] == 2 and not sft["reused"] and sft["steps"] >= 1
    assert Path(sft["model_dir"]).is_relative_to(tmp_path / "work")  # the 0.5 GB model never lands beside results
    for arm in report["results"].values():
        assert arm["searches"] == 2
        assert sum(arm["failed_by_reason"].values()) == arm["failed_searches"]
    lines = format_report(report).splitlines()
    assert lines[0].startswith("fine-tune: 4 demonstrations") and len(lines) == 5
    demos = [json.loads(x) for x in (Path(sft["model_dir"]).parent / "demos.jsonl").read_text().splitlines()]
    measured = {t["question"] for arm in report["results"].values() for t in arm["examples"]}
    assert len(demos) == 4 and not measured & {d["messages"][1]["content"].splitlines()[0][7:] for d in demos}
    again = run_simulated_search_bench(settings)
    assert again["sft"]["reused"] and again["sft"]["model_dir"] == sft["model_dir"]


def test_too_many_demonstrations_for_the_world_name_the_key(tiny_model_dir, tmp_path):
    settings = SimulatedSearchBenchSettings(
        simulator=str(tiny_model_dir), questions=2, world_size=100, sft_demos=100_000, out=str(tmp_path / "s.json")
    )
    with pytest.raises(ValueError, match="sft_demos asks for 100000"):
        run_simulated_search_bench(settings)


@given(
    st.lists(st.sampled_from(["the", "Bara", "Zorran", "mayor", "of", "Muskefield", ",", "."]), max_size=12),
    st.sampled_from(["Bara Zorran", "the Mayor", "zorran"]),
)
def test_an_answer_is_held_only_as_whole_words(words, answer):
    text = " ".join(words)
    held = holds_answer(text, (answer,))
    assert held == holds_answer(text.upper(), (answer.lower(),))  # case and punctuation never decide
    assert holds_answer(f"{text} {answer}.", (answer,))
    assert not holds_answer(text.replace(" ", "") + "x", ("Bara Zorran",)) or "barazorran" in text.lower()
