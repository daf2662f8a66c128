"""Answer normalisation shared by the judges and by whatever compares answers (SQuAD-style, CJK-aware)."""

from __future__ import annotations

import re
import string
import unicodedata

_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
_CJK = re.compile(
    "[\u1100-\u11ff\u3005-\u3007\u3040-\u30ff\u3130-\u318f\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
    "\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0002fa1f\U00030000-\U000323af]"
)
_YES_NO = {"true": "yes", "false": "no"}


class _CharTable(dict):
    """str.translate table, filled lazily per code point: drop ASCII and Unicode (P*) punctuation, optionally
    pad CJK."""

    def __init__(self, pad_cjk: bool) -> None:
        super().__init__()
        self.pad_cjk = pad_cjk

    def __missing__(self, code_point: int) -> int | str | None:
        """Classify an unseen code point once and cache the result."""
        char = chr(code_point)
        mapped: int | str | None
        if char in string.punctuation or unicodedata.category(char).startswith("P"):
            mapped = None
        elif self.pad_cjk and _CJK.match(char):
            mapped = f" {char} "
        else:
            mapped = code_point
        self[code_point] = mapped
        return mapped


_PUNCTUATION = _CharTable(pad_cjk=False)
_PUNCTUATION_AND_CJK = _CharTable(pad_cjk=True)


def _normalize(s: str, table: _CharTable) -> str:
    """Lower-case, translate with `table`, drop articles, collapse whitespace, map a bare true/false to yes/no."""
    text = " ".join(_ARTICLES.sub(" ", s.lower().translate(table)).split())
    return _YES_NO.get(text, text)


def normalize_answer(s: str) -> str:
    """SQuAD-style normalisation: lower-case, drop punctuation and articles, collapse whitespace;
    true/false -> yes/no."""
    return _normalize(s, _PUNCTUATION)


def answer_tokens(s: str) -> list[str]:
    """Normalised tokens, with each CJK character its own token since those scripts do not mark word boundaries."""
    return _normalize(s, _PUNCTUATION_AND_CJK).split()


def holds_answer(text: str, answers: tuple[str, ...] | list[str]) -> bool:
    """Whether a labelled answer appears, as whole words, in the normalised text."""
    padded = f" {normalize_answer(text)} "
    return any(f" {a} " in padded for a in (normalize_answer(x) for x in answers) if a)
