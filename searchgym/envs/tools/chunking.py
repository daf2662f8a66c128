"""Split page text into bounded chunks at natural breaks, losing and adding nothing."""

from __future__ import annotations

import re

# Cut points in order of preference; a cut falls at the end of a match.
_BREAKS = (
    re.compile(r"\n[^\S\n]*\n\s*"),  # paragraph break
    re.compile(r"\n\s*"),  # line break
    re.compile(r"[.!?][\"')\]\u2019\u201d]*\s+"),  # sentence end
    re.compile(r"\s+"),  # any whitespace
)
_SEARCH_FRACTION = 0.2  # look for a break only in the last 20% of the window, so chunks stay near full


def chunk_text(text: str, chunk_chars: int) -> list[str]:
    """Chunks of at most chunk_chars characters whose concatenation is exactly text; [''] for ''."""
    if chunk_chars < 1:
        raise ValueError(f"chunk_chars must be >= 1, got {chunk_chars}")
    chunks: list[str] = []
    start = 0
    while len(text) - start > chunk_chars:
        end = _cut(text, start, start + chunk_chars)
        chunks.append(text[start:end])
        start = end
    chunks.append(text[start:])
    return chunks


def _cut(text: str, start: int, limit: int) -> int:
    """Where to end the chunk starting at start: the best break ending in the window's tail, else limit."""
    earliest = max(start + 1, limit - int((limit - start) * _SEARCH_FRACTION))
    for pattern in _BREAKS:
        end = _last_match_end(pattern, text, start, limit)
        if end >= earliest:
            return end
    return limit


def _last_match_end(pattern: re.Pattern[str], text: str, pos: int, endpos: int) -> int:
    """End of the last match of pattern within text[pos:endpos], or -1 if none."""
    end = -1
    for match in pattern.finditer(text, pos, endpos):
        end = match.end()
    return end
