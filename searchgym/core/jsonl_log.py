"""Append-only JSON Lines files that survive a kill mid-write: one reader/writer for every resumable file.

Evaluation samples, synthesis pools and their progress logs are appended one row at a time (flushed and
fsynced), so a run killed at any point leaves at most one partial last line. Opening the file again
repairs it: a cut last line is dropped (its item is simply played again), and a damaged line in the
middle (bad JSON, or a row the caller's `check` refuses) is moved, with its line number, to a sidecar
file `NAME.damaged.jsonl` next to it: reported, never silently kept or silently lost.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class BadRow(ValueError):
    """Raised by a `check` to say why a parsed row is unusable (e.g. "missing field 'stats'"); reported as the
    reason."""


@dataclass(frozen=True)
class DamagedLine:
    """A line that could not be used: where it was, why, and its first characters."""

    line: int  # 1-based, in the file as it was found
    reason: str
    text: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason} ({self.text[:60]!r})"


@dataclass
class JsonlLog:
    """The rows of an append-only JSONL file, repaired on open; `append` adds one row durably.

    `check(row)` may raise ValueError/KeyError/TypeError to call a parsed row damaged (e.g. a field
    missing). After opening, `rows` holds the good rows in file order and `damaged` what was set aside.
    """

    path: Path
    check: Callable[[Any], object] | None = None
    rows: list[Any] = field(default_factory=list)
    damaged: list[DamagedLine] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        if self.path.exists():
            self._load()

    def __iter__(self) -> Iterator[Any]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def append(self, row: Any) -> None:
        """Write one row as one line, flushed and fsynced before returning."""
        line = json.dumps(row, ensure_ascii=False) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.rows.append(row)

    def _load(self) -> None:
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        complete = data.endswith(b"\n") or not data
        kept: list[bytes] = []
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            last = number == len(lines)
            try:
                row = json.loads(raw)
            except ValueError as e:
                reason = "cut by a kill mid-write" if last and not complete else f"damaged ({type(e).__name__})"
                self.damaged.append(DamagedLine(number, reason, raw.decode("utf-8", "replace")))
                continue
            try:
                if self.check is not None:
                    self.check(row)
            except (ValueError, KeyError, TypeError) as e:  # a whole row the caller cannot use: kept aside
                reason = f"damaged ({str(e)[:200]})" if isinstance(e, BadRow) else f"damaged ({type(e).__name__})"
                self.damaged.append(DamagedLine(number, reason, raw.decode("utf-8", "replace")))
                continue
            self.rows.append(row)
            kept.append(raw)
        clean = b"".join(line + b"\n" for line in kept)
        if clean != data:
            self._set_aside()
            self._rewrite(clean)

    def _set_aside(self) -> None:
        """Keep every damaged middle line in the sidecar file (a cut last line holds nothing to keep)."""
        middle = [d for d in self.damaged if d.reason != "cut by a kill mid-write"]
        if middle:
            sidecar = self.path.with_name(self.path.name.removesuffix(".jsonl") + ".damaged.jsonl")
            with open(sidecar, "a", encoding="utf-8") as f:
                for d in middle:
                    f.write(
                        json.dumps(
                            {"file": str(self.path), "line": d.line, "reason": d.reason, "text": d.text},
                            ensure_ascii=False,
                        )
                        + "\n"
                    )
        if self.damaged:
            warnings.warn(
                f"{self.path}: set aside {len(self.damaged)} unusable line(s): "
                + "; ".join(str(d) for d in self.damaged[:5])
                + (f"; damaged lines kept in {self.path.stem}.damaged.jsonl" if middle else ""),
                stacklevel=2,
            )

    def _rewrite(self, clean: bytes) -> None:
        """Replace the file with its good lines, atomically, before anything is appended again."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(clean)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
