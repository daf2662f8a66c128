"""AReaL's staleness control: how far rollouts may run ahead of training, and the buffer between them.

Units. A *group* is the `group_size` episodes (trajectories) of one task; the learner consumes
`batch_size` groups per step, and each step raises the trained version by one (so after v steps,
v * batch_size groups have been consumed). `max_concurrent_rollouts` counts episodes.

The rule (AReaL's `max_head_offpolicyness` = eta): a group may start at trained version v only while
    accepted + running + 1 <= (v + eta + 1) * batch_size    (groups; rejected groups do not count)
    (running + 1) * group_size <= max_concurrent_rollouts   (episodes)
So when a group is admitted at version s, at most (s + eta + 1) * batch_size groups that are not
rejected have started, this one included: the batches trained at versions up to s + eta have room
for all of them, provided the learner does not spend that room on younger groups while old ones are
still being played. `GroupBuffer` sees to it: each group is due by version start + eta; batches hold
the oldest groups, and the learner waits (for groups still being played) whenever taking a batch now
would leave more groups due by version v + k than the k batches before then can hold. Hence a group
trained at version v started at version >= v - eta: its tokens are at most eta versions older than
the weights the step starts from (eta + 1 older than the weights it produces). eta = 0 is
synchronous RL: no group starts before the previous batch is trained.
"""
from __future__ import annotations

import asyncio
import bisect
import heapq
from collections import Counter

from searchgym.agents.trajectory import Trajectory


class StalenessController:
    """Counts groups (started, accepted, rejected, running) and admits a new one only within AReaL's bound."""

    def __init__(self, batch_size: int, max_staleness: int, max_concurrent_rollouts: int, group_size: int = 1):
        if batch_size < 1 or group_size < 1 or max_staleness < 0:
            raise ValueError("batch_size and group_size must be >= 1 and max_staleness >= 0")
        if max_concurrent_rollouts < group_size:
            raise ValueError(f"max_concurrent_rollouts ({max_concurrent_rollouts} episodes) must hold one group "
                             f"of {group_size} episodes")
        self.batch_size, self.max_staleness = batch_size, max_staleness
        self.max_concurrent_rollouts, self.group_size = max_concurrent_rollouts, group_size
        self.accepted = 0  # groups finished and handed to the learner's buffer
        self.rejected = 0  # groups finished without reaching the buffer (filtered, failed, cancelled)
        self.running = 0  # groups in flight

    @property
    def started(self) -> int:
        """Groups admitted so far."""
        return self.accepted + self.rejected + self.running

    def capacity(self, trained_version: int) -> int:
        """How many more groups may start now, at `trained_version`."""
        by_concurrency = self.max_concurrent_rollouts // self.group_size - self.running
        by_staleness = (trained_version + self.max_staleness + 1) * self.batch_size - (self.accepted + self.running)
        return max(0, min(by_concurrency, by_staleness))

    def admit(self, trained_version: int) -> bool:
        """Take a slot for one group if the rule allows it now."""
        if self.capacity(trained_version) <= 0:
            return False
        self.running += 1
        return True

    def finish(self, *, accepted: bool) -> None:
        """A running group ended; a group that does not reach the buffer gives its slot back."""
        if self.running <= 0:
            raise RuntimeError("finish() without a running group")
        self.running -= 1
        if accepted:
            self.accepted += 1
        else:
            self.rejected += 1

    def state_dict(self) -> dict[str, int]:
        """Counters to resume from; groups in flight do not survive a restart, so `running` is not saved."""
        return {"accepted": self.accepted, "rejected": self.rejected}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore the counters of `state_dict`; only allowed with no group in flight."""
        if self.running:
            raise RuntimeError("cannot load a state while groups are running")
        self.accepted, self.rejected = int(state["accepted"]), int(state["rejected"])


class GroupBuffer:
    """Finished trajectory groups waiting for the learner, handed out oldest first.

    It also tracks the groups still being played (`begin`, then `put` or `drop`, by start version), so
    that with `max_staleness` set, `get_batch` at trained version v waits rather than let younger groups
    take the room an older one needs to be trained by version start + max_staleness.
    """

    def __init__(self, max_staleness: int | None = None):
        self.max_staleness = max_staleness
        self._ready: list[tuple[int, int, list[Trajectory]]] = []  # heap of (started_version, arrival, group)
        self._in_flight: Counter[int] = Counter()  # start version -> groups still being played
        self._arrivals = 0
        self._changed = asyncio.Event()

    def __len__(self) -> int:
        """Finished groups waiting (groups, not trajectories)."""
        return len(self._ready)

    @property
    def in_flight(self) -> int:
        """Groups begun and not yet put or dropped."""
        return sum(self._in_flight.values())

    def begin(self, started_version: int) -> None:
        """A group started at `started_version`; it must later be `put` or `drop`ped."""
        self._in_flight[started_version] += 1

    def put(self, group: list[Trajectory], *, started_version: int) -> None:
        """A begun group finished and was accepted: queue it for the learner."""
        self._end(started_version)
        heapq.heappush(self._ready, (started_version, self._arrivals, group))
        self._arrivals += 1

    def drop(self, started_version: int) -> None:
        """A begun group ended without a result (filtered out, failed or cancelled)."""
        self._end(started_version)

    def ready(self, batch_size: int, trained_version: int | None = None) -> bool:
        """Whether `get_batch` would return now: enough groups, and taking them keeps every deadline.

        After this batch, trained at v = trained_version, the k batches of versions v + 1 .. v + k must
        hold every group left (waiting or in flight) that is due by version v + k, i.e. started at
        v + k - max_staleness or earlier. Only k < max_staleness needs checking: the admission rule
        takes care of later versions.
        """
        if len(self._ready) < batch_size:
            return False
        if trained_version is None or self.max_staleness is None:
            return True
        waiting = sorted(started for started, _, _ in self._ready)
        left = sorted(waiting[batch_size:] + list(self._in_flight.elements()))
        return all(bisect.bisect_right(left, trained_version - self.max_staleness + k) <= k * batch_size
                   for k in range(self.max_staleness))

    async def get_batch(self, batch_size: int, *, trained_version: int | None = None) -> list[list[Trajectory]]:
        """Wait until `ready`, then take `batch_size` groups, oldest (by start version, then arrival) first."""
        while not self.ready(batch_size, trained_version):
            self._changed.clear()
            await self._changed.wait()
        return [heapq.heappop(self._ready)[2] for _ in range(batch_size)]

    def _end(self, started_version: int) -> None:
        """Take a group off the in-flight count and wake a waiting `get_batch`."""
        if self._in_flight[started_version] <= 0:
            raise ValueError(f"no group started at version {started_version} is in flight")
        self._in_flight[started_version] -= 1
        if not self._in_flight[started_version]:
            del self._in_flight[started_version]
        self._changed.set()
