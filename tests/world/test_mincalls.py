"""Questions that need many tool calls: the proven minimum holds, no shorter play exists, and the oracle solves them."""

import asyncio
import hashlib
import re

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import searchgym  # noqa: F401  (registers the env ids)
from searchgym.envs.search_env import SearchEnv
from searchgym.envs.tasks import Task, TaskPool
from searchgym.world import mincalls
from searchgym.world.kbwalk import KBWalker
from searchgym.world.mincalls import PROOF_ENV, pool_key, synthesize_min_calls_pool
from searchgym.world.oracle import OracleAgent
from searchgym.world.prover import _STOP, PROOF_VERSION, MinCallsProver, part_body
from searchgym.world.world import World, page_url
from tests.conftest import SMALL

N = 6


@pytest.fixture(scope="module")
def world():
    return World(SMALL["size"], SMALL["seed"])


@pytest.fixture(scope="module")
def deep_env():
    env = gym.make("searchgym/SyntheticQA-v0", **SMALL, min_calls=N, min_calls_tasks=3, judge="em")
    yield env
    env.close()


def fresh_prover(world, index) -> MinCallsProver:
    return MinCallsProver.over(world, index, **PROOF_ENV)


def test_every_question_needs_exactly_its_proven_calls(deep_env, world):
    env = deep_env.unwrapped
    assert len(env.tasks) == 3 and {k: getattr(env, k) for k in PROOF_ENV} == PROOF_ENV
    prover = fresh_prover(world, env.search_backend)
    for task in env.tasks:
        meta = task.metadata
        proof = meta["min_calls_proof"]
        assert meta["min_calls"] == N == proof["min_calls"] == len(proof["play"])
        assert proof["queries"] and proof["urls"] and proof["env"] == PROOF_ENV
        shorter = asyncio.run(prover.prove(task, N - 1))  # a fresh prover, calls played again through an env
        assert shorter.min_calls is None, "some play of fewer calls observes the answer"
        again = asyncio.run(prover.prove(task, N))
        assert again.min_calls == N


def test_the_oracle_solves_them_through_the_gym_env_in_min_calls(deep_env):
    env = deep_env.unwrapped
    for task in env.tasks:
        obs, _ = deep_env.reset(options={"task_id": task.id})
        calls, read = 0, ""
        for tool, argument in task.metadata["min_calls_proof"]["play"]:
            obs, reward, terminated, truncated, info = deep_env.step(f"<{tool}> {argument} </{tool}>")
            calls += 1
            read = read + part_body(obs) if tool == "access" else obs
            assert not terminated and not truncated and info["tool"] == tool
        meta = task.metadata
        entity = meta.get("answer_type") == "entity"
        assert meta["answer_on_page"] in read or (entity and meta["path"][-1]["name"] in read), "the last call shows it"
        _, reward, terminated, _, info = deep_env.step(f"<answer> {task.answers[0]} </answer>")
        assert terminated and reward == 1.0 and calls == meta["min_calls"] >= N
        result = asyncio.run(OracleAgent().arun(env, task))
        assert result.solved and len(result.turns) == N + 1


def brute_force_min(prover: MinCallsProver, task: Task, depth: int) -> int | None:
    """The fewest calls, up to `depth`, over every play in the prover's stated action set: plays enumerated one
    by one (no shortest-path reduction), so it checks the prover's Dijkstra argument independently."""
    meta = task.metadata
    answer_entity_url = page_url(task.answers[0]) if meta["answer_type"] == "entity" else None
    q_names = prover.names.find(task.question)
    keywords = " ".join(
        w
        for w in re.findall(r"[^\s,.;:?!()\"]+", task.question)
        if w.lower() not in _STOP and not any(w in n.split() for n in q_names)
    )

    def goal(url: str, text: str) -> bool:
        return (url == meta["answer_page"] and meta["answer_on_page"] in text) or (
            url == answer_entity_url and meta["path"][-1]["name"] in text
        )

    def actions(names: frozenset, urls: frozenset) -> list[tuple[str, str]]:
        queries = {task.question, meta["start_query"], *task.answers}
        queries |= set(names) | {f"{n} {keywords}" for n in names if keywords}
        all_urls = set(urls) | {page_url(n) for n in names} | ({answer_entity_url} if answer_entity_url else set())
        return sorted({("search", q) for q in queries if q} | {("access", u) for u in all_urls})

    best: list[int | None] = [None]

    def play(names: frozenset, urls: frozenset, cursor: dict, n: int) -> None:
        if n >= depth or (best[0] is not None and n + 1 >= best[0]):
            return
        for tool, arg in actions(names, urls):
            if tool == "search":
                segments = asyncio.run(prover.search(arg))
                new_cursor = cursor
            else:
                parts = asyncio.run(prover.page(arg))
                k = cursor.get(arg, 0) + 1
                segments = [(arg, prover.read(arg, k))] if k <= len(parts) else []  # parts 1..k, joined
                new_cursor = {**cursor, arg: k}
            if any(goal(u, t) for u, t in segments):
                best[0] = n + 1
                return
            seen = set().union(*(prover.names.find(t) for _, t in segments)) if segments else set()
            play(names | seen, urls | {u for u, _ in segments}, new_cursor, n + 1)

    play(frozenset(q_names), frozenset(), {}, 0)
    return best[0]


def test_brute_force_over_plays_agrees_with_the_prover(world, small_index):
    pool, _ = synthesize_min_calls_pool(world, small_index, 2, 3, seed=5)
    prover = fresh_prover(world, small_index)
    for task in pool:
        assert task.metadata["min_calls"] == 3
        assert brute_force_min(prover, task, 2) is None, "no play of 1 or 2 calls observes the answer"
        assert brute_force_min(prover, task, 3) == 3


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000))
def test_recorded_min_calls_equal_play_length_and_bound_for_any_seed(world, small_index, seed):
    pool, report = synthesize_min_calls_pool(world, small_index, 2, (3, 5), seed=seed)
    prover = fresh_prover(world, small_index)
    for task in pool:
        n = task.metadata["min_calls"]
        assert 3 <= n <= 5 and len(task.metadata["min_calls_proof"]["play"]) == n
        assert asyncio.run(prover.prove(task, n - 1)).min_calls is None
        env = SearchEnv(TaskPool([task]), small_index, small_index, judge="em", max_turns=n + 2, **PROOF_ENV)
        result = asyncio.run(OracleAgent().arun(env, task))
        assert result.solved and len(result.turns) == n + 1
    assert report["accepted"] == 2


def test_same_seed_same_questions_and_proofs(world, small_index):
    first, _ = synthesize_min_calls_pool(world, small_index, 2, (3, 4), seed=7)
    again, _ = synthesize_min_calls_pool(world, small_index, 2, (3, 4), seed=7)
    assert [t.to_row() for t in first] == [t.to_row() for t in again]


@pytest.mark.parametrize("bad", [0, -1, 13, (5, 3), True, "6", 2.5, range(4, 4)])
def test_bad_min_calls_is_a_value_error_naming_it(bad):
    with pytest.raises(ValueError, match="min_calls"):
        gym.make("searchgym/SyntheticQA-v0", **SMALL, min_calls=bad)


def test_settings_that_break_the_proof_are_refused():
    with pytest.raises(ValueError, match="min_calls.*page_chunk_chars"):
        gym.make("searchgym/SyntheticQA-v0", **SMALL, min_calls=4, page_chunk_chars=10_000)
    with pytest.raises(ValueError, match="min_calls=6 needs max_turns"):
        gym.make("searchgym/SyntheticQA-v0", **SMALL, min_calls=6, max_turns=6)


def test_more_than_the_world_holds_is_a_value_error(world, small_index, monkeypatch):
    monkeypatch.setattr(mincalls, "MIN_CANDIDATES", 30)
    monkeypatch.setattr(mincalls, "CANDIDATES_PER_TASK", 10)
    with pytest.raises(ValueError, match=r"min_calls=12: only 0 of 1 questions"):
        synthesize_min_calls_pool(world, small_index, 1, 12)


def test_hops_pools_are_untouched(small_bundle, deep_env):
    digest = hashlib.sha256((small_bundle / "tasks.jsonl").read_bytes()).hexdigest()
    plain = gym.make("searchgym/SyntheticQA-v0", **SMALL)
    assert all("min_calls" not in t.metadata and t.metadata["hops"] <= 4 for t in plain.unwrapped.tasks)
    assert hashlib.sha256((small_bundle / "tasks.jsonl").read_bytes()).hexdigest() == digest
    assert (small_bundle / f"mincalls-{pool_key()}-{N}-{N}-tasks3.jsonl").exists()  # beside tasks.jsonl, keyed
    assert pool_key().startswith(f"v{PROOF_VERSION}-")
    with pytest.raises(ValueError, match="hops must be between 1 and 4"):
        KBWalker(World(SMALL["size"], SMALL["seed"]), hop_weights={5: 1.0})
    plain.close()


def test_demonstrations_play_a_min_calls_question_by_its_path_never_by_guessing_the_answer():
    """A proof's witness play may open by searching the answer verbatim (a lucky guess is in the prover's action
    set): fine for proving the minimum, poison for a warm start. Demonstrations play the question's path instead."""
    from searchgym.agents.scripted import demonstrations

    gym_env = gym.make(
        "searchgym/SyntheticQA-v0", **SMALL, min_calls=(1, 2), min_calls_tasks=12, judge="em", max_turns=64
    )
    env = gym_env.unwrapped
    guessing = [
        t
        for t in env.tasks
        if any(tool == "search" and arg in t.answers for tool, arg in t.metadata["min_calls_proof"]["play"])
    ]
    assert guessing, "no witness play here guesses the answer: the test shows nothing"
    solved = 0
    for task in guessing:
        for chat in asyncio.run(demonstrations(env, [task], think=False)):
            searches = [m["content"] for m in chat if m["role"] == "assistant" and "<search>" in m["content"]]
            assert searches and not any(answer in s for s in searches for answer in task.answers)
            solved += 1
    assert solved, "the oracle solved none of them by their path"
    # validation still replays the witness: the fewest calls, as proven
    task = guessing[0]
    replayed = asyncio.run(OracleAgent().arun(env, task))
    assert replayed.solved and len(replayed.turns) == task.metadata["min_calls"] + 1
    gym_env.close()
