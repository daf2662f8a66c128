"""Answer metrics equal to other projects' training rewards, so a searchgym run can claim their reward exactly.

searchgym's own F1/EM (`judges.py`) normalise more (Unicode punctuation, articles, true/false in any case);
these reproduce, on purpose, what the reference projects compute, written from their described behaviour
and checked row by row against scores those projects' own functions produced
(`tests/envs/fixtures/reference_scores.jsonl`):

- ASearcher's training reward (inclusionAI/ASearcher, `AReaL/ASearcher/utils/rewards.py`, F1 and EM; the
  `aug_answer` blend of `AReaL/ASearcher/utils/search_tool.py`): `asearcher_f1`, `asearcher_em`,
  `blend_aug`.
- Search-R1's `verl/utils/reward_score/qa_em.py` `em_check`: `searchr1_em`.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

_TO_SPACE = str.maketrans({p: " " for p in string.punctuation})
_DROP_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
_BOOL_WORDS = {"True": "yes", "False": "no"}  # exact spelling only: "true" or "TRUE" stay as they are
_CJK_DROPPED = frozenset("0123456789，。 ,.-")  # removed from a CJK answer's characters (digits come back as runs)
GOLD_WEIGHT, AUG_WEIGHT = 0.7, 0.3  # ASearcher: score = 0.7 * s + 0.3 * max(s, s_aug)


def _has_chinese(text: str) -> bool:
    """Whether text holds a CJK Unified Ideograph (U+4E00..U+9FFF); kana and Hangul do not count, as in ASearcher."""
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


def asearcher_normalize(text: str) -> str:
    """ASearcher's F1 normalisation: True/False -> yes/no (exact strings), ASCII punctuation -> spaces,
    whitespace collapsed, lower-cased. Articles and Unicode punctuation stay."""
    text = _BOOL_WORDS.get(text, text)
    return " ".join(text.translate(_TO_SPACE).split()).lower()


def _cjk_tokens(text: str) -> set[str]:
    """A CJK answer's tokens: its characters (less ASCII digits, separators and the CJK comma/full stop) plus each
    run of consecutive digits (any digit `str.isdigit` accepts) as one token."""
    runs: list[str] = []
    previous_digit = False
    for ch in text:
        if ch.isdigit():
            if previous_digit:
                runs[-1] += ch
            else:
                runs.append(ch)
        previous_digit = ch.isdigit()
    return {ch for ch in text if ch not in _CJK_DROPPED} | set(runs)


def asearcher_f1(prediction: str, gold: str) -> float:
    """F1 of the token *sets* of prediction and one gold, ASearcher-normalised; 0 when either set is empty.

    The prediction is stripped first (ASearcher strips the text it extracts from `<answer>`). A gold with a
    Chinese character puts both sides in character mode (`_cjk_tokens`); otherwise tokens are split on spaces."""
    pred, ref = asearcher_normalize(prediction.strip()), asearcher_normalize(gold)
    if _has_chinese(ref):
        pred_tokens, ref_tokens = _cjk_tokens(pred), _cjk_tokens(ref)
    else:
        pred_tokens, ref_tokens = set(pred.split()), set(ref.split())
    common = len(pred_tokens & ref_tokens)
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_normalize(text: str) -> str:
    """SQuAD's normalisation as Search-R1 and ASearcher's EM use it: lower-case, delete ASCII punctuation,
    articles a/an/the to spaces, whitespace collapsed."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_DROP_PUNCTUATION)).split())


def asearcher_em(prediction: str, gold: str) -> float:
    """ASearcher's EM: stripped prediction and gold, True/False -> yes/no, then equal after `squad_normalize`."""
    prediction = prediction.strip()
    return float(
        squad_normalize(_BOOL_WORDS.get(prediction, prediction)) == squad_normalize(_BOOL_WORDS.get(gold, gold))
    )


def searchr1_em(prediction: str, golds: Sequence[str]) -> float:
    """Search-R1's `em_check`: 1.0 when the `squad_normalize`d prediction equals some normalised gold."""
    pred = squad_normalize(prediction)
    return float(any(squad_normalize(gold) == pred for gold in golds))


def blend_aug(score: float, aug_score: float) -> float:
    """ASearcher's use of a task's `aug_answer`: 0.7 * score + 0.3 * max(score, aug_score), so augmented answers
    earn at most 0.3 and never lower a score."""
    return GOLD_WEIGHT * score + AUG_WEIGHT * max(score, aug_score)
