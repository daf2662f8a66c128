"""What a tool call cost, in each backend's own units: the units and the budgets over them.

The env opens a meter around each search or access (`metered()`, core/cost_meter.py); the backend, however deep,
charges what it spent (`charge(api_calls=1)`) into the meter of the call it serves (a context variable, so
concurrent episodes sharing a backend never mix their costs). Charges outside a meter (an LLM judge's calls) are
not tool costs and are dropped. Units, by backend:

- web search: `api_calls` (one per provider request; a cache hit costs none);
- web pages: `fetches` and `bytes_fetched` (the bytes read from the network; a cache hit costs none);
- simulated search: `model_calls`, `prompt_tokens` and `generated_tokens` (tokens where the endpoint reports them);
- local index and retrieval server: nothing (their cost is the call's time, which a workflow records per turn as
  `env_seconds`; it stays out of `info` so a local episode's info is the same on every run).

A `cost_budget` may name only these units (COST_UNITS, and those a custom backend registers): it is checked when
given (`check_cost_budget`), since a budget in a unit nothing charges would never end an episode.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

COST_UNITS = {"api_calls", "fetches", "bytes_fetched", "model_calls", "prompt_tokens", "generated_tokens"}


def register_cost_unit(unit: str) -> None:
    """Declare a unit a custom backend charges, so a `cost_budget` may name it."""
    if not (isinstance(unit, str) and unit.isidentifier()):
        raise ValueError(f"a cost unit is a name like 'api_calls', got {unit!r}")
    COST_UNITS.add(unit)


def check_cost_budget(budget: Any, key: str = "cost_budget") -> dict[str, float]:
    """`budget` as {unit: limit} once each unit is one a backend charges and each limit a finite number > 0; a
    ValueError naming `key`, the unit and the allowed values otherwise (a unit no backend charges is never reached,
    so a budget naming one would silently never be enforced)."""
    if budget is None:
        return {}
    if not isinstance(budget, Mapping):
        raise ValueError(f"{key} maps cost units to limits (e.g. {{'api_calls': 20}}), got {type(budget).__name__}")
    out = {}
    for unit, limit in budget.items():
        if unit not in COST_UNITS:
            raise ValueError(
                f"{key}: unknown cost unit {str(unit)[:80]!r}; the units are {', '.join(sorted(COST_UNITS))} "
                "(a custom backend's own: searchgym.envs.tools.costs.register_cost_unit)"
            )
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not math.isfinite(limit) or limit <= 0:
            raise ValueError(f"{key}.{unit} must be a finite number > 0, got {limit!r}")
        out[unit] = limit
    return out
