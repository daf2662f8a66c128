"""Directories being written before they are renamed into place, and the ones a dead writer left behind.

A writer holds an exclusive lock (flock) on `<partial>.lock` from before it creates `<partial>` until the rename;
the kernel drops the lock when the writer exits, however it exits (SIGKILL included). So a partial directory
whose lock is free was abandoned and can be removed, while one a live process (this one, another process, or
another host on a file system with working locks) is still writing is kept. A partial without a lock file (written
before the locks existed) is judged by the pid at the end of its name.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from searchgym.core.atomic_file import disk_error
from searchgym.core.file_lock import NO_LOCKS

log = logging.getLogger(__name__)
PATTERNS = (".partial-*", ".sharded-step-*")  # write_model_dir's and the sharded learner's staging directories
_PID = re.compile(r"^\.partial-.+-(\d+)$")  # write_model_dir's names end with the writer's pid


def lock_path(partial: Path) -> Path:
    return partial.with_name(partial.name + ".lock")


@contextlib.contextmanager
def writer_lock(partial: Path) -> Iterator[None]:
    """Hold `partial`'s lock while it is written; the lock file is removed after."""
    lock = lock_path(partial)
    lock.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:
            if e.errno not in NO_LOCKS:
                os.close(fd)
                raise
            os.close(fd)  # a file system without flock (Lustre without -o flock, NFS without lockd): the lock
            log.warning("%s: file locks are not supported here (%s); writing without one", lock.parent, e)
            try:  # file stays as a marker, and the pid in the partial's name tells a dead writer's partial apart
                yield
            finally:
                lock.unlink(missing_ok=True)
            return
        try:
            if os.fstat(fd).st_ino == os.stat(lock).st_ino:  # not a file a cleaner unlinked while we waited
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)
        os.close(fd)


@dataclass
class PartialWrite:
    """A partial directory being written, and what is being written into it now (for an error's message)."""

    path: Path
    doing: str


@contextlib.contextmanager
def partial_dir(final: Path, what: str) -> Iterator[PartialWrite]:
    """A fresh, locked `.partial-<name>-<pid>` beside `final` to write `what` into (and rename to `final`).

    On any failure the partial directory is removed, and an error the disk caused is raised as DiskWriteError
    naming the file (or the directory) and what was being written (`PartialWrite.doing`).
    """
    write = PartialWrite(final.parent / f".partial-{final.name}-{os.getpid()}", what)
    try:
        with writer_lock(write.path):
            try:
                shutil.rmtree(write.path, ignore_errors=True)
                write.path.mkdir()
                yield write
            except BaseException:
                shutil.rmtree(write.path, ignore_errors=True)
                raise
    except Exception as e:  # noqa: BLE001 -- re-raised, as DiskWriteError when the disk refused the write
        if (disk := disk_error(e, write.path, write.doing)) is not None:
            raise disk from e
        raise


def remove_stale(directory: str | os.PathLike) -> list[Path]:
    """Remove the partial directories under `directory` that no live writer holds (and their lock files).

    One that cannot be removed (a read-only disk, no permission) is logged and left: cleaning never stops a run.
    """
    directory, removed = Path(directory), list[Path]()
    if not directory.is_dir():
        return removed
    for path in sorted({p for pattern in PATTERNS for p in directory.glob(pattern)}):
        lone_lock = path.name.endswith(".lock")  # a writer killed between its rename and unlinking its lock
        partial = path.with_name(path.name[: -len(".lock")]) if lone_lock else path
        if lone_lock and partial.exists():
            continue  # judged with its directory
        try:
            with _claimed(partial) as free:  # a claimed lock file is unlinked on the way out
                if free and not lone_lock:
                    shutil.rmtree(partial) if partial.is_dir() else partial.unlink(missing_ok=True)
                    removed.append(partial)
        except OSError as e:
            log.warning("could not remove %s, left by an unfinished write: %s", partial, e)
    return removed


@contextlib.contextmanager
def _claimed(partial: Path) -> Iterator[bool]:
    """Whether no live writer holds `partial` (then its lock is held here, and its lock file removed after)."""
    lock = lock_path(partial)
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        match = _PID.match(partial.name)
        yield match is None or not pid_alive(int(match.group(1)))
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        except OSError as e:
            if e.errno not in NO_LOCKS:
                raise
            match = _PID.match(partial.name)  # no locks on this file system: only a dead writer's pid frees it
            yield match is not None and not pid_alive(int(match.group(1)))
            return
        try:
            yield True
        finally:
            lock.unlink(missing_ok=True)
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` exists on this host (this process counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
