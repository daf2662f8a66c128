"""chunk_text: lossless, bounded chunks that prefer natural breaks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchgym.envs.tools.chunking import chunk_text

# Text rich in the characters the splitter looks for, so every branch gets exercised.
_texty = st.text(alphabet=st.sampled_from(list("ab .!?\n\t\"')") + ["\u201d", "\u00e9", "\U0001f600"]), max_size=600)


@given(text=st.one_of(st.text(max_size=600), _texty), chunk_chars=st.integers(1, 120))
def test_invariants(text: str, chunk_chars: int) -> None:
    chunks = chunk_text(text, chunk_chars)
    assert "".join(chunks) == text
    assert all(len(chunk) <= chunk_chars for chunk in chunks)
    if text:
        assert all(chunks)
    else:
        assert chunks == [""]


@given(text=st.text(min_size=1, max_size=400), chunk_chars=st.integers(5, 50))
def test_chunks_are_near_full(text: str, chunk_chars: int) -> None:
    chunks = chunk_text(text, chunk_chars)
    assert all(len(chunk) >= chunk_chars - chunk_chars // 5 for chunk in chunks[:-1])


def test_empty_text() -> None:
    assert chunk_text("", 10) == [""]


def test_short_text_is_one_chunk() -> None:
    assert chunk_text("hello", 5) == ["hello"]


@pytest.mark.parametrize("chunk_chars", [0, -3])
def test_rejects_nonpositive_size(chunk_chars: int) -> None:
    with pytest.raises(ValueError, match="chunk_chars"):
        chunk_text("abc", chunk_chars)


def test_prefers_paragraph_break() -> None:
    text = "x" * 85 + ". yy\n\n" + "z" * 50
    assert chunk_text(text, 100)[0] == "x" * 85 + ". yy\n\n"


def test_prefers_line_break_over_sentence() -> None:
    text = "x" * 82 + "\nab. cd" + "z" * 50
    assert chunk_text(text, 100)[0] == "x" * 82 + "\n"


def test_prefers_sentence_end_over_space() -> None:
    text = "x" * 82 + '." ab cd ' + "z" * 50
    assert chunk_text(text, 100)[0] == "x" * 82 + '." '


def test_cuts_at_whitespace() -> None:
    assert chunk_text("aaaa bbbb cccc", 5) == ["aaaa ", "bbbb ", "cccc"]


def test_hard_cut_without_breaks() -> None:
    assert chunk_text("a" * 25, 10) == ["a" * 10, "a" * 10, "a" * 5]


def test_ignores_breaks_early_in_window() -> None:
    text = "ab\n\n" + "x" * 200
    assert chunk_text(text, 100)[0] == text[:100]
