"""What one training step records: the learner's stats, the batch's episodes, throughput, the rollouts' counters.

Keys a row carries beside the learner's own stats (every row of metrics.jsonl, and TensorBoard):

    learner/step_s                      seconds the loop waited for this step's learner update (for the Ray
                                        launcher, the batch's trip to the learner actor included)
    rollout/episodes                    episodes finished since the rollouts started (cumulative)
    rollout/generated_tokens_per_s      policy tokens in finished episodes per second since the rollouts started
    rollout/engine_idle_fraction        1 - engine busy seconds / elapsed, since the rollouts started (TorchEngine)
    rollout/episodes_in_flight_mean     episodes being played, time-weighted mean since the previous row
                                        (summed over rollout controllers; a group counts its group_size episodes)
    rollout/admission_blocked_share     share of the time since the previous row the ledger ran below its group
                                        limit (max_concurrent_rollouts // group_size): mostly the staleness rule
                                        holding groups back, plus the moments between a group's end and the next
                                        admission and after the run stops admitting (mean over controllers)
    engine/decode_steps, engine/prefill_tokens, engine/reused_tokens, engine/generated_tokens, engine/busy_s
                                        the engine's work counters, cumulative since this process started it
                                        (summed over engines; only engines that count them: the TorchEngine)
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from searchgym.agents.trajectory import Trajectory
from searchgym.envs.tools.simulated_search import noisy_share
from searchgym.trainers.rollout.controller import RolloutStats


class StepClock:
    """Wall time since this process began training, and trajectories trained per second over it."""

    def __init__(self) -> None:
        self.started, self.trajectories = time.perf_counter(), 0

    def tick(self, batch: list[list[Trajectory]]) -> dict[str, float]:
        """Count a trained batch; the elapsed time and throughput so far."""
        self.trajectories += sum(len(group) for group in batch)
        elapsed = time.perf_counter() - self.started
        return {"elapsed_s": elapsed, "trajectories_per_s": self.trajectories / elapsed}


def episode_metrics(batch: list[list[Trajectory]]) -> dict[str, float]:
    """Means over the batch's episodes: reward, success, turns, tool use and its cost per unit, generated tokens."""
    episodes = [t for group in batch for t in group]
    n = max(len(episodes), 1)
    costs = [t.tool_cost for t in episodes]
    units = sorted({unit for cost in costs for unit in cost})
    # a simulated search engine's noise share in the batch's results: its curriculum, recorded step by step
    noise = noisy_share([hit for t in episodes for turn in t.turns for hit in turn.info.get("hits") or ()])
    return {
        **({"episode/simulated_noise_share": noise} if noise is not None else {}),
        **{f"episode/cost/{unit}": sum(cost.get(unit, 0) for cost in costs) / n for unit in units},
        "episode/reward": sum(t.reward for t in episodes) / n,
        "episode/success": sum(bool((t.verdict or {}).get("correct")) for t in episodes) / n,
        "episode/turns": sum(len(t.turns) for t in episodes) / n,
        "episode/searches": sum(t.counts.get("search", 0) for t in episodes) / n,
        "episode/accesses": sum(t.counts.get("access", 0) for t in episodes) / n,
        "episode/generated_tokens": sum(t.generated_tokens for t in episodes) / n,
        "episode/segments": sum(t.num_segments for t in episodes) / n,  # context segments (1: never overflowed)
    }


class OccupancyWindow:
    """The rollouts' occupancy since the previous reading, from each controller's cumulative totals."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[float, float, float]] = {}  # per controller: episode-s, below-limit s, span s

    def read(self, stats: Sequence[RolloutStats]) -> dict[str, float]:
        """Mean episodes in flight and the share of time below the group limit since the last call (none: no time)."""
        in_flight = blocked = span = 0.0
        for i, r in enumerate(stats):
            now = (r.in_flight_episode_s, r.below_limit_s, r.occupancy_s)
            last, self._last[i] = self._last.get(i, (0.0, 0.0, 0.0)), now
            d_episodes, d_blocked, d_span = (a - b for a, b in zip(now, last, strict=True))
            if d_span > 0:
                in_flight += d_episodes / d_span
                blocked, span = blocked + d_blocked, span + d_span
        if span <= 0:
            return {}
        return {
            "rollout/episodes_in_flight_mean": in_flight,
            "rollout/admission_blocked_share": min(1.0, max(0.0, blocked / span)),
        }


def engine_metrics(stats: Sequence[RolloutStats]) -> dict[str, float]:
    """The engines' cumulative work counters (engine/decode_steps, ...), summed over controllers, where reported."""
    out: dict[str, float] = {}
    for r in stats:
        for key, value in r.engine.items():
            out[f"engine/{key}"] = out.get(f"engine/{key}", 0.0) + value
    return out


def rollout_metrics(stats: Sequence[RolloutStats]) -> dict[str, float]:
    """The rollout side's counters summed over controllers: throughput, engine idle fraction, dropped groups."""
    tokens_per_s = sum(r.generated_tokens / r.elapsed_s for r in stats if r.elapsed_s)
    out = {
        "rollout/episodes": float(sum(r.episodes for r in stats)),
        "rollout/failed_groups": float(sum(r.failed_groups for r in stats)),
        "rollout/rejected_groups": float(sum(r.rejected_groups for r in stats)),
        "rollout/judge_failed_groups": float(sum(r.judge_failed_groups for r in stats)),
        "rollout/generated_tokens_per_s": tokens_per_s,
    }
    idle = [r.engine_idle_fraction for r in stats if r.engine_idle_fraction is not None]
    if idle:
        out["rollout/engine_idle_fraction"] = sum(idle) / len(idle)
    return out


def step_metrics(
    learner_stats: dict[str, float],
    batch: list[list[Trajectory]],
    clock: StepClock,
    rollouts: Sequence[RolloutStats],
    window: OccupancyWindow | None = None,
) -> dict[str, float]:
    """One step's record: the learner's stats, the batch's episode means, throughput, rollout and engine counters."""
    return {
        **learner_stats,
        **episode_metrics(batch),
        **clock.tick(batch),
        **rollout_metrics(rollouts),
        **(window.read(rollouts) if window is not None else {}),
        **engine_metrics(rollouts),
    }
