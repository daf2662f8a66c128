"""Episode rewards as a trainer outside searchgym receives them: the judge's bounded verdict, with
process rewards only through Clip or Delta refinement (arXiv 2410.15115), and judge failures kept
apart from wrong answers.

A process reward here is the env's privileged evidence that a search retrieved the answer page
(`info["evidence"]["answer_page_rank"]`). Paid as it is, a policy could raise its return by
repeating that search; refined, it cannot:
- "clip":  r_t -> min(r_t - threshold, 0), so the process part of the return is at most 0;
- "delta": r_t -> r_t - r_{t+1}, so the process part telescopes to the first step's reward.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

PROCESS_MODES = ("clip", "delta")


def refine_process_rewards(step_rewards: Sequence[float], *, mode: str = "clip", threshold: float = 0.0) -> list[float]:
    """Per-step process rewards refined so that repeating a rewarded step cannot raise the return (2410.15115).

    - "clip":  r_t -> min(r_t - threshold, 0). Every refined reward is <= 0, so each extra step can only lower
      the return: the sum of process rewards is bounded above by 0.
    - "delta": r_t -> r_t - r_{t+1} with r_{T+1} = 0. The sum from step t telescopes to r_t, so the return of
      the whole trajectory gets exactly one step's reward, however many steps it takes.
    - "none":  unchanged (the reference trainer's opt-out). Hackable: a policy can raise its return by repeating
      any positively rewarded step, so nothing that crosses to a third-party trainer uses it.
    """
    rewards = [float(r) for r in step_rewards]
    if mode == "clip":
        return [min(r - threshold, 0.0) for r in rewards]
    if mode == "delta":
        return [r - nxt for r, nxt in zip(rewards, rewards[1:] + [0.0], strict=False)]  # no rewards: []
    if mode == "none":
        return rewards
    raise ValueError(f"unknown reward refinement mode {mode!r}: expected 'clip', 'delta' or 'none'")


def answer_page_rewards(step_infos: Sequence[Mapping[str, Any]], weight: float) -> list[float]:
    """`weight` for each step whose search retrieved the task's answer page, else 0 (one entry per step)."""
    return [weight * float(((info.get("evidence") or {}).get("answer_page_rank")) is not None) for info in step_infos]


class JudgeFailed(RuntimeError):
    """The judge could not score the answer (its call failed, was cut off or gave no verdict): no reward exists.

    Raised by the adapters for libraries without a "no reward" value (GEM, SkyRL-gym, verifiers), where a 0
    would train the agent on a failure of the judge's."""


def judge_error(step_infos: Sequence[Mapping[str, Any]]) -> str | None:
    """The judge's failure message if the episode's answer could not be judged, else None."""
    for info in step_infos:
        verdict = info.get("verdict")
        if isinstance(verdict, Mapping) and verdict.get("error"):
            return str(verdict["error"])
    return None


def episode_reward(
    step_infos: Sequence[Mapping[str, Any]],
    *,
    process: str | None = None,
    process_weight: float = 0.0,
    threshold: float = 0.0,
) -> float | None:
    """The episode's reward from its steps' infos: the verdict's score (0 without an answer), plus the
    refined answer-page process rewards when `process` is "clip" or "delta"; None when the judge failed.

    The outcome is in [0, 1] (a Verdict cannot hold another score); the refined process part is at
    most 0 under clip and at most `process_weight` under delta, whatever the number of steps.
    """
    if process is not None and process not in PROCESS_MODES:
        raise ValueError(
            f"process rewards cross only refined: process must be one of {PROCESS_MODES} or None, got {process!r}"
        )
    if judge_error(step_infos) is not None:
        return None
    outcome = 0.0
    for info in step_infos:
        verdict = info.get("verdict")
        if isinstance(verdict, Mapping):
            outcome = float(verdict["score"])
    if process is None or process_weight == 0.0 or not step_infos:
        return outcome
    refined = refine_process_rewards(answer_page_rewards(step_infos, process_weight), mode=process, threshold=threshold)
    return outcome + sum(refined)
