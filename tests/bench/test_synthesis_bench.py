"""`searchgym bench synthesis`: the stage yields, rejections with their questions, failed calls counted apart (a
model that loops to its token budget, one that replies nothing), and an accepted task played in LocalQA-v0, through
the rule-based stand-in LLM (a test double, not a model); and the tiny local model, whose every reply is cut off."""

import json
from pathlib import Path

import pytest

from searchgym.bench.synthesis import SynthesisBenchSettings, format_report, run_synthesis_bench
from searchgym.envs.tools.local_index import LocalIndex
from searchgym.synthesis.run import seed_pages
from searchgym.testing.stand_in_llm import StandInLLM, stand_in_server

# one scenario per seed page, in the bench's seed order; "loops" and "silent" are faults set below
SCENARIOS = ["accept", "quality", "easy", "nonunique", "answer_changed", "malformed", "loops", "silent"]


@pytest.fixture
def fast_retries(monkeypatch):
    monkeypatch.setenv("SEARCHGYM_LLM_BACKOFF", "0.001")


def test_stage_yields_reasons_and_a_played_episode(small_bundle, tmp_path, fast_retries):
    index = LocalIndex(small_bundle / "index")
    titles = {doc.url: doc.title for doc in index.iter_docs()}
    urls = seed_pages(index, 0, limit=len(SCENARIOS))
    double = StandInLLM({titles[u]: s for u, s in zip(urls, SCENARIOS, strict=True)})

    def faults(n, prompt):
        """The "loops" seed's edit replies run to the token budget; the "silent" seed's quality check says nothing."""
        if prompt.startswith("## Task: make the question harder") and double._entry(prompt)["scenario"] == "loops":
            return "cut"
        if prompt.startswith("## Task: check a question's quality") and double._entry(prompt)["scenario"] == "silent":
            return "empty"
        return None

    double.faults = faults
    out = tmp_path / "synthesis.json"
    with stand_in_server(double) as url:
        settings = SynthesisBenchSettings(
            model=f"openai:{url}:stand-in", seeds=len(SCENARIOS), k=2, work=str(tmp_path / "work"), out=str(out)
        )
        report = run_synthesis_bench(settings)
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    table = {row["stage"]: row for row in report["stages"]}
    assert [(s, table[s]["seeds"], table[s].get("rejected"), table[s].get("failed_call")) for s in table] == [
        ("tried", 8, None, None),
        ("proposed", 7, 0, 1),  # malformed: the read never parses
        ("edited", 5, 1, 1),  # answer_changed by FUZZ; loops: every act reply cut at max_tokens
        ("quality", 3, 1, 1),  # quality fails; silent: the check's replies are empty
        ("difficulty", 2, 1, 0),  # easy
        ("uniqueness", 1, 1, 0),  # nonunique
        ("accepted", 1, 0, 0),
    ]
    assert report["accepted"] == 1 and report["seeds_tried"] == 8
    assert report["rejections"] == {
        "difficulty: too easy": 1,
        "fuzz: answer changed": 1,
        "quality: failed": 1,
        "uniqueness: another answer fits": 1,
    }
    assert report["failed_calls"]["by_reason"] == {"act: cut off": 1, "quality: unparseable": 1, "read: unparseable": 1}
    rejected = report["samples"]["rejected"]
    assert len(rejected) == 4 and all(r["question"] and r["reason"] and r["stage"] for r in rejected)
    easy = next(r for r in rejected if r["reason"] == "difficulty: too easy")  # the solver's graded answers kept
    assert len(easy["solver"]) == 2 and all(s["correct"] and s["answer"] for s in easy["solver"])
    failed = {r["failed"]: r for r in report["samples"]["failed_calls"]}
    assert failed["act: cut off"]["stage"] == "proposed" and failed["act: cut off"]["question"]
    assert failed["quality: unparseable"]["stage"] == "edited" and "question" not in failed["read: unparseable"]
    (accepted,) = report["samples"]["accepted"]
    assert accepted["answer"] == titles[urls[0]] and accepted["actions"]
    played = report["played_in_localqa"]
    assert played["question_in_first_observation"] and played["steps"][-1] == {
        **played["steps"][-1],
        "reward": 1.0,
        "terminated": True,
    }
    assert "accepted        1" in format_report(report)
    assert report["command"].startswith("searchgym bench synthesis --model openai:")
    # a rerun resumes: finished seeds are not asked again, only the three pending ones
    requests = double.requests
    with stand_in_server(double) as url:
        settings.model = f"openai:{url}:stand-in"
        again = run_synthesis_bench(settings)
    assert again["this_run"]["seeds_tried"] == 3 and again["accepted"] == 1 and double.requests > requests


def test_the_tiny_model_is_counted_never_a_crash(small_bundle, tiny_model_dir, tmp_path, fast_retries):
    """A local model dir whose replies are all cut at max_tokens: every seed is a failed read, the run finishes."""
    out = tmp_path / "tiny.json"
    settings = SynthesisBenchSettings(
        model=str(tiny_model_dir), seeds=2, k=1, max_tokens=16, concurrency=2, work=str(tmp_path / "w"), out=str(out)
    )
    report = run_synthesis_bench(settings)
    assert [row["seeds"] for row in report["stages"]] == [2, 0, 0, 0, 0, 0, 0]
    assert report["stages"][1]["failed_call"] == 2 and report["failed_calls"]["by_reason"] == {"read: cut off": 2}
    assert report["played_in_localqa"] is None and report["model"]["dir"] == str(tiny_model_dir)


def test_the_fine_tuned_synthesizer_learns_from_other_pages_and_is_reused(tiny_model_dir, tmp_path, fast_retries):
    """`--sft-demos`: the KB's demonstrations over the pages after the measured seeds tune the model, which then writes
    into a pool of its own beside it; a rerun reuses the tuned model and resumes that pool."""
    settings = SynthesisBenchSettings(
        model=str(tiny_model_dir),
        seeds=2,
        k=1,
        max_tokens=16,
        work=str(tmp_path / "w"),
        out=str(tmp_path / "tuned.json"),
        sft_demos=3,
        sft_epochs=1,
        sft_batch_tokens=4096,
    )
    report = run_synthesis_bench(settings)
    sft = report["sft"]
    assert sft["demo_pages"] == 3 and sft["demo_seeds"]["accepted"] == 3 and not sft["reused"] and sft["steps"] >= 1
    assert set(sft["demos_by_step"]) == {"read", "propose", "act", "inject", "quality", "solve", "judge", "uniqueness"}
    assert sft["system_message"] is None  # the tiny model's template writes no system message of its own
    where = (tmp_path / "w").resolve()
    model_dir = Path(sft["model_dir"])
    assert model_dir.parent.parent.resolve() == where and (model_dir / "config.json").exists()
    demos = [json.loads(line) for line in (model_dir.parent / "demos.jsonl").read_text().splitlines()]
    measured = set(seed_pages(LocalIndex(Path(report["corpus"]["index"])), 0, limit=2))
    assert {d["seed_page"] for d in demos}.isdisjoint(measured) and len({d["seed_page"] for d in demos}) == 3
    assert report["model"]["dir"] == str(tiny_model_dir)  # the base model is recorded, the tuned one under "sft"
    assert report["seeds_tried"] == 2 and report["kb_check"]["tasks"] == report["accepted"]
    assert not (where / "pool.jsonl").exists()  # the base model's pool is never mixed with the tuned one's
    again = run_synthesis_bench(settings)
    assert again["sft"]["reused"] and again["sft"]["model_dir"] == sft["model_dir"]
    settings.difficulty_judge = "cover_em"  # another difficulty judge: the same tuned model, a pool of its own
    ruled = run_synthesis_bench(settings)
    assert ruled["sft"]["reused"] and ruled["this_run"]["seeds_tried"] == 2
    assert (model_dir.parent / "pool-difficulty-cover_em.jsonl.progress.jsonl").exists()
    assert "--difficulty-judge cover_em" in ruled["command"]
