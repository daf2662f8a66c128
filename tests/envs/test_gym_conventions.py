"""Gymnasium's conventions, checked with Gymnasium's own vector envs and wrappers on every kind of searchgym env."""

import copy
import multiprocessing
import pickle

import gymnasium as gym
import pytest
from gymnasium.error import ResetNeeded
from gymnasium.spaces.utils import flatten, unflatten
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory, write_to_shared_memory
from gymnasium.wrappers import Autoreset, RecordEpisodeStatistics, TimeAwareObservation, TimeLimit
from hypothesis import given, settings
from hypothesis import strategies as st

import searchgym  # noqa: F401  (registers the ids)
from searchgym.envs.search_env import SearchEnv
from searchgym.envs.spaces import UnicodeText
from searchgym.serve.retrieval import serving
from tests.conftest import SMALL
from tests.servers import ThreadServer, free_port

SYNTHETIC = "searchgym/SyntheticQA-v0"
ACTIONS = [
    "<search>river</search>",
    "<access>https://world.searchgym.test/wiki/Vitrarn_River</access>",
    "no tool call",
    '<tool_call>{"name": "search", "arguments": {"query": "founded"}}</tool_call>',
    "<answer>no idea</answer>",
]


@pytest.fixture(scope="module")
def retrieval_url(small_index):
    with ThreadServer(lambda: serving(small_index)) as url:
        yield url


def make(kind, small_bundle, retrieval_url, tmp_path):
    tasks = small_bundle / "tasks.jsonl"
    if kind == "synthetic":
        return gym.make(SYNTHETIC, **SMALL)
    if kind == "local-index":
        return gym.make("searchgym/LocalQA-v0", tasks=tasks, index=small_bundle)
    if kind == "local-servers":
        return gym.make("searchgym/LocalQA-v0", tasks=tasks, servers=retrieval_url + "/retrieve")
    return gym.make(
        "searchgym/WebQA-v0",
        tasks=tasks,
        search_api_key="k",
        search_options={"retries": 0},
        search_endpoint=f"http://127.0.0.1:{free_port()}/search",
        cache=tmp_path / "web.sqlite",
    )


def play(env, seed):
    return [env.reset(seed=seed)] + [env.step(action) for action in ACTIONS]


@pytest.mark.parametrize(
    "copier", [lambda env: pickle.loads(pickle.dumps(env)), copy.deepcopy], ids=["pickle", "deepcopy"]
)
@pytest.mark.parametrize("kind", ["synthetic", "local-index", "local-servers", "web"])
def test_a_copy_of_an_env_plays_the_same_seeded_episode(kind, copier, small_bundle, retrieval_url, tmp_path):
    env = make(kind, small_bundle, retrieval_url, tmp_path)
    env.reset(seed=1)
    env.step(ACTIONS[0])  # a copy made mid-use: the index, sessions and loop are opened again in it
    twin = copier(env)
    try:
        assert play(twin, seed=5) == play(env, seed=5)
    finally:
        env.close()
        twin.close()


def test_an_env_reaches_another_process_whole(small_bundle):
    env = gym.make(SYNTHETIC, **SMALL)
    with multiprocessing.get_context("spawn").Pool(1) as pool:  # a fresh interpreter: nothing inherited
        remote = pool.apply(play, (env, 3))
    assert remote == play(env, 3)


def _trace(envs, autoreset, steps=4):
    """Observations, rewards and end flags of a few batched steps (done envs reset by mask when autoreset is off)."""
    obs, _ = envs.reset(seed=7)
    trace = [tuple(obs)]
    for step in range(steps):
        actions = tuple(ACTIONS[(step + i) % len(ACTIONS)] for i in range(envs.num_envs))
        obs, rewards, terminated, truncated, _ = envs.step(actions)
        trace.append((tuple(obs), rewards.tolist(), terminated.tolist(), truncated.tolist()))
        if autoreset == AutoresetMode.DISABLED and (done := terminated | truncated).any():
            obs, _ = envs.reset(options={"reset_mask": done})
            trace.append(tuple(obs))
    envs.close()
    return trace


@pytest.mark.parametrize("autoreset", list(AutoresetMode), ids=lambda mode: mode.name)
def test_async_vector_envs_with_default_arguments_match_sync_ones(autoreset):
    kwargs = {"num_envs": 3, "max_turns": 3, "vector_kwargs": {"autoreset_mode": autoreset}, **SMALL}
    sync = _trace(gym.make_vec(SYNTHETIC, vectorization_mode="sync", **kwargs), autoreset)
    in_processes = _trace(gym.make_vec(SYNTHETIC, vectorization_mode="async", **kwargs), autoreset)  # shared memory on
    assert in_processes == sync
    steps = [step for step in sync if len(step) == 4]
    assert all("Question:" in obs for obs in sync[0])
    assert any(any(s[2]) for s in steps) and any(any(s[3]) for s in steps)  # episodes ended both ways


def test_make_vec_with_no_arguments_at_all():
    envs = gym.make_vec(SYNTHETIC, num_envs=4, vectorization_mode="async", **SMALL)
    reference = gym.make_vec(SYNTHETIC, num_envs=4, **SMALL)  # the default mode: sync (no vector entry point)
    assert isinstance(reference, gym.vector.SyncVectorEnv)
    obs, _ = envs.reset(seed=11)
    assert obs == reference.reset(seed=11)[0] and all(o.endswith("?") for o in obs)
    step = ("<search>river</search>",) * 4
    assert envs.step(step)[0] == reference.step(step)[0]
    envs.close()
    reference.close()


@settings(max_examples=200, deadline=None)
@given(text=st.text(st.characters(codec=None, categories=None), max_size=64))
def test_any_string_survives_flattening_and_shared_memory(text):
    space = UnicodeText(64)
    assert unflatten(space, flatten(space, text)) == text
    memory = create_shared_memory(space, n=2)
    write_to_shared_memory(space, 1, text, memory)
    view = read_from_shared_memory(space, memory, n=2)
    assert tuple(view) == ("", text) and copy.deepcopy(view) == ("", text)
    write_to_shared_memory(space, 0, text[::-1], memory)
    assert view[0] == text[::-1]  # the view reads the buffer as it is now, as AsyncVectorEnv needs


def test_spec_and_gymnasium_s_wrappers_see_the_env_s_own_turn_limit():
    env = gym.make(SYNTHETIC, max_turns=3, **SMALL)
    assert env.spec.max_episode_steps == 3 and gym.make(SYNTHETIC, **SMALL).spec.max_episode_steps == 32
    assert not isinstance(env, TimeLimit)  # the env truncates by itself; no wrapper does it twice
    stats = RecordEpisodeStatistics(TimeAwareObservation(env, flatten=False))
    obs, _ = stats.reset(seed=0)
    assert obs["time"].tolist() == [0] and "Question:" in obs["obs"]
    for turn in range(1, 4):
        obs, reward, terminated, truncated, info = stats.step("<search>river</search>")
        assert obs["time"].tolist() == [turn]
    assert truncated and not terminated and info["episode"]["l"] == 3 and info["episode"]["r"] == 0.0

    flat = TimeAwareObservation(gym.make(SYNTHETIC, max_turns=3, **SMALL))  # flatten=True: code points, then the time
    obs, _ = flat.reset(seed=0)
    assert unflatten(env.observation_space, obs[:-1]) == env.reset(seed=0)[0] and obs[-1] == 0

    shorter = gym.make(SYNTHETIC, max_episode_steps=2, **SMALL)  # a TimeLimit asked for on top still applies
    shorter.reset(seed=0)
    assert shorter.spec.max_episode_steps == 2 and [shorter.step("<search>a</search>")[3] for _ in range(2)] == [
        False,
        True,
    ]


def test_autoreset_wrapper_starts_the_next_episode_on_the_step_after_the_end():
    env = Autoreset(gym.make(SYNTHETIC, **SMALL))
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("<answer>no idea</answer>")
    assert terminated and "verdict" in info
    obs, reward, terminated, truncated, info = env.step("<answer>ignored</answer>")
    assert "Question:" in obs and (reward, terminated, truncated) == (0.0, False, False)


def test_step_before_reset_raises_and_step_after_the_end_repeats_how_it_ended(small_pool, small_index):
    env = SearchEnv(small_pool, small_index, max_turns=1)
    with pytest.raises(ResetNeeded):
        env.step("<search>river</search>")
    for action, ending in (("<search>river</search>", (False, True)), ("<answer>no idea</answer>", (True, False))):
        env.reset(seed=0)
        assert env.step(action)[2:4] == ending
        for _ in range(2):
            with pytest.warns(UserWarning, match="after the episode ended"):
                obs, reward, terminated, truncated, info = env.step("<answer>late</answer>")
            assert (reward, terminated, truncated) == (0.0, *ending) and "episode is over" in obs
            assert info == {"error": "step after the episode ended"}  # nothing was judged or run
    env.close()
