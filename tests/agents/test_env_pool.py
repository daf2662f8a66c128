"""EnvPool lends envs across episodes: as many are made as run at once, and a reused env plays like a new one."""

import asyncio

import pytest

from searchgym.agents.env_pool import EnvPool
from searchgym.envs.search_env import SearchEnv
from searchgym.world.oracle import OracleAgent


def test_envs_are_reused_and_a_reused_env_replays_exactly(small_pool, small_index):
    made: list[SearchEnv] = []

    def make_env():
        made.append(SearchEnv(small_pool, small_index, max_turns=6))
        return made[-1]

    pool = EnvPool(make_env)
    tasks = list(small_pool)[:6]

    async def play(task):
        with pool.env() as env:
            result = await OracleAgent().arun(env, task)
            await asyncio.sleep(0)  # let the other episodes interleave while this env is lent
            return result

    async def play_all():
        return await asyncio.gather(*(play(t) for t in tasks[:3]))

    first = asyncio.run(play_all())
    assert pool.made == 3  # three at once: three envs
    again = asyncio.run(play_all())
    assert pool.made == 3  # no new env for the second round
    assert [(r.turns, r.reward) for r in again] == [(r.turns, r.reward) for r in first]
    assert any(r.solved for r in again)


def test_an_env_whose_episode_failed_is_closed_not_lent_again(small_pool, small_index):
    pool = EnvPool(lambda: SearchEnv(small_pool, small_index))
    with pytest.raises(RuntimeError):
        with pool.env() as env:
            failed = env
            raise RuntimeError("engine died")
    with pool.env() as env:
        assert env is not failed
    assert pool.made == 2
    pool.close()
