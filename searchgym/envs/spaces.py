"""A Gymnasium `Text` space for real language: any Unicode string within its length bounds.

Gymnasium's `Text` checks every character against a small charset (letters and digits by default),
so an observation with a space or a bracket would fall outside it. Search agents read and write
arbitrary Unicode, so `contains` here checks only type and length; `sample` draws from a mixed
charset (ASCII, punctuation, angle brackets, accented Latin, CJK, emoji) so random actions exercise
the parser the way a confused model would.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

_SAMPLE_CHARSET = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    " \n\t.,;:!?'\"()[]{}<>/\\-_=+*&%$#@~|"
    "éüßçñøåÆœ"
    "北京大学東京한국어"
    "😀🚀🔍"
)


class UnicodeText(spaces.Text):
    """Text space accepting any `str` with `min_length <= len(s) <= max_length`."""

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | np.random.Generator | None = None):
        super().__init__(max_length=max_length, min_length=min_length, charset=_SAMPLE_CHARSET, seed=seed)
        self._sample_chars = np.array(sorted(set(_SAMPLE_CHARSET)))  # sorted: str hashing is salted per process

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random string; lengths are drawn up to min(max_length, 512) to keep checks fast."""
        if mask is not None or probability is not None:
            return super().sample(mask=mask, probability=probability)
        high = max(self.min_length, min(self.max_length, 512))
        length = int(self.np_random.integers(self.min_length, high + 1))
        chars = self.np_random.choice(self._sample_chars, size=length)
        return "".join(chars.tolist())

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )
