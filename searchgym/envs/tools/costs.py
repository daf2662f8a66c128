"""What a tool call cost, in each backend's own units, metered per call without passing a ledger around.

The env opens a meter around each search or access (`metered()`); the backend, however deep, charges what it
spent (`charge(api_calls=1)`) into the meter of the call it serves (a context variable, so concurrent episodes
sharing a backend never mix their costs). Charges outside a meter (an LLM judge's calls) are not tool costs and
are dropped. Units, by backend:

- web search: `api_calls` (one per provider request; a cache hit costs none);
- web pages: `fetches` and `bytes_fetched` (the bytes read from the network; a cache hit costs none);
- simulated search: `model_calls`, `prompt_tokens` and `generated_tokens` (tokens where the endpoint reports them);
- local index and retrieval server: nothing (their cost is the call's time, which a workflow records per turn as
  `env_seconds`; it stays out of `info` so a local episode's info is the same on every run).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_METER: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar("searchgym_tool_cost", default=None)


def charge(**units: float) -> None:
    """Add `units` to the cost of the tool call being metered (nothing when none is)."""
    meter = _METER.get()
    if meter is not None:
        for unit, amount in units.items():
            if amount:
                meter[unit] = meter.get(unit, 0) + amount


@contextlib.contextmanager
def metered() -> Iterator[dict[str, float]]:
    """A fresh meter for the calls made inside the block (and the tasks they start); yields its units."""
    meter: dict[str, float] = {}
    token = _METER.set(meter)
    try:
        yield meter
    finally:
        _METER.reset(token)
