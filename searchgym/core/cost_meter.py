"""What a call cost, metered per call without passing a ledger around.

A caller opens a meter around one call (`metered()`); the code it runs, however deep, charges what it spent
(`charge(api_calls=1)`) into the meter of the call it serves (a context variable, so concurrent calls never mix
their costs). Charges outside a meter are dropped. The env meters each tool call this way; the units and the
budgets over them are the env's (envs/tools/costs.py); an LLM call charges the tokens its endpoint reports
(core/llm_calls.py).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_METER: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar("searchgym_tool_cost", default=None)


def charge(**units: float) -> None:
    """Add `units` to the cost of the call being metered (nothing when none is)."""
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
