"""The training loop, the one both launchers run; they differ only in the handles they pass.

Read top to bottom; one step is

    batch   = rollouts.get_batch()          batch_size groups, oldest first, within the staleness bound
    stats   = learner.train_step(batch)     one decoupled-PPO update: weights v -> v + 1
    version = learner.push_weights()        the engines serve v + 1; generations in flight continue
    rollouts.set_trained_version(version)   admission now counts against v + 1
    record the step's metrics and the batch's trajectories (the run log)
    every save_every steps and at the last: learner.save_checkpoint(step, rollouts.state_dicts())

The rollouts never wait for this loop: they keep playing groups while the learner trains.

With the collapse watchdog (watchdog.py, on unless `watchdog.enabled: false`) each step is judged before its
weights reach the engines. A collapsed step's update is never pushed; instead

    learner.restore(healthy, lr_scale)      the last healthy checkpoint's weights and optimizer state, lower lr
    learner.push_weights()                  the engines serve them, under a version that still only grows
    rollouts.discard()                      every group in flight or buffered was sampled by the collapsed
                                            weights (or older): dropped, their data positions played again
    the step's metrics row says so (watchdog/*), one line on stderr, and a checkpoint of the restored state

and the run goes on to its last step. A collapse after `max_restores` restores stops the run (TrainingCollapsed,
with `latest` pointing at the last healthy checkpoint, so --resume starts from it).

On SIGTERM or SIGINT (`stop`, stopping.py) the loop ends at a step boundary: a batch still awaited is abandoned,
a step being trained finishes; the last trained step is checkpointed (after an abandoned wait, where the rollout
side is `cancel_safe`: its state then still owes every group), and TrainingStopped names what `latest` holds.

`launchers/local.py` passes in-process handles (a RolloutController, a Learner and a WeightSync in one event
loop); `launchers/ray_cluster.py` passes handles to Ray actors.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tqdm import tqdm

from searchgym.agents.trajectory import Trajectory
from searchgym.trainers.rollout.controller import RolloutStats
from searchgym.trainers.run.checkpoint import LATEST, checkpoint_root, write_pointer
from searchgym.trainers.run.log import RunLog
from searchgym.trainers.run.metrics import OccupancyWindow, StepClock, episode_metrics, step_metrics
from searchgym.trainers.run.stopping import StopRequest
from searchgym.trainers.run.watchdog import Alarm, HealthyState, TrainingCollapsed, Watchdog, describe


@dataclass
class Batch:
    """One step's groups; `refs` says where they already live (Ray object refs), so a remote learner fetches them
    there."""

    groups: list[list[Trajectory]]
    refs: Sequence[Any] = ()


class RolloutSide(Protocol):
    """What the loop needs from the rollout side (one controller, or one per Ray rollout actor)."""

    # whether a cancelled get_batch leaves every group in the state_dicts (a stop's checkpoint then loses none)
    cancel_safe: bool

    async def get_batch(self) -> Batch:
        """The next batch, oldest groups first, within the staleness bound at the trained version."""
        ...

    async def set_trained_version(self, version: int) -> None:
        """The learner has trained `version`: admit new groups against it."""
        ...

    async def stats(self) -> list[RolloutStats]:
        """Each controller's counters."""
        ...

    async def state_dicts(self) -> list[dict[str, Any]]:
        """Each controller's checkpoint state (data position, groups to replay, counts)."""
        ...

    async def discard(self) -> int:
        """Drop every group in flight or buffered (their positions are played again); how many."""
        ...


class LearnerSide(Protocol):
    """What the loop needs from the learner side (in this process, or a Ray actor)."""

    async def train_step(self, batch: Batch) -> dict[str, float]:
        """One learner step on the batch; its statistics (the new version among them)."""
        ...

    async def push_weights(self) -> int:
        """Send the current weights to every engine; returns the version they now serve."""
        ...

    async def save_checkpoint(self, step: int, rollouts: list[dict[str, Any]]) -> None:
        """Write checkpoint `step`: the model, the learner state and the rollout controllers' states."""
        ...

    async def restore(self, weights: str, from_checkpoint: bool, watchdog: dict[str, Any]) -> float:
        """Load healthy weights (a checkpoint, or the initial model) with the watchdog's lr scale; the new lr."""
        ...


@dataclass(frozen=True)
class Schedule:
    """Which steps this process trains and when it checkpoints."""

    first_step: int  # 1 for a fresh run; the checkpoint's step + 1 when resuming
    last_step: int  # config.steps
    version: int  # the weight version at first_step (the learner steps already taken)
    save_every: int

    def checkpoint_due(self, step: int) -> bool:
        """Every `save_every` steps, and always at the last step."""
        return step % self.save_every == 0 or step == self.last_step


async def train_loop(
    rollouts: RolloutSide,
    learner: LearnerSide,
    run_log: RunLog,
    schedule: Schedule,
    *,
    progress: bool = True,
    desc: str = "training",
    watchdog: Watchdog | None = None,
    stop: StopRequest | None = None,
) -> list[dict[str, float]]:
    """Train steps first_step .. last_step; every step's metrics, this run's and (after a resume) the earlier ones'.

    With `stop` (set by SIGTERM/SIGINT, stopping.py) the loop ends at a step boundary and raises TrainingStopped.
    """
    clock, window, version = StepClock(), OccupancyWindow(), schedule.version
    trained = saved = schedule.first_step - 1  # the last step trained, and the last one `latest` holds

    async def save(step: int) -> None:
        nonlocal saved
        if watchdog is not None:
            watchdog.protect()
        await learner.save_checkpoint(step, await rollouts.state_dicts())
        if watchdog is not None:
            watchdog.saved(step)
        saved = step

    steps = range(schedule.first_step, schedule.last_step + 1)
    try:
        for step in tqdm(
            steps, desc=desc, disable=not progress, initial=schedule.first_step - 1, total=schedule.last_step
        ):
            batch = await _batch_unless_stopped(rollouts, stop)
            if batch is None:  # stopped while waiting: nothing of this step was trained
                if saved < trained and getattr(rollouts, "cancel_safe", False):
                    await save(trained)  # the trained steps since the last checkpoint are kept
                break
            started = time.perf_counter()
            stats = await learner.train_step(batch)
            learner_s = time.perf_counter() - started
            alarm = watchdog.check(step, {**stats, **episode_metrics(batch.groups)}) if watchdog else None
            trained_version, collapsed = version, None
            extra: dict[str, Any]
            if alarm is None or watchdog is None:
                version, extra = await learner.push_weights(), {}
                await rollouts.set_trained_version(version)
            elif watchdog.exhausted:
                extra, collapsed = _stop(run_log, watchdog, alarm, step)
            else:
                version, extra = await _recover(rollouts, learner, watchdog, alarm, step)
            metrics = step_metrics(
                {**stats, "learner/step_s": learner_s}, batch.groups, clock, await rollouts.stats(), window
            )
            run_log.record(step, {**metrics, **extra}, batch.groups, trained_version)
            trained = step
            if collapsed is not None:
                raise collapsed
            stopping = stop is not None and stop.requested
            # after a restore too, so latest is never collapsed
            if alarm is not None or schedule.checkpoint_due(step) or stopping:
                await save(step)
            if stopping:
                break
    except asyncio.CancelledError:
        if stop is None or not stop.abandoned:
            raise
        raise stop.stopped(trained, _latest(run_log)) from None
    if stop is not None and stop.requested and trained < schedule.last_step:
        raise stop.stopped(trained, _latest(run_log))
    return run_log.history()


async def _batch_unless_stopped(rollouts: RolloutSide, stop: StopRequest | None) -> Batch | None:
    """The next batch, or None when `stop` is requested first (the wait is cancelled; a batch that came wins)."""
    if stop is None:
        return await rollouts.get_batch()
    if stop.requested:
        return None
    fetch, stopped = asyncio.ensure_future(rollouts.get_batch()), asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({fetch, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not fetch.done():
            fetch.cancel()
            await asyncio.gather(fetch, return_exceptions=True)
    return None if fetch.cancelled() else fetch.result()


def _latest(run_log: RunLog) -> str | None:
    """The checkpoint `latest` names now, if any."""
    pointer = checkpoint_root(run_log.dir) / LATEST
    return pointer.read_text().strip() if pointer.exists() else None


def _alarm_metrics(watchdog: Watchdog, alarm: Alarm, state: HealthyState) -> dict[str, float]:
    """The metrics row's account of a trigger: which steps it blamed and what it restored."""
    return {
        "watchdog/trigger": 1.0,
        "watchdog/since_step": float(alarm.since),
        "watchdog/restored_step": float(state.step or 0),
        "watchdog/restores": float(watchdog.restores),
    }


def _stop(run_log: RunLog, watchdog: Watchdog, alarm: Alarm, step: int) -> tuple[dict[str, float], TrainingCollapsed]:
    """No restore left: point `latest` at the healthy state (so --resume starts there); the error that ends the run."""
    state = watchdog.healthy(alarm)
    if state.step is not None:
        write_pointer(checkpoint_root(run_log.dir) / LATEST, state.path.name)
    else:  # the healthy state is the run's initial weights: no checkpoint of this run is, so --resume has none
        (checkpoint_root(run_log.dir) / LATEST).unlink(missing_ok=True)
    print(describe(alarm, state, step=step, lr=None, stopping=True), file=sys.stderr, flush=True)
    where = (
        f"{state.name}, which checkpoints/latest now names (--resume goes on from it at its own learning rate; "
        f"for a lower one start a new run with model.path={state.path} and a lower learner.lr)"
        if state.step is not None
        else f"{state.name} (checkpoints/latest is removed, so --resume cannot go on "
        "from collapsed weights): start again with a lower learner.lr"
    )
    error = TrainingCollapsed(
        f"training collapsed at step {step} ({alarm.rule}: {alarm.reason}) after {watchdog.restores} restore(s) "
        f"(watchdog.max_restores={watchdog.config.max_restores}); the last healthy state is {where}"
    )
    return {**_alarm_metrics(watchdog, alarm, state), "watchdog/stopped": 1.0}, error


async def _recover(
    rollouts: RolloutSide, learner: LearnerSide, watchdog: Watchdog, alarm: Alarm, step: int
) -> tuple[int, dict[str, float]]:
    """Restore the healthy state with a lower lr, push it, drop the groups the collapsed weights generated."""
    state = watchdog.healthy(alarm)
    lr = await learner.restore(
        str(state.path),
        state.step is not None,
        {"restores": watchdog.restores + 1, "lr_scale": watchdog.lr_scale * watchdog.config.lr_factor},
    )
    watchdog.restored(state)
    version = await learner.push_weights()  # the restored weights, under the collapsed step's version: never an old one
    dropped = await rollouts.discard()
    await rollouts.set_trained_version(version)
    print(
        describe(alarm, state, step=step, lr=lr, stopping=False) + f"; {dropped} groups in flight dropped",
        file=sys.stderr,
        flush=True,
    )
    return version, {
        **_alarm_metrics(watchdog, alarm, state),
        "watchdog/lr": lr,
        "watchdog/dropped_groups": float(dropped),
    }
