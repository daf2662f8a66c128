"""An episode's calls keep each prompt as the tokens after the last answered call's prompt + output: the record holds
an agent's tokens about once, not once per turn (a 64-turn episode of 32k-token prompts would hold 2M), and every
prompt is rebuilt exactly."""

from hypothesis import given, settings
from hypothesis import strategies as st

from searchgym.agents.trajectory import Trajectory
from searchgym.serve.proxy import EpisodeRecord

tokens = st.lists(st.integers(0, 50), max_size=6)


@st.composite
def episodes(draw):
    """(prompt, output) per call: each prompt extends the previous call's prompt + output, or starts afresh."""
    calls, full = [], []
    for _ in range(draw(st.integers(1, 12))):
        prompt = [*full, *draw(tokens)] if full and draw(st.booleans()) else draw(tokens.filter(bool))
        output = draw(tokens)
        calls.append((prompt, output))
        full = [*prompt, *output]
    return calls


def record_of(calls):
    record = EpisodeRecord("ep")
    for prompt, output in calls:
        call = record.new_call()
        call.output_ids, call.logprobs, call.versions = list(output), [-1.0] * len(output), [0] * len(output)
        record.keep_prompt(call, list(prompt))
    return record


@settings(max_examples=200, deadline=None)
@given(episodes())
def test_every_prompt_is_rebuilt_exactly_from_what_the_record_keeps(calls):
    record = record_of(calls)
    assert [c.prompt_ids for c in record.calls] == [p for p, _ in calls]
    assert [c.prompt_tokens for c in record.calls] == [len(p) for p, _ in calls]
    full = []
    for call, (prompt, output) in zip(record.calls, calls, strict=True):
        extends = bool(full) and prompt[: len(full)] == full
        assert len(call.prompt_tail) == len(prompt) - (len(full) if extends else 0)
        full = [*prompt, *output]
    traj = Trajectory(task_id="t")
    record.link(traj)
    trained = [c for c in record.calls if c.output_ids]
    if trained:  # the live segment ends with the last trained call's prompt and output, as when prompts were whole
        last = trained[-1]
        assert traj.input_ids[-len(last.output_ids) :] == last.output_ids
    assert traj.generated_tokens == sum(len(o) for _, o in calls)  # every output trained, in whichever segment


def test_a_64_turn_episode_is_kept_once_not_once_per_turn():
    turn = list(range(500))  # each turn adds 500 prompt tokens (a tool result) and the model writes 20
    calls, prompt = [], list(range(1000))
    for _ in range(64):
        output = [7] * 20
        calls.append((prompt, output))
        prompt = [*prompt, *output, *turn]
    record = record_of(calls)
    kept = sum(len(c.prompt_tail) + len(c.output_ids) for c in record.calls)
    whole = sum(len(p) for p, _ in calls)
    assert kept == len(calls[-1][0]) + 20  # the final sequence, once
    assert whole > 30 * kept  # what whole prompts per call held
    assert record.calls[-1].prompt_ids == calls[-1][0]
