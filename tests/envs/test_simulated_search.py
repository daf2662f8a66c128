"""The LLM-simulated search engine (ZeroSearch): documents written by a chat model through the real OpenAI client
against a scripted server on loopback, and by the tiny model; noise share and curriculum, record/replay, failures
shown as failures, and the trainer's version moving the curriculum."""

from __future__ import annotations

import asyncio
import itertools
import json

import gymnasium as gym
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import searchgym  # noqa: F401
from searchgym.agents.scripted import ScriptedWorkflow
from searchgym.agents.workflow import TokenWorkflow
from searchgym.envs.tools.simulated_search import (
    NoiseSchedule,
    SimulatedSearch,
    SimulatorOptions,
    load_prompts,
    parse_documents,
)
from tests.envs.simulator_double import TASKS, ScriptedSimulator, simulator_server

SIM = "searchgym/SimulatedQA-v0"


@pytest.fixture
def simulator():
    double = ScriptedSimulator()
    with simulator_server(double) as engine:
        yield double, engine


@pytest.fixture
def tasks_file(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    return path


def test_a_simulated_episode_searches_reads_and_answers(simulator, tasks_file):
    double, engine = simulator
    env = gym.make(SIM, tasks=tasks_file, engine=engine, noise=0.4, top_k=5, max_turns=4)
    obs, info = env.reset(options={"task_id": "t1"})
    obs, reward, *_, info = env.step("<search>lighthouse of Teslin Bay colour</search>")
    assert info["simulated"] is True and len(info["hits"]) == 5
    noisy = [h for h in info["hits"] if h["doc_id"].startswith("sim-n-")]
    assert len(noisy) == 2  # round(0.4 * 5)
    assert "sim-n-" not in obs and "sim-u-" not in obs  # which documents are noise is never shown to the agent
    useful = next(h for h in info["hits"] if h["doc_id"].startswith("sim-u-"))
    obs, *_, info = env.step(f"<access>{useful['url']}</access>")
    assert "painted green" in obs and info["page"]["doc_id"] == useful["doc_id"]
    obs, reward, terminated, *_ = env.step("<answer>green</answer>")
    assert terminated and reward == 1.0
    assert len(double.requests) == 2  # one call for the useful documents, one for the noisy ones
    env.close()


def test_results_are_recorded_and_replayed_without_the_model(simulator, tasks_file, tmp_path):
    double, engine = simulator
    cache = tmp_path / "sim.sqlite"
    env = gym.make(SIM, tasks=tasks_file, engine=engine, noise=0.2, top_k=5, cache=cache, simulator_seed=7)
    env.reset(options={"task_id": "t2"})
    first = env.step("<search>Orrin Vale Observatory founder</search>")[-1]["hits"]
    env.close()
    calls = len(double.requests)
    dead = "openai:http://127.0.0.1:9/v1:simulator"  # nothing listens: a model call would fail
    replay = gym.make(
        SIM, tasks=tasks_file, engine=dead, noise=0.2, top_k=5, cache=cache, cache_mode="replay_only", simulator_seed=7
    )
    replay.reset(options={"task_id": "t2"})
    obs, *_, info = replay.step("<search>orrin  vale OBSERVATORY founder</search>")  # the same query, normalised
    assert info["hits"] == first and len(double.requests) == calls
    obs, *_, info = replay.step(f"<access>{first[0]['url']}</access>")  # the recorded page, in a new process too
    assert "Mirela Kost" in obs or "Cheese" in obs
    obs, *_, info = replay.step("<search>something never recorded</search>")
    assert "search failed" in info["error"] and "replay-only" in info["error"] and "hits" not in info
    replay.close()


def test_a_model_that_writes_no_document_is_a_failed_search_not_results(tasks_file):
    double = ScriptedSimulator(mode="garbage")
    with simulator_server(double) as engine:
        env = gym.make(SIM, tasks=tasks_file, engine=engine, top_k=3)
        env.reset(options={"task_id": "t1"})
        obs, reward, terminated, truncated, info = env.step("<search>anything</search>")
        env.close()
    assert "search failed" in info["error"] and "no document" in info["error"] and "hits" not in info
    assert len(double.requests) == 3  # asked again (ReplyRetry's 3 tries), then reported
    assert not terminated and reward == 0.0


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**6), st.text(max_size=40), st.integers(1, 10), st.floats(0.0, 1.0))
def test_noisy_slots_are_a_fixed_share_placed_by_seed_and_query(seed, query, k, share):
    engine = SimulatedSearch(None, SimulatorOptions(noise=share, seed=seed))
    slots = engine.noisy_slots(query, k)
    assert len(slots) == k and sum(slots) == min(k, int(share * k + 0.5))
    assert engine.noisy_slots(query, k) == slots


def test_the_curriculum_follows_the_trained_version():
    schedule = NoiseSchedule(start=0.0, end=0.6, steps=10, base=4.0)
    shares = [schedule.at(v) for v in range(12)]
    assert shares[0] == 0.0 and shares[10] == pytest.approx(0.6) and shares[11] == pytest.approx(0.6)
    assert all(a <= b for a, b in itertools.pairwise(shares))
    assert shares[5] < 0.3  # b > 1: slow at first (ZeroSearch's curriculum)
    engine = SimulatedSearch(None, SimulatorOptions(noise=schedule))
    engine.set_trained_version(10)
    assert sum(engine.noisy_slots("q", 5)) == 3
    for bad, key in (({"start": 1.5}, "start"), ({"steps": 0}, "steps"), ({"base": 1.0}, "base")):
        with pytest.raises(ValueError, match=key):
            NoiseSchedule(**bad)


def test_prompts_are_data_and_a_bad_prompt_file_is_refused(tmp_path):
    prompts = load_prompts()
    assert "{query}" in prompts["useful"] and "{n}" in prompts["noisy"]
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({**prompts, "useful": "no placeholders"}))
    with pytest.raises(ValueError, match="useful"):
        load_prompts(bad)
    assert parse_documents("Title: A\nURL: u\nText: one\nmore\n\nTitle: B\nText: two")[0]["text"] == "one more"


def test_the_trainers_version_moves_the_noise_of_the_episodes_it_plays(simulator, tasks_file):
    """The rollout controller reports its trained version to each env before an episode: the curriculum moves."""
    from searchgym.agents.simulated_env import make_simulated_qa
    from searchgym.trainers.rollout.controller import GroupLimits, RolloutController
    from searchgym.trainers.run.metrics import episode_metrics

    _, engine = simulator

    def script(env, task):
        yield "<search>lighthouse</search>"
        yield "<answer>green</answer>"

    def make_env():
        return make_simulated_qa(
            tasks_file, engine=engine, top_k=4, noise_schedule={"start": 0.0, "end": 1.0, "steps": 4, "base": 2.0}
        )

    async def noisy_share(version: int) -> float:
        controller = RolloutController(
            make_env,
            ScriptedWorkflow(script),
            ["t1", "t2"],
            GroupLimits(group_size=2, batch_size=1, max_staleness=0, max_concurrent_rollouts=2),
            seed=version,
        )
        controller.trained_version = version
        async with controller.running():
            [group] = await controller.get_batch()
        hits = [h for traj in group for h in traj.turns[0].info["hits"]]
        assert all(traj.turns[0].info["simulated"] for traj in group)
        share = sum(h["doc_id"].startswith("sim-n-") for h in hits) / len(hits)
        assert episode_metrics([group])["episode/simulated_noise_share"] == share  # what the trainer logs per step
        return share

    assert asyncio.run(noisy_share(0)) == 0.0
    assert asyncio.run(noisy_share(4)) == 1.0


def test_the_tiny_model_as_simulator_gives_results_or_a_clean_failure(tiny_model_dir, tasks_file):
    from searchgym.agents.simulated_env import make_simulated_qa

    async def play():
        env = make_simulated_qa(tasks_file, engine=str(tiny_model_dir), top_k=2, simulator_max_tokens=48)
        await env.areset(options={"task_id": "t1"})
        return await env.astep("<search>lighthouse</search>")

    obs, reward, terminated, truncated, info = asyncio.run(play())
    assert ("hits" in info and len(info["hits"]) == 2) or "search failed" in info["error"]
    assert not terminated and reward == 0.0


def test_each_call_reports_its_cost_and_a_cost_budget_ends_the_episode(simulator, tasks_file):
    double, engine = simulator
    env = gym.make(
        SIM,
        tasks=tasks_file,
        engine=engine,
        noise=0.5,
        top_k=2,
        max_turns=8,
        cost_budget={"model_calls": 4, "generated_tokens": 10_000},
    )
    env.reset(options={"task_id": "t1"})
    obs, reward, terminated, truncated, info = env.step("<search>lighthouse</search>")
    # one call for the useful document and one for the noisy one; the endpoint reported 10 + 20 tokens each
    assert info["cost"] == {"model_calls": 2, "prompt_tokens": 20, "generated_tokens": 40}
    assert not truncated and info["episode_cost"]["model_calls"] == 2
    obs, *_, info = env.step(f"<access>{info['hits'][0]['url']}</access>")
    assert info["cost"] == {}  # a page it already wrote costs nothing
    obs, reward, terminated, truncated, info = env.step("<search>observatory</search>")
    assert truncated and not terminated and info["truncation"] == "cost budget"
    assert "tool budget is spent (model_calls 4 of 4)" in obs
    with pytest.raises(ValueError, match="cost_budget"):
        gym.make(SIM, tasks=tasks_file, engine=engine, cost_budget={"model_calls": 0})
    env.close()


def test_eval_and_trainer_metrics_sum_the_tool_costs(simulator, tasks_file, tmp_path, tiny_model_dir):
    from searchgym.agents.trajectory import Trajectory, Turn
    from searchgym.eval.harness import run_eval
    from searchgym.trainers.run.metrics import episode_metrics

    _, engine = simulator
    summary = run_eval(
        SIM,
        str(tiny_model_dir),
        tmp_path / "eval",
        k=2,
        judge="f1",
        progress=False,
        env_kwargs={
            "tasks": str(tasks_file),
            "engine": engine,
            "top_k": 3,
            "noise": 0.0,
            "cost_budget": {"model_calls": 50},
        },
        workflow="tests.envs.test_simulated_search:SearchTwice",
    )
    metrics, card = summary["metrics"], summary["card"]
    assert metrics["cost/model_calls"] == 2.0 and metrics["cost/generated_tokens"] == 40.0  # per sample
    assert card["run"]["tool_costs"] == {"model_calls": 8, "prompt_tokens": 80, "generated_tokens": 160}
    assert card["protocol"]["budgets"]["cost_budget"] == {"model_calls": 50}
    turns = [
        Turn(action="a", tool="search", observation="o", reward=0.0, info={"cost": {"api_calls": 1}}),
        Turn(action="b", tool="search", observation="o", reward=0.0, info={"cost": {"api_calls": 2}}),
    ]
    batch = [[Trajectory(task_id="t", turns=turns), Trajectory(task_id="t")]]
    assert episode_metrics(batch)["episode/cost/api_calls"] == 1.5


class SearchTwice(ScriptedWorkflow):
    """A scripted agent for the eval test: two searches (one model call each at noise 0), then an answer."""

    def __init__(self, settings=None):
        super().__init__(self.play, settings)

    @staticmethod
    def play(env, task):
        yield "<search>lighthouse</search>"
        yield "<search>observatory</search>"
        yield "<answer>green</answer>"

    @classmethod
    def from_handle(cls, handle, settings):
        return cls(settings)


class SearchFirst(TokenWorkflow):
    """The tiny model's first turn is sent to the env as a search for the question (its tokens are still what it
    generated and what the learner trains): every episode meets the simulated engine once."""

    async def act(self, env, traj, text):
        return f"<search>{env.task.question}</search>" if not traj.turns else text


def test_a_training_run_on_the_simulated_engine_records_its_curriculum_per_step(simulator, tasks_file, tmp_path):
    from searchgym.trainers.config import load_config
    from searchgym.trainers.launchers.local import train

    _, engine = simulator
    config = load_config(
        None,
        [
            f"out_dir={tmp_path / 'run'}",
            "steps=3",
            "mode=sync",
            "env.id=searchgym/SimulatedQA-v0",
            f"env.kwargs={{tasks: '{tasks_file}', engine: '{engine}', top_k: 4, max_turns: 2,"
            " noise_schedule: {start: 0.0, end: 1.0, steps: 2, base: 2.0}}",
            "rollout.group_size=2",
            "rollout.batch_size=1",
            "rollout.max_new_tokens=8",
            "rollout.max_concurrent_rollouts=2",
            "learner.drop_no_spread=false",
            "rollout.workflow=tests.envs.test_simulated_search:SearchFirst",
        ],
    )
    history = train(config, progress=False)
    # sync: step v's batch was played at trained version v - 1; ZeroSearch's curriculum over 2 versions, base 2:
    # 0, then (2**0.5 - 1) = 0.41 of 4 results (2 of them), then all
    assert [h["episode/simulated_noise_share"] for h in history] == [0.0, 0.5, 1.0]
    assert all(h["episode/cost/model_calls"] >= 1 for h in history)


def test_answer_aware_prompts_tell_the_useful_documents_the_task_and_never_share_them_across_tasks(simulator, tmp_path):
    double, engine = simulator
    same_query = [{**t, "question": f"{t['question']} (lighthouse)"} for t in TASKS]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in same_query))
    env = gym.make(SIM, tasks=tasks, engine=engine, noise=0.5, top_k=2, prompts="answer_aware", cache=tmp_path / "c")
    for task in same_query:
        env.reset(options={"task_id": task["id"]})
        env.step("<search>lighthouse</search>")  # the same query for two tasks
    useful = [p for p in double.requests if "do not contain" not in p]
    noisy = [p for p in double.requests if "do not contain" in p]
    assert [("The answer is: green" in p, "The answer is: Mirela Kost" in p) for p in useful] == [
        (True, False),
        (False, True),
    ]  # each task's own answer, asked again for the second task rather than served from the first one's cache
    assert all(t["question"] in p for t, p in zip(same_query, useful, strict=True))
    assert noisy and not any("green" in p or "Mirela" in p for p in noisy)  # the noisy prompt never hears the answer
    env.close()


def test_answer_aware_prompts_outside_an_env_step_are_a_clear_failure(simulator):
    from searchgym.agents.simulated_env import open_chat
    from searchgym.envs.tools.base import BackendError

    _, engine = simulator
    backend = SimulatedSearch(open_chat(engine), SimulatorOptions(prompts="answer_aware"))
    with pytest.raises(BackendError, match=r"need the question and its answers"):
        asyncio.run(backend.search("lighthouse", 2))
