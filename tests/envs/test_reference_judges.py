"""The asearcher_f1, asearcher_em and searchr1_em judges equal the reference projects' reward functions.

The oracle is `fixtures/reference_scores.jsonl`: 3,000 answers scored by ASearcher's and Search-R1's own
functions (see fixtures/README.md). Every row must agree; the invariants below hold on any input.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchgym.envs import reference_metrics as ref
from searchgym.envs.judges import CompositeJudge, FormatGate, aug_kwargs, make_judge
from searchgym.envs.search_env import SearchEnv
from searchgym.envs.tasks import Task, TaskPool

FIXTURE = Path(__file__).parent / "fixtures" / "reference_scores.jsonl"
ROWS = [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines() if line.strip()]
REFERENCE_JUDGES = ("asearcher_f1", "asearcher_em", "searchr1_em")


def score(judge_name: str, answer: str, golds: list[str], aug: list[str] | None) -> float:
    """The named judge's score, with the row's augmented answers passed as the env passes a task's."""
    judge = make_judge(judge_name)
    return judge.judge(answer, golds, **aug_kwargs(judge, aug or ())).score


def test_fixture_covers_what_it_should() -> None:
    """The oracle exercises augmented answers, CJK golds, True/False, and partial scores (else agreement proves
    little)."""
    assert len(ROWS) == 3000
    assert sum(r["aug_answers"] is not None for r in ROWS) > 500
    assert any(any("\u4e00" <= c <= "\u9fff" for g in r["golds"] for c in g) for r in ROWS)
    assert {"True", "False"} <= {g for r in ROWS for g in r["golds"]}
    assert any(0 < r["asearcher_f1"] < 1 for r in ROWS) and any(
        r["aug_answers"] and 0 < r["asearcher_f1"] < 1 for r in ROWS
    )


@pytest.mark.parametrize("judge_name", REFERENCE_JUDGES)
def test_every_fixture_row_agrees(judge_name: str) -> None:
    """Each judge gives every row (aug_answer rows included) the reference project's own score, within 1e-9."""
    wrong = [
        (r, got)
        for r in ROWS
        if abs((got := score(judge_name, r["answer"], r["golds"], r["aug_answers"])) - r[judge_name]) > 1e-9
    ]
    assert not wrong, f"{len(wrong)} of {len(ROWS)} rows disagree, e.g. " + "; ".join(
        f"{json.dumps(r, ensure_ascii=False)} -> {got}" for r, got in wrong[:5]
    )


# --- invariants --------------------------------------------------------------------------------------------

texts = st.text(max_size=30)
stripped = texts.map(str.strip)
non_chinese = st.text(
    alphabet=st.characters(blacklist_characters="".join(map(chr, range(0x4E00, 0xA000)))), max_size=30
).map(str.strip)
words = st.lists(st.from_regex(r"[a-z0-9]{1,5}", fullmatch=True), min_size=1, max_size=6)


@given(texts, st.lists(texts, max_size=4), st.lists(texts, max_size=3))
def test_scores_in_unit_interval(prediction: str, golds: list[str], aug: list[str]) -> None:
    """Every reference judge scores in [0, 1] whatever the answer, golds and augmented answers."""
    for name in REFERENCE_JUDGES:
        assert 0.0 <= score(name, prediction, golds, aug) <= 1.0


@given(non_chinese, non_chinese)
def test_asearcher_f1_symmetric_without_chinese(a: str, b: str) -> None:
    """Set F1 is symmetric when neither side switches the gold into character mode."""
    assert ref.asearcher_f1(a, b) == pytest.approx(ref.asearcher_f1(b, a), abs=1e-12)


@given(texts, texts)
def test_em_judges_symmetric(a: str, b: str) -> None:
    """Search-R1's EM is an equality of normalised strings, so it is symmetric; so is ASearcher's EM on stripped
    text."""
    assert ref.searchr1_em(a, [b]) == ref.searchr1_em(b, [a])
    assert ref.asearcher_em(a.strip(), b.strip()) == ref.asearcher_em(b.strip(), a.strip())


@given(stripped)
def test_identical_strings_score_one(s: str) -> None:
    """An answer equal to the gold scores 1, except F1 when normalisation leaves nothing (no tokens: F1 is 0)."""
    assert ref.searchr1_em(s, [s]) == 1.0
    assert ref.asearcher_em(s, s) == 1.0
    empty = not ref.asearcher_normalize(s).split()
    assert ref.asearcher_f1(s, s) == (0.0 if empty else 1.0)


@given(words, st.randoms())
def test_asearcher_f1_counts_sets(tokens: list[str], rnd) -> None:
    """ASearcher's F1 counts token sets: order and repetition do not change the score, unlike searchgym's f1."""
    shuffled = tokens + tokens[:2]
    rnd.shuffle(shuffled)
    assert ref.asearcher_f1(" ".join(shuffled), " ".join(tokens)) == 1.0


@given(texts, st.lists(texts, min_size=1, max_size=4), st.lists(texts, min_size=1, max_size=3))
def test_aug_answers_never_lower_and_weigh_at_most_0_3(prediction: str, golds: list[str], aug: list[str]) -> None:
    """The blend 0.7 * s + 0.3 * max(s, s_aug) only raises a score, by at most 0.3 of what is missing; golds given
    again as augmented answers change nothing; searchr1_em ignores them."""
    for name in ("asearcher_f1", "asearcher_em"):
        plain, blended = score(name, prediction, golds, None), score(name, prediction, golds, aug)
        assert plain - 1e-12 <= blended <= plain + 0.3 * (1 - plain) + 1e-12
        assert score(name, prediction, golds, golds) == pytest.approx(plain, abs=1e-12)
    assert score("searchr1_em", prediction, golds, aug) == score("searchr1_em", prediction, golds, None)


@given(texts, st.lists(texts, min_size=1, max_size=4))
def test_score_is_max_over_golds_and_correct_means_a_full_gold_score(prediction: str, golds: list[str]) -> None:
    """Judge score = max over golds of the per-gold metric; `correct` iff some gold alone scores 1."""
    verdict = make_judge("asearcher_f1").judge(prediction, golds)
    per_gold = [ref.asearcher_f1(prediction, g) for g in golds]
    assert verdict.score == max(per_gold)
    assert verdict.correct == (max(per_gold) == 1.0)


def test_documented_differences_from_searchgym_f1() -> None:
    """The behaviours the docs name: articles kept, ASCII-only punctuation, exact True/False, Chinese by characters,
    kana and Hangul by words, digit runs as one token."""
    assert ref.asearcher_f1("the Beatles", "Beatles") == pytest.approx(2 / 3)  # articles are tokens
    assert ref.asearcher_f1("“Paris”", "Paris") == 0.0  # curly quotes stay attached
    assert ref.asearcher_f1("U.S.", "U S") == 1.0  # ASCII punctuation becomes spaces
    assert ref.asearcher_f1("yes", "True") == 1.0 and ref.asearcher_f1("yes", "true") == 0.0
    assert ref.asearcher_f1("北京", "北京大学") == pytest.approx(2 / 3)  # characters of a Chinese gold
    assert ref.asearcher_f1("ソニー", "ソ ニー") == 0.0  # kana are not split into characters
    assert ref.asearcher_f1("1901年", "1901年") == 1.0 and ref.asearcher_f1("190年", "1901年") == pytest.approx(0.5)
    assert ref.searchr1_em("The Beatles!", ["beatles"]) == 1.0 and ref.searchr1_em("“Beatles”", ["beatles"]) == 0.0


# --- wiring: names, composites, the env and task rows ------------------------------------------------------


def test_names_build_the_reference_judges_and_compose() -> None:
    """The names select the judges; `+format` and comma lists pass augmented answers to the judges that blend them."""
    for name in REFERENCE_JUDGES:
        assert make_judge(name).name == name
    gated = make_judge("asearcher_f1+format")
    assert isinstance(gated, FormatGate) and gated.uses_aug_references
    assert gated.judge("Paris!", ["London"], aug_references=["Paris"]).score == pytest.approx(0.3)
    assert gated.judge("Paris!", ["London"], aug_references=["Paris"], format_errors=["x"]).score == 0.0
    combo = make_judge("asearcher_f1,f1")
    assert isinstance(combo, CompositeJudge)
    verdict = combo.judge("Paris", ["London"], aug_references=["Paris"])
    assert verdict.score == pytest.approx(0.3) and verdict.detail["scores"]["f1"] == 0.0
    averdicts = asyncio.run(combo.averdicts("Paris", ["London"], aug_references=["Paris"]))
    assert averdicts["asearcher_f1"].score == pytest.approx(0.3)


def test_env_blends_aug_answer_of_an_asearcher_row(tmp_path, small_index) -> None:
    """An ASearcher-format row's `aug_answer` reaches the asearcher_f1 reward (0.3 for an augmented-only answer) and
    stays out of the answers every other judge scores against."""
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(
        json.dumps({"question": "Capital of France?", "answer": ["Paris"], "aug_answer": ["Lutetia"], "qid": 7}) + "\n"
    )
    pool = TaskPool.from_jsonl(tasks)
    assert pool[0].answers == ("Paris",) and pool[0].aug_answers == ("Lutetia",)
    assert Task.from_row(pool[0].to_row(), fallback_id="x").aug_answers == ("Lutetia",)  # kept through our row form
    rewards = {}
    for judge in ("asearcher_f1", "f1", "asearcher_f1,em"):
        for answer in ("Lutetia", "Paris"):
            env = SearchEnv(pool, small_index, judge=judge)
            env.reset(seed=0)
            rewards[judge, answer] = env.step(f"<answer>{answer}</answer>")[1]
    assert rewards == {
        ("asearcher_f1", "Lutetia"): pytest.approx(0.3),
        ("asearcher_f1", "Paris"): 1.0,
        ("f1", "Lutetia"): 0.0,
        ("f1", "Paris"): 1.0,
        ("asearcher_f1,em", "Lutetia"): pytest.approx(0.3),
        ("asearcher_f1,em", "Paris"): 1.0,
    }
