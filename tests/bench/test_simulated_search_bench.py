"""`searchgym bench simulated-search`: documents a local model writes as the simulated engine, under each packaged
prompt set, counted by kind and by whether they hold the answer; a failed search is counted, never a result."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchgym.bench.simulated_search import SimulatedSearchBenchSettings, holds_answer, run_simulated_search_bench
from searchgym.settings import load_settings


def test_every_prompt_set_meets_the_same_questions_and_each_document_is_counted_once(tiny_model_dir, tmp_path):
    out = tmp_path / "sim.json"
    report = run_simulated_search_bench(
        SimulatedSearchBenchSettings(
            simulator=str(tiny_model_dir), questions=3, world_size=100, k=2, max_tokens=24, out=str(out)
        )
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert set(report["results"]) == {"blind", "answer_aware"}
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
