"""`searchgym index build`: its settings (the command's flags are these fields) and the build they run."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from searchgym.settings import setting

if TYPE_CHECKING:
    from searchgym.envs.tools.dense_index import DenseIndex


@dataclass
class IndexBuildSettings:
    """A tantivy BM25 index (or, with `dense`, a faiss one; with `shards`, N BM25 ones) over a corpus JSONL."""

    corpus: Path = setting(help="a corpus JSONL")
    out: Path = setting(help="the index directory")
    threads: int = setting(
        1,
        help="BM25 indexing threads (one writes one segment in corpus order: equal scores rank in corpus order)",
    )
    dense: bool = setting(False, help="a faiss index of sentence embeddings instead (extra: dense)")
    encoder: str = setting("minilm", help="dense encoder preset: minilm, e5 or bge")
    encoder_model: str | None = setting(None, help="local model directory for the preset (e5/bge need one)")
    index_type: str = setting("flat", help="dense index: flat, hnsw or ivf")
    shards: int | None = setting(
        None,
        at_least=1,
        metavar="N",
        help="split the corpus by url into N BM25 indexes (OUT/shard-NN/index, OUT/shards.json), served as "
        "one by `searchgym serve ray-search --index OUT`",
    )


def build_index(settings: IndexBuildSettings) -> None:
    """Build the index the settings describe and say how long it took."""
    from searchgym.envs.tools.local_index import LocalIndex

    t0 = time.perf_counter()
    if settings.shards is not None:
        from searchgym.envs.tools.shards import build_shards

        if settings.dense:
            raise ValueError("--shards builds BM25 shards; a dense index is not sharded (drop --dense or --shards)")
        build_shards(settings.corpus, settings.out, settings.shards, threads=settings.threads, progress=True)
        took = time.perf_counter() - t0
        print(f"indexed {settings.corpus} into {settings.shards} shards under {settings.out} in {took:.1f} s")
        return
    index: LocalIndex | DenseIndex
    if settings.dense:
        from searchgym.envs.tools.dense_index import DenseIndex
        from searchgym.envs.tools.encoders import Encoder

        encoder = (
            Encoder.preset(settings.encoder, model=settings.encoder_model)
            if settings.encoder_model
            else Encoder(settings.encoder)
        )
        index = DenseIndex.build(
            settings.corpus, settings.out, encoder=encoder, index_type=settings.index_type, progress=True
        )
    else:
        index = LocalIndex.build(settings.corpus, settings.out, threads=settings.threads, progress=True)
    print(f"indexed {len(index)} documents into {settings.out} in {time.perf_counter() - t0:.1f} s")
