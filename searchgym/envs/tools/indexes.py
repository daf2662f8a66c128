"""open_index: the search index at a path, whichever form the path takes, built on first use when it can be.

One function for "open or build the index", so the env ids, the CLI, synthesis and the benches accept
the same paths: an index directory, a directory holding `index/` (a SyntheticQA bundle, a world from
`searchgym world build`), or a corpus JSONL. Parallel processes (async vector env workers) build a
missing index once: the build holds a file lock beside it. An index built beside its corpus is rebuilt when the
corpus changes (its manifest records the corpus's size and sha256), never served stale.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from searchgym.core.file_lock import file_lock
from searchgym.core.hashing import file_sha256
from searchgym.envs.tools.index_files import MANIFEST, has_manifest, manifest_kind

CORPUS = "corpus.jsonl"  # a bundle's or world's corpus file


def open_index(path: str | os.PathLike, *, dense: bool | str | Any = None, progress: bool = False) -> Any:
    """The index at path (a LocalIndex, or a DenseIndex when its manifest says dense).

    - a directory with `index.json`: that index;
    - a directory holding `index/` (or `dense-index/` when dense is asked for): that index, built from
      the directory's `corpus.jsonl` on first use;
    - a corpus JSONL file: the index beside it at `FILE.index` (`FILE.dense-index`), built on first use.

    `dense`: None takes whatever kind is there (BM25 when it must build); False or True insist on BM25 or dense;
    an encoder preset name ("minilm", "e5", "bge") or an `Encoder` builds dense with that encoder.

    A sharded index (`index build --shards N`) is no one index: it is refused, saying to serve it with
    `searchgym serve ray-search` (a deployment per shard behind one address), the one place shards are searched.
    """
    from searchgym.envs.tools.shards import is_sharded

    path = Path(path)
    if path.is_dir() and is_sharded(path):
        raise FileNotFoundError(
            f"{path} is a sharded index (shards.json, from `searchgym index build --shards N`), not one index: serve "
            f"its shards as one address with `searchgym serve ray-search --index {path}` (pip install "
            "'searchgym[serve-ray]') and search that address"
        )
    if path.is_dir() and has_manifest(path):
        return _open(path, dense)
    want_dense = dense is not None and dense is not False
    if path.is_dir():
        target, corpus = path / ("dense-index" if want_dense else "index"), path / CORPUS
        if not has_manifest(target) and not corpus.is_file():
            raise FileNotFoundError(
                f"{path}: neither an index directory (no {MANIFEST}) nor a directory holding "
                f"{target.name}/ or {CORPUS}; build one with `searchgym index build`"
            )
    elif path.is_file():
        target, corpus = path.with_name(path.name + (".dense-index" if want_dense else ".index")), path
    else:
        raise FileNotFoundError(
            f"{path} does not exist: give an index directory (from `searchgym index build`), "
            "a directory holding index/, or a corpus JSONL"
        )
    if not has_manifest(target) or is_stale(target, corpus, dense):
        with file_lock(target.with_name(target.name + ".lock")):
            # another process may have built it while we waited
            if not has_manifest(target) or is_stale(target, corpus, dense):
                _build(corpus, target, dense, progress)
    return _open(target, dense)


def is_stale(index_dir: Path, corpus: Path, dense: Any = None) -> bool:
    """Whether the index at `index_dir` was built from other content than `corpus` holds now (its manifest records
    the corpus's size and sha256: a different size, or a newer corpus whose hash differs). A stale dense index
    whose encoder the caller did not name is an error saying how to rebuild it (a BM25 rebuild would replace it)."""
    manifest_path = index_dir / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
        stat = corpus.stat()
    except (OSError, ValueError):
        return False  # no corpus beside it, or a manifest _open will name
    size, digest = manifest.get("corpus_bytes"), manifest.get("corpus_sha256")
    if not isinstance(size, int) or not isinstance(digest, str):
        return False  # built before manifests recorded their corpus
    if stat.st_size == size and (stat.st_mtime_ns < manifest_path.stat().st_mtime_ns or file_sha256(corpus) == digest):
        return False
    if manifest_kind(manifest) == "dense" and (dense is None or dense is False):
        raise ValueError(
            f"the dense index at {index_dir} was built from another version of {corpus}; rebuild it with "
            f"`searchgym index build --corpus {corpus} --out {index_dir} --dense --encoder NAME` (or open it with "
            "dense=NAME to rebuild it here)"
        )
    return True


def _open(index_dir: Path, dense: Any) -> Any:
    """Open a complete index of the kind its manifest names, refusing a kind the caller ruled out."""
    kind = manifest_kind(json.loads((index_dir / MANIFEST).read_text()))
    if dense is not None and (kind == "dense") != (dense is not False):
        wanted = "BM25" if dense is False else "dense"
        raise ValueError(f"{index_dir} holds a {kind} index, not a {wanted} one")
    if kind == "dense":
        from searchgym.envs.tools.dense_index import DenseIndex

        return DenseIndex(index_dir)
    from searchgym.envs.tools.local_index import LocalIndex

    return LocalIndex(index_dir)


def _build(corpus: Path, target: Path, dense: Any, progress: bool) -> None:
    """Build target from corpus: BM25, or dense with the asked-for encoder (MiniLM for dense=True)."""
    if dense is None or dense is False:
        from searchgym.envs.tools.local_index import LocalIndex

        LocalIndex.build(corpus, target, progress=progress)
        return
    from searchgym.envs.tools.dense_index import DenseIndex

    DenseIndex.build(corpus, target, encoder="minilm" if dense is True else dense, progress=progress).close()
