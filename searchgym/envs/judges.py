"""Answer judges: score an agent's final answer against a task's reference answers (aliases included)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from searchgym.core.llm_calls import ChatModel
from searchgym.envs import reference_metrics as ref
from searchgym.envs.answer_text import answer_tokens, normalize_answer
from searchgym.envs.llm_judge import LLMJudge
from searchgym.envs.verdicts import Judge, Verdict

__all__ = [
    "ASearcherEM",
    "ASearcherF1",
    "CompositeJudge",
    "CoverExactMatch",
    "ExactMatch",
    "FormatGate",
    "Judge",
    "LLMJudge",
    "SearchR1EM",
    "TokenF1",
    "Verdict",
    "answer_tokens",
    "aug_kwargs",
    "cover_exact_match",
    "exact_match",
    "make_judge",
    "normalize_answer",
    "token_f1",
]

MAX_DETAIL_CHARS = 1000


def _em(pred: list[str], ref: list[str]) -> float:
    """Exact match on token sequences."""
    return float(pred == ref)


def _f1(pred: list[str], ref: list[str]) -> float:
    """SQuAD token F1 as 2*overlap/(|pred|+|ref|), the harmonic mean of precision and recall, exact when equal."""
    if not pred or not ref:
        return float(pred == ref)
    overlap = sum((Counter(pred) & Counter(ref)).values())
    return 2 * overlap / (len(pred) + len(ref))


def _cover(pred: list[str], ref: list[str]) -> float:
    """Whether ref occurs as a contiguous token run in pred; an empty reference never covers."""
    if not ref:
        return 0.0
    return float(f" {' '.join(ref)} " in f" {' '.join(pred)} ")


def exact_match(prediction: str, reference: str) -> float:
    """1.0 if the normalised answers are identical, else 0.0."""
    return _em(answer_tokens(prediction), answer_tokens(reference))


def token_f1(prediction: str, reference: str) -> float:
    """SQuAD token-overlap F1 in [0, 1]; both empty -> 1.0, one empty -> 0.0."""
    return _f1(answer_tokens(prediction), answer_tokens(reference))


def cover_exact_match(prediction: str, reference: str) -> float:
    """1.0 if the normalised reference occurs in the normalised prediction on token boundaries."""
    return _cover(answer_tokens(prediction), answer_tokens(reference))


def _clip(text: str) -> str:
    """Bound evidence strings so a huge untrusted answer cannot bloat logs."""
    return text if len(text) <= MAX_DETAIL_CHARS else text[:MAX_DETAIL_CHARS] + f"...[{len(text)} chars]"


def _as_references(references: Sequence[str]) -> list[str]:
    """Accept a bare string as a single reference rather than iterating its characters."""
    return [references] if isinstance(references, str) else list(references)


class _MaxOverReferences:
    """Base for string-metric judges: the score is the metric's maximum over all references."""

    name: str
    metric: staticmethod

    def judge(
        self, prediction: str, references: Sequence[str], *, question: str = "", format_errors: Sequence[str] = ()
    ) -> Verdict:
        """Score the prediction against every reference and keep the best."""
        refs = _as_references(references)
        pred = answer_tokens(prediction)
        if not refs:
            detail = {"reason": "no reference answers", "normalized_prediction": _clip(" ".join(pred))}
            return Verdict(0.0, False, self.name, detail)
        ref_tokens = [answer_tokens(r) for r in refs]
        scores = [self.metric(pred, r) for r in ref_tokens]
        best = max(range(len(refs)), key=scores.__getitem__)
        detail = {
            "best_reference": refs[best],
            "normalized_reference": _clip(" ".join(ref_tokens[best])),
            "normalized_prediction": _clip(" ".join(pred)),
        }
        return Verdict(scores[best], self._correct(scores[best], pred, ref_tokens), self.name, detail)

    async def ajudge(
        self, prediction: str, references: Sequence[str], *, question: str = "", format_errors: Sequence[str] = ()
    ) -> Verdict:
        """Async entry point; these metrics are cheap, so it just calls `judge`."""
        return self.judge(prediction, references, question=question, format_errors=format_errors)

    def _correct(self, score: float, pred: list[str], refs: list[list[str]]) -> bool:
        """Binary call: a perfect score."""
        return score == 1.0


class ExactMatch(_MaxOverReferences):
    """Exact match after normalisation, against any reference."""

    name = "em"
    metric = staticmethod(_em)


class TokenF1(_MaxOverReferences):
    """Token F1 reward; counted correct only on an exact match, so partial overlap earns reward but not credit."""

    name = "f1"
    metric = staticmethod(_f1)

    def _correct(self, score: float, pred: list[str], refs: list[list[str]]) -> bool:
        """Correct iff the prediction exactly matches some reference."""
        return any(_em(pred, r) for r in refs)


class CoverExactMatch(_MaxOverReferences):
    """Cover-EM: some normalised reference appears within the normalised prediction."""

    name = "cover_em"
    metric = staticmethod(_cover)


def aug_kwargs(judge: Judge, aug_references: Sequence[str]) -> dict[str, Any]:
    """`{"aug_references": [...]}` for a judge that blends a task's augmented answers (`uses_aug_references`),
    else `{}`: other judges, user judges included, keep the plain `Judge` call."""
    if aug_references and getattr(judge, "uses_aug_references", False):
        return {"aug_references": _as_references(aug_references)}
    return {}


class _ReferenceJudge:
    """Base for judges equal to another project's reward function (`reference_metrics`): the max over the golds,
    blended with a task's `aug_answer` list the way ASearcher does when `uses_aug_references`."""

    name: str
    uses_aug_references = False

    def score(self, prediction: str, gold: str) -> float:
        """The metric against one gold."""
        raise NotImplementedError

    def judge(
        self,
        prediction: str,
        references: Sequence[str],
        *,
        question: str = "",
        format_errors: Sequence[str] = (),
        aug_references: Sequence[str] = (),
    ) -> Verdict:
        """Max over references (0 with none), blended with the max over `aug_references` when there are any;
        correct iff some reference alone scores 1."""
        refs = _as_references(references)
        scores = [self.score(prediction, r) for r in refs]
        base = max(scores, default=0.0)
        detail: dict[str, Any] = {"best_reference": refs[scores.index(base)] if refs else None, "gold_score": base}
        if not refs:
            detail["reason"] = "no reference answers"
        total = base
        if self.uses_aug_references and aug_references:
            augs = _as_references(aug_references)
            aug = max(self.score(prediction, a) for a in augs)
            total = ref.blend_aug(base, aug)
            detail.update(aug_score=aug, aug_references=[_clip(a) for a in augs])
        return Verdict(min(total, 1.0), base == 1.0, self.name, detail)

    async def ajudge(
        self,
        prediction: str,
        references: Sequence[str],
        *,
        question: str = "",
        format_errors: Sequence[str] = (),
        aug_references: Sequence[str] = (),
    ) -> Verdict:
        """Async entry point; the metric is cheap, so it just calls `judge`."""
        return self.judge(
            prediction, references, question=question, format_errors=format_errors, aug_references=aug_references
        )


class ASearcherF1(_ReferenceJudge):
    """ASearcher's training reward (`AReaL/ASearcher/utils/rewards.py` F1): set-token F1, ASCII punctuation to
    spaces, articles kept, True/False -> yes/no, Chinese golds by characters; `aug_answer` blended."""

    name = "asearcher_f1"
    uses_aug_references = True

    def score(self, prediction: str, gold: str) -> float:
        """ASearcher F1 against one gold."""
        return ref.asearcher_f1(prediction, gold)


class ASearcherEM(_ReferenceJudge):
    """ASearcher's EM reward (`AReaL/ASearcher/utils/rewards.py`): SQuAD normalisation after True/False -> yes/no;
    `aug_answer` blended."""

    name = "asearcher_em"
    uses_aug_references = True

    def score(self, prediction: str, gold: str) -> float:
        """ASearcher EM against one gold."""
        return ref.asearcher_em(prediction, gold)


class SearchR1EM(_ReferenceJudge):
    """Search-R1's reward (`verl/utils/reward_score/qa_em.py` `em_check`): SQuAD normalisation with ASCII punctuation
    only, equality with any gold. Search-R1 has no augmented answers, so they are ignored."""

    name = "searchr1_em"

    def score(self, prediction: str, gold: str) -> float:
        """Search-R1 EM against one gold."""
        return ref.searchr1_em(prediction, [gold])


def _run_sync(
    judge: Judge,
    prediction: str,
    references: Sequence[str],
    question: str,
    format_errors: Sequence[str],
    aug_references: Sequence[str] = (),
) -> Verdict:
    """Call a judge synchronously, falling back to its async method for async-only judges."""
    extra = aug_kwargs(judge, aug_references)
    sync = getattr(judge, "judge", None)
    if sync is not None:
        return sync(prediction, references, question=question, format_errors=format_errors, **extra)
    return asyncio.run(judge.ajudge(prediction, references, question=question, format_errors=format_errors, **extra))


class FormatGate:
    """Zero the reward when the answer broke the output format, while recording what the content would have scored."""

    def __init__(self, inner: Judge) -> None:
        self.inner = inner
        self.name = f"{inner.name}+format"
        self.uses_aug_references = bool(getattr(inner, "uses_aug_references", False))

    def judge(
        self,
        prediction: str,
        references: Sequence[str],
        *,
        question: str = "",
        format_errors: Sequence[str] = (),
        aug_references: Sequence[str] = (),
    ) -> Verdict:
        """Sync form of `ajudge`."""
        return self._gate(_run_sync(self.inner, prediction, references, question, (), aug_references), format_errors)

    async def ajudge(
        self,
        prediction: str,
        references: Sequence[str],
        *,
        question: str = "",
        format_errors: Sequence[str] = (),
        aug_references: Sequence[str] = (),
    ) -> Verdict:
        """Judge the content with the inner judge, then apply the format gate."""
        inner = await self.inner.ajudge(
            prediction, references, question=question, **aug_kwargs(self.inner, aug_references)
        )
        return self._gate(inner, format_errors)

    def _gate(self, inner: Verdict, format_errors: Sequence[str]) -> Verdict:
        """Pass the inner verdict through, or zero it when there are format errors."""
        if not format_errors:
            return replace(inner, judge=self.name)
        detail = {"format_errors": list(format_errors), "inner": inner.to_dict()}
        return Verdict(0.0, False, self.name, detail)


def _failure(name: str, exc: BaseException) -> Verdict:
    """Verdict for a sub-judge that raised, so one broken judge does not sink a composite."""
    return Verdict(0.0, False, name, {}, error=f"{type(exc).__name__}: {exc}")


class CompositeJudge:
    """Run several judges on one answer; the primary decides the reward, the rest are logged alongside."""

    def __init__(self, judges: Mapping[str, Judge], primary: str) -> None:
        if primary not in judges:
            raise ValueError(f"primary judge {primary!r} is not among {list(judges)}")
        self.judges = dict(judges)
        self.primary = primary
        self.name = ",".join(self.judges)
        self.uses_aug_references = any(getattr(j, "uses_aug_references", False) for j in self.judges.values())

    def judge(
        self,
        prediction: str,
        references: Sequence[str],
        *,
        question: str = "",
        format_errors: Sequence[str] = (),
        aug_references: Sequence[str] = (),
    ) -> Verdict:
        """Run every judge synchronously and combine."""
        verdicts = {}
        for name, judge in self.judges.items():
            try:
                verdicts[name] = _run_sync(judge, prediction, references, question, format_errors, aug_references)
            except Exception as exc:  # noqa: BLE001 - recorded as that judge's failure
                verdicts[name] = _failure(name, exc)
        return self._combine(verdicts)

    async def ajudge(
        self,
        prediction: str,
        references: Sequence[str],
        *,
        question: str = "",
        format_errors: Sequence[str] = (),
        aug_references: Sequence[str] = (),
    ) -> Verdict:
        """Run every judge concurrently (LLM judges are slow) and combine."""
        return self._combine(
            await self.averdicts(
                prediction, references, question=question, format_errors=format_errors, aug_references=aug_references
            )
        )

    async def averdicts(
        self,
        prediction: str,
        references: Sequence[str],
        *,
        question: str = "",
        format_errors: Sequence[str] = (),
        aug_references: Sequence[str] = (),
    ) -> dict[str, Verdict]:
        """Every judge's own verdict by name; a judge that raised gets a failure verdict (`error` set). Judges that
        blend augmented answers get `aug_references`; the others are called as plain `Judge`s."""
        calls = [
            j.ajudge(
                prediction, references, question=question, format_errors=format_errors, **aug_kwargs(j, aug_references)
            )
            for j in self.judges.values()
        ]
        results = await asyncio.gather(*calls, return_exceptions=True)
        return {
            name: _failure(name, r) if isinstance(r, BaseException) else r
            for name, r in zip(self.judges, results, strict=True)
        }

    def _combine(self, verdicts: dict[str, Verdict]) -> Verdict:
        """Primary's score and call, with every judge's scores, calls, errors and details as evidence."""
        main = verdicts[self.primary]
        detail = {
            "primary": self.primary,
            "scores": {n: v.score for n, v in verdicts.items()},
            "correct": {n: v.correct for n, v in verdicts.items()},
            "errors": {n: v.error for n, v in verdicts.items() if v.error is not None},
            "details": {n: v.detail for n, v in verdicts.items()},
        }
        return Verdict(main.score, main.correct, self.name, detail, error=main.error)


_JUDGES: dict[str, Callable[[], Judge]] = {
    "em": ExactMatch,
    "f1": TokenF1,
    "cover_em": CoverExactMatch,
    "asearcher_f1": ASearcherF1,
    "asearcher_em": ASearcherEM,
    "searchr1_em": SearchR1EM,
}


def _named_judge(name: str, chat: ChatModel | None = None) -> Judge:
    """Build one judge from its name, optionally suffixed with '+format' for a FormatGate."""
    if name.endswith("+format"):
        return FormatGate(_named_judge(name.removesuffix("+format"), chat))
    if name == "llm":
        if chat is None:
            raise ValueError("the 'llm' judge needs a chat model (e.g. --judge-model openai:http://host/v1[:model])")
        return LLMJudge(chat)
    if name not in _JUDGES:
        valid = ", ".join([*_JUDGES, *(f"{n}+format" for n in _JUDGES)])
        raise ValueError(f"unknown judge {name!r}; valid names: {valid} (or comma lists of them)")
    return _JUDGES[name]()


def make_judge(spec: str | Judge, chat: ChatModel | None = None) -> Judge:
    """Build a judge from a name ('em', 'f1', 'cover_em', 'asearcher_f1', 'asearcher_em', 'searchr1_em', 'llm',
    'f1+format') or comma list (first is primary),
    or pass one through; `chat` is the model behind 'llm'."""
    if not isinstance(spec, str):
        if not isinstance(spec, Judge):
            raise TypeError(f"expected a judge name or an object with `name` and `ajudge`, got {type(spec).__name__}")
        return spec
    names = list(dict.fromkeys(n.strip().lower() for n in spec.split(",") if n.strip()))
    if not names:
        raise ValueError(f"empty judge spec {spec!r}; valid names: {', '.join(_JUDGES)}")
    judges = {name: _named_judge(name, chat) for name in names}
    return judges[names[0]] if len(judges) == 1 else CompositeJudge(judges, primary=names[0])
