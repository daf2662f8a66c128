"""Host memory and KV-cache sizes: what the TorchEngine bounds its batch by, and what `train --dry-run` counts.

    available_memory()                       # (bytes, where the figure came from), or None where neither source exists
    kv_bytes_per_token(layers, kv_heads, head_dim, 4)   # keys + values of one token, all layers, in fp32
    batch_bytes(config_shapes(config), 4, rows=8, tokens=4096, prefill_tokens=16384)   # the TorchEngine's batch

Nothing here imports torch: the plan reads model shapes, the engine reads its model's config.
"""

from __future__ import annotations

import gc
import importlib
from pathlib import Path
from typing import Any

from searchgym.core.heap import release_free_heap

MEMINFO = Path("/proc/meminfo")
# a CPU batch's peak RSS over its live tensors: 1.16x to 1.58x measured (SmolLM2-135M, docs/agents.md)
RSS_FACTOR = 1.75


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


def memory_after_release() -> tuple[int, str] | None:
    """`available_memory()` once this process's freed memory is back with the OS (its cycles collected, then the
    heap's free pages trimmed, `core.heap`): what a budget read after earlier stages (an RL run, then its
    evaluation) can count on, rather than what glibc still holds."""
    gc.collect()
    release_free_heap()
    return available_memory()


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


def batch_bytes(shape: dict[str, int], dtype_bytes: int, *, rows: int, tokens: int, prefill_tokens: int) -> int:
    """The most memory a TorchEngine batch of `rows` rows, each at most `tokens` long, takes: its live tensors (keys
    and values twice, as a joining row's merge and a finished row's removal copy the batch; each row's decode
    activations and fp32 sampling buffers; one prefill's activations, at most `prefill_tokens` tokens) times
    RSS_FACTOR, what the host allocator holds beyond them at the peak."""
    hidden, intermediate, kv = shape["hidden"], shape["intermediate"], shape["kv_heads"] * shape["head_dim"]
    per_token = kv_bytes_per_token(shape["layers"], shape["kv_heads"], shape["head_dim"], dtype_bytes)
    row = dtype_bytes * (4 * hidden + 3 * intermediate) + 16 * shape["vocab"]  # + logits, softmax, cdf
    prefill = prefill_tokens * dtype_bytes * (4 * hidden + 2 * kv + 3 * intermediate)
    return int(RSS_FACTOR * (rows * (2 * tokens * per_token + row) + prefill))
