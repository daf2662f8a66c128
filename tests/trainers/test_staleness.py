"""Staleness control: random admit / finish / learner-step sequences against the group ledger.

The reference is AReaL's StalenessManager (inclusionAI/AReaL, areal/infra/staleness_manager.py at
747f9f5b5409c5dc682aa38fc005221862257e72), modelled here by its counters: `running` and `accepted`
(a rejected rollout gives its slot back), capacity = min(max_concurrent - running,
(max_staleness + version + 1) * batch_size - (accepted + running)). Our concurrency counts groups of
`group_size` episodes, so its max_concurrent is max_concurrent_rollouts // group_size.
"""

import asyncio
import json

import pytest
from hypothesis import given, settings, target
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from searchgym.agents.trajectory import Trajectory
from searchgym.trainers.rollout.ledger import GroupLedger


class AReaLCounters:
    """AReaL's StalenessManager reduced to its decisions: three counters and the capacity formula."""

    def __init__(self, max_concurrent: int, batch_size: int, max_staleness: int):
        self.max_concurrent, self.batch_size, self.max_staleness = max_concurrent, batch_size, max_staleness
        self.running = self.accepted = self.rejected = 0

    def capacity(self, version: int) -> int:
        return min(
            self.max_concurrent - self.running,
            (self.max_staleness + version + 1) * self.batch_size - (self.accepted + self.running),
        )


class StalenessMachine(RuleBasedStateMachine):
    """A model of the rollout loop and the learner around a real ledger, decisions checked against AReaL's."""

    @initialize(
        batch_size=st.integers(1, 3),
        max_staleness=st.integers(0, 3),
        group_size=st.integers(1, 3),
        extra=st.integers(0, 6),
    )
    def setup(self, batch_size, max_staleness, group_size, extra):
        self.B, self.eta, self.G = batch_size, max_staleness, group_size
        self.C = group_size + extra  # episodes
        self.ledger = GroupLedger(batch_size, max_staleness, self.C, group_size)
        self.areal = AReaLCounters(self.C // group_size, batch_size, max_staleness)
        self.loop = asyncio.new_event_loop()
        self.version = 0  # trained version = learner steps taken
        self.running: list[tuple[int, int]] = []  # (position, start version) of groups in flight, in start order
        self.arrivals: list[tuple[int, int, int]] = []  # (start version, arrival, position) of buffered groups
        self.owed: list[int] = []  # positions cancelled, to be replayed before new ones
        self.trained: list[int] = []  # positions handed to the learner
        self.dropped: list[int] = []  # positions rejected or failed (never replayed)
        self.admitted: list[int] = []  # positions running or buffered, in admission order
        self.next_new = 0  # the next new data position
        self.arrived = 0
        self.oldest_age = 0  # most learner steps a group in flight has been overtaken by: steer the search up

    def teardown(self):
        if hasattr(self, "loop"):
            target(float(self.oldest_age), label="age of the oldest group in flight")
            self.loop.close()

    @rule(most=st.integers(1, 6))
    def admit(self, most):
        """Start up to `most` groups, as the rollout loop does when it wakes, checking each decision with AReaL's."""
        for _ in range(most):
            v = self.version
            allowed = self.areal.capacity(v) > 0
            assert self.ledger.capacity(v) == max(0, self.areal.capacity(v))
            group = self.ledger.admit(v)
            assert (group is not None) == allowed  # never admits beyond the rule, never refuses within it
            if not allowed:
                return
            self.areal.running += 1
            if self.owed:
                expected = self.owed.pop(0)
            else:
                expected, self.next_new = self.next_new, self.next_new + 1
            assert (group.position, group.version) == (expected, v)  # an owed position first, else the next new one
            self.running.append((group.position, v))
            self.admitted.append(group.position)

    @precondition(lambda self: self.running)
    @rule(
        data=st.data(),
        outcome=st.sampled_from(["accepted", "accepted", "rejected", "failed", "cancelled"]),
        eager=st.booleans(),
    )
    def finish(self, data, outcome, eager):
        """End a running group, the newest most often, so that young groups overtake old ones (stragglers)."""
        position, started = self.running.pop(len(self.running) - 1 - data.draw(st.integers(0, len(self.running) - 1)))
        self.areal.running -= 1
        if outcome == "accepted":
            self.ledger.finish(position, [Trajectory(task_id=str(position)) for _ in range(self.G)])
            self.areal.accepted += 1
            self.arrivals.append((started, self.arrived, position))
            self.arrived += 1
        else:
            {"rejected": self.ledger.reject, "failed": self.ledger.fail, "cancelled": self.ledger.cancel}[outcome](
                position
            )
            self.areal.rejected += 1
            (self.owed if outcome == "cancelled" else self.dropped).append(position)
            self.admitted.remove(position)
        while eager and self.ledger.ready(self.version):
            self.learner_step()

    @precondition(lambda self: self.ledger.ready(self.version))
    @rule()
    def learner_step(self):
        batch = self.loop.run_until_complete(self.ledger.take_batch(self.version))
        expected = sorted(self.arrivals)[: self.B]
        assert [int(g[0].task_id) for g in batch] == [p for _, _, p in expected]  # oldest first, then arrival
        assert all(len(g) == self.G for g in batch)
        for started, _, _ in expected:
            assert started >= self.version - self.eta  # tokens at most eta versions behind the trained weights
        self.arrivals = sorted(self.arrivals)[self.B :]
        self.trained += [p for _, _, p in expected]
        self.admitted = [p for p in self.admitted if p not in self.trained]
        self.version += 1
        self.oldest_age = max(self.oldest_age, self.version - min((v for _, v in self.running), default=self.version))

    @precondition(lambda self: not self.running)
    @rule()
    def checkpoint_round_trip(self):
        """A resumed ledger replays the owed and buffered groups first and counts only what the learner consumed."""
        state = json.loads(json.dumps(self.ledger.state_dict()))
        fresh = GroupLedger(self.B, self.eta, self.C, self.G)
        fresh.load_state_dict(state)
        replay = self.owed + self.admitted
        assert fresh.owed() == replay and fresh.position == self.next_new
        assert (fresh.trained, fresh.accepted, fresh.running) == (len(self.trained), len(self.trained), 0)
        # AReaL's counters once the buffered groups gave their slots back
        given_back = AReaLCounters(self.C // self.G, self.B, self.eta)
        given_back.accepted = len(self.trained)
        for v in range(self.version, self.version + 3):
            assert fresh.capacity(v) == max(0, given_back.capacity(v))
        admitted = []
        while (group := fresh.admit(self.version + len(replay))) is not None and len(admitted) <= len(replay):
            admitted.append(group.position)
        assert admitted[: len(replay)] == replay[: len(admitted)]
        assert admitted[len(replay) :] == list(range(self.next_new, self.next_new + len(admitted) - len(replay)))

    @invariant()
    def counters_agree(self):
        ledger = self.ledger
        assert ledger.running == len(self.running) == self.areal.running
        assert ledger.running * self.G <= self.C
        assert ledger.accepted == self.areal.accepted == len(self.trained) + ledger.buffered
        assert ledger.started == ledger.accepted + ledger.rejected + ledger.failed + ledger.cancelled + ledger.running

    @invariant()
    def no_group_lost_or_repeated(self):
        """Every position started so far is in exactly one place: trained, dropped, owed, running or buffered."""
        assert sorted(self.trained + self.dropped + self.owed + self.admitted) == list(range(self.next_new))
        assert self.ledger.owed() == self.owed + self.admitted and self.ledger.position == self.next_new

    @invariant()
    def never_stuck(self):
        """If the learner cannot take a batch, a group is in flight or another may start."""
        if not self.ledger.ready(self.version):
            assert self.ledger.running > 0 or self.ledger.capacity(self.version) > 0


TestStalenessMachine = StalenessMachine.TestCase
TestStalenessMachine.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)


@given(st.lists(st.integers(0, 5), min_size=1, max_size=30))
def test_batch_hands_out_oldest_first(versions):
    ledger = GroupLedger(batch_size=len(versions), max_staleness=0, max_concurrent_rollouts=len(versions))
    positions = [ledger.admit(v).position for v in versions]
    for i, position in enumerate(positions):
        ledger.finish(position, [Trajectory(task_id=str(i))])
    batch = asyncio.run(ledger.take_batch(trained_version=0))
    order = [int(g[0].task_id) for g in batch]
    assert order == sorted(range(len(versions)), key=lambda i: (versions[i], i))
    assert ledger.buffered == 0 and ledger.trained == len(versions) and ledger.owed() == []


async def test_take_batch_waits_rather_than_let_young_groups_overtake_old_ones():
    """batch_size 1, max_staleness 2: three groups start at version 0, so each of versions 0, 1, 2 must train one."""
    ledger = GroupLedger(batch_size=1, max_staleness=2, max_concurrent_rollouts=100)
    a, b, c = (ledger.admit(0).position for _ in range(3))
    ledger.finish(a, [Trajectory(task_id="a")])
    assert [g[0].task_id for g in await ledger.take_batch(0)] == ["a"]
    young = ledger.admit(1).position
    ledger.finish(young, [Trajectory(task_id="young")])
    # training "young" at version 1 would leave both old groups for the one batch of version 2
    assert not ledger.ready(1)
    waiting = asyncio.ensure_future(ledger.take_batch(1))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    ledger.finish(b, [Trajectory(task_id="b")])
    assert [g[0].task_id for g in await asyncio.wait_for(waiting, 1)] == ["b"]
    # one old group still in flight, due at version 2: it holds the batch of version 2, not "young"
    assert not ledger.ready(2)
    ledger.finish(c, [Trajectory(task_id="c")])
    assert [g[0].task_id for g in await ledger.take_batch(2)] == ["c"]
    assert [g[0].task_id for g in await ledger.take_batch(3)] == ["young"]


def test_synchronous_when_max_staleness_is_zero():
    ledger = GroupLedger(batch_size=3, max_staleness=0, max_concurrent_rollouts=100)
    assert ledger.capacity(0) == 3
    positions = [ledger.admit(0).position for _ in range(3)]
    assert ledger.admit(0) is None
    ledger.reject(positions.pop())  # a rejected group gives its slot back
    positions.append(ledger.admit(0).position)
    assert ledger.admit(0) is None
    for position in positions:
        ledger.finish(position, [])
    assert ledger.capacity(0) == 0 and ledger.capacity(1) == 3


def test_a_cancelled_group_is_replayed_before_new_ones():
    ledger = GroupLedger(batch_size=2, max_staleness=0, max_concurrent_rollouts=2)
    first, second = ledger.admit(0).position, ledger.admit(0).position
    ledger.cancel(first)
    assert ledger.owed() == [first, second]  # the owed one first, then the running one
    assert ledger.admit(0).position == first and ledger.admit(0) is None
    assert (ledger.cancelled, ledger.running, ledger.position) == (1, 2, 2)


def test_unbalanced_calls_raise():
    ledger = GroupLedger(1, 0, 1)
    with pytest.raises(ValueError, match="no group is running at position 0"):
        ledger.finish(0, [])
    position = ledger.admit(0).position
    ledger.finish(position, [])
    with pytest.raises(ValueError, match="no group is running"):
        ledger.reject(position)  # buffered, not running: ended once already
    with pytest.raises(RuntimeError, match="running or buffered"):
        ledger.load_state_dict(ledger.state_dict())
    with pytest.raises(ValueError, match="max_concurrent_rollouts"):
        GroupLedger(batch_size=2, max_staleness=0, max_concurrent_rollouts=3, group_size=4)


def test_the_ledger_records_groups_in_flight_over_time_and_time_below_the_limit():
    now = [0.0]
    ledger = GroupLedger(
        batch_size=2, max_staleness=0, max_concurrent_rollouts=4, group_size=2, clock=lambda: now[0]
    )  # 2 groups at once
    assert ledger.occupancy.totals().span_s == 0.0  # nothing counted before the first admission
    now[0] = 10.0
    first = ledger.admit(0).position  # 1 running from t=10: below the limit
    now[0] = 11.0
    second = ledger.admit(0).position  # 2 running from t=11: at the limit
    now[0] = 14.0
    ledger.finish(first, [])  # 1 running from t=14
    now[0] = 15.0
    ledger.finish(second, [])  # 0 running from t=15: the staleness rule holds the next batch back
    assert ledger.admit(0) is None
    now[0] = 20.0
    totals = ledger.occupancy.totals()
    assert totals.span_s == 10.0 and totals.group_s == 1 * 1 + 2 * 3 + 1 * 1 + 0 * 5
    assert totals.below_limit_s == 1 + 1 + 5  # all but the 3 seconds at the limit
    now[0] = 21.0
    ledger.admit(1)
    assert ledger.occupancy.totals().group_s == totals.group_s  # the new group counts from its admission on
    now[0] = 23.0
    assert ledger.occupancy.totals() == type(totals)(totals.group_s + 2, totals.below_limit_s + 3, 13.0)
