"""A Gymnasium `Text` space for real language: any Unicode string within its length bounds.

Gymnasium's `Text` checks every character against a small charset (letters and digits by default),
so an observation with a space or a bracket would fall outside it. Search agents read and write
arbitrary Unicode, so `contains` here checks only type and length; `sample` draws from a mixed
charset (ASCII, punctuation, angle brackets, accented Latin, CJK, emoji) so random actions exercise
the parser the way a confused model would.

Flattened (and in `AsyncVectorEnv`'s shared memory) a string is its Unicode code points, padded with
`PAD`, so every string survives the round trip; `Text`'s charset-index form would garble or refuse it.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.spaces.utils import flatten, flatten_space, unflatten
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory

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


PAD = 0x110000  # one past the last code point: fills the unused tail of a flattened string


@flatten_space.register(UnicodeText)
def _flatten_space(space: UnicodeText) -> spaces.Box:
    return spaces.Box(low=0, high=PAD, shape=(space.max_length,), dtype=np.int32)


@flatten.register(UnicodeText)
def _flatten(space: UnicodeText, x: str) -> np.ndarray:  # type: ignore[misc]  # mypy: fallback's Space[T] is generic
    """The string's code points, then PAD up to max_length (the shared-memory writer uses this too)."""
    codes = np.frombuffer(x.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    if len(codes) > space.max_length:
        raise ValueError(f"a string of {len(codes)} characters does not fit {space!r}")
    out = np.full(space.max_length, PAD, dtype=np.int32)
    out[: len(codes)] = codes
    return out


@unflatten.register(UnicodeText)
def _unflatten(space: UnicodeText, x: np.ndarray) -> str:  # type: ignore[misc]  # as _flatten
    codes = np.asarray(x)
    return codes[codes < PAD].astype("<u4").tobytes().decode("utf-32-le", "surrogatepass")


class SharedTexts(Sequence):
    """The strings in a shared-memory buffer, decoded on every read; a deep copy is a tuple of them.

    AsyncVectorEnv reads its shared buffer once, at construction, and hands out (a deep copy of) that
    object after every step, as it does with numpy views for array spaces; a tuple would stay frozen at
    the buffer's initial contents.
    """

    def __init__(self, space: UnicodeText, rows: np.ndarray) -> None:
        self._space, self._rows = space, rows

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self))))
        return _unflatten(self._space, self._rows[i])

    def __deepcopy__(self, memo: dict) -> tuple[str, ...]:
        return tuple(self)

    def __repr__(self) -> str:
        return f"SharedTexts({tuple(self)!r})"


@create_shared_memory.register(UnicodeText)
def _create_shared_memory(space: UnicodeText, n: int = 1, ctx: Any = multiprocessing) -> Any:
    """n rows of max_length code points, all PAD: an unwritten row reads as the empty string."""
    memory = ctx.Array(np.dtype(np.int32).char, n * space.max_length)
    np.frombuffer(memory.get_obj(), dtype=np.int32)[:] = PAD
    return memory


@read_from_shared_memory.register(UnicodeText)
def _read_from_shared_memory(space: UnicodeText, shared_memory: Any, n: int = 1) -> SharedTexts:
    return SharedTexts(space, np.frombuffer(shared_memory.get_obj(), dtype=np.int32).reshape((n, space.max_length)))
