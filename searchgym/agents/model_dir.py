"""What a directory must hold to be a policy: a Hugging Face causal LM and a tokenizer with a chat template.

Engines, `serve model`, sft, train and eval all take a model dir; each checks it here first, so a wrong
directory (a GGUF not yet converted, an encoder, a base model with no chat template) is one clear error naming
the directory and the way out, not a traceback from deep inside Transformers or a silently garbled prompt.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def check_policy_dir(path: str | os.PathLike, *, chat_template: bool = True) -> Path:
    """`path` as a Path when it holds a causal LM (with a chat template, unless `chat_template` is False: the caller
    brings its own tokenizer); else a ValueError saying what is wrong."""
    model_dir = Path(path)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model dir {model_dir} does not exist")
    config = _json(model_dir / "config.json")
    if config is None:
        ggufs = sorted(p.name for p in model_dir.glob("*.gguf"))
        if ggufs:
            raise ValueError(
                f"{model_dir} holds a GGUF file ({ggufs[0]}), not a Hugging Face model directory: convert it with "
                f"`searchgym model get {model_dir / ggufs[0]} --out DIR` and pass DIR"
            )
        raise ValueError(f"{model_dir} is not a Hugging Face model directory: it has no readable config.json")
    architectures = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    causal = _causal_lm_classes()
    if architectures and causal and not any(a in causal for a in architectures):
        raise ValueError(
            f"{model_dir} holds a {', '.join(architectures)} (model_type {config.get('model_type')!r}), which is not "
            "a causal language model: a policy must be one (e.g. LlamaForCausalLM, Qwen2ForCausalLM)"
        )
    if chat_template and not has_chat_template(model_dir):
        raise ValueError(
            f"{model_dir} has no chat template (tokenizer_config.json's chat_template or chat_template.jinja): "
            "every episode is rendered through it, so a base model needs one added before it can play"
        )
    return model_dir


def has_chat_template(model_dir: Path) -> bool:
    """Whether the saved tokenizer carries a chat template (in its config or as chat_template.jinja)."""
    if (model_dir / "chat_template.jinja").is_file() or (model_dir / "chat_template.json").is_file():
        return True
    tokenizer_config = _json(model_dir / "tokenizer_config.json")
    return bool(tokenizer_config and tokenizer_config.get("chat_template"))


def _causal_lm_classes() -> frozenset[str]:
    """The class names Transformers' AutoModelForCausalLM builds (empty where Transformers is absent)."""
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:
        return frozenset()
    names: set[str] = set()
    for value in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        names.update([value] if isinstance(value, str) else value)
    return frozenset(names)


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
