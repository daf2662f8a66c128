"""An env's ranking as one word: `retriever="bm25" | "dense" | "hybrid"` over one local corpus.

- `"bm25"`: the corpus's BM25 `LocalIndex` (built on first use, as `open_index` does).
- `"dense"`: a `DenseIndex` of the same corpus with the shipped all-MiniLM-L6-v2 encoder (the `dense` extra),
  built on first use beside the corpus (`DIR/dense-index/` for a directory holding `corpus.jsonl`, `FILE.dense-index`
  for a corpus file) under a file lock, and reused after, like the BM25 index.
- `"hybrid"`: both, fused by reciprocal rank fusion (`HybridIndex`); pages are served by the BM25 index.

Where the path is a built index of one kind, the other kind is made from the corpus that index was built from: the
`corpus.jsonl` beside it (a world or bundle directory's `index/`), else the corpus its manifest names.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from searchgym.envs.tools.index_files import MANIFEST, has_manifest, manifest_kind
from searchgym.envs.tools.indexes import CORPUS, open_index

RETRIEVERS = ("bm25", "dense", "hybrid")
DEFAULT_RETRIEVER = "bm25"
DENSE_ENCODER = "minilm"  # the encoder preset of retriever="dense" / "hybrid" (shipped by the `dense` extra)


def check_retriever(env_id: str, value: Any) -> str:
    """`value` when it names a retriever; else a ValueError naming the env kwarg `retriever` and the choices."""
    if not isinstance(value, str) or value not in RETRIEVERS:
        choices = ", ".join(repr(r) for r in RETRIEVERS)
        raise ValueError(f"{env_id}: env kwarg 'retriever' must be one of {choices}, got {value!r}")
    return value


def open_retriever(path: str | os.PathLike, retriever: str, *, progress: bool = False) -> tuple[Any, Any]:
    """(search backend, page backend) of `retriever` over the corpus at `path`: an index directory, a directory
    holding `corpus.jsonl` (and `index/`), or a corpus JSONL. Indexes missing are built on first use."""
    check_retriever("open_retriever", retriever)
    path = Path(path)
    if retriever == "hybrid":
        from searchgym.envs.tools.hybrid import HybridIndex

        bm25 = _index_of_kind(path, False, retriever, progress)
        return HybridIndex(bm25, _index_of_kind(path, DENSE_ENCODER, retriever, progress)), bm25
    index = _index_of_kind(path, DENSE_ENCODER if retriever == "dense" else False, retriever, progress)
    return index, index


def _index_of_kind(path: Path, dense: str | bool, retriever: str, progress: bool) -> Any:
    """The BM25 (dense=False) or dense index of the corpus at path, built on first use."""
    if not (path.is_dir() and has_manifest(path)):
        return open_index(path, dense=dense, progress=progress)
    manifest = json.loads((path / MANIFEST).read_text())
    if (manifest_kind(manifest) == "dense") == (dense is not False):
        return open_index(path, dense=dense, progress=progress)
    home = _corpus_home(path, manifest)
    if home is None:
        wanted = "a BM25" if dense is False else "a dense"
        raise ValueError(
            f"retriever={retriever!r} needs {wanted} index of the corpus {path} was built from, and that corpus is "
            f"neither beside it ({path.parent / CORPUS}) nor where its manifest says "
            f"({manifest.get('corpus_path')}); give corpus=FILE instead"
        )
    return open_index(home, dense=dense, progress=progress)


def _corpus_home(index_dir: Path, manifest: dict[str, Any]) -> Path | None:
    """Where to open the other kind of index from: the directory holding the index and its corpus, else the corpus
    file the manifest names (if it is still there)."""
    if index_dir.name in ("index", "dense-index") and (index_dir.parent / CORPUS).is_file():
        return index_dir.parent
    named = manifest.get("corpus_path")
    if isinstance(named, str) and Path(named).is_file():
        return Path(named)
    return None
