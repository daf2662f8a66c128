"""Files replaced whole or not at all: a reader (or a run killed mid-write) sees the old file or the new one."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike) -> Iterator[TextIO]:
    """Write text to a temporary file beside `path`; on success flush it to disk and rename it over `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Replace `path` with `text` atomically."""
    with atomic_open(path) as f:
        f.write(text)
