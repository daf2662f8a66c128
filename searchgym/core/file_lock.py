"""Exclusive locks between processes on one machine: parallel workers build a shared file once, and two runs never
work in one folder."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)
NO_LOCKS = (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP)  # flock's answers where a file system has no locks


@contextlib.contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """An exclusive inter-process lock on path for the block, so parallel workers build a shared thing once."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class FolderInUse(ValueError):
    """Another process holds the folder's run lock (a ValueError, so the CLI prints it as a clear error)."""


@contextlib.contextmanager
def sole_run(folder: str | os.PathLike, what: str) -> Iterator[None]:
    """Hold `folder`'s run lock (FOLDER/.lock, with this pid and `what`) for the block; while another process holds
    it, refuse at once, naming it, so a second run never clears or rewrites what the first is writing. The lock dies
    with its process, so a killed run leaves nothing to clean up."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            pid, _, holder = handle.read().strip().partition(" ")
            raise FolderInUse(
                f"{folder} is in use by another {holder or 'run'} (pid {pid or 'unknown'}); wait for it to finish or "
                f"stop it (a stopped run goes on from its finished units when rerun), or give this {what} another "
                "out_dir"
            ) from None
        except OSError as e:
            if e.errno not in NO_LOCKS:
                raise
            log.warning("%s: file locks are not supported here (%s); running without the folder's lock", folder, e)
            yield
            return
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()} {what}\n")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_holder(folder: str | os.PathLike) -> str | None:
    """ "PID WHAT" of the process holding `folder`'s run lock (`sole_run`), or None when no process holds it."""
    lock = Path(folder) / ".lock"
    try:
        handle = open(lock)
    except OSError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return handle.read().strip() or "unknown"
        except OSError as e:  # no locks on this file system: no holder can be known
            if e.errno not in NO_LOCKS:
                raise
            return None
        fcntl.flock(handle, fcntl.LOCK_UN)
        return None
