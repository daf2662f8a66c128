"""Context management: 64-turn episodes in a 2k-token window go on in linked segments (fold, summarise), every
segment token-exact against the engine's own record, and one learner step trains all of them."""

import asyncio

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from searchgym.agents.context import (
    DROPPED_NOTE,
    SUMMARY_INSTRUCTION,
    Entry,
    FoldPolicy,
    History,
    SummarisePolicy,
    context_policy,
    lay_out,
)
from searchgym.agents.engines.torch_engine import TorchEngine
from searchgym.agents.engines.types import SamplingParams
from searchgym.agents.formats import ChatTemplateDelta
from searchgym.agents.trajectory import Trajectory
from searchgym.agents.workflow import TokenWorkflow, WorkflowSettings
from searchgym.envs.search_env import SearchEnv
from searchgym.trainers.algorithm.learner import Learner
from searchgym.trainers.build import workflow_settings
from searchgym.trainers.config import LearnerConfig, load_config
from tests.agents.forced_engine import ForcedEngine
from tests.conftest import torch_threads

TURNS, MAX_CONTEXT = 64, 2048
SAMPLING = SamplingParams(max_new_tokens=48, temperature=1.0)


# --- the layout of a rebuilt context ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def template(tokenizer):
    return ChatTemplateDelta(tokenizer)


words = st.lists(
    st.sampled_from(["river", "Aldra", "flows", "through", "the", "city", "of", "1987", "page", "."]), max_size=300
).map(" ".join)
observations = st.tuples(words, st.integers(1, 12)).map(lambda pair: "\n".join([pair[0]] * pair[1]))
entries = st.lists(
    st.builds(
        Entry,
        action_ids=st.lists(st.integers(10, 1500), min_size=1, max_size=40),
        ended_with_eos=st.booleans(),
        observation=observations,
        stub=st.sampled_from(["[folded: result of search 'x']", "[folded: page 'doc://1']"]),
        foldable=st.booleans(),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries=entries, target=st.integers(40, 2048), keep=st.floats(0.1, 1.0))
def test_a_rebuilt_context_fits_and_never_splits_a_turn(template, entries, target, keep):
    history = History("Where does the Aldra flow?", entries)
    layout = lay_out(template, history, target, int(target * keep))
    if layout is None:  # only when not even the question and the newest action fit
        least = (
            len(
                template.prompt_ids(
                    history.question + (DROPPED_NOTE.format(n=len(entries) - 1) if len(entries) > 1 else "")
                )
            )
            + len(entries[-1].action_ids)
            + len(template.observation_ids("", entries[-1].ended_with_eos))
        )
        assert least + 40 > target
        return
    assert len(layout.ids) <= target
    kept = list(range(layout.dropped, len(entries)))
    actions = [(start, end, i) for kind, start, end, i in layout.pieces if kind == "action"]
    assert [i for *_, i in actions] == kept  # the newest turns, whole, in order: only the oldest are dropped
    for start, end, i in actions:
        assert layout.ids[start:end] == entries[i].action_ids  # the engine's exact ids, never cut
    for kind, start, end, i in layout.pieces:
        if kind == "observation" and i != len(entries) - 1:
            shown = layout.ids[start:end]
            full = template.observation_ids(entries[i].observation, entries[i].ended_with_eos)
            assert shown == full or (
                entries[i].foldable and shown == template.observation_ids(entries[i].stub, entries[i].ended_with_eos)
            )
    assert [kind for kind, *_ in layout.pieces] == ["prompt"] + ["action", "observation"] * len(kept)
    if layout.truncated_tokens:  # the newest observation was cut, and says so
        start, end = layout.pieces[-1][1:3]
        assert "[truncated: this result had" in template.tokenizer.decode(layout.ids[start:end])


def test_an_observation_bigger_than_the_window_is_truncated_with_a_note(template, tokenizer):
    huge = " ".join(["river"] * 5000)
    history = History("Where does the Aldra flow?", [Entry([11, 12, 13], False, huge, "[folded]")])
    layout = lay_out(template, history, 300)
    assert layout is not None and len(layout.ids) <= 300 and layout.truncated_tokens > 0
    assert "[truncated: this result had" in tokenizer.decode(layout.ids)


class TightFold(FoldPolicy):
    """A user's policy: fold down to half the room at each rebuild."""

    def __init__(self):
        super().__init__(keep_fraction=0.5)


def test_the_context_policy_settings_are_checked_by_key():
    config = load_config(
        None, ["rollout.context_policy=summarise", "rollout.summary_tokens=64", "rollout.max_segments=9"]
    )
    settings = workflow_settings(config.rollout)  # what the trainer's workflow is built with
    assert isinstance(settings.context, SummarisePolicy) and settings.context.summary_tokens == 64
    assert settings.max_segments == 9
    assert isinstance(workflow_settings(load_config(None, ["rollout.context_policy=fold"]).rollout).context, FoldPolicy)
    assert not workflow_settings(load_config(None, []).rollout).context.managed  # default: end, as before
    custom = load_config(None, ["rollout.context_policy=tests.agents.test_context:TightFold"]).rollout
    assert isinstance(workflow_settings(custom).context, TightFold)  # a user's subclass, by import path
    with pytest.raises(ValueError, match="rollout.context_policy"):
        workflow_settings(load_config(None, ["rollout.context_policy=tests.agents.test_context:Script"]).rollout)
    for override, key in (
        ("rollout.context_policy=squash", "rollout.context_policy"),
        ("rollout.max_segments=0", "rollout.max_segments"),
        ("rollout.summary_tokens=0", "rollout.summary_tokens"),
    ):
        with pytest.raises(ValueError, match=key):
            load_config(None, [override])
    with pytest.raises(ValueError, match="rollout.summary_tokens"):
        load_config(
            None, ["rollout.context_policy=summarise", "rollout.summary_tokens=4000", "rollout.max_context=4096"]
        )
    with pytest.raises(ValueError, match="squash"):
        context_policy("squash")


# --- 64-turn episodes in a 2k window ----------------------------------------------------------------------------


class Script:
    """Per episode (rid): 63 searches then an answer; a summary when asked (the first one empty where told)."""

    def __init__(self, tokenizer, answers: dict[str, str], empty_first_summary: set[str] = frozenset()):
        self.tokenizer, self.answers, self.empty = tokenizer, answers, set(empty_first_summary)
        self.turns: dict[str, int] = {}
        self.summaries: dict[str, int] = {}

    def __call__(self, rid: str, input_ids: list[int]) -> tuple[str, bool]:
        if SUMMARY_INSTRUCTION[-40:] in self.tokenizer.decode(input_ids[-80:]):
            n = self.summaries[rid] = self.summaries.get(rid, 0) + 1
            if rid in self.empty and n == 1:
                return "", True
            return f"I searched {self.turns.get(rid, 0)} times; the river pages matter.", True
        n = self.turns[rid] = self.turns.get(rid, 0) + 1
        if n < TURNS:
            return f"<search>river city {n}</search>", False
        return f"<answer>{self.answers[rid]}</answer>", False


def play_group(
    engine, tokenizer, pool, index, policy, *, empty_first_summary=False, max_segments=256, workflow_class=TokenWorkflow
) -> tuple[list[Trajectory], ForcedEngine]:
    """Two 64-turn episodes of one task, one answering right and one wrong, played concurrently."""
    task = pool[0]
    answers = {"right": task.answers[0], "wrong": "Nowhere at all"}
    script = Script(tokenizer, answers, {"right"} if empty_first_summary else set())
    forced = ForcedEngine(engine, tokenizer, script)
    workflow = workflow_class(
        forced, tokenizer, WorkflowSettings(SAMPLING, MAX_CONTEXT, context=policy, max_segments=max_segments)
    )

    async def main():
        envs = [SearchEnv(pool, index, max_turns=TURNS + 4, top_k=3, doc_chars=400) for _ in answers]
        return await asyncio.gather(
            *(
                workflow.arun_episode(env, seed=0, options={"task_id": task.id}, rid=rid)
                for env, rid in zip(envs, answers, strict=True)
            )
        )

    with torch_threads(1):  # a tiny model on a shared 2-core machine: a second thread only waits
        return asyncio.run(main()), forced


class HugePages(TokenWorkflow):
    """Shows the model every result ten times over: each observation alone is bigger than the 2k window."""

    async def observe(self, env, traj, step):
        return "\n".join([step.observation] * 10)


def test_an_episode_over_its_segment_budget_ends_truncated_with_everything_kept(engine, small_pool, small_index):
    """Observations bigger than the whole window are truncated with a note; the segment budget ends the episode."""
    (right, wrong), forced = play_group(
        engine, engine.tokenizer, small_pool, small_index, FoldPolicy(), max_segments=3, workflow_class=HugePages
    )
    for traj, rid in ((right, "right"), (wrong, "wrong")):
        assert traj.truncated and traj.stop_reason == "segment budget" and traj.num_segments == 3
        assert_segments_are_the_engines_record(traj, forced.calls, rid)  # every token the engine gave is kept
        assert any(e["truncated_tokens"] > 0 for e in traj.context_events)
        assert "[truncated: this result had" in engine.tokenizer.decode(traj.segments[1].input_ids)
        assert traj.generated_tokens == sum(len(c.response.output_ids) for c in forced.calls if c.rid == rid)


def assert_segments_are_the_engines_record(traj: Trajectory, calls, rid: str) -> None:
    """Every generated token of every segment is one engine answer to exactly that segment's prefix, and every
    engine answer for the episode is in exactly one segment (nothing lost, nothing re-tokenised)."""
    segments = traj.token_segments()
    mine = [c for c in calls if c.rid == rid]
    placed = set()
    for s, seg in enumerate(segments):
        n = len(seg.input_ids)
        assert n == len(seg.loss_mask) == len(seg.logprobs) == len(seg.versions) and n <= MAX_CONTEXT
        assert seg.loss_mask[: seg.prompt_length] == [0] * seg.prompt_length
        for i in range(n):
            if not seg.loss_mask[i]:
                assert seg.logprobs[i] == 0.0 and seg.versions[i] == -1
                continue
            match = [k for k, c in enumerate(mine) if len(c.input_ids) == i and seg.input_ids[:i] == c.input_ids]
            assert len(match) == 1, f"segment {s} token {i}: {len(match)} engine calls gave it"
            response = mine[match[0]].response
            assert [seg.input_ids[i]] == response.output_ids
            assert [seg.logprobs[i]] == response.logprobs and [seg.versions[i]] == response.versions
            placed.add(match[0])
    assert placed == set(range(len(mine)))


def check_episode(traj: Trajectory, forced: ForcedEngine, rid: str) -> None:
    assert traj.terminated and traj.stop_reason == "answer" and len(traj.turns) == TURNS
    assert traj.turns[-1].tool == "answer" and all(t.tool == "search" for t in traj.turns[:-1])
    assert traj.num_segments > 2 and len(traj.context_events) == traj.num_segments - 1
    assert_segments_are_the_engines_record(traj, forced.calls, rid)
    for seg in traj.token_segments():  # one run of policy tokens per entry of run_turns, each naming a real turn
        runs = sum(1 for i, m in enumerate(seg.loss_mask) if m and (i == 0 or not seg.loss_mask[i - 1]))
        assert runs == len(seg.run_turns) and all(0 <= t < TURNS for t in seg.run_turns)
    # a round trip through to_dict keeps the segments
    again = Trajectory.from_dict(traj.to_dict())
    assert [s.input_ids for s in again.token_segments()] == [s.input_ids for s in traj.token_segments()]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return TorchEngine(tiny_model_dir, seed=0)


@pytest.fixture(scope="module")
def folded(engine, small_pool, small_index):
    return play_group(engine, engine.tokenizer, small_pool, small_index, FoldPolicy())


@pytest.fixture(scope="module")
def summarised(engine, small_pool, small_index):
    return play_group(
        engine, engine.tokenizer, small_pool, small_index, SummarisePolicy(summary_tokens=64), empty_first_summary=True
    )


def test_a_64_turn_episode_folds_its_way_to_the_answer_token_exact(folded, engine):
    (right, wrong), forced = folded
    for traj, rid in ((right, "right"), (wrong, "wrong")):
        check_episode(traj, forced, rid)
        assert all(e["policy"] == "fold" for e in traj.context_events)
        assert any(e["dropped_turns"] > 0 for e in traj.context_events)  # late in the episode even stubs overflow
        text = engine.tokenizer.decode(traj.token_segments()[-1].input_ids)
        assert "[folded: result of search 'river city" in text  # old results are stubs now; the actions stay
    assert right.reward > wrong.reward


def test_a_64_turn_episode_summarises_its_way_to_the_answer_token_exact(summarised, engine):
    (right, wrong), forced = summarised
    for traj, rid in ((right, "right"), (wrong, "wrong")):
        check_episode(traj, forced, rid)
        summaries = [e for e in traj.context_events if e["policy"] == "summarise"]
        assert summaries and all(e["summary_tokens"] > 0 for e in summaries)
        # each summary is policy output in the segment it closed: trained tokens beyond the turns' own
        for seg, event in zip(traj.segments, traj.context_events, strict=True):
            assert seg.end == event["policy"] and seg.loss_mask[-1] == 1  # the segment ends with the summary's tokens
    fallback = right.context_events[0]
    assert fallback["policy"] == "fold (empty summary)" and fallback["fallback"] == "empty summary"
    assert right.segments[0].end == "fold (empty summary)"
    eos = engine.tokenizer.eos_token_id
    assert right.segments[0].input_ids[-1] == eos and right.segments[0].loss_mask[-1] == 1  # the empty summary, kept


def test_one_learner_step_trains_every_segment_of_the_episodes(tiny_model_dir, folded, summarised):
    groups = [list(folded[0]), list(summarised[0])]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # forced tokens have behaviour probability ~1, so behaviour weighting is off: every segment's tokens count
    learner = Learner(model, LearnerConfig(lr=1e-3, behav_weight_cap=None, micro_batch_tokens=8192))
    trained = []
    update = learner._update
    learner._update = lambda samples: trained.extend(samples) or update(samples)
    with torch_threads(1):
        stats = learner.step(groups)
    episodes = [t for g in groups for t in g]
    segments = [s for t in episodes for s in t.token_segments()]
    assert stats["updated"] == 1.0 and stats["trained_segments"] == len(segments) == len(trained)
    assert stats["segments_mean"] == pytest.approx(sum(t.num_segments for t in episodes) / len(episodes))
    assert stats["trained_tokens"] == sum(t.generated_tokens for t in episodes)
    assert sorted(len(s.ids) for s in trained) == sorted(len(s.input_ids) for s in segments)
    # the right episode's segments carry a positive advantage, the wrong one's a negative one, on policy tokens
    for sample in trained:
        values = sample.advantages[sample.mask.bool()]
        assert len(values) and (bool((values > 0).all()) or bool((values < 0).all()))
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_eval_plays_past_its_window_with_a_context_policy(tmp_path, tiny_model_dir, small_bundle):
    """`searchgym eval --context-policy fold`: episodes longer than --max-context go on in segments, counted per row."""
    import json

    from searchgym.eval.harness import run_eval
    from tests.conftest import WARM_ENV

    env_kwargs = {**WARM_ENV, "max_turns": 8}
    with pytest.raises(ValueError, match="squash"):
        run_eval(
            "searchgym/SyntheticQA-v0",
            str(tiny_model_dir),
            tmp_path / "bad",
            context_policy="squash",
            env_kwargs=env_kwargs,
            progress=False,
            report=False,
        )
    with torch_threads(1):
        run_eval(
            "searchgym/SyntheticQA-v0",
            str(tiny_model_dir),
            tmp_path / "fold",
            k=1,
            max_tasks=3,
            judge="em",
            env_kwargs=env_kwargs,
            max_new_tokens=32,
            max_context=256,
            context_policy="fold",
            progress=False,
            report=False,
        )
    rows = [json.loads(line) for line in (tmp_path / "fold" / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and max(r["stats"]["segments"] for r in rows) > 1
    for row in rows:  # every segment of every episode is in the stored trajectory and within the window
        traj = Trajectory.from_dict(row["trajectory"])
        assert traj.num_segments == row["stats"]["segments"]
        assert all(len(s.input_ids) <= 256 for s in traj.token_segments())
    assert json.loads((tmp_path / "fold" / "run.json").read_text())["context_policy"] == "fold"


@pytest.mark.parametrize("bad", [float("nan"), 10**9, 0, True, 2.5, "256"])
def test_a_summary_budget_that_is_not_a_sane_whole_number_is_refused(bad):
    from searchgym.agents.context import MAX_SUMMARY_TOKENS, context_policy

    with pytest.raises(ValueError, match=rf"summary_tokens must be a whole number in \[1, {MAX_SUMMARY_TOKENS}\]"):
        context_policy("summarise", summary_tokens=bad)
    with pytest.raises(ValueError, match="keep_fraction"):
        context_policy("fold", keep_fraction=float("nan"))
    assert context_policy("summarise", summary_tokens=MAX_SUMMARY_TOKENS).summary_tokens == MAX_SUMMARY_TOKENS
