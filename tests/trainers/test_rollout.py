"""The rollout controller with the real tiny model (TorchEngine) and real SearchEnvs, next to a fake learner."""

import asyncio

import pytest

from searchgym.agents.engines.torch_engine import TorchEngine
from searchgym.agents.engines.types import SamplingParams
from searchgym.agents.workflow import TokenWorkflow, WorkflowSettings
from searchgym.envs.search_env import SearchEnv
from searchgym.trainers.rollout.controller import ENGINE_COUNTERS, GroupLimits, RolloutController, RolloutStats
from searchgym.trainers.run.metrics import OccupancyWindow, engine_metrics

SAMPLING = SamplingParams(max_new_tokens=32, temperature=1.0)
GROUP, BATCH = 3, 2
MAX_CONCURRENT = 4 * GROUP  # episodes


@pytest.fixture
async def engine(tiny_model_dir):
    engine = TorchEngine(tiny_model_dir, seed=0)
    yield engine
    await engine.close()


def make_controller(engine, pool, index, *, max_staleness, make_env=None, **kwargs):
    make_env = make_env or (lambda: SearchEnv(pool, index, max_turns=3))
    workflow = TokenWorkflow(engine, engine.tokenizer, WorkflowSettings(SAMPLING, max_context=2048))
    return RolloutController(
        make_env,
        workflow,
        pool,
        GroupLimits(GROUP, BATCH, max_staleness, MAX_CONCURRENT),
        engine=engine,
        seed=1,
        **kwargs,
    )


async def train(controller, engine, steps):
    """A learner that trains nothing: take each batch, bump the weights' version, tell the controller.

    Returns (trained version, batch) pairs and the admissions (trained version, accepted, running) seen.
    """
    ledger = controller.ledger
    admissions = []
    admit = ledger.admit

    def recording_admit(version):
        admitted = admit(version)
        if admitted is not None:
            admissions.append((version, ledger.accepted, ledger.running))
        return admitted

    ledger.admit = recording_admit
    rollouts = asyncio.create_task(controller.run())
    batches = []
    for _ in range(steps):
        version = controller.trained_version
        batch = await asyncio.wait_for(controller.get_batch(), 60)
        batches.append((version, batch))
        await engine.update_weights(engine.model.state_dict(), version + 1)
        controller.trained_version = version + 1
    controller.stop()
    await asyncio.wait_for(rollouts, 30)
    return batches, admissions


def check_run(controller, batches, admissions, max_staleness):
    """Complete groups of one task, AReaL's admission rule at every admit, and the staleness bound."""
    for version, accepted, running in admissions:  # counters just after each admission
        assert accepted + running <= (version + max_staleness + 1) * BATCH
        assert running * GROUP <= MAX_CONCURRENT
    ages = []
    for version, batch in batches:
        assert len(batch) == BATCH
        for group in batch:
            assert len(group) == GROUP and len({traj.task_id for traj in group}) == 1
            for traj in group:
                generated = [v for v, m in zip(traj.versions, traj.loss_mask, strict=True) if m]
                assert generated and traj.turns and (traj.terminated or traj.truncated)
                assert min(generated) >= version - max_staleness
                ages.append(version - min(generated))
    ledger = controller.ledger
    assert ledger.running == 0  # stopped cleanly: nothing left in flight
    assert ledger.trained == len(batches) * BATCH and ledger.accepted == ledger.trained + ledger.buffered
    # no group lost or repeated: every position started is trained, buffered, dropped or owed again, once
    trained = [group[0].group for _, batch in batches for group in batch]
    assert len(set(trained)) == len(trained) and not set(trained) & set(ledger.owed())
    stats = controller.stats()
    assert stats.episodes >= len(batches) * BATCH * GROUP and stats.generated_tokens > 0
    assert stats.engine_idle_fraction is not None and 0.0 <= stats.engine_idle_fraction <= 1.0
    # the ledger's occupancy, cumulative: episodes in flight over time never above the limit
    assert 0 < stats.occupancy_s <= stats.elapsed_s and 0.0 <= stats.below_limit_s <= stats.occupancy_s
    assert 0 < stats.in_flight_episode_s <= MAX_CONCURRENT * stats.occupancy_s
    # the engine's own work counters ride along: every finished episode's tokens were decoded by it
    assert stats.engine["generated_tokens"] >= stats.generated_tokens and stats.engine["decode_steps"] > 0
    assert set(stats.engine) == set(ENGINE_COUNTERS)
    return ages


class SlowEnv(SearchEnv):
    """A SearchEnv whose tool calls on one task take long: that task's group becomes a straggler."""

    slow_task = ""

    async def astep(self, action):
        if self.task.id == self.slow_task:
            await asyncio.sleep(1.0)
        return await super().astep(action)


async def test_async_rollouts_stay_within_the_staleness_bound(engine, small_pool, small_index):
    controller = make_controller(
        engine, small_pool, small_index, max_staleness=1, make_env=lambda: SlowEnv(small_pool, small_index, max_turns=3)
    )
    SlowEnv.slow_task = controller.task_at(0)
    batches, admissions = await train(controller, engine, steps=4)
    ages = check_run(controller, batches, admissions, max_staleness=1)
    assert max(ages) == 1  # rollouts really ran ahead: some trained tokens came from the previous weights
    assert {version for version, _, _ in admissions} == {0, 1, 2, 3}  # new groups started after every step
    # younger groups overtook the straggler, yet it was trained at the last version the bound allows
    trained_at = {group[0].task_id: version for version, batch in batches for group in batch}
    assert trained_at[SlowEnv.slow_task] == 1
    played = [traj.task_id for _, batch in batches for group in batch for traj in group]
    assert set(played) <= {controller.task_at(i) for i in range(controller.position)}


async def test_max_staleness_zero_is_synchronous(engine, small_pool, small_index):
    controller = make_controller(engine, small_pool, small_index, max_staleness=0)
    batches, admissions = await train(controller, engine, steps=3)
    assert set(check_run(controller, batches, admissions, max_staleness=0)) == {0}  # every token on-policy
    # exactly one batch of groups starts at each version, and none before the previous batch is trained
    assert [version for version, _, _ in admissions] == [v for v in range(3) for _ in range(BATCH)]


async def test_rejected_and_failed_groups_give_their_slot_back(engine, small_pool, small_index, caplog):
    turned_down = {task.id for task in small_pool[::2]}
    calls = 0

    def flaky_env():
        nonlocal calls
        calls += 1
        if calls % 7 == 0:
            raise RuntimeError("env construction failed")
        return SearchEnv(small_pool, small_index, max_turns=3)

    controller = make_controller(
        engine,
        small_pool,
        small_index,
        max_staleness=1,
        make_env=flaky_env,
        filter_group=lambda group: group[0].task_id not in turned_down,
    )
    batches, admissions = await train(controller, engine, steps=3)
    check_run(controller, batches, admissions, max_staleness=1)
    stats, ledger = controller.stats(), controller.ledger
    assert stats.rejected_groups > 0 and stats.failed_groups > 0
    assert "env construction failed" in caplog.text  # each failure is logged, and the loop went on
    assert (ledger.rejected, ledger.failed, ledger.cancelled) == (
        stats.rejected_groups,
        stats.failed_groups,
        stats.cancelled_groups,
    )
    assert ledger.accepted == stats.groups
    # rejected and failed groups are not replayed; the groups stop() cut short are
    assert len(ledger.owed()) == ledger.cancelled + ledger.buffered
    assert ledger.started == ledger.position  # every position admitted once: nothing was owed while running
    delivered = {traj.task_id for _, batch in batches for group in batch for traj in group}
    assert delivered and not delivered & turned_down


async def test_resume_continues_the_data_order(engine, small_pool, small_index):
    controller = make_controller(engine, small_pool, small_index, max_staleness=1)
    await train(controller, engine, steps=1)
    state = controller.state_dict()
    resumed = make_controller(engine, small_pool, small_index, max_staleness=1)
    resumed.load_state_dict(state)
    assert resumed.position == controller.position
    assert [resumed.task_at(controller.position + i) for i in range(5)] == [
        controller.task_at(controller.position + i) for i in range(5)
    ]
    # groups left in the buffer are not saved: the resumed run counts only what the learner consumed,
    # and replays every group that was not trained (buffered, or cut short by stop) before new ones
    assert resumed.ledger.accepted == BATCH and resumed.ledger.running == 0
    assert resumed.ledger.owed() == controller.ledger.owed() and len(state["replay"]) > 0
    epoch = [controller.task_at(i) for i in range(len(small_pool))]
    assert sorted(epoch) == sorted(task.id for task in small_pool)  # each epoch plays every task once


def test_the_occupancy_window_takes_each_rows_share_of_the_controllers_totals():
    """Per row: episodes in flight summed over controllers (Ray has several), blocked time averaged, engines summed."""
    window = OccupancyWindow()
    first = [
        RolloutStats(in_flight_episode_s=8.0, below_limit_s=1.0, occupancy_s=2.0, engine={"decode_steps": 5.0}),
        RolloutStats(in_flight_episode_s=2.0, below_limit_s=2.0, occupancy_s=2.0, engine={"decode_steps": 1.0}),
    ]
    assert window.read(first) == {
        "rollout/episodes_in_flight_mean": 4.0 + 1.0,
        "rollout/admission_blocked_share": 3.0 / 4.0,
    }
    assert engine_metrics(first) == {"engine/decode_steps": 6.0}
    later = [
        RolloutStats(in_flight_episode_s=14.0, below_limit_s=1.0, occupancy_s=4.0),  # 3 in flight, never blocked
        RolloutStats(in_flight_episode_s=2.0, below_limit_s=2.0, occupancy_s=2.0),
    ]  # no time since: left out
    assert window.read(later) == {"rollout/episodes_in_flight_mean": 3.0, "rollout/admission_blocked_share": 0.0}
    assert window.read(later) == {} and engine_metrics(later) == {}  # no time passed; an engine counting nothing


class _JudgeModel:
    """A judge's chat model whose first `down` calls fail on transport (an outage), then grades Correct."""

    def __init__(self, down: int) -> None:
        self.down, self.calls = down, 0

    async def achat(self, messages, **sampling):
        self.calls += 1
        if self.calls <= self.down:
            raise ConnectionError("judge endpoint refused the connection")
        return '{"rationale": "same entity", "judgement": "Correct"}'


class _AnsweringEnv(SearchEnv):
    """A SearchEnv whose every turn answers, so each episode ends at the judge."""

    async def astep(self, action):
        return await super().astep("<answer>the answer</answer>")


async def test_a_judge_failure_is_never_trained_as_a_reward_and_its_group_plays_again(
    engine, small_pool, small_index, caplog
):
    """Issue 26: a judge outage on a group's answers is no reward of 0: the group is not trained, counted apart,
    and its position is owed again, so the trained batches hold only verdicts the judge really gave."""
    from searchgym.envs.llm_judge import LLMJudge
    from searchgym.trainers.run.metrics import rollout_metrics

    judge_model = _JudgeModel(down=2 * GROUP)
    judge = LLMJudge(judge_model)
    controller = make_controller(
        engine,
        small_pool,
        small_index,
        max_staleness=1,
        make_env=lambda: _AnsweringEnv(small_pool, small_index, max_turns=3, judge=judge),
    )
    failed_positions = []
    judge_fail = controller.ledger.judge_fail

    def recording(position):
        failed_positions.append(position)
        judge_fail(position)

    controller.ledger.judge_fail = recording
    batches, admissions = await train(controller, engine, steps=3)
    check_run(controller, batches, admissions, max_staleness=1)
    stats = controller.stats()
    assert stats.judge_failed_groups == len(failed_positions) >= 1 and judge_model.calls > 2 * GROUP
    assert rollout_metrics([stats])["rollout/judge_failed_groups"] == len(failed_positions)
    assert "the judge failed" in caplog.text and "refused the connection" in caplog.text
    trained = [traj for _, batch in batches for group in batch for traj in group]
    assert all(traj.verdict and not traj.verdict.get("error") and traj.reward == 1.0 for traj in trained)
    # a judge-failed position is owed again: played after the outage and trained, or still owed at the stop
    positions = {group[0].group for _, batch in batches for group in batch}
    assert set(failed_positions) <= positions | set(controller.ledger.owed())
    assert set(failed_positions) & positions  # the first ones came back within three steps
    state = controller.ledger.state_dict()
    assert state["staleness"]["judge_failed"] == len(failed_positions)
