"""The recording proxy at ASearcher's depth: an agent program whose model searches every turn plays a 64-turn
episode through the proxy, and its trajectory is one segment whose every trained token is the engine's own."""

import asyncio

from transformers import AutoTokenizer

from searchgym.bench.proxy_long import play_long_episode
from tests.agents.test_proxy import check_against_engine

TURNS = 64


def test_a_64_turn_agent_program_episode_is_one_token_exact_trajectory(tiny_model_dir, small_bundle):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    traj, engine = asyncio.run(play_long_episode(tokenizer, TURNS))
    assert [t.tool for t in traj.turns] == ["search"] * TURNS + ["answer"], traj.stop_reason
    assert traj.terminated and traj.stop_reason == "answer"
    # every call continued the one before: one linked trajectory, no segment, nothing left untrained
    assert len(traj.proxy_calls) == len(engine.calls) == TURNS + 1
    assert traj.num_segments == 1 and not traj.context_events
    assert all(c["untrainable"] == "" and c["segment"] == 0 for c in traj.proxy_calls)
    assert check_against_engine(traj, engine.calls) == TURNS + 1  # each run of trained tokens is one engine answer
    assert traj.generated_tokens == sum(len(r.output_ids) for _, r in engine.calls)
    assert traj.run_turns == list(range(TURNS + 1))  # each call's tokens get the advantage of the turn they led to
    # the last prompt holds every search result: the history was never cut
    assert tokenizer.decode(engine.calls[-1][0].input_ids).count("<tool_response>") == TURNS
