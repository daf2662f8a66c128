"""A user's source files, as converters and caches read them: lines decoded with errors that name the file and line,
and a stamp of the content a derived file came from, so a changed source is rebuilt, never served stale.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class SourceFileError(ValueError):
    """A source file that cannot be read as asked; the message names the file (and line) and the fix."""


def text_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """Each line of a UTF-8 text file (a leading BOM dropped) with its 1-based number; other encodings are refused
    naming the file and line, and a UTF-16 file (NUL bytes) by name."""
    name = os.fspath(path)
    with open(name, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if lineno == 1 and raw.startswith((b"\xff\xfe", b"\xfe\xff")):
                raise SourceFileError(f"{name}: the file is UTF-16 (it starts with a UTF-16 BOM); save it as UTF-8")
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise SourceFileError(
                    f"{name}:{lineno}: not valid UTF-8 ({e.reason} at byte {e.start}); save the file as UTF-8"
                ) from None
            if "\x00" in line:
                raise SourceFileError(f"{name}:{lineno}: holds NUL characters (UTF-16?); save the file as UTF-8")
            yield lineno, line


def json_lines(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """Each non-blank line of a JSONL file parsed, with its line number; bad text or JSON names the file and line."""
    for lineno, line in text_lines(path):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:
            why = f"{e.msg} at column {e.colno}" if isinstance(e, json.JSONDecodeError) else "nested too deeply"
            raise SourceFileError(f"{os.fspath(path)}:{lineno}: not JSON ({why})") from None


def read_json(path: str | os.PathLike, what: str) -> Any:
    """A whole JSON file (`what` it is, for the message); unreadable text or junk names the file."""
    text = "".join(line for _, line in text_lines(path))
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        where = f"{os.fspath(path)}:{e.lineno}" if isinstance(e, json.JSONDecodeError) else os.fspath(path)
        raise SourceFileError(f"{where}: {what} is not JSON ({getattr(e, 'msg', 'nested too deeply')})") from None


HASHED_BYTES = 64 << 20  # a source's files are hashed up to this many bytes in all; past it, size and mtime alone


def content_stamp(path: str | os.PathLike) -> str:
    """A short hex key of what `path` holds now: its resolved path and, for it (a file) or every file under it (a
    directory), the size, the mtime and (within the first HASHED_BYTES) the bytes: a replaced, edited or touched
    source gets a new stamp, even one rewritten at the same size within the clock's tick."""
    root = Path(path).resolve()
    digest = hashlib.sha256(str(root).encode())
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    budget = HASHED_BYTES
    for file in files:
        stat = file.stat()
        name = file.relative_to(root) if root.is_dir() else ""
        digest.update(f"\0{name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
        if stat.st_size <= budget:
            budget -= stat.st_size
            with open(file, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()[:16]


def path_stamp(path: str | os.PathLike) -> str:
    """A short hex key of `path`'s resolved location alone (what a source's derived files share across versions)."""
    return hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:12]
