"""How full the rollout side ran: a time-weighted record of the groups in flight, kept by the ledger.

The ledger calls `Occupancy.change` whenever its count of running groups changes (an admission, an
ending); the record integrates that count over time and the seconds it spent below the group limit.
Its totals are cumulative from the first change on, so any reader (the metrics row of each learner
step, a benchmark) takes differences between two readings for a window. Two float additions per
change: no cost worth measuring.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class OccupancyTotals:
    """Cumulative since the first change: group-seconds in flight, seconds below the limit, seconds observed."""

    group_s: float = 0.0
    below_limit_s: float = 0.0
    span_s: float = 0.0


class Occupancy:
    """The integral of groups running over time, and the time spent with fewer running than the limit."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self._group_s = self._below_s = self._span_s = 0.0
        self._since: float | None = None  # when the current level began; None before the first change
        self._running = self._limit = 0

    def change(self, running: int, limit: int) -> None:
        """The count of running groups is now `running` (of at most `limit`): close the interval at the old count."""
        now = self.clock()
        self._settle(now)
        if self._since is None:
            self._since = now
        self._running, self._limit = running, limit

    def totals(self) -> OccupancyTotals:
        """The cumulative figures up to now (the current level counted up to this instant)."""
        self._settle(self.clock())
        return OccupancyTotals(self._group_s, self._below_s, self._span_s)

    def _settle(self, now: float) -> None:
        """Count the current level from `_since` up to `now`, and start its next interval there."""
        if self._since is not None and now > self._since:
            dt = now - self._since
            self._group_s += self._running * dt
            self._below_s += dt if self._running < self._limit else 0.0
            self._span_s += dt
            self._since = now
