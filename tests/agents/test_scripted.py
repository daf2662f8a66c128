"""The oracle's script played by the world's validation driver and by the agents' ScriptedWorkflow gives one episode."""

import asyncio

from searchgym.agents.scripted import OracleWorkflow, demonstrations
from searchgym.envs.search_env import SearchEnv
from searchgym.world.oracle import OracleAgent


def test_validation_and_demonstrations_play_the_same_episodes(small_pool, small_index):
    env = SearchEnv(small_pool, small_index, max_turns=12)
    tasks = list(small_pool)[:24]
    oracle = OracleAgent(skim=True, think=False)

    async def both():
        results = [await oracle.arun(env, task) for task in tasks]
        trajectories = [await OracleWorkflow(oracle).arun_episode(env, options={"task_id": t.id}) for t in tasks]
        return results, trajectories, await demonstrations(env, tasks)

    results, trajectories, chats = asyncio.run(both())
    for result, traj in zip(results, trajectories, strict=True):
        assert [t["action"] for t in result.turns] == [t.action for t in traj.turns]
        assert result.solved == bool((traj.verdict or {}).get("correct"))
        if result.solved:
            assert traj.messages == result.messages() and traj.prediction == small_pool.by_id(result.task_id).answers[0]
        else:
            assert traj.stop_reason.startswith("script: ") or traj.truncated
    assert chats == [r.messages() for r in results if r.solved] and len(chats) >= len(tasks) // 2


def test_demonstrations_are_written_in_the_env_s_tool_format(small_pool, small_index):
    env = SearchEnv(small_pool, small_index, max_turns=12, tool_format="hermes")
    chats = asyncio.run(demonstrations(env, list(small_pool)[:6]))
    actions = [m["content"] for chat in chats for m in chat if m["role"] == "assistant"]
    assert chats and all("<tool_call>" in a and "<search>" not in a and "<answer>" not in a for a in actions)
