"""Files replaced whole or not at all: a reader (or a run killed mid-write) sees the old file or the new one.

A write that fails because of the disk (full, read-only, no permission) raises DiskWriteError naming the cause
and the file, even where a serializer wrapped the OSError (torch's `unexpected pos 531072 vs 531024`,
safetensors' `I/O error: ... (os error 28)`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

# the errors that say the disk refused a write, and how a message names each
DISK_ERRORS = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EFBIG: "file too large",
}
_ERRNO_IN_TEXT = re.compile(r"\(os error (\d+)\)|\[Errno (\d+)\]")  # Rust's io::Error, Python's OSError text
LOW_SPACE_BYTES = 1 << 20  # a disk with less free is full for a writer whose error does not say why


class DiskWriteError(OSError):
    """A write the disk refused: `errno` says why, the message names the file and what was being written."""

    def __init__(self, message: str, code: int, path: str | os.PathLike):
        super().__init__(message)
        self.message, self.errno, self.filename = message, code, os.fspath(path)

    def __str__(self) -> str:
        return self.message


def disk_error(error: BaseException, path: str | os.PathLike, what: str) -> DiskWriteError | None:
    """The DiskWriteError behind `error`, raised while writing `what` to `path` (or the file the error names); None
    when the disk is not the cause.

    The cause is found in the exception chain (an OSError's errno, or an errno in a wrapping library's message),
    else by probing the file system under `path` (read-only mount, no free space, not writable).
    """
    if isinstance(error, DiskWriteError):
        return error
    code, detail = _chained_errno(error)
    if code is None and not any(isinstance(link, OSError) and link.errno for link in _chain(error)):
        code, detail = _probe(Path(path))  # nothing in the chain says why: ask the file system
    if code is None:
        return None
    named = getattr(_chained_oserror(error), "filename", None) or path
    return DiskWriteError(f"{DISK_ERRORS[code]} while writing {what} to {os.fspath(named)}: {detail}", code, named)


def _chained_oserror(error: BaseException) -> OSError | None:
    for link in _chain(error):
        if isinstance(link, OSError) and link.errno in DISK_ERRORS:
            return link
    return None


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ or link.__context__


def _chained_errno(error: BaseException) -> tuple[int | None, str]:
    """The disk errno an exception (or one it wraps) carries, as an attribute or in its text; with a description."""
    for link in _chain(error):
        if isinstance(link, OSError) and link.errno in DISK_ERRORS:
            return link.errno, os.strerror(link.errno)
        for match in _ERRNO_IN_TEXT.finditer(str(link)):
            code = int(match.group(1) or match.group(2))
            if code in DISK_ERRORS:
                return code, os.strerror(code)
    return None, ""


def _probe(path: Path) -> tuple[int | None, str]:
    """Why the file system under `path` refuses writes (read-only, full, not writable), if it does."""
    where = path if path.exists() else next((p for p in path.parents if p.exists()), path)
    try:
        stat = os.statvfs(where)
    except OSError:
        return None, ""
    if stat.f_flag & os.ST_RDONLY:
        return errno.EROFS, f"{os.strerror(errno.EROFS)} ({where} is mounted read-only)"
    free = (stat.f_bfree if os.geteuid() == 0 else stat.f_bavail) * stat.f_frsize
    if free < LOW_SPACE_BYTES:
        return errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({free} bytes free under {where})"
    directory = where if where.is_dir() else where.parent
    if not os.access(directory, os.W_OK):
        return errno.EACCES, f"{os.strerror(errno.EACCES)} ({directory} is not writable)"
    return None, ""


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
    except OSError as e:
        if (disk := disk_error(e, tmp, f"the new {path.name}")) is not None:
            raise disk from e
        raise
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Replace `path` with `text` atomically."""
    with atomic_open(path) as f:
        f.write(text)
