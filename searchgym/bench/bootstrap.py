"""A hierarchical bootstrap over (seed, question): how far a pooled mean moves when both seeds and questions are
redrawn.

Questions within one seed share that seed's world, warm start and RL run, so they are not independent draws;
resampling (seed, question) pairs as if they were would make the interval too narrow. Each bootstrap draw
therefore resamples the seeds with replacement, then the questions within each drawn seed with replacement,
and takes the mean over every drawn (seed, question) pair, the same statistic as the point estimate.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

RESAMPLES = 2000
K = TypeVar("K", bound=Hashable)  # a group's key (a seed)


def hierarchical_bootstrap(
    groups: Mapping[K, Sequence[float]], *, seed: int = 0, resamples: int = RESAMPLES
) -> dict[str, Any]:
    """Mean over all values of `groups` (seed -> per-question values) with a 95% two-level percentile interval."""
    arrays = [np.asarray(values, dtype=float) for _, values in sorted(groups.items(), key=lambda kv: str(kv[0]))]
    arrays = [a for a in arrays if a.size]
    if not arrays:
        raise ValueError("no values to bootstrap: every group is empty")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    if any(not np.all(np.isfinite(a)) for a in arrays):
        raise ValueError("values must be finite numbers")
    rng = np.random.default_rng(seed)
    counts = np.array([a.size for a in arrays])
    means = np.empty(resamples)
    for r in range(resamples):
        picked = rng.integers(len(arrays), size=len(arrays))
        total = sum(arrays[g][rng.integers(counts[g], size=counts[g])].sum() for g in picked)
        means[r] = total / counts[picked].sum()
    point = float(np.concatenate(arrays).mean())
    low, high = (float(x) for x in np.percentile(means, [2.5, 97.5]))
    return {
        "gain": point,
        "ci95_low": low,
        "ci95_high": high,
        "significant": bool(low > 0 or high < 0),
        "seeds": len(arrays),
        "questions": int(counts.sum()),
        "bootstrap": "hierarchical: seeds with replacement, then questions within each drawn seed",
        "resamples": resamples,
    }


def seed_list(text: str) -> list[int]:
    """A `--seeds` value: comma-separated integers."""
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds takes comma-separated integers, got {text!r}") from None
