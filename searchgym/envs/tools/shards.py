"""An index split into shards, searched as one: for corpora past one machine's memory, or for more throughput.

`split_corpus` deals a corpus's documents to N shards by a stable hash of their url, so the shard that holds a
page is known from its url alone; `searchgym index build --shards N` builds one index per shard
(`OUT/shard-00/`, ... with `shards.json`, which records the count and each shard's documents, and is checked against
the shard directories on every open: an edited or half-replaced index is an error, never a silent loss of shards).
`ShardedSearch` searches every shard at once and merges their hits by score into one top-k, and sends each page
request to the shard that holds the url. The shards are any search backends: local indexes (`open_sharded`) or
retrieval servers, each shard a `RemoteSearch` over its replicas (health checks and failover among them are
RemoteSearch's).

BM25 scores from different shards are merged as they are: each shard computes IDF over its own documents, which
for a hash split of a large corpus is close to the whole corpus's (the usual trade of sharded BM25; the merged
ranking can differ from one index's near ties). A shard that fails after its own retries fails the search
(BackendError naming it): a search that silently lost a shard's documents would be a wrong result. So does a
shard whose scores are not finite numbers: a NaN would sort anywhere and an inf would take the whole top-k.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchgym.core.atomic_file import write_atomic
from searchgym.envs.source_files import SourceFileError, read_json
from searchgym.envs.tools.base import BackendError, Page, SearchHit, backend_stats
from searchgym.envs.tools.corpus import read_corpus
from searchgym.envs.tools.index_files import MANIFEST

if TYPE_CHECKING:
    from searchgym.envs.tools.remote_search import RemoteOptions

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
    return (Path(path) / SHARDS_MANIFEST).is_file()


def open_sharded(path: str | os.PathLike) -> ShardedSearch:
    """The local shards `build_shards` wrote at `path`, searched as one index."""
    from searchgym.envs.tools.local_index import LocalIndex

    return ShardedSearch([LocalIndex(shard_dir(path, i) / "index") for i in range(read_shards_manifest(path))])


class ShardedSearch:
    """Search and pages over shards: every search fans out to all of them, a page goes to its url's shard."""

    def __init__(self, shards: Sequence[Any]) -> None:
        if not shards:
            raise ValueError("ShardedSearch needs at least one shard")
        self.shards = list(shards)

    @classmethod
    def remote(cls, servers: Sequence[Sequence[str]], options: RemoteOptions | None = None) -> ShardedSearch:
        """Shard i served by the retrieval servers `servers[i]` (its replicas, failed over by RemoteSearch)."""
        from searchgym.envs.tools.remote_search import RemoteSearch

        return cls([RemoteSearch(list(replicas), options) for replicas in servers])

    async def search(self, query: str, k: int) -> list[SearchHit]:
        """The top-k of every shard's top-k, by score (ties: lower shard first, then each shard's order)."""
        results = await asyncio.gather(*(shard.search(query, k) for shard in self.shards), return_exceptions=True)
        merged = []
        for i, result in enumerate(results):
            if isinstance(result, BaseException):
                if isinstance(result, (BackendError, TimeoutError, OSError)):
                    raise BackendError(f"shard {i} of {len(self.shards)} failed: {result}") from result
                raise result
            if not all(isinstance(hit.score, (int, float)) and math.isfinite(hit.score) for hit in result):
                raise BackendError(f"shard {i} of {len(self.shards)} failed: it sent a score that is not finite")
            merged += [(-hit.score, i, rank, hit) for rank, hit in enumerate(result)]
        merged.sort(key=lambda item: item[:3])
        return [hit for *_, hit in merged[:k]]

    async def fetch(self, url: str) -> Page:
        """The page from the shard its url hashes to (PageNotFound from there when no shard has it)."""
        return await self.shards[shard_of(url, len(self.shards))].fetch(url)

    def stats(self) -> dict[str, Any]:
        return {
            "shards": len(self.shards),
            **{f"shard_{i}": backend_stats(s) for i, s in enumerate(self.shards) if backend_stats(s)},
        }

    async def close(self) -> None:
        for shard in self.shards:
            close = getattr(shard, "close", None)
            if close is not None:
                result = close()
                if asyncio.iscoroutine(result):
                    await result
