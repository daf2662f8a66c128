"""Tests for searchgym.envs.judges: metric properties, judge verdicts, composition and hostile inputs."""

from __future__ import annotations

import json
import string
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchgym.envs.judges import (
    CompositeJudge,
    CoverExactMatch,
    ExactMatch,
    FormatGate,
    Judge,
    TokenF1,
    Verdict,
    answer_tokens,
    cover_exact_match,
    exact_match,
    make_judge,
    normalize_answer,
    token_f1,
)

METRICS = {"em": exact_match, "f1": token_f1, "cover_em": cover_exact_match}
JUDGES = {"em": ExactMatch, "f1": TokenF1, "cover_em": CoverExactMatch}
PUNCTUATION = string.punctuation + "，。、「」『』！？—–…¿¡«»“”‘’·"
ARTICLES = ("a", "an", "the", "A", "An", "The", "THE")

texts = st.text(max_size=40)
plain_texts = st.text(alphabet=string.ascii_letters + string.digits + " éü北京大学東京", max_size=40)
words = st.from_regex(r"[a-z0-9]{1,6}", fullmatch=True).filter(lambda w: w not in {"a", "an", "the", "true", "false"})
reference_lists = st.lists(texts, min_size=1, max_size=5)


class FixedJudge:
    """Async-only stand-in for an LLM judge returning a preset verdict (or raising)."""

    def __init__(self, name: str, verdict: Verdict | None = None, exc: Exception | None = None) -> None:
        self.name, self.verdict, self.exc = name, verdict, exc

    async def ajudge(self, prediction, references, *, question="", format_errors=()) -> Verdict:
        """Return the preset verdict or raise the preset exception."""
        if self.exc is not None:
            raise self.exc
        return self.verdict


def insert_at(base: str, pieces: list[tuple[int, str]]) -> str:
    """Insert each (position, piece) into base, positions taken modulo the growing length."""
    for pos, piece in pieces:
        pos %= len(base) + 1
        base = base[:pos] + piece + base[pos:]
    return base


# --- metric properties -------------------------------------------------------------------------------


@given(texts, texts)
def test_f1_in_unit_interval_and_symmetric(a: str, b: str) -> None:
    assert 0.0 <= token_f1(a, b) <= 1.0
    assert token_f1(a, b) == token_f1(b, a)


@given(texts, texts)
def test_em_implies_full_f1_and_cover(pred: str, ref: str) -> None:
    if exact_match(pred, ref) == 1.0:
        assert token_f1(pred, ref) == 1.0
        assert cover_exact_match(pred, ref) == (1.0 if answer_tokens(ref) else 0.0)


@given(texts)
def test_self_match(s: str) -> None:
    assert exact_match(s, s) == 1.0 and token_f1(s, s) == 1.0


@given(st.text(alphabet=string.printable, max_size=40))
def test_case_invariance(s: str) -> None:
    for variant in (s.upper(), s.lower(), s.swapcase()):
        assert exact_match(variant, s) == 1.0
        assert token_f1(variant, s) == 1.0


@given(plain_texts, st.lists(st.tuples(st.integers(0, 100), st.sampled_from(PUNCTUATION)), max_size=8))
def test_punctuation_invariance(s: str, inserts: list[tuple[int, str]]) -> None:
    noisy = insert_at(s, inserts)
    assert normalize_answer(noisy) == normalize_answer(s)
    assert exact_match(noisy, s) == 1.0 and token_f1(noisy, s) == 1.0


@given(
    st.lists(words, min_size=1, max_size=6),
    st.lists(st.tuples(st.integers(0, 10), st.sampled_from(ARTICLES)), max_size=4),
)
def test_article_invariance(tokens: list[str], articles: list[tuple[int, str]]) -> None:
    with_articles = list(tokens)
    for pos, article in articles:
        with_articles.insert(pos % (len(with_articles) + 1), article)
    assert exact_match(" ".join(with_articles), " ".join(tokens)) == 1.0
    assert token_f1(" ".join(with_articles), " ".join(tokens)) == 1.0


@given(
    st.lists(st.sampled_from(["x", "y", "z", "北"]), max_size=5),
    st.lists(st.sampled_from(["x", "y", "z", "北"]), max_size=5),
)
def test_f1_is_one_iff_token_multisets_equal(a: list[str], b: list[str]) -> None:
    pred, ref = " ".join(a), " ".join(b)
    assert (token_f1(pred, ref) == 1.0) == (Counter(answer_tokens(pred)) == Counter(answer_tokens(ref)))


@settings(max_examples=50)
@given(texts, reference_lists)
def test_judge_score_is_max_over_references(pred: str, refs: list[str]) -> None:
    for name, judge_cls in JUDGES.items():
        verdict = judge_cls().judge(pred, refs)
        assert verdict.score == max(METRICS[name](pred, r) for r in refs)
        assert verdict.detail["best_reference"] in refs
        assert verdict.error is None


@settings(max_examples=50)
@given(texts, reference_lists)
def test_f1_correct_means_exact_match(pred: str, refs: list[str]) -> None:
    assert TokenF1().judge(pred, refs).correct == any(exact_match(pred, r) == 1.0 for r in refs)


@given(texts, texts)
def test_binary_metrics_are_binary(pred: str, ref: str) -> None:
    assert exact_match(pred, ref) in (0.0, 1.0)
    assert cover_exact_match(pred, ref) in (0.0, 1.0)


# --- hand cases --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  a  Tale\tof  two\ncities ", "tale of two cities"),
        ("True", "yes"),
        ("FALSE.", "no"),
        ("true story", "true story"),
        ("«Bonjour», dit-il。", "bonjour ditil"),
        ("412,310", "412310"),
        ("", ""),
    ],
)
def test_normalize_answer(raw: str, normalized: str) -> None:
    assert normalize_answer(raw) == normalized


def test_cjk_characters_are_tokens() -> None:
    assert answer_tokens("北京大学") == ["北", "京", "大", "学"]
    assert answer_tokens("東京タワー 서울 in Asia") == ["東", "京", "タ", "ワ", "ー", "서", "울", "in", "asia"]
    assert token_f1("北京大学", "北京") == pytest.approx(2 / 3)
    assert exact_match("北京 大学", "北京大学") == 1.0
    assert cover_exact_match("他在北京大学读书", "北京大学") == 1.0


def test_cover_em_respects_token_boundaries() -> None:
    assert cover_exact_match("1873", "1") == 0.0
    assert cover_exact_match("He was born in 1873.", "1873") == 1.0
    assert cover_exact_match("born in 1873", "born 1873") == 0.0
    assert cover_exact_match("anything", "") == 0.0
    assert cover_exact_match("anything", "the") == 0.0


def test_numbers_match_after_punctuation_removal() -> None:
    assert exact_match("412,310", "412310") == 1.0
    assert exact_match("$412,310.", "412310") == 1.0


def test_true_false_map_to_yes_no() -> None:
    assert exact_match("True", "yes") == 1.0
    assert exact_match("false", "No.") == 1.0
    assert exact_match("true", "no") == 0.0


def test_f1_edge_cases() -> None:
    assert token_f1("", "") == 1.0
    assert token_f1("the", "") == 1.0
    assert token_f1("", "paris") == 0.0
    assert token_f1("paris", "") == 0.0
    assert token_f1("paris france", "paris") == pytest.approx(2 / 3)


def test_f1_partial_is_reward_but_not_correct() -> None:
    verdict = TokenF1().judge("Paris, France", ["Paris", "City of Light"])
    assert verdict.score == pytest.approx(2 / 3)
    assert not verdict.correct
    assert verdict.detail["best_reference"] == "Paris"
    assert verdict.detail["normalized_prediction"] == "paris france"
    assert TokenF1().judge("paris", ["Paris", "City of Light"]).correct


def test_em_uses_aliases() -> None:
    verdict = ExactMatch().judge("the city of light", ["Paris", "City of Light"])
    assert verdict.score == 1.0 and verdict.correct and verdict.judge == "em"
    assert verdict.detail["best_reference"] == "City of Light"


@pytest.mark.parametrize("judge_cls", list(JUDGES.values()))
def test_empty_reference_list_scores_zero(judge_cls) -> None:
    verdict = judge_cls().judge("Paris", [])
    assert verdict.score == 0.0 and not verdict.correct and verdict.error is None
    assert "no reference" in verdict.detail["reason"]


def test_bare_string_reference_is_one_reference() -> None:
    assert ExactMatch().judge("Paris", "Paris").correct


async def test_ajudge_matches_judge() -> None:
    for judge_cls in JUDGES.values():
        judge = judge_cls()
        assert isinstance(judge, Judge)
        assert await judge.ajudge("born in 1873", ["1873"]) == judge.judge("born in 1873", ["1873"])


def test_verdict_validates_score_and_serialises() -> None:
    with pytest.raises(ValueError):
        Verdict(1.5, True, "em", {})
    with pytest.raises(ValueError):
        Verdict(float("nan"), False, "em", {})
    verdict = ExactMatch().judge("Paris", ["paris"])
    assert json.loads(json.dumps(verdict.to_dict()))["score"] == 1.0


# --- FormatGate and CompositeJudge -------------------------------------------------------------------


async def test_format_gate_zeroes_on_format_errors() -> None:
    gate = FormatGate(ExactMatch())
    verdict = await gate.ajudge("Paris", ["Paris"], format_errors=["missing </answer>"])
    assert gate.name == "em+format" and verdict.judge == "em+format"
    assert verdict.score == 0.0 and not verdict.correct and verdict.error is None
    assert verdict.detail["format_errors"] == ["missing </answer>"]
    assert verdict.detail["inner"]["score"] == 1.0
    assert gate.judge("Paris", ["Paris"], format_errors=["x"]).score == 0.0


async def test_format_gate_passes_through_without_errors() -> None:
    gate = FormatGate(TokenF1())
    verdict = await gate.ajudge("Paris France", ["Paris"])
    assert verdict.score == pytest.approx(2 / 3) and verdict.judge == "f1+format"
    assert gate.judge("Paris France", ["Paris"]) == verdict


async def test_composite_reports_all_and_uses_primary() -> None:
    judge = CompositeJudge({"em": ExactMatch(), "f1": TokenF1(), "cover_em": CoverExactMatch()}, primary="f1")
    verdict = await judge.ajudge("born in 1873", ["1873"])
    assert verdict.score == pytest.approx(0.5) and not verdict.correct
    assert verdict.detail["primary"] == "f1"
    assert verdict.detail["scores"] == {"em": 0.0, "f1": pytest.approx(0.5), "cover_em": 1.0}
    assert verdict.detail["correct"] == {"em": False, "f1": False, "cover_em": True}
    assert verdict.detail["errors"] == {}
    assert judge.judge("born in 1873", ["1873"]) == verdict


async def test_composite_propagates_primary_failure_only() -> None:
    failed = Verdict(0.0, False, "llm", {}, error="no parseable verdict")
    primary_failed = CompositeJudge({"llm": FixedJudge("llm", failed), "em": ExactMatch()}, primary="llm")
    verdict = await primary_failed.ajudge("Paris", ["Paris"])
    assert verdict.error == "no parseable verdict"
    assert verdict.detail["scores"]["em"] == 1.0
    secondary_raised = CompositeJudge(
        {"em": ExactMatch(), "llm": FixedJudge("llm", exc=TimeoutError("slow"))}, primary="em"
    )
    verdict = await secondary_raised.ajudge("Paris", ["Paris"])
    assert verdict.error is None and verdict.correct
    assert "TimeoutError" in verdict.detail["errors"]["llm"]


def test_composite_sync_runs_async_only_judges() -> None:
    ok = Verdict(1.0, True, "llm", {})
    judge = CompositeJudge({"em": ExactMatch(), "llm": FixedJudge("llm", ok)}, primary="llm")
    verdict = judge.judge("Lyon", ["Paris"])
    assert verdict.correct and verdict.detail["scores"] == {"em": 0.0, "llm": 1.0}


def test_composite_rejects_unknown_primary() -> None:
    with pytest.raises(ValueError, match="primary"):
        CompositeJudge({"em": ExactMatch()}, primary="f1")


# --- make_judge --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "cls"), [("em", ExactMatch), ("f1", TokenF1), ("cover_em", CoverExactMatch), (" F1 ", TokenF1)]
)
def test_make_judge_single(spec: str, cls: type) -> None:
    assert isinstance(make_judge(spec), cls)


def test_make_judge_composite_and_format() -> None:
    judge = make_judge("em,f1")
    assert isinstance(judge, CompositeJudge) and judge.primary == "em" and judge.name == "em,f1"
    gated = make_judge("f1+format")
    assert isinstance(gated, FormatGate) and gated.name == "f1+format"
    assert make_judge(gated.name).name == "f1+format"


def test_make_judge_passes_objects_through() -> None:
    judge = FixedJudge("llm", Verdict(1.0, True, "llm", {}))
    assert make_judge(judge) is judge
    with pytest.raises(TypeError):
        make_judge(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("spec", ["bleu", "em,rouge", "", " , "])
def test_make_judge_unknown_lists_valid_names(spec: str) -> None:
    with pytest.raises(ValueError, match="em"):
        make_judge(spec)


def test_make_judge_llm_needs_a_chat_model_and_uses_it() -> None:
    with pytest.raises(ValueError, match="needs a chat model"):
        make_judge("llm")

    class Always:
        async def achat(self, messages, **sampling):
            return '{"rationale": "same", "judgement": "Correct"}'

    judge = make_judge("em,llm", chat=Always())
    verdict = judge.judge("Lyon", ["Paris"], question="Capital of France?")
    assert verdict.score == 0.0 and verdict.detail["scores"] == {"em": 0.0, "llm": 1.0}


# --- hostile inputs ----------------------------------------------------------------------------------


def hostile_megabyte() -> str:
    """About 1 MB mixing control characters, emoji, CJK, RTL text and unbalanced tags."""
    chunk = "\x00\x07\x1b[31m<answer>Paris</think>😀👩‍👩‍👧北京大学 東京タワー 서울\u202eعربى\ufeff\U0010ffff \ud800"
    return chunk * (1_000_000 // len(chunk))


@pytest.mark.parametrize("spec", ["em", "f1", "cover_em", "em,f1,cover_em", "f1+format"])
async def test_megabyte_input_does_not_raise(spec: str) -> None:
    big = hostile_megabyte()
    judge = make_judge(spec)
    verdict = await judge.ajudge(big, ["Paris", big[:1000], ""], format_errors=["too long"])
    assert 0.0 <= verdict.score <= 1.0
    assert len(json.dumps(verdict.to_dict())) < 100_000
    assert (await judge.ajudge("<answer>", [big])).score < 1.0
