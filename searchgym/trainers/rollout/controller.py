"""The rollout side of asynchronous RL: keep episode groups in flight, never waiting for the learner.

One asyncio loop admits groups under the staleness rule, plays each task's `group_size` episodes
concurrently through the rollout workflow (the engine batches their requests), and records every
group's life in one `GroupLedger`: admitted, then buffered, rejected, failed or cancelled, then
handed to the learner by `get_batch()` (oldest first; it waits only when a younger batch would push
an older group past the staleness bound). Tasks come in a seeded order, epoch after epoch, so a
resumed run continues the same data order. The trainer sets `trained_version` after each learner
step; the loop wakes on that and whenever a group ends, never polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from searchgym.agents.engines.types import InferenceEngine
from searchgym.agents.env_pool import EnvPool
from searchgym.agents.trajectory import Trajectory
from searchgym.agents.workflow import Workflow
from searchgym.envs.search_env import SearchEnv
from searchgym.envs.tasks import TaskPool
from searchgym.trainers.rollout.ledger import GroupLedger

log = logging.getLogger(__name__)

# the engine's cumulative work counters a RolloutStats carries, where the engine's stats() has them (TorchEngine)
ENGINE_COUNTERS = ("decode_steps", "prefill_tokens", "reused_tokens", "generated_tokens", "busy_s")


@dataclass
class RolloutStats:
    """What the rollouts have done: group counts over the whole run (a resumed one included), the rest since run()."""

    episodes: int = 0  # episodes finished, in groups that finished
    groups: int = 0  # groups accepted (buffered or trained)
    rejected_groups: int = 0  # groups the filter turned down
    failed_groups: int = 0  # groups dropped because an episode (or the filter) raised
    cancelled_groups: int = 0  # groups cut short by stop()
    judge_failed_groups: int = 0  # groups played again because the judge failed on an answer (not trained)
    generated_tokens: int = 0  # policy tokens in finished episodes
    reward_sum: float = 0.0  # over finished episodes
    elapsed_s: float = 0.0  # since run() began
    engine_idle_fraction: float | None = None  # 1 - engine busy time / elapsed, if the engine has stats()
    # cumulative since the first admission (the ledger's Occupancy): episodes in flight integrated over time,
    # seconds with fewer groups running than the limit, and the seconds observed
    in_flight_episode_s: float = 0.0
    below_limit_s: float = 0.0
    occupancy_s: float = 0.0
    engine: dict[str, float] = dataclasses.field(default_factory=dict)  # ENGINE_COUNTERS the engine reports


def judge_failures(group: list[Trajectory]) -> list[str]:
    """The judge errors on a group's answers (an LLM judge whose call failed, was cut off or gave no verdict)."""
    return [
        str(traj.verdict["error"]) for traj in group if isinstance(traj.verdict, dict) and traj.verdict.get("error")
    ]


@dataclass
class GroupLimits:
    """What the controller plays and keeps: `group_size` episodes a group (one task), `batch_size` groups a batch,
    groups at most `max_staleness` weight versions behind the trained one, `max_concurrent_rollouts` episodes in
    flight (the staleness rule, `GroupLedger`)."""

    group_size: int
    batch_size: int
    max_staleness: int
    max_concurrent_rollouts: int


class RolloutController:
    """Keeps episode groups in flight without ever waiting for training.

    Admits groups under the staleness rule, plays each task's `group_size` episodes concurrently with
    the workflow (each on its own env, lent from a pool of `make_env`'s envs, with its own seed and rid,
    all on the same task), and buffers finished groups the filter accepts. A rejected or failed group
    gives its slot back. `limits` (`GroupLimits`) sizes the groups, the batches and what is in flight.
    `engine`, the one the workflow plays on (its caller owns it), gives the starting version and the busy-time
    statistics; without it the version starts at 0 and the stats have no engine counters.
    """

    def __init__(
        self,
        make_env: Callable[[], SearchEnv],
        workflow: Workflow,
        tasks: TaskPool | Sequence[str],
        limits: GroupLimits,
        *,
        engine: InferenceEngine | None = None,
        seed: int = 0,
        filter_group: Callable[[list[Trajectory]], bool] | None = None,
    ):
        self.task_ids = [t.id for t in tasks] if isinstance(tasks, TaskPool) else [str(t) for t in tasks]
        if not self.task_ids:
            raise ValueError("no tasks to play")
        self.envs, self.workflow = EnvPool(make_env), workflow
        self.engine = engine
        self.group_size, self.seed, self.filter_group = limits.group_size, seed, filter_group
        self.ledger = GroupLedger(
            limits.batch_size, limits.max_staleness, limits.max_concurrent_rollouts, limits.group_size
        )
        self._trained_version = self.engine.version if self.engine is not None else 0
        self._stats = RolloutStats()
        self._wake = asyncio.Event()
        self._stopping = False
        self._playing: set[asyncio.Task] = set()  # the groups being played
        self._rid = uuid.uuid4().hex[:8]
        self._order: tuple[int, np.ndarray] | None = None  # (epoch, permutation of task indices)
        self._started_at: tuple[float, float | None] | None = None  # (wall clock, engine busy seconds) at run()

    @property
    def position(self) -> int:
        """The data position of the next new group."""
        return self.ledger.position

    @property
    def trained_version(self) -> int:
        """The version of the weights the learner has trained (the engine's version after the last step)."""
        return self._trained_version

    @trained_version.setter
    def trained_version(self, version: int) -> None:
        self._trained_version = version
        self._wake.set()

    def task_at(self, position: int) -> str:
        """The task the position-th group plays: epoch after epoch, each a seeded permutation of the tasks."""
        epoch, index = divmod(position, len(self.task_ids))
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, np.random.default_rng([self.seed, epoch]).permutation(len(self.task_ids)))
        return self.task_ids[self._order[1][index]]

    async def get_batch(self) -> list[list[Trajectory]]:
        """The learner's next `batch_size` groups, oldest first, within the staleness bound at `trained_version`."""
        return await self.ledger.take_batch(self.trained_version)

    async def run(self) -> None:
        """Admit and start groups whenever the rule allows, until stop(); then cancel the groups in flight."""
        self._started_at = (time.perf_counter(), self._engine_stats().get("busy_s"))
        groups = self._playing
        try:
            while not self._stopping:
                self._wake.clear()
                while (admitted := self.ledger.admit(self.trained_version)) is not None:
                    group = asyncio.create_task(self._play_group(admitted.position))
                    groups.add(group)
                    group.add_done_callback(groups.discard)
                await self._wake.wait()
        finally:
            for group in groups:
                group.cancel()
            await asyncio.gather(*groups, return_exceptions=True)
            self.envs.close()
            self._stopping = False

    def stop(self) -> None:
        """Ask run() to return: it starts nothing more and cancels the groups in flight."""
        self._stopping = True
        self._wake.set()

    async def discard(self) -> int:
        """Drop every group being played or buffered; their positions are played again. How many were dropped.

        After the trainer restored older weights, no group sampled (even in part) by the weights it replaced may
        reach the learner; replaying the positions keeps the data order whole.
        """
        playing = list(self._playing)
        for group in playing:
            group.cancel()
        await asyncio.gather(*playing, return_exceptions=True)
        dropped = len(playing) + self.ledger.requeue_buffered()
        self._wake.set()
        return dropped

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[RolloutController]:
        """run() in the background for the duration of the block; stopped (groups in flight cancelled) after it."""
        task = asyncio.create_task(self.run())
        try:
            yield self
        finally:
            self.stop()
            await task

    def stats(self) -> RolloutStats:
        """Counters so far, with the elapsed time and engine idle fraction since run() began."""
        ledger, occupancy = self.ledger, self.ledger.occupancy.totals()
        engine = self._engine_stats()
        stats = dataclasses.replace(
            self._stats,
            groups=ledger.accepted,
            rejected_groups=ledger.rejected,
            failed_groups=ledger.failed,
            cancelled_groups=ledger.cancelled,
            judge_failed_groups=ledger.judge_failed,
            in_flight_episode_s=occupancy.group_s * self.group_size,
            below_limit_s=occupancy.below_limit_s,
            occupancy_s=occupancy.span_s,
            engine={k: float(engine[k]) for k in ENGINE_COUNTERS if k in engine},
        )
        if self._started_at is None:
            return stats
        elapsed = time.perf_counter() - self._started_at[0]
        busy, busy_then = engine.get("busy_s"), self._started_at[1]
        idle = (
            None if busy is None or busy_then is None or elapsed <= 0 else max(0.0, 1.0 - (busy - busy_then) / elapsed)
        )
        return dataclasses.replace(stats, elapsed_s=elapsed, engine_idle_fraction=idle)

    def state_dict(self) -> dict[str, Any]:
        """The ledger's checkpoint: data position, the groups to replay, and the counts to resume from."""
        return self.ledger.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state_dict`: replay its unfinished positions, then go on from `position`."""
        self.ledger.load_state_dict(state)

    async def _play_group(self, position: int) -> None:
        """Play one group to the end and record how it ended in the ledger: buffered, rejected, failed or cancelled."""
        task_id = self.task_at(position)
        try:
            async with asyncio.TaskGroup() as episodes:
                played = [
                    episodes.create_task(self._play_episode(task_id, position, k)) for k in range(self.group_size)
                ]
            group = [episode.result() for episode in played]
            for traj in group:
                traj.group = position
            accepted = self.filter_group is None or self.filter_group(group)
        except asyncio.CancelledError:
            self.ledger.cancel(position)
            raise
        except Exception as exc:  # noqa: BLE001 -- one bad episode must not stop the rollouts
            log.warning("group %d (task %s) dropped: %r", position, task_id, exc, exc_info=exc)
            self.ledger.fail(position)
            self._wake.set()
            return
        failures = judge_failures(group)
        if failures:  # the judge's failure is not the agent's: no reward from it is trained; the group plays again
            log.warning(
                "group %d (task %s) played again: the judge failed on %d answer(s): %s",
                position,
                task_id,
                len(failures),
                failures[0],
            )
            self.ledger.judge_fail(position)
            self._wake.set()
            return
        self._stats.episodes += len(group)
        self._stats.generated_tokens += sum(traj.generated_tokens for traj in group)
        self._stats.reward_sum += sum(traj.reward for traj in group)
        if accepted:
            self.ledger.finish(position, group)
        else:
            self.ledger.reject(position)
        self._wake.set()

    async def _play_episode(self, task_id: str, position: int, k: int) -> Trajectory:
        """One episode of the group on its own env, with a seed and rid unique to (position, k)."""
        with self.envs.env() as env:
            env.set_trained_version(self.trained_version)  # a backend's schedule over training follows the policy
            seed = int(np.random.SeedSequence([self.seed, position, k]).generate_state(1)[0])
            return await self.workflow.arun_episode(
                env, seed=seed, options={"task_id": task_id}, rid=f"{self._rid}-{position}-{k}"
            )

    def _engine_stats(self) -> dict[str, Any]:
        """The engine's stats(), or nothing when it has none."""
        stats = getattr(self.engine, "stats", None)
        return stats() if callable(stats) else {}
