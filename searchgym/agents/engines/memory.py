"""Host memory and KV-cache sizes: what the TorchEngine bounds its batch by, and what `train --dry-run` counts.

    available_memory()                       # (bytes, where the figure came from), or None where neither source exists
    kv_bytes_per_token(layers, kv_heads, head_dim, 4)   # keys + values of one token, all layers, in fp32

Nothing here imports torch: the plan reads model shapes, the engine reads its model's config.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

MEMINFO = Path("/proc/meminfo")


def available_memory() -> tuple[int, str] | None:
    """This machine's available memory in bytes (what new allocations can take without swapping), and its source:
    psutil's `virtual_memory().available` if psutil is installed, else /proc/meminfo's MemAvailable; None if neither."""
    try:
        psutil: Any = importlib.import_module("psutil")  # an optional dependency, without type stubs here
    except ImportError:
        pass
    else:
        return int(psutil.virtual_memory().available), "psutil.virtual_memory().available"
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, f"{MEMINFO} MemAvailable"
    except (OSError, ValueError, IndexError):
        pass
    return None


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes of one token's keys and values over all layers."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def config_shapes(config: Any) -> dict[str, int]:
    """The sizes a Hugging Face causal LM's config gives the KV cache and the decode step: layers, kv heads, head
    dim, hidden, intermediate and vocab (text config of multimodal models)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    return {
        "layers": text.num_hidden_layers,
        "kv_heads": getattr(text, "num_key_value_heads", None) or heads,
        "head_dim": getattr(text, "head_dim", None) or text.hidden_size // heads,
        "hidden": text.hidden_size,
        "intermediate": getattr(text, "intermediate_size", None) or 4 * text.hidden_size,
        "vocab": text.vocab_size,
    }
