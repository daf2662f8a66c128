"""Generated token ids -> output text, by SGLang's rules (what its `/generate` and OpenAI routes return).

A matched stop token is dropped from the text and a matched stop string cut off (with the string
kept when `no_stop_trim`); special tokens are skipped unless asked otherwise. The token ids
themselves are never changed: only the text is. `StopStrings` finds stop strings while tokens
arrive, decoding each token once.
"""

from __future__ import annotations

from typing import Any

from searchgym.agents.engines.types import FinishReason


def output_text(
    tokenizer: Any,
    ids: list[int],
    finish: FinishReason,
    *,
    skip_special_tokens: bool = True,
    no_stop_trim: bool = False,
    spaces_between_special_tokens: bool = True,
) -> str:
    """The text SGLang returns for `ids` that ended with `finish`."""
    matched = finish.matched if finish.type == "stop" else None
    if isinstance(matched, int) and not no_stop_trim and ids:
        ids = ids[:-1]
    text = tokenizer.decode(
        ids, skip_special_tokens=skip_special_tokens, spaces_between_special_tokens=spaces_between_special_tokens
    )
    if isinstance(matched, str) and (pos := text.find(matched)) >= 0:
        text = text[: pos + len(matched)] if no_stop_trim else text[:pos]
    return text


class StopStrings:
    """Finds the first stop string a growing token sequence completes, decoding each new token once.

    Keeps the tokens since the last character boundary (plus the one token before them, as context for
    tokenizers whose decode depends on it) and the last `len(longest stop) - 1` committed characters: a
    newly completed stop string lies within that tail plus the new characters. Text whose last character
    is still incomplete (decoded as U+FFFD) is checked but not committed until the next token completes it.
    Matches what checking `stop in decode(last 4n+4 tokens)` after every token finds, at a constant cost
    per token instead of a decode of the whole window.
    """

    PENDING_LIMIT = 16  # tokens without a complete last character (or any text) before they are committed anyway

    def __init__(self, tokenizer: Any, stops: tuple[str, ...]):
        self.stops = tuple(stops)
        self._keep = max(map(len, self.stops), default=1) - 1
        self._decode = _raw_decoder(tokenizer)
        self._ids: list[int] = []  # context token(s), then the tokens not yet committed
        self._context_text = ""  # decode of the context tokens
        self._context = 0  # how many of _ids are context
        self._tail = ""  # the last `_keep` committed characters

    def push(self, token: int) -> str | None:
        """Add the next generated token; the stop string (first in `stops` order) it completes, or None."""
        self._ids.append(token)
        body = self._decode(self._ids)[len(self._context_text) :]
        pending = body.endswith("\ufffd") and len(self._ids) - self._context < self.PENDING_LIMIT
        window = self._tail + body
        match = next((stop for stop in self.stops if stop in window), None)
        if (not pending and body) or len(self._ids) - self._context >= self.PENDING_LIMIT:  # bounded work per token
            self._tail = window[-self._keep :] if self._keep else ""
            self._ids = self._ids[self._context :][-1:]
            self._context, self._context_text = 1, self._decode(self._ids)
        return match


def _raw_decoder(tokenizer: Any) -> Any:
    """`tokenizer.decode(ids, skip_special_tokens=False)`, through the Rust tokenizer when that is the same."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return lambda ids: backend.decode(ids, skip_special_tokens=False)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=False)
