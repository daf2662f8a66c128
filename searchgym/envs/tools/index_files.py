"""What every on-disk index shares: the manifest that marks it complete, the atomic build, and page lookup.

An index directory is complete when its manifest (`index.json`) exists: builders write everything
into a temporary directory beside the target, write the manifest last and rename the directory into
place, so a crashed or failed build never leaves a half-index where a good one was.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from searchgym.core.hashing import file_sha256
from searchgym.envs.tools.base import Page, PageNotFound
from searchgym.envs.tools.corpus import CorpusDoc

MANIFEST = "index.json"
FORMAT_VERSION = 1
MAX_K = 100  # the most hits any index returns for one query


def has_manifest(index_dir: str | os.PathLike) -> bool:
    """True when index_dir holds a finished index."""
    return (Path(index_dir) / MANIFEST).is_file()


def manifest_kind(manifest: dict[str, Any]) -> str:
    """ "bm25" or "dense" (manifests written before `kind` existed tell by their encoder)."""
    return str(manifest.get("kind") or ("dense" if "encoder" in manifest else "bm25"))


def corpus_fields(corpus: Path) -> dict[str, Any]:
    """The manifest fields that identify the corpus an index was built from."""
    return {
        "corpus_path": str(corpus.absolute()),
        "corpus_bytes": corpus.stat().st_size,
        "corpus_sha256": file_sha256(corpus),
    }


def write_manifest(index_dir: Path, kind: str, doc_count: int, **fields: Any) -> None:
    """Write index.json (call it last: its presence marks a complete index)."""
    manifest = {"format_version": FORMAT_VERSION, "kind": kind, "doc_count": doc_count, **fields}
    (index_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def read_manifest(index_dir: Path, kind: str, builder: str, *, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """The manifest of a complete index of this kind; a clear error when it is missing, old or another kind."""
    path = index_dir / MANIFEST
    what = "dense index" if kind == "dense" else "index"
    if not path.is_file():
        raise FileNotFoundError(
            f"no complete {what} at {index_dir} (missing {MANIFEST}); build one with {builder}(corpus, out_dir)"
        )
    manifest = json.loads(path.read_text())
    if manifest.get("format_version") != FORMAT_VERSION or any(key not in manifest for key in required):
        raise ValueError(
            f"{what} at {index_dir} has format {manifest.get('format_version')}, expected {FORMAT_VERSION}; rebuild it"
        )
    if manifest_kind(manifest) != kind:
        raise ValueError(
            f"{index_dir} holds a {manifest_kind(manifest)} index, not a {kind} one; open it with open_index"
        )
    return manifest


@contextlib.contextmanager
def atomic_build(out_dir: str | os.PathLike) -> Iterator[Path]:
    """A temporary directory beside out_dir to build into; renamed to out_dir when the block succeeds, removed if
    not. What a killed build left beside out_dir (its process gone) is removed first."""
    out = Path(out_dir).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-{os.getpid()}-", dir=out.parent))
    try:
        yield tmp
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


_LEFTOVER = re.compile(r"\.(?:building|old)-(?:(\d+)-)?[^/]*")
LEGACY_LEFTOVER_AGE = 3600.0  # seconds after which a leftover without its builder's pid (older versions) is removed


def remove_leftovers(out: Path) -> list[Path]:
    """Remove the `.NAME.building-PID-*` / `.NAME.old-PID-*` directories beside `out` whose process is gone (a
    build killed mid-way, SIGKILL included, leaves them); the ones removed."""
    removed = []
    for path in out.parent.glob(f".{glob.escape(out.name)}.*"):
        match = _LEFTOVER.fullmatch(path.name[len(out.name) + 1 :])
        if not match or not path.is_dir():
            continue
        if match.group(1) is None:
            stale = time.time() - path.stat().st_mtime > LEGACY_LEFTOVER_AGE
        else:
            stale = not process_alive(int(match.group(1)))
        if stale:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine (one of another user counts as running)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return pid > 0
    return True


def replace_dir(new: Path, target: Path) -> None:
    """Move new into target's place; an existing target is moved aside first and removed after."""
    if not target.exists():
        new.rename(target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-{os.getpid()}-", dir=target.parent))
    target.rename(old / "index")
    new.rename(target)
    shutil.rmtree(old, ignore_errors=True)


class PagesByUrl:
    """Page access for an index that stores its pages: by exact url, else by doc id (a PageBackend)."""

    def _lookup(self, field: str, value: str) -> CorpusDoc | None:
        """The stored doc whose `field` ("url" or "id") equals value exactly, or None."""
        raise NotImplementedError

    def get_page(self, url_or_id: str) -> Page:
        """The page with this exact url, else with this doc id; PageNotFound if neither exists."""
        key = url_or_id.strip()
        doc = (self._lookup("url", key) or self._lookup("id", key)) if key else None
        if doc is None:
            raise PageNotFound(
                f"unknown url {url_or_id!r}: there is no such page; access a url taken from search results"
            )
        return Page(url=doc.url, title=doc.title, text=doc.text, links=doc.links, doc_id=doc.id)

    async def fetch(self, url: str) -> Page:
        """PageBackend: the page at url (a doc id also works)."""
        return self.get_page(url)
