"""One ledger for every rollout group's whole life, and AReaL's staleness rule read from it.

Units. A *group* is the `group_size` episodes (trajectories) of one task, identified by its data
*position* (the position-th group of the run's seeded task order). The learner consumes `batch_size`
groups per step, and each step raises the trained version by one. `max_concurrent_rollouts` counts
episodes.

A group's life, every step of it recorded here and nowhere else:

    admitted at trained version v -> running -> finished: buffered -> handed to the learner (trained)
                                             -> rejected (the filter turned it down)
                                             -> failed (an episode raised)
                                             -> cancelled (the rollouts stopped; its position is replayed)

The rule (AReaL's `max_head_offpolicyness` = eta, as in its StalenessManager): a group may start at
trained version v only while
    capacity = min(max_concurrent_rollouts // group_size - running,
                   (eta + v + 1) * batch_size - (accepted + running)) > 0
where accepted = buffered + trained (rejected, failed and cancelled groups give their slot back).
So when a group is admitted at version s, at most (s + eta + 1) * batch_size groups that count have
started, this one included: the batches trained at versions up to s + eta have room for all of
them, provided the learner does not spend that room on younger groups while old ones are still
being played. `take_batch` sees to it: each group is due by version s + eta; batches hold the
oldest groups (by start version, then by the order they finished), and the learner waits (for
groups still being played) whenever taking a batch now would leave more groups due by version
v + k than the k batches before then can hold. Hence a group trained at version v started at
version >= v - eta. eta = 0 is synchronous RL: no group starts before the previous batch is trained.

Occupancy. Every change in the count of running groups goes to `occupancy` (occupancy.py): groups in
flight integrated over time, and the seconds spent below the group limit (when admission is eager,
that is the staleness rule holding groups back). The metrics rows read it per learner step.

Checkpoints. `state_dict` holds the next new position, the positions to replay (owed from an earlier
restart, then every group running or buffered, in admission order) and the counts of groups
trained and rejected. Groups running or buffered are not saved as trajectories: a resumed run plays
their positions again before new ones, so no group is lost and none is trained twice.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from searchgym.agents.trajectory import Trajectory
from searchgym.trainers.rollout.occupancy import Occupancy


@dataclass(eq=False)
class Group:
    """One admitted group: its data position, the trained version it started at, and its result once buffered."""

    position: int
    version: int
    trajectories: list[Trajectory] | None = None  # set when it finishes and is accepted (buffered)

    @property
    def running(self) -> bool:
        return self.trajectories is None


class GroupLedger:
    """Every group from admission to the learner: the admission rule, the oldest-first batch, the checkpoint."""

    def __init__(
        self,
        batch_size: int,
        max_staleness: int,
        max_concurrent_rollouts: int,
        group_size: int = 1,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ):
        if batch_size < 1 or group_size < 1 or max_staleness < 0:
            raise ValueError("batch_size and group_size must be >= 1 and max_staleness >= 0")
        if max_concurrent_rollouts < group_size:
            raise ValueError(
                f"max_concurrent_rollouts ({max_concurrent_rollouts} episodes) must hold one group "
                f"of {group_size} episodes"
            )
        self.batch_size, self.max_staleness = batch_size, max_staleness
        self.max_groups = max_concurrent_rollouts // group_size  # groups in flight at once
        self.position = 0  # the next new group's data position
        self.trained = 0  # groups handed to the learner
        self.rejected = 0  # groups the filter turned down
        self.failed = 0  # groups dropped because an episode (or the filter) raised
        self.cancelled = 0  # groups cut short by a stop (their positions are owed again)
        self.judge_failed = 0  # groups whose judge failed on an answer (their positions are owed again)
        self.running = 0  # groups in flight
        self._groups: dict[int, Group] = {}  # running or buffered groups by position, in admission order
        self._buffer: list[tuple[int, int, int]] = []  # heap of (start version, arrival, position)
        self._arrivals = 0
        self._replay: list[int] = []  # positions owed (from a checkpoint or a stop), played before new ones
        self._changed = asyncio.Event()
        self.occupancy = Occupancy(clock)  # groups in flight over time, and time below max_groups (`clock`'s seconds)

    # ---- counts ------------------------------------------------------------------------------------------

    @property
    def buffered(self) -> int:
        """Finished, accepted groups waiting for the learner."""
        return len(self._buffer)

    @property
    def accepted(self) -> int:
        """Groups that finished and were accepted: buffered or already trained (AReaL's `accepted`)."""
        return self.trained + self.buffered

    @property
    def started(self) -> int:
        """Groups admitted so far."""
        return self.accepted + self.rejected + self.failed + self.cancelled + self.judge_failed + self.running

    # ---- admission ---------------------------------------------------------------------------------------

    def capacity(self, trained_version: int) -> int:
        """How many more groups may start now, at `trained_version` (AReaL's rule; never negative)."""
        by_concurrency = self.max_groups - self.running
        by_staleness = (trained_version + self.max_staleness + 1) * self.batch_size - (self.accepted + self.running)
        return max(0, min(by_concurrency, by_staleness))

    def admit(self, trained_version: int) -> Group | None:
        """Start one group now if the rule allows it: an owed position first, else the next new one."""
        if self.capacity(trained_version) <= 0:
            return None
        if self._replay:
            position = self._replay.pop(0)
        else:
            position, self.position = self.position, self.position + 1
        group = self._groups[position] = Group(position, trained_version)
        self.running += 1
        self.occupancy.change(self.running, self.max_groups)
        return group

    # ---- endings -----------------------------------------------------------------------------------------

    def finish(self, position: int, trajectories: list[Trajectory]) -> None:
        """A running group finished and was accepted: buffer it for the learner."""
        group = self._end(position)
        group.trajectories = trajectories
        heapq.heappush(self._buffer, (group.version, self._arrivals, position))
        self._arrivals += 1

    def reject(self, position: int) -> None:
        """A running group finished but the filter turned it down: its slot is free, its position is not replayed."""
        del self._groups[self._end(position).position]
        self.rejected += 1

    def fail(self, position: int) -> None:
        """A running group raised: its slot is free, its position is not replayed."""
        del self._groups[self._end(position).position]
        self.failed += 1

    def cancel(self, position: int) -> None:
        """A running group was cut short by a stop: its slot is free and its position is owed again."""
        del self._groups[self._end(position).position]
        self.cancelled += 1
        self._replay.append(position)

    def judge_fail(self, position: int) -> None:
        """A running group finished but the judge failed on an answer (its call, not the agent): nothing of it is
        trained, its slot is free and its position is owed again, since a dependency's failure is never a reward."""
        del self._groups[self._end(position).position]
        self.judge_failed += 1
        self._replay.append(position)

    def requeue_buffered(self) -> int:
        """Drop every buffered group (counted as cancelled); their positions are owed again, oldest first. How many."""
        positions = [position for _, _, position in sorted(self._buffer)]
        for position in positions:
            del self._groups[position]
        self._buffer.clear()
        self._replay.extend(positions)
        self.cancelled += len(positions)
        self._changed.set()
        return len(positions)

    def _end(self, position: int) -> Group:
        """The running group at `position`, now no longer running; wakes a waiting `take_batch`."""
        group = self._groups.get(position)
        if group is None or not group.running:
            raise ValueError(f"no group is running at position {position}")
        self.running -= 1
        self.occupancy.change(self.running, self.max_groups)
        self._changed.set()
        return group

    # ---- the learner's side ------------------------------------------------------------------------------

    def ready(self, trained_version: int) -> bool:
        """Whether `take_batch` would return now: a whole batch, and taking it keeps every deadline.

        After this batch, trained at v = trained_version, the k batches of versions v + 1 .. v + k must
        hold every group left (buffered or running) that is due by version v + k, i.e. started at
        v + k - max_staleness or earlier. Only k < max_staleness needs checking: the admission rule
        takes care of later versions.
        """
        if len(self._buffer) < self.batch_size:
            return False
        waiting = sorted(version for version, _, _ in self._buffer)
        left = sorted(waiting[self.batch_size :] + [g.version for g in self._groups.values() if g.running])
        return all(
            bisect.bisect_right(left, trained_version - self.max_staleness + k) <= k * self.batch_size
            for k in range(self.max_staleness)
        )

    async def take_batch(self, trained_version: int) -> list[list[Trajectory]]:
        """Wait until `ready`, then hand `batch_size` groups to the learner, oldest (start version, arrival) first."""
        while not self.ready(trained_version):
            self._changed.clear()
            await self._changed.wait()
        batch: list[list[Trajectory]] = []
        for _ in range(self.batch_size):
            _, _, position = heapq.heappop(self._buffer)
            batch.append(self._groups.pop(position).trajectories or [])  # buffered: finished, never None
        self.trained += self.batch_size
        return batch

    # ---- checkpoints -------------------------------------------------------------------------------------

    def owed(self) -> list[int]:
        """Positions a resumed run must play before new ones: owed ones, then those running or buffered."""
        return [*self._replay, *self._groups]

    def state_dict(self) -> dict[str, Any]:
        """The next position, the positions to replay, and the counts to resume from (JSON-ready)."""
        return {
            "position": self.position,
            "replay": self.owed(),
            "staleness": {
                "accepted": self.trained,
                "rejected": self.rejected,
                "failed": self.failed,
                "judge_failed": self.judge_failed,
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state_dict`: replay its owed positions, then go on from `position`."""
        if self._groups:
            raise RuntimeError("cannot load a state while groups are running or buffered")
        counts = state["staleness"]
        self.position = int(state["position"])
        self._replay = [int(p) for p in state.get("replay", [])]
        self.trained, self.rejected = int(counts["accepted"]), int(counts["rejected"])
        self.failed, self.cancelled = int(counts.get("failed", 0)), 0
        self.judge_failed = int(counts.get("judge_failed", 0))
