"""What a training run does not record itself but `bench trainer` needs: learner seconds, episodes in flight, engine work.

`probe_training()` wraps `Learner.step` (timing each learner step), the rollout ledger's `admit` and
`_end` (logging the groups in flight after every change) and `TorchEngine.close` (keeping the
engine's counters: decode steps, tokens prefilled and reused) for the duration of a `with` block, so a
benchmark can say what limits throughput: the learner's share of the wall time, and how long the
rollout side ran below its concurrency limit because the staleness rule held admissions back.
The wrappers call the originals unchanged.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from searchgym.agents.engines.torch_engine import TorchEngine
from searchgym.trainers.learner import Learner
from searchgym.trainers.ledger import GroupLedger


@dataclass
class Probe:
    """Learner steps as (start, end) times, and (time, groups running, group limit) after each ledger change."""

    learner_steps: list[tuple[float, float]] = field(default_factory=list)
    in_flight: list[tuple[float, int, int]] = field(default_factory=list)
    engine: dict[str, Any] = field(default_factory=dict)  # the TorchEngine's counters when it closed

    def engine_summary(self) -> dict[str, float | None]:
        """Rows per decode step (batching), prompt tokens prefilled and reused per generated token."""
        e = self.engine
        generated, steps = e.get("generated_tokens", 0), e.get("decode_steps", 0)
        return {"engine_rows_per_decode_step": round(generated / steps, 2) if steps else None,
                "engine_prefill_per_generated_token": round(e["prefill_tokens"] / generated, 2) if generated else None,
                "engine_reused_per_generated_token": (round(e.get("reused_tokens", 0) / generated, 2)
                                                      if generated else None),
                "engine_busy_s": round(e["busy_s"], 2) if "busy_s" in e else None}

    def window(self, start: float, end: float, group_size: int) -> dict[str, float | None]:
        """Over [start, end]: the learner's share of the time, mean episodes in flight, share below the limit."""
        span = end - start
        if span <= 0:
            return {"learner_share": None, "episodes_in_flight_mean": None, "admission_blocked_share": None}
        learner = sum(max(0.0, min(b, end) - max(a, start)) for a, b in self.learner_steps)
        running_area = blocked = 0.0
        events = sorted(self.in_flight)
        for (t, running, limit), (t_next, _, _) in zip(events, [*events[1:], (end, 0, 0)]):
            a, b = max(t, start), min(t_next, end)
            if b > a:
                running_area += running * (b - a)
                blocked += (b - a) if running < limit else 0.0
        return {"learner_share": round(learner / span, 4),
                "episodes_in_flight_mean": round(running_area * group_size / span, 2),
                "admission_blocked_share": round(blocked / span, 4)}


@contextlib.contextmanager
def probe_training() -> Iterator[Probe]:
    """Record learner steps and groups in flight while the block runs (one training run at a time)."""
    probe = Probe()
    step, admit, end, close = Learner.step, GroupLedger.admit, GroupLedger._end, TorchEngine.close

    def timed_step(self: Learner, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return step(self, *args, **kwargs)
        finally:
            probe.learner_steps.append((t0, time.perf_counter()))

    def logged_admit(self: GroupLedger, *args: Any, **kwargs: Any) -> Any:
        group = admit(self, *args, **kwargs)
        probe.in_flight.append((time.perf_counter(), self.running, self.max_groups))
        return group

    def logged_end(self: GroupLedger, *args: Any, **kwargs: Any) -> Any:
        group = end(self, *args, **kwargs)
        probe.in_flight.append((time.perf_counter(), self.running, self.max_groups))
        return group

    async def counted_close(self: TorchEngine, *args: Any, **kwargs: Any) -> Any:
        probe.engine = dict(self.stats())
        return await close(self, *args, **kwargs)

    Learner.step, GroupLedger.admit, GroupLedger._end = timed_step, logged_admit, logged_end
    TorchEngine.close = counted_close
    try:
        yield probe
    finally:
        Learner.step, GroupLedger.admit, GroupLedger._end, TorchEngine.close = step, admit, end, close
