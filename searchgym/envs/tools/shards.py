"""An index split into shards: for corpora past one machine's memory, or for more throughput.

`split_corpus` deals a corpus's documents to N shards by a stable hash of their url, so the shard that holds a
page is known from its url alone (`shard_of`); `searchgym index build --shards N` builds one index per shard
(`OUT/shard-00/`, ... with `shards.json`, which records the count and each shard's documents, and is checked against
the shard directories whenever it is read: an edited or half-replaced index is an error, never a silent loss of
shards).

Searching the shards as one is Ray Serve's (`searchgym serve ray-search --index OUT`, `serve/ray_search.py`): a
deployment per shard, their replicas placed, routed and replaced by Ray, and an ingress that merges each query's
hits by score and sends a page request to the shard its url hashes to. This module is only the layout it serves.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

from searchgym.core.atomic_file import write_atomic
from searchgym.envs.source_files import SourceFileError, read_json
from searchgym.envs.tools.corpus import read_corpus
from searchgym.envs.tools.index_files import MANIFEST

SHARDS_MANIFEST = "shards.json"
SHARD_DIR = re.compile(r"shard-\d{2,}")


def shard_of(url: str, shards: int) -> int:
    """The shard that holds `url`: a stable hash (the same in every process and on every machine)."""
    return int.from_bytes(hashlib.sha1(url.encode()).digest()[:8], "big") % shards


def shard_dir(root: str | os.PathLike, shard: int) -> Path:
    return Path(root) / f"shard-{shard:02d}"


def split_corpus(corpus: str | os.PathLike, out: str | os.PathLike, shards: int) -> list[Path]:
    """The corpus's documents dealt to `shards` corpus files (OUT/shard-NN/corpus.jsonl) by url; their paths."""
    if not (isinstance(shards, int) and shards >= 1):
        raise ValueError(f"shards must be a whole number >= 1, got {shards!r}")
    paths = [shard_dir(out, i) / "corpus.jsonl" for i in range(shards)]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
    files = [open(path.with_suffix(".jsonl.tmp"), "w", encoding="utf-8") for path in paths]
    try:
        for doc in read_corpus(corpus):
            row = {"id": doc.id, "title": doc.title, "url": doc.url, "text": doc.text, "links": list(doc.links)}
            files[shard_of(doc.url, shards)].write(json.dumps(row, ensure_ascii=False) + "\n")
    finally:
        for f in files:
            f.close()
    for path in paths:
        os.replace(path.with_suffix(".jsonl.tmp"), path)
    return paths


def build_shards(
    corpus: str | os.PathLike, out: str | os.PathLike, shards: int, *, threads: int = 1, progress: bool = False
) -> Path:
    """One BM25 index per shard (OUT/shard-NN/index) and OUT/shards.json naming them; OUT."""
    from searchgym.envs.tools.local_index import LocalIndex

    (Path(out) / SHARDS_MANIFEST).unlink(missing_ok=True)  # an earlier build's manifest no longer describes OUT
    for extra in shard_dirs(out)[shards:]:  # an earlier build's shards past this one's count
        shutil.rmtree(extra)
    docs = []
    for i, path in enumerate(split_corpus(corpus, out, shards)):
        LocalIndex.build(path, shard_dir(out, i) / "index", threads=threads, progress=progress)
        path.unlink()  # the index holds the documents; the split copy would double the disk
        docs.append(index_doc_count(shard_dir(out, i) / "index"))
    manifest = {"shards": shards, "split": "sha1(url) mod shards", "corpus": os.fspath(corpus), "shard_docs": docs}
    write_atomic(Path(out) / SHARDS_MANIFEST, json.dumps(manifest, indent=2) + "\n")
    return Path(out)


def shard_dirs(root: str | os.PathLike) -> list[Path]:
    """The `shard-NN` directories under `root`, in shard order."""
    return sorted((p for p in Path(root).glob("shard-*") if SHARD_DIR.fullmatch(p.name) and p.is_dir()), key=_number)


def _number(path: Path) -> int:
    return int(path.name.removeprefix("shard-"))


def index_doc_count(index_dir: Path) -> int | None:
    """The document count an index's manifest records (None: no readable manifest)."""
    try:
        count = read_json(index_dir / MANIFEST, "an index manifest").get("doc_count")
    except (OSError, ValueError, AttributeError):
        return None
    return count if isinstance(count, int) else None


def read_shards_manifest(root: str | os.PathLike) -> int:
    """The shard count of the sharded index at `root`, once `shards.json` is checked against the shard directories
    beside it (every shard there and complete, none extra, each holding the documents it recorded); a clear error
    naming the manifest when they disagree."""
    path = Path(root) / SHARDS_MANIFEST
    manifest = read_json(path, "a shards manifest")
    count = manifest.get("shards") if isinstance(manifest, dict) else None
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise SourceFileError(f"{path}: `shards` must be a whole number >= 1, got {str(count)[:80]}")
    rebuild = f"rebuild it with `searchgym index build --corpus FILE --out {root} --shards N`"
    found = [_number(p) for p in shard_dirs(root)]
    if found != list(range(count)):
        raise SourceFileError(
            f"{path} says {count} shard(s) but {root} holds shard directories {found or 'none'}; the manifest and the "
            f"shards disagree, so search would lose documents and pages would route to the wrong shard: {rebuild}"
        )
    recorded = manifest.get("shard_docs")
    if recorded is not None and (not isinstance(recorded, list) or len(recorded) != count):
        raise SourceFileError(f"{path}: `shard_docs` must list one document count per shard; {rebuild}")
    for i in range(count):
        index = shard_dir(root, i) / "index"
        docs = index_doc_count(index)
        if docs is None:
            raise SourceFileError(f"{path}: shard {i}'s index at {index} is missing or incomplete; {rebuild}")
        if recorded is not None and recorded[i] != docs:
            raise SourceFileError(
                f"{path}: shard {i} recorded {recorded[i]} documents but its index holds {docs}; {rebuild}"
            )
    return count


def is_sharded(path: str | os.PathLike) -> bool:
    """Whether `path` is a sharded index (it holds shards.json), not a plain one."""
    return (Path(path) / SHARDS_MANIFEST).is_file()
