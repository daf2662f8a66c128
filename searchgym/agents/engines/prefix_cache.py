"""Finished sequences' attention (KV) caches, kept per request id under a byte budget, for the next turn.

An agent's next turn re-sends the episode so far (previous prompt + output + observation) under the
same rid, so the cache is keyed by rid: a lookup takes the entry out (its memory now lives in the
batch), keeps its longest common token prefix with the new prompt, and the engine prefills only the
rest. Entries are stored compactly (one sequence, no padding) and evicted least recently used first;
the cache never holds more than its budget.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from searchgym.core.extras import needs

with needs("TorchEngine's prefix cache"):
    import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values)


@dataclass
class _Entry:
    tokens: list[int]  # the tokens whose keys and values `kv` holds, in order
    kv: KV  # per layer, each (kv_heads, len(tokens), head_dim)
    nbytes: int


class PrefixCache:
    """rid -> (tokens, per-layer keys and values of one sequence), LRU-evicted under `budget_bytes` (0: off)."""

    def __init__(self, budget_bytes: int):
        if budget_bytes < 0:
            raise ValueError("prefix cache budget must be >= 0 bytes")
        self.budget_bytes = budget_bytes
        self.nbytes = 0
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, rid: str, tokens: list[int], kv: KV) -> bool:
        """Keep `kv` (copied to its own compact memory) for `rid`, replacing its old entry; False if it cannot fit."""
        self.discard(rid)
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if not rid or not tokens or nbytes > self.budget_bytes:
            return False
        while self.nbytes + nbytes > self.budget_bytes:
            self.discard(next(iter(self._entries)))
        self._entries[rid] = _Entry(
            list(tokens), [(k.contiguous().clone(), v.contiguous().clone()) for k, v in kv], nbytes
        )
        self.nbytes += nbytes
        return True

    def take(self, rid: str, prompt: list[int]) -> tuple[int, KV | None]:
        """Remove `rid`'s entry; return how many leading prompt tokens it covers (leaving one to feed) and their KV."""
        entry = self._entries.get(rid) if rid else None
        if entry is None:
            return 0, None
        self.discard(rid)
        length = _common_prefix(entry.tokens, prompt, limit=len(prompt) - 1)
        if length == 0:
            return 0, None
        return length, [(k[:, :length], v[:, :length]) for k, v in entry.kv]

    def discard(self, rid: str | None = None) -> None:
        """Drop `rid`'s entry (every entry when None)."""
        if rid is None:
            self._entries.clear()
            self.nbytes = 0
        elif (entry := self._entries.pop(rid, None)) is not None:
            self.nbytes -= entry.nbytes


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """Length of the longest common prefix of a and b, at most `limit`."""
    n = min(len(a), len(b), limit)
    if a[:n] == b[:n]:
        return max(n, 0)
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
