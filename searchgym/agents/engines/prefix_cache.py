"""Finished sequences' attention (KV) caches, kept per request id under a byte budget, for the next turn.

An agent's next turn re-sends the episode so far (previous prompt + output + observation) under the
same rid, so the cache is keyed by rid: a lookup takes the entry out (its memory now lives in the
batch), keeps its longest common token prefix with the new prompt, and the engine prefills only the
rest. Entries are stored compactly (one sequence, no padding) and evicted least recently used first;
the cache never holds more than its budget.

Shared prefixes: a prompt whose rid has no entry (an episode's first turn) borrows the longest common token prefix
any entry has with it, read-only (the entry stays for its own episode). Episodes of one env open with the same
system message and instructions, hundreds of tokens with ASearcher's, so each new episode prefills only its question
once another episode has finished a turn. Off with `share=False`. `shared_prefixes` finds what requests arriving
together share (a GRPO group's identical first prompts), which the engine prefills once and puts here to lend.
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

    def __init__(self, budget_bytes: int, *, share: bool = True):
        if budget_bytes < 0:
            raise ValueError("prefix cache budget must be >= 0 bytes")
        self.budget_bytes = budget_bytes
        self.share = share
        self.nbytes = 0
        self.shared_tokens = 0  # prompt tokens borrowed from another rid's entry, over the cache's life
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
        """Remove `rid`'s entry; return how many leading prompt tokens it covers (leaving one to feed) and their KV.
        Without an entry of its own (or one sharing nothing with the prompt), the longest prefix another entry
        shares with it, read-only (`share`)."""
        entry = self._entries.get(rid) if rid else None
        if entry is not None:
            self.discard(rid)
            length = _common_prefix(entry.tokens, prompt, limit=len(prompt) - 1)
            if length:
                return length, [(k[:, :length], v[:, :length]) for k, v in entry.kv]
        return self.borrow(prompt, limit=len(prompt) - 1) if self.share else (0, None)

    def holds(self, rid: str) -> bool:
        """Whether `rid` has an entry of its own."""
        return bool(rid) and rid in self._entries

    def borrow(self, prompt: list[int], *, limit: int) -> tuple[int, KV | None]:
        """The longest prefix of `prompt` (at most `limit` tokens) that some entry holds, as views of that entry,
        which stays (marked recently used)."""
        best, length = None, 0
        for rid, entry in self._entries.items():
            if (n := _common_prefix(entry.tokens, prompt, limit)) > length:
                best, length = rid, n
        if best is None:
            return 0, None
        self._entries.move_to_end(best)
        self.shared_tokens += length
        return length, [(k[:, :length], v[:, :length]) for k, v in self._entries[best].kv]

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


def shared_prefixes(prompts: list[list[int]], *, minimum: int) -> list[list[int]]:
    """The prefixes of at least `minimum` tokens that neighbours in sorted order share (leaving each of the two one
    token of its own to feed), once each, shortest first: nested ones, such as an env's instructions and then a GRPO
    group's whole first prompt, can each be prefilled on top of the one before."""
    ordered = sorted(prompts)
    found: dict[tuple[int, ...], None] = {}
    for a, b in zip(ordered, ordered[1:], strict=False):
        n = _common_prefix(a, b, min(len(a), len(b)) - 1)
        if n >= minimum:
            found.setdefault(tuple(a[:n]), None)
    return [list(prefix) for prefix in sorted(found, key=len)]
