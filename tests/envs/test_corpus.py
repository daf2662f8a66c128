"""read_corpus: both row forms, and a fixable file:line error for every malformed row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchgym.envs.tools.corpus import CorpusDoc, CorpusError, read_corpus


def _write(tmp_path: Path, lines: list[str], *, bom: bool = False) -> Path:
    """Write raw lines to corpus.jsonl and return its path."""
    path = tmp_path / "corpus.jsonl"
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + ("\n".join(lines) + "\n").encode())
    return path


def _rows(tmp_path: Path, *rows: object) -> Path:
    """Write JSON rows to corpus.jsonl and return its path."""
    return _write(tmp_path, [json.dumps(row) for row in rows])


def test_our_form_with_links(tmp_path: Path) -> None:
    path = _rows(tmp_path, {"id": "a", "title": "A", "url": "https://x/a", "text": "alpha", "links": ["https://x/b"]})
    assert list(read_corpus(path)) == [CorpusDoc("a", "A", "https://x/a", "alpha", ("https://x/b",))]


def test_missing_url_defaults_to_doc_scheme_and_int_id_is_str(tmp_path: Path) -> None:
    (doc,) = read_corpus(_rows(tmp_path, {"id": 7, "title": "Seven", "text": "seven"}))
    assert doc.id == "7" and doc.url == "doc://7" and doc.links == ()


def test_search_r1_contents_row(tmp_path: Path) -> None:
    (doc,) = read_corpus(
        _rows(tmp_path, {"id": 3, "contents": '"Marie Curie"\nMarie Curie was a physicist.\nSecond line.'})
    )
    assert doc == CorpusDoc("3", "Marie Curie", "doc://3", "Marie Curie was a physicist.\nSecond line.")


def test_search_r1_row_with_url_and_title(tmp_path: Path) -> None:
    row = {"id": "9", "contents": '"Ignored"\nbody', "title": "Given", "url": "https://x/9"}
    (doc,) = read_corpus(_rows(tmp_path, row))
    assert (doc.title, doc.url, doc.text) == ("Given", "https://x/9", "body")


def test_search_r1_contents_without_quoted_title(tmp_path: Path) -> None:
    (doc,) = read_corpus(_rows(tmp_path, {"id": 1, "contents": "just text"}))
    assert (doc.title, doc.text) == ("", "just text")


def test_bom_and_blank_lines(tmp_path: Path) -> None:
    lines = [
        json.dumps({"id": "a", "title": "A", "text": "x"}),
        "",
        "   ",
        json.dumps({"id": "b", "title": "B", "text": "y"}),
    ]
    assert [d.id for d in read_corpus(_write(tmp_path, lines, bom=True))] == ["a", "b"]


def test_streams_lazily(tmp_path: Path) -> None:
    path = _write(tmp_path, [json.dumps({"id": "a", "title": "A", "text": "x"}), "{broken"])
    docs = read_corpus(path)
    assert next(docs).id == "a"
    with pytest.raises(CorpusError, match=r"corpus.jsonl:2:"):
        next(docs)


GOOD = json.dumps({"id": "ok", "title": "Ok", "text": "fine"})


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("{not json", r"invalid JSON"),
        ("[1, 2]", r"expected a JSON object, got list"),
        ('"a string"', r"expected a JSON object, got str"),
        (json.dumps({"title": "T", "text": "x"}), r"missing field 'id'"),
        (json.dumps({"id": "", "title": "T", "text": "x"}), r"field 'id' is empty"),
        (json.dumps({"id": "  ", "title": "T", "text": "x"}), r"field 'id' is empty"),
        (json.dumps({"id": 1.5, "title": "T", "text": "x"}), r"field 'id' must be a string or integer, got float"),
        (json.dumps({"id": True, "title": "T", "text": "x"}), r"field 'id' must be a string or integer, got bool"),
        (
            json.dumps({"id": "x", "title": "T"}),
            r"missing field 'text' \(each line needs id, title, url, text; or Search-R1's id, contents\)",
        ),
        (json.dumps({"id": "x", "title": "T", "text": None}), r"missing field 'text'"),
        (json.dumps({"id": "x", "text": "body"}), r"missing field 'title'"),
        (json.dumps({"id": "x", "title": "T", "text": 5}), r"field 'text' must be a string, got int"),
        (json.dumps({"id": "x", "title": ["T"], "text": "t"}), r"field 'title' must be a string, got list"),
        (json.dumps({"id": "x", "title": "T", "text": "t", "url": 3}), r"field 'url' must be a string, got int"),
        (
            json.dumps({"id": "x", "title": "T", "text": "t", "links": "u"}),
            r"field 'links' must be a list of url strings",
        ),
        (
            json.dumps({"id": "x", "title": "T", "text": "t", "links": [1]}),
            r"field 'links' must be a list of url strings",
        ),
        (json.dumps({"id": "x", "contents": 7}), r"field 'contents' must be a string, got int"),
    ],
)
def test_bad_row_names_file_and_line(tmp_path: Path, bad_line: str, message: str) -> None:
    path = _write(tmp_path, [GOOD, "", bad_line])
    with pytest.raises(CorpusError, match=r"corpus\.jsonl:3: " + message):
        list(read_corpus(path))


def test_invalid_utf8_names_line(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(GOOD.encode() + b"\n" + b'{"id": "\xff"}\n')
    with pytest.raises(CorpusError, match=r"corpus\.jsonl:2: not valid UTF-8"):
        list(read_corpus(path))


def test_duplicate_id_names_both_lines(tmp_path: Path) -> None:
    path = _rows(
        tmp_path,
        {"id": 1, "title": "A", "text": "a", "url": "u1"},
        {"id": 2, "title": "B", "text": "b"},
        {"id": "1", "title": "C", "text": "c", "url": "u3"},
    )
    with pytest.raises(CorpusError, match=r"corpus\.jsonl:3: duplicate id '1' \(first used on line 1\)"):
        list(read_corpus(path))


def test_duplicate_url_names_both_lines(tmp_path: Path) -> None:
    path = _rows(
        tmp_path,
        {"id": "a", "title": "A", "text": "a", "url": "https://x"},
        {"id": "b", "title": "B", "text": "b", "url": "https://x"},
    )
    with pytest.raises(CorpusError, match=r"corpus\.jsonl:2: duplicate url 'https://x' \(first used on line 1\)"):
        list(read_corpus(path))


def test_corpus_error_is_value_error() -> None:
    assert issubclass(CorpusError, ValueError)
