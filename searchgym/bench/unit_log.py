"""The finished units (seeds, or (seed, arm) pairs) of a resumable benchmark: in its run folder, and beside its results.

A learning bench's units take most of an hour each on a CPU, more than one session holds for all of them. Each
finished unit's row is written to the run folder's log (`runs/NAME/seeds.jsonl`, with the models it was built from)
and to a copy beside the results file (`results/NAME.seeds.jsonl`), which is committed with the results. Opening
the log carries rows each way that only one of the two holds, so a fresh clone, or the next session, goes on where
the last one stopped instead of running an hour-long unit again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from searchgym.core.jsonl_log import JsonlLog


class UnitLog:
    """The rows of a run folder's unit log and of its copy beside the results; `append` writes both durably.

    Every row carries the fingerprint of the settings it ran with; `fingerprint` is the one every row must have, or
    a function giving the one a row must have (a claim's arms each have their own, so arms run apart still pool; it
    returns None for a row it cannot place). A file holding any other row is refused before anything is carried, so
    runs of two configurations never mix."""

    def __init__(
        self,
        run_log: Path,
        kept: Path,
        *,
        fingerprint: str | Callable[[Any], str | None],
        check: Callable[[Any], object],
    ) -> None:
        expected = fingerprint if callable(fingerprint) else lambda _row: fingerprint
        self.run = JsonlLog(run_log, check=check)
        self.kept = JsonlLog(kept, check=check) if Path(kept).resolve() != Path(run_log).resolve() else None
        for log in [self.run] if self.kept is None else [self.run, self.kept]:
            for row in log.rows:
                want = expected(row)
                if row["fingerprint"] != want:
                    now = f"now {want}" if want is not None else "none of this run's units is such a row"
                    raise ValueError(
                        f"{log.path} holds runs of another configuration (fingerprint {row['fingerprint']}, {now}); "
                        "use another out_dir and --out"
                    )
        if self.kept is not None:
            _carry(self.kept, self.run)
            _carry(self.run, self.kept)

    @property
    def rows(self) -> list[Any]:
        return self.run.rows

    def append(self, row: Any) -> None:
        self.run.append(row)
        if self.kept is not None:
            self.kept.append(row)


def _carry(source: JsonlLog, target: JsonlLog) -> None:
    have = {_identity(row) for row in target.rows}
    for row in source.rows:
        if _identity(row) not in have:
            target.append(row)
            have.add(_identity(row))


def _identity(row: Any) -> str:
    return json.dumps(row, sort_keys=True)
