"""Staleness control: random admit / finish / learner-step sequences keep AReaL's bound and never deadlock."""
import asyncio
import json

import pytest
from hypothesis import given, settings, target
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from searchgym.agents.trajectory import Trajectory
from searchgym.trainers.staleness import GroupBuffer, StalenessController


class StalenessMachine(RuleBasedStateMachine):
    """A model of the rollout loop and the learner around a real controller and buffer."""

    @initialize(batch_size=st.integers(1, 3), max_staleness=st.integers(0, 3), group_size=st.integers(1, 3),
                extra=st.integers(0, 6))
    def setup(self, batch_size, max_staleness, group_size, extra):
        self.B, self.eta, self.G = batch_size, max_staleness, group_size
        self.C = group_size + extra  # episodes
        self.controller = StalenessController(batch_size, max_staleness, self.C, group_size)
        self.buffer = GroupBuffer(max_staleness)
        self.loop = asyncio.new_event_loop()
        self.version = 0  # trained version = learner steps taken
        self.running: list[int] = []  # start versions of groups in flight, in start order
        self.arrivals: list[tuple[int, int]] = []  # (start version, arrival) of buffered groups
        self.next_id = 0
        self.consumed = 0
        self.oldest_age = 0  # most learner steps a group in flight has been overtaken by: steer the search up

    def teardown(self):
        if hasattr(self, "loop"):
            target(float(self.oldest_age), label="age of the oldest group in flight")
            self.loop.close()

    @rule(most=st.integers(1, 6))
    def admit(self, most):
        """Start up to `most` groups, as the rollout loop does when it wakes, checking the rule at each."""
        for _ in range(most):
            c, v = self.controller, self.version
            allowed = c.accepted + c.running + 1 <= (v + self.eta + 1) * self.B and (c.running + 1) * self.G <= self.C
            assert (c.capacity(v) > 0) == allowed
            assert c.admit(v) == allowed  # the rule, exactly: never admits beyond it, never refuses within it
            if not allowed:
                return
            self.running.append(v)
            self.buffer.begin(v)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), accepted=st.booleans(), eager=st.booleans())
    def finish(self, data, accepted, eager):
        """End a running group, the newest most often, so that young groups overtake old ones (stragglers)."""
        self._finish(len(self.running) - 1 - data.draw(st.integers(0, len(self.running) - 1)), accepted, eager)

    def _finish(self, index, accepted, eager):
        """End a running group; an eager learner then takes every batch it can at once."""
        started = self.running.pop(index)
        self.controller.finish(accepted=accepted)
        if accepted:
            group = [Trajectory(task_id=f"t{self.next_id}") for _ in range(self.G)]
            self.buffer.put(group, started_version=started)
            self.arrivals.append((started, self.next_id))
            self.next_id += 1
        else:
            self.buffer.drop(started)
        while eager and self.buffer.ready(self.B, self.version):
            self.learner_step()

    @precondition(lambda self: self.buffer.ready(self.B, self.version))
    @rule()
    def learner_step(self):
        batch = self.loop.run_until_complete(self.buffer.get_batch(self.B, trained_version=self.version))
        expected = sorted(self.arrivals)[: self.B]
        assert [int(g[0].task_id[1:]) for g in batch] == [i for _, i in expected]  # oldest first, then arrival
        for started, _ in expected:
            assert started >= self.version - self.eta  # tokens at most eta versions behind the trained weights
        self.arrivals = sorted(self.arrivals)[self.B:]
        self.consumed += self.B
        self.version += 1
        self.oldest_age = max(self.oldest_age, self.version - min(self.running, default=self.version))

    @precondition(lambda self: not self.running)
    @rule()
    def checkpoint_round_trip(self):
        state = json.loads(json.dumps(self.controller.state_dict()))
        fresh = StalenessController(self.B, self.eta, self.C, self.G)
        fresh.load_state_dict(state)
        for attr in ("started", "accepted", "rejected", "running"):
            assert getattr(fresh, attr) == getattr(self.controller, attr)
        for v in range(self.version, self.version + 3):
            assert fresh.capacity(v) == self.controller.capacity(v)

    @invariant()
    def counters_agree(self):
        c = self.controller
        assert c.running == len(self.running) == self.buffer.in_flight
        assert c.running * self.G <= self.C
        assert c.started == c.accepted + c.rejected + c.running
        assert c.accepted == self.consumed + len(self.buffer)

    @invariant()
    def never_stuck(self):
        """If the learner cannot take a batch, a group is in flight or another may start."""
        if not self.buffer.ready(self.B, self.version):
            assert self.controller.running > 0 or self.controller.capacity(self.version) > 0


TestStalenessMachine = StalenessMachine.TestCase
TestStalenessMachine.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)


@given(st.lists(st.integers(0, 5), min_size=1, max_size=30))
def test_buffer_hands_out_oldest_first(versions):
    buffer = GroupBuffer()
    for i, v in enumerate(versions):
        buffer.begin(v)
        buffer.put([Trajectory(task_id=str(i))], started_version=v)
    batch = asyncio.run(buffer.get_batch(len(versions)))
    order = [int(g[0].task_id) for g in batch]
    assert order == sorted(range(len(versions)), key=lambda i: (versions[i], i))
    assert len(buffer) == 0


async def test_get_batch_waits_rather_than_let_young_groups_overtake_old_ones():
    """batch_size 1, max_staleness 2: three groups start at version 0, so each of versions 0, 1, 2 must train one."""
    buffer = GroupBuffer(max_staleness=2)
    for _ in range(3):
        buffer.begin(0)
    buffer.put([Trajectory(task_id="a")], started_version=0)
    assert [g[0].task_id for g in await buffer.get_batch(1, trained_version=0)] == ["a"]
    buffer.begin(1)
    buffer.put([Trajectory(task_id="young")], started_version=1)
    # training "young" at version 1 would leave both old groups for the one batch of version 2
    assert not buffer.ready(1, trained_version=1)
    waiting = asyncio.ensure_future(buffer.get_batch(1, trained_version=1))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    buffer.put([Trajectory(task_id="b")], started_version=0)
    assert [g[0].task_id for g in await asyncio.wait_for(waiting, 1)] == ["b"]
    # one old group still in flight, due at version 2: it holds the batch of version 2, not "young"
    assert not buffer.ready(1, trained_version=2)
    buffer.put([Trajectory(task_id="c")], started_version=0)
    assert [g[0].task_id for g in await buffer.get_batch(1, trained_version=2)] == ["c"]
    assert [g[0].task_id for g in await buffer.get_batch(1, trained_version=3)] == ["young"]


def test_synchronous_when_max_staleness_is_zero():
    c = StalenessController(batch_size=3, max_staleness=0, max_concurrent_rollouts=100)
    assert c.capacity(0) == 3 and all(c.admit(0) for _ in range(3)) and not c.admit(0)
    c.finish(accepted=False)  # a rejected group gives its slot back
    assert c.admit(0) and not c.admit(0)
    for _ in range(3):
        c.finish(accepted=True)
    assert c.capacity(0) == 0 and c.capacity(1) == 3


def test_unbalanced_calls_raise():
    with pytest.raises(RuntimeError):
        StalenessController(1, 0, 1).finish(accepted=True)
    with pytest.raises(ValueError):
        GroupBuffer().drop(0)
    with pytest.raises(ValueError):
        StalenessController(batch_size=2, max_staleness=0, max_concurrent_rollouts=3, group_size=4)
