"""JSONL corpora of pages: our row form and Search-R1's, validated line by line with fixable errors."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

_FORMS_HINT = "each line needs id, title, url, text; or Search-R1's id, contents"


@dataclass(frozen=True)
class CorpusDoc:
    """One page of a corpus: a stable id, a title, a unique url, plain text and outgoing links."""

    id: str
    title: str
    url: str
    text: str
    links: tuple[str, ...] = ()


class CorpusError(ValueError):
    """A corpus line is malformed; the message names the file, the 1-based line and the fix."""


def read_corpus(path: str | os.PathLike) -> Iterator[CorpusDoc]:
    """Stream the docs of a JSONL corpus, rejecting bad rows and duplicate ids or urls."""
    name = os.fspath(path)
    seen_ids: set[str] = set()
    seen_urls: set[str] = set()
    for lineno, doc in _docs(name):
        _check_unique(name, lineno, "id", doc.id, seen_ids)
        _check_unique(name, lineno, "url", doc.url, seen_urls)
        yield doc


def _docs(name: str) -> Iterator[tuple[int, CorpusDoc]]:
    """Parse every non-blank line into a CorpusDoc, without the cross-row uniqueness checks."""
    with open(name, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            line = _decode(name, lineno, raw)
            if line.strip():
                yield lineno, _parse_line(name, lineno, line)


def _decode(name: str, lineno: int, raw: bytes) -> str:
    """Decode one line as UTF-8, tolerating a BOM at the start of the file."""
    try:
        return raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
    except UnicodeDecodeError as e:
        raise CorpusError(
            f"{name}:{lineno}: not valid UTF-8 ({e.reason} at byte {e.start}); save the file as UTF-8"
        ) from None


def _parse_line(name: str, lineno: int, line: str) -> CorpusDoc:
    """Turn one JSON line into a CorpusDoc, prefixing any problem with file:line."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise CorpusError(
            f"{name}:{lineno}: invalid JSON ({e.msg} at column {e.colno}); each line must be one JSON object"
        ) from None
    try:
        return _doc_from_row(row)
    except ValueError as e:
        raise CorpusError(f"{name}:{lineno}: {e}") from None


def _doc_from_row(row: Any) -> CorpusDoc:
    """Build a CorpusDoc from our row form or Search-R1's `contents` form; ValueError says what to fix."""
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__} ({_FORMS_HINT})")
    doc_id = _id_of(row)
    if "text" in row:
        title, text = _str_field(row, "title", required=True), _str_field(row, "text", required=True)
    elif "contents" in row:
        title, text = split_contents(_str_field(row, "contents", required=True))
        title = _str_field(row, "title", required=False) or title
    else:
        raise ValueError(f"missing field 'text' ({_FORMS_HINT})")
    url = _str_field(row, "url", required=False) or f"doc://{doc_id}"
    return CorpusDoc(id=doc_id, title=title, url=url, text=text, links=_links_of(row))


def _id_of(row: dict) -> str:
    """The row's id as a non-empty string; ints are accepted because Search-R1 corpora use them."""
    value = row.get("id")
    if value is None:
        raise ValueError(f"missing field 'id' ({_FORMS_HINT})")
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"field 'id' must be a string or integer, got {type(value).__name__}")
    doc_id = str(value)
    if not doc_id.strip():
        raise ValueError("field 'id' is empty; give every row a unique non-empty id")
    return doc_id


def _str_field(row: dict, key: str, *, required: bool) -> str:
    """A string field of the row ('' when optional and absent); wrong types raise ValueError."""
    value = row.get(key)
    if value is None:
        if required:
            raise ValueError(f"missing field '{key}' ({_FORMS_HINT})")
        return ""
    if not isinstance(value, str):
        raise ValueError(f"field '{key}' must be a string, got {type(value).__name__}")
    return value


def _links_of(row: dict) -> tuple[str, ...]:
    """The optional `links` list as a tuple of url strings."""
    links = row.get("links")
    if links is None:
        return ()
    if not isinstance(links, list) or not all(isinstance(link, str) for link in links):
        raise ValueError("field 'links' must be a list of url strings")
    return tuple(links)


def split_contents(contents: str) -> tuple[str, str]:
    """Split Search-R1's `"Title"\\ntext` into (title, text); no quoted first line means no title."""
    first, newline, rest = contents.partition("\n")
    if newline and len(first) >= 2 and first[0] == first[-1] == '"':
        return first[1:-1], rest
    return "", contents


def join_contents(title: str, text: str) -> str:
    """A page as Search-R1's `contents`: the quoted title, a newline, the text (split_contents inverts it)."""
    return f'"{title}"\n{text}' if title else text


def _check_unique(name: str, lineno: int, key: str, value: str, seen: set[str]) -> None:
    """Record value, or raise naming both lines if an earlier row already used it."""
    if value not in seen:
        seen.add(value)
        return
    first = _first_line_with(name, key, value)
    raise CorpusError(
        f"{name}:{lineno}: duplicate {key} {value!r} (first used on line {first}); every row needs a unique {key}"
    )


def _first_line_with(name: str, key: str, value: str) -> int:
    """Re-scan the file for the first line whose doc has this id or url (error path only, saves memory)."""
    return next(lineno for lineno, doc in _docs(name) if getattr(doc, key) == value)
