"""GEM and SkyRL-gym run searchgym envs through their own APIs: gem.make with GEM's wrappers and vector env,
skyrl_gym.make with SkyRL's init/step loop. The oracle wins (reward 1 at the end), and a judge failure raises."""

from __future__ import annotations

import pytest

gem = pytest.importorskip("gem")
skyrl_gym = pytest.importorskip("skyrl_gym")

from gem.wrappers.episode_tracking_wrapper import EpisodeTrackingWrapper  # noqa: E402
from gem.wrappers.observation_wrapper import ObservationWrapper  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from searchgym.integrations.gem import JudgeFailed as GemJudgeFailed  # noqa: E402
from searchgym.integrations.gem import register_gem  # noqa: E402
from searchgym.integrations.skyrl import JudgeFailed as SkyJudgeFailed  # noqa: E402
from searchgym.integrations.skyrl import register_skyrl  # noqa: E402
from searchgym.world.oracle import OracleAgent  # noqa: E402
from tests.integrations.conftest import ENV_KWARGS, BrokenJudge  # noqa: E402

GEM_ID = "searchgym:SyntheticQA-v0"
KWARGS = {**ENV_KWARGS, "max_turns": 8}


def oracle_actions(searchgym_env):
    """The oracle's script on the env's current task: a generator sent (observation, info)."""
    return OracleAgent(tool_format=searchgym_env.tool_format).script(searchgym_env.task, searchgym_env.max_page_chunks)


def test_gem_make_with_gems_wrappers_plays_an_oracle_episode_to_reward_one():
    assert GEM_ID in register_gem() and GEM_ID in register_gem()  # idempotent
    env = ObservationWrapper(
        EpisodeTrackingWrapper(gem.make(GEM_ID, env_kwargs=KWARGS)), include_action=True, include_chat_template=False
    )
    obs, info = env.reset(seed=3)
    inner = env.unwrapped._env
    assert inner.task.question in obs and info["step_counter"] == 0
    script, rewards = oracle_actions(inner), []
    action = next(script)
    while True:
        obs, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        if terminated or truncated:
            break
        action = script.send((obs, info))
    assert terminated and rewards[-1] == 1.0 and sum(rewards[:-1]) == 0.0
    assert info["cumulative_rewards"] == 1.0 and info["step_counter"] == len(rewards)
    assert action in obs  # GEM's observation wrapper concatenated the agent's turns into the history
    env.close()


def test_gem_vector_env_seeds_each_copy_and_spawn_copies_the_configuration():
    register_gem()
    vec = gem.make_vec([GEM_ID] * 2, vec_kwargs=[{"env_kwargs": KWARGS}, {"env_kwargs": KWARGS}], seed=10)
    obs, _ = vec.reset()
    assert len(obs) == 2 and obs[0] != obs[1]  # copies seeded 10 and 11 draw different tasks
    env = gem.make(GEM_ID, env_kwargs=KWARGS, seed=5)
    first, _ = env.reset()
    again, _ = env.spawn().reset(seed=5)
    assert first == again
    with pytest.raises(ValueError, match="'sise'"):
        gem.make(GEM_ID, env_kwargs={**KWARGS, "sise": 3})


def test_gem_raises_on_a_judge_failure_instead_of_a_zero_reward():
    register_gem()
    env = gem.make(GEM_ID, env_kwargs={**KWARGS, "judge": BrokenJudge()})
    env.reset(seed=0)
    with pytest.raises(GemJudgeFailed, match="timed out"):
        env.step("<answer>anything</answer>")


@pytest.mark.parametrize("config_type", [dict, OmegaConf.create])
def test_skyrl_make_init_step_plays_an_oracle_episode(config_type):
    env_id = register_skyrl()
    assert register_skyrl() == env_id
    config = config_type({"env_id": "searchgym/SyntheticQA-v0", "env_kwargs": KWARGS})
    probe = skyrl_gym.make(env_id, env_config=config, extras={"index": 4})
    prompt, meta = probe.init([{"role": "system", "content": "be brief"}, {"role": "user", "content": ""}])
    task = probe._env.task
    assert prompt[0]["content"] == "be brief" and task.question in prompt[-1]["content"] and meta["task_id"] == task.id
    env = skyrl_gym.make(env_id, env_config=config, extras={"task_id": task.id, "max_turns": 6})
    env.init([])
    assert env.max_turns == 6 and env._env.task.id == task.id
    script = oracle_actions(env._env)
    action, last = next(script), None
    while True:
        out = env.step(action)
        if out["done"]:
            last = out
            break
        assert out["reward"] == 0.0 and out["observations"][0]["role"] == "user"
        action = script.send((out["observations"][0]["content"], {}))
    assert last["reward"] == 1.0 and last["observations"] == [] and last["metadata"]["verdict"]["correct"]
    metrics = env.get_metrics()
    assert metrics["answered"] == 1.0 and metrics["searches"] >= 1
    assert type(env).aggregate_metrics([metrics, metrics])["turns"] == metrics["turns"]


def test_skyrl_refuses_bad_settings_and_raises_on_a_judge_failure():
    env_id = register_skyrl()
    with pytest.raises(ValueError, match="env_config takes env_id and env_kwargs"):
        skyrl_gym.make(env_id, env_config={"env": "x"}, extras={})
    with pytest.raises(ValueError, match="'sise'"):
        skyrl_gym.make(env_id, env_config={"env_kwargs": {**KWARGS, "sise": 1}}, extras={})
    env = skyrl_gym.make(env_id, env_config={"env_kwargs": {**KWARGS, "judge": BrokenJudge()}}, extras={"index": 0})
    env.init([])
    with pytest.raises(SkyJudgeFailed, match="timed out"):
        env.step("<answer>anything</answer>")
