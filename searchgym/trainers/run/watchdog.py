"""The collapse watchdog: after each learner step, is training collapsing, and which saved weights are still healthy.

RL on language models collapses in ways its users recognise (Search-R1, ZeroSearch and rLLM users report them):
the loss or the gradient turns NaN, the gradient norm jumps far above its usual level, the policy's entropy falls
to nothing (it repeats one token) or explodes (it babbles), the importance ratios blow up (the policy moved far from
the one that sampled), or the episode reward falls to zero from a healthy level. Each rule, with its default
(`WatchdogConfig`, the `watchdog:` config section; a null threshold turns a rule off):

    non_finite         loss, grad_norm or entropy is NaN or infinite                      always on
    grad_norm_spike    grad_norm > grad_norm_factor x the median of earlier healthy ones   20x, after min_history 3
    entropy_collapse   entropy < entropy_floor and < entropy_drop x its median             0.05 nats and 0.1x
    entropy_explosion  entropy > entropy_rise x its median                                 10x, after min_history 3
    ratio_blowup       importance_weight_max > ratio_max                                   100
    clip_blowup        clip_fraction > clip_fraction_max                                   0.8
    behav_capped       behav_capped_fraction > behav_capped_max                            0.5
    reward_collapse    mean episode/reward of the last reward_window steps < reward_drop   window 5, 0.1x, watched
                       x the median reward before them, that median being >= reward_level  from a median of 0.1

Medians run over the last `history` (20) healthy steps; the grad-norm median counts only steps that had a gradient.
A relative rule cannot fire before it has seen healthy steps, so a run that starts collapsed (or a converged
policy's naturally low entropy) does not trigger it: it catches a sudden change, not a level.

Which weights are healthy. A step's statistics are measured on the weights it started from (its forward pass and
gradient), so a trigger at step s blames the weights step s - 1 produced, and the reward rule blames the weights
from its window's first step on. The healthy state is the newest checkpoint whose weights came from before the
blamed ones, or the run's initial weights (the model it started from, or the checkpoint it resumed from). The
watchdog names that checkpoint in `checkpoints/healthy`, which checkpoint pruning (`keep_checkpoints`) never deletes.
The training loop (loop.py) acts on a trigger: it restores that state with a lower learning rate, or stops.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from searchgym.trainers.config import WatchdogConfig
from searchgym.trainers.run.checkpoint import HEALTHY, checkpoint_dir, checkpoint_root, write_pointer


class TrainingCollapsed(ValueError):
    """The run collapsed again after `max_restores` restores: it stops (the CLI prints this and exits non-zero)."""


@dataclass(frozen=True)
class Alarm:
    """A rule's verdict that training is collapsing: which rule, why (with the numbers), and since which step."""

    rule: str
    reason: str
    since: int  # the first step whose statistics show it (the reward rule: its window's first step)


@dataclass(frozen=True)
class HealthyState:
    """Weights to restore: a checkpoint (or the initial model) and the step whose update produced them."""

    path: Path
    origin: int  # the step that produced these weights (the start step for the initial weights)
    step: int | None  # the checkpoint's step; None for the initial weights

    @property
    def name(self) -> str:
        return self.path.name if self.step is not None else f"the initial weights ({self.path})"


def _finite(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _series(history: Sequence[dict[str, float]], key: str, last: int, *, positive: bool = False) -> list[float]:
    """The finite values of `key` in the last `last` healthy steps (only > 0 with `positive`)."""
    values = [h[key] for h in history if _finite(h.get(key))]
    return [v for v in values if v > 0][-last:] if positive else values[-last:]


def check_rules(
    config: WatchdogConfig, step: int, metrics: dict[str, float], history: Sequence[dict[str, float]]
) -> Alarm | None:
    """The first rule `metrics` (step `step`) breaks, given the earlier healthy steps' metrics (oldest first)."""
    for key in ("loss", "grad_norm", "entropy"):
        if key in metrics and not _finite(metrics[key]):
            return Alarm("non_finite", f"{key} is {metrics[key]}", step)
    median: float | None
    grad = metrics.get("grad_norm")
    if config.grad_norm_factor is not None and grad is not None:
        earlier = _series(history, "grad_norm", config.history, positive=True)
        if len(earlier) >= max(config.min_history, 1):
            median = statistics.median(earlier)
            if grad > config.grad_norm_factor * median:
                return Alarm(
                    "grad_norm_spike",
                    f"grad_norm {grad:.4g} > {config.grad_norm_factor:g} x its median {median:.4g}",
                    step,
                )
    entropy = metrics.get("entropy")
    if entropy is not None:
        earlier = _series(history, "entropy", config.history)
        median = statistics.median(earlier) if earlier else None
        if (
            config.entropy_floor is not None
            and median is not None
            and entropy < config.entropy_floor
            and entropy < config.entropy_drop * median
        ):
            return Alarm(
                "entropy_collapse",
                f"entropy {entropy:.4g} < floor {config.entropy_floor:g} and < "
                f"{config.entropy_drop:g} x its median {median:.4g}",
                step,
            )
        if (
            config.entropy_rise is not None
            and median is not None
            and len(earlier) >= max(config.min_history, 1)
            and entropy > config.entropy_rise * median
        ):
            return Alarm(
                "entropy_explosion", f"entropy {entropy:.4g} > {config.entropy_rise:g} x its median {median:.4g}", step
            )
    for rule, key, limit in (
        ("ratio_blowup", "importance_weight_max", config.ratio_max),
        ("clip_blowup", "clip_fraction", config.clip_fraction_max),
        ("behav_capped", "behav_capped_fraction", config.behav_capped_max),
    ):
        value = metrics.get(key)
        if limit is not None and value is not None and value > limit:
            return Alarm(rule, f"{key} {value:.4g} > {limit:g}", step)
    return _reward_rule(config, step, metrics, history)


def _reward_rule(
    config: WatchdogConfig, step: int, metrics: dict[str, float], history: Sequence[dict[str, float]]
) -> Alarm | None:
    """Episode reward fallen to near zero: the window's mean far below the median of the healthy steps before it."""
    if config.reward_drop is None or not _finite(metrics.get("episode/reward")):
        return None
    rows = [h for h in history if _finite(h.get("episode/reward"))] + [metrics]
    window, before = rows[-config.reward_window :], rows[: -config.reward_window][-config.history :]
    if len(window) < config.reward_window or len(before) < max(config.min_history, 1):
        return None
    level = statistics.median(h["episode/reward"] for h in before)
    mean = statistics.fmean(h["episode/reward"] for h in window)
    if level >= config.reward_level and mean < config.reward_drop * level:
        since = int(window[0].get("step", step))
        return Alarm(
            "reward_collapse",
            f"mean episode reward {mean:.4g} over steps {since}..{step} < "
            f"{config.reward_drop:g} x its earlier median {level:.4g}",
            since,
        )
    return None


@dataclass
class _Step:
    """A healthy step: its number, the origin of the weights it started from, and its metrics."""

    step: int
    origin: int
    metrics: dict[str, float]


@dataclass
class Watchdog:
    """Judges each step (`check`), remembers healthy steps and saved checkpoints, and names the state to restore.

    `origin` is the step that produced the learner's current weights: the step just trained, or after a restore
    the restored weights' origin; checkpoints are remembered with the origin of the weights they hold.
    """

    config: WatchdogConfig
    run_dir: Path
    initial: HealthyState  # the weights the run started from: always healthy, the last resort
    restores: int = 0
    lr_scale: float = 1.0
    origin: int = 0
    last_step: int = 0  # the last step checked
    _steps: list[_Step] = field(default_factory=list)
    _checkpoints: list[tuple[int, int]] = field(default_factory=list)  # (step, origin of its weights)
    _parent: dict[int, int] = field(default_factory=dict)  # healthy step -> the origin of the weights it started from

    @classmethod
    def for_run(
        cls,
        config: WatchdogConfig,
        run_dir: str | os.PathLike,
        initial_weights: str | os.PathLike,
        *,
        start_step: int,
        state: dict[str, Any] | None = None,
        can_restore: bool = True,
    ) -> Watchdog | None:
        """The watchdog of a run starting after `start_step` from `initial_weights` (None when it is disabled).

        `state` is a resumed checkpoint's `state()` (restores so far, learning-rate scale), so --resume keeps both.
        A learner that cannot restore (the sharded one, today) gets `max_restores=0`: a collapse stops the run
        cleanly at its last healthy checkpoint instead of failing in the middle of a restore.
        """
        if not config.enabled:
            return None
        if not can_restore:
            config = dataclasses.replace(config, max_restores=0)
        state = state or {}
        start = HealthyState(Path(initial_weights), start_step, start_step if start_step else None)
        return cls(
            config,
            Path(run_dir),
            start,
            restores=int(state.get("restores", 0)),
            lr_scale=float(state.get("lr_scale", 1.0)),
            origin=start_step,
            last_step=start_step,
        )

    # ---- judging steps -------------------------------------------------------------------------------------------

    def check(self, step: int, metrics: dict[str, float]) -> Alarm | None:
        """Whether step `step` (its learner and episode metrics) shows a collapse; healthy steps are remembered."""
        alarm = check_rules(self.config, step, {**metrics, "step": step}, [s.metrics for s in self._steps])
        self.last_step = step
        if alarm is None:
            self._steps.append(_Step(step, self.origin, {**metrics, "step": step}))
            del self._steps[: -(self.config.history + self.config.reward_window)]
            self._parent[step] = self.origin
            self.origin = step
        return alarm

    @property
    def exhausted(self) -> bool:
        """No restore left: the next trigger stops the run."""
        return self.restores >= self.config.max_restores

    # ---- checkpoints ---------------------------------------------------------------------------------------------

    def saved(self, step: int) -> None:
        """A checkpoint of the current weights was written at `step`."""
        self._checkpoints.append((step, self.origin))

    def healthy(self, alarm: Alarm) -> HealthyState:
        """The newest state whose weights predate those `alarm` blames: a checkpoint still on disk, else the initial."""
        return self._newest_before(self._blamed_origin(alarm.since))

    def protect(self) -> None:
        """Name in checkpoints/healthy the checkpoint a later trigger could restore, so pruning keeps it.

        A trigger at the next step blames the current weights; the reward rule can blame weights up to its window
        back, but only from a step whose earlier median reward is already at `reward_level`, so in a run whose
        reward never got there the pinned checkpoint is at most one save old and `keep_checkpoints` holds as set.
        """
        blamed = [self.origin]
        config, rewards = self.config, [(s.step, s.metrics.get("episode/reward")) for s in self._steps]
        if config.reward_drop is not None:
            for i, (since, _) in enumerate(rewards):
                before = [r for _, r in rewards[:i] if _finite(r)][-config.history :]
                if (
                    since > self.last_step + 1 - config.reward_window
                    and len(before) >= max(config.min_history, 1)
                    and statistics.median(before) >= config.reward_level
                ):
                    blamed.append(self._blamed_origin(since))
        state, pointer = self._newest_before(min(blamed)), checkpoint_root(self.run_dir) / HEALTHY
        if state.path.parent == checkpoint_root(self.run_dir):
            write_pointer(pointer, state.path.name)
        else:  # the initial weights live outside the run's checkpoints: nothing there to keep
            pointer.unlink(missing_ok=True)

    def restored(self, state: HealthyState) -> None:
        """The learner now holds `state`'s weights, with the learning rate lowered once more."""
        self.restores += 1
        self.lr_scale *= self.config.lr_factor
        self.origin = state.origin
        lineage = self._ancestors(state.origin)  # the steps that led to the restored weights
        self._steps = [s for s in self._steps if s.step in lineage or s.origin == state.origin]
        self._checkpoints = [(step, origin) for step, origin in self._checkpoints if origin in lineage]

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the watchdog: restores so far and the learning-rate scale."""
        return {"restores": self.restores, "lr_scale": self.lr_scale}

    def _ancestors(self, origin: int) -> set[int]:
        """`origin` and the origins of the weights each step before it started from, back to the initial weights."""
        lineage = {origin}
        while origin in self._parent and self._parent[origin] not in lineage:
            origin = self._parent[origin]
            lineage.add(origin)
        return lineage

    def _blamed_origin(self, since: int) -> int:
        """The origin of the weights step `since` started from (the current weights for a step not yet seen)."""
        for s in self._steps:
            if s.step == since:
                return s.origin
        return self.origin

    def _newest_before(self, origin: int) -> HealthyState:
        """The newest checkpoint on disk holding weights from before `origin`, else the initial weights."""
        for step, held in reversed(self._checkpoints):
            path = checkpoint_dir(self.run_dir, step)
            if held < origin and (path / "trainer.pt").exists():
                return HealthyState(path, held, step)
        return self.initial


def describe(alarm: Alarm, state: HealthyState, *, step: int, lr: float | None, stopping: bool) -> str:
    """The one-line report of a trigger, for stderr."""
    head = f"searchgym watchdog: step {step}: {alarm.rule}: {alarm.reason}"
    if stopping:
        return f"{head}; stopping"
    return f"{head}; restored {state.name}" + (f", learning rate now {lr:.3g}" if lr is not None else "")
