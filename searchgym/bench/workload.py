"""Heavy-tailed agent episodes for `bench trainer`: how many turns an episode plays and how many tokens each turn
writes.

ASearcher reports search-agent episodes whose length varies over an order of magnitude: median 3
turns, 90th percentile 16, up to 40, and 58 to 1,920 generated tokens per episode. A `Workload`
draws one `EpisodePlan` per episode from that shape: the turn count from a log-normal fitted to the
median and the 90th percentile (rounded, capped at `turns_max`), each turn's token count from a
log-normal around `turn_tokens_median`, then the episode's total scaled into
[`episode_tokens_min`, `episode_tokens_max`]. The plan is a function of (workload seed, episode seed,
task id) only, so an episode plays the same plan whichever trainer mode (or staleness) runs it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

_Z90 = 1.2815515655446004  # the standard normal's 90th percentile


@dataclass(frozen=True)
class EpisodePlan:
    """One episode's shape: tokens to generate at each of its turns (its turn count is the list's length)."""

    turn_tokens: tuple[int, ...]

    @property
    def turns(self) -> int:
        return len(self.turn_tokens)

    @property
    def tokens(self) -> int:
        return sum(self.turn_tokens)


@dataclass(frozen=True)
class Workload:
    """The distribution episodes are drawn from; the defaults are ASearcher's shape (see the module docstring)."""

    turns_median: float = 3.0
    turns_p90: float = 16.0
    turns_max: int = 40
    turn_tokens_median: float = 48.0
    turn_tokens_sigma: float = 0.5  # log-normal sigma of one turn's token count
    turn_tokens_max: int = 192
    episode_tokens_min: int = 58
    episode_tokens_max: int = 1920
    seed: int = 0
    tail_share: float = 0.0  # the share of episodes that play exactly turns_max turns (a long tail on purpose)

    def __post_init__(self) -> None:
        if not 1 <= self.turns_median < self.turns_p90 <= self.turns_max:
            raise ValueError(
                f"turn counts need 1 <= median < p90 <= max, got {self.turns_median}, "
                f"{self.turns_p90}, {self.turns_max}"
            )
        if not 1 <= self.turn_tokens_median <= self.turn_tokens_max or self.turn_tokens_sigma < 0:
            raise ValueError("turn tokens need 1 <= median <= max and sigma >= 0")
        if not 0.0 <= self.tail_share <= 1.0:
            raise ValueError(f"tail_share must be in [0, 1], got {self.tail_share}")
        if not 1 <= self.episode_tokens_min <= self.episode_tokens_max:
            raise ValueError("episode tokens need 1 <= min <= max")
        if self.episode_tokens_min > self.turn_tokens_max or self.episode_tokens_max < self.turns_max:
            raise ValueError(
                "every turn count must be able to meet the episode token bounds: "
                "episode_tokens_min <= turn_tokens_max and episode_tokens_max >= turns_max"
            )

    @property
    def turns_sigma(self) -> float:
        """The log-normal sigma that puts the 90th percentile of the turn count at `turns_p90`."""
        return math.log(self.turns_p90 / self.turns_median) / _Z90

    def plan(self, episode_seed: int | str | None, task_id: str) -> EpisodePlan:
        """The episode's plan, a function of (seed, episode_seed, task_id) only."""
        rng = random.Random(f"workload:{self.seed}:{episode_seed}:{task_id}")
        turns = min(self.turns_max, max(1, round(rng.lognormvariate(math.log(self.turns_median), self.turns_sigma))))
        if self.tail_share and rng.random() < self.tail_share:  # drawn only with a tail: other plans stay as they were
            turns = self.turns_max
        tokens = [
            min(
                self.turn_tokens_max,
                max(1, round(rng.lognormvariate(math.log(self.turn_tokens_median), self.turn_tokens_sigma))),
            )
            for _ in range(turns)
        ]
        total = sum(tokens)
        if total < self.episode_tokens_min or total > self.episode_tokens_max:
            target = min(max(total, self.episode_tokens_min), self.episode_tokens_max)
            tokens = _rescale(tokens, target, self.turn_tokens_max)
        return EpisodePlan(tuple(tokens))


def _rescale(tokens: list[int], target: int, cap: int) -> list[int]:
    """`tokens` scaled to sum to `target` (each at least 1 and at most `cap`), keeping their proportions."""
    total = sum(tokens)
    scaled = [min(cap, max(1, math.floor(t * target / total))) for t in tokens]
    i = 0
    while sum(scaled) != target:  # hand out (or take back) the rounding remainder one token at a time
        step = 1 if sum(scaled) < target else -1
        if 1 <= scaled[i] + step <= cap:
            scaled[i] += step
        i = (i + 1) % len(scaled)
    return scaled


def quantiles(values: list[float], points: tuple[float, ...] = (0.5, 0.9, 0.99)) -> dict[str, float | None]:
    """Nearest-rank percentiles (p50, p90, p99) and the max of `values`; None for each if there are none."""
    names = [f"p{round(p * 100)}" for p in points]
    if not values:
        return {**{n: None for n in names}, "max": None}
    ordered = sorted(values)
    out = {
        n: round(ordered[min(len(ordered) - 1, math.ceil(p * len(ordered)) - 1)], 4)
        for n, p in zip(names, points, strict=True)
    }
    return {**out, "max": round(ordered[-1], 4)}
