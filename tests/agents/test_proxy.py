"""The recording proxy (serve/proxy.py) through the official `openai` client, on a real tiny model in a TorchEngine:
every trained token is one the engine produced for exactly the prompt before it, tool calls and streaming work as
in `serve model`, a rewritten history starts a segment, and calls it cannot train on are recorded as such."""

import json

import openai
import pytest
import pytest_asyncio

from searchgym.agents.engines.torch_engine import TorchEngine
from searchgym.agents.engines.types import FinishReason, GenerateRequest, GenerateResponse
from searchgym.agents.trajectory import Trajectory
from searchgym.serve.proxy import REWRITE, RecordingProxy
from tests.agents.tool_model import ANSWER, ARGUMENTS, RESULT, TOOLS, exchange

in_module_loop = pytest.mark.asyncio(loop_scope="module")
NAME = "policy"


class LoggedEngine:
    """A TorchEngine that logs every request it was given and the response it returned: the engine's own record."""

    def __init__(self, inner: TorchEngine) -> None:
        self.inner, self.max_context, self.tokenizer = inner, inner.max_context, inner.tokenizer
        self.log: list[tuple[GenerateRequest, GenerateResponse]] = []

    @property
    def version(self) -> int:
        return self.inner.version

    async def agenerate(self, request: GenerateRequest, *, progress=None, keep_prefix: bool = True) -> GenerateResponse:
        response = await self.inner.agenerate(request, progress=progress, keep_prefix=keep_prefix)
        self.log.append((request, response))
        return response

    async def update_weights(self, source, version: int) -> None:
        await self.inner.update_weights(source, version)


def check_against_engine(traj: Trajectory, log: list[tuple[GenerateRequest, GenerateResponse]]) -> int:
    """Every run of trained tokens is one logged response (ids, log-probs, versions), and the tokens before it in its
    segment are exactly that request's prompt; returns the number of runs checked."""
    runs = 0
    for segment in traj.token_segments():
        assert len(segment.input_ids) == len(segment.loss_mask) == len(segment.logprobs) == len(segment.versions)
        i = 0
        while i < len(segment.loss_mask):
            if not segment.loss_mask[i]:
                assert segment.logprobs[i] == 0.0 and segment.versions[i] == -1
                i += 1
                continue
            end = i
            while end < len(segment.loss_mask) and segment.loss_mask[end]:
                end += 1
            prompt, output = segment.input_ids[:i], segment.input_ids[i:end]
            matches = [r for q, r in log if list(q.input_ids) == prompt and list(r.output_ids) == output]
            assert matches, f"trained tokens {i}:{end} are no output the engine gave for the prompt before them"
            # the same prompt may have been answered alike twice: one of those answers has these very numbers
            assert any(
                segment.logprobs[i:end] == list(r.logprobs) and segment.versions[i:end] == list(r.versions)
                for r in matches
            )
            runs, i = runs + 1, end
        assert len(segment.run_turns) == sum(
            1 for k, m in enumerate(segment.loss_mask) if m and (k == 0 or not segment.loss_mask[k - 1])
        )
    return runs


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def proxied(tool_model_dir):
    """The tool-calling tiny model in a logged TorchEngine behind a recording proxy: (proxy, engine)."""
    inner = TorchEngine(tool_model_dir, seed=0)
    engine = LoggedEngine(inner)
    try:
        async with RecordingProxy(engine, inner.tokenizer, served_model_name=NAME, context_length=1024) as proxy:
            yield proxy, engine
    finally:
        await inner.close()


def episode(proxy: RecordingProxy):
    """A fresh episode's record and an `openai` client pointed at it."""
    record = proxy.open_episode()
    return record, openai.AsyncOpenAI(base_url=proxy.base_url(record.key), api_key="unused", max_retries=0)


@in_module_loop
async def test_tool_call_then_streamed_answer_link_into_one_token_exact_trajectory(proxied):
    proxy, engine = proxied
    record, client = episode(proxy)
    first, _ = exchange()
    called = await client.chat.completions.create(model=NAME, messages=first, tools=TOOLS, temperature=0)
    (call,) = called.choices[0].message.tool_calls
    assert called.choices[0].finish_reason == "tool_calls" and json.loads(call.function.arguments) == ARGUMENTS
    history = [*first, called.choices[0].message, {"role": "tool", "tool_call_id": call.id, "content": RESULT}]
    reused = engine.inner.stats()["reused_tokens"]
    stream = await client.chat.completions.create(model=NAME, messages=history, tools=TOOLS, temperature=0, stream=True)
    text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
    assert text == ANSWER
    await client.close()
    # the engine kept the first call's keys and values under the episode's rid: the second prefilled only the new part
    assert engine.inner.stats()["reused_tokens"] - reused >= called.usage.prompt_tokens

    traj = Trajectory(task_id="t")
    proxy.close_episode(record.key).link(traj)
    assert [c["streamed"] for c in traj.proxy_calls] == [False, True]
    assert all(c["untrainable"] == "" and c["status"] == 200 for c in traj.proxy_calls)
    # the second prompt re-renders the model's own call token for token: one sequence, the tool result masked out
    assert traj.num_segments == 1 and [c["segment"] for c in traj.proxy_calls] == [0, 0]
    assert check_against_engine(traj, engine.log[-2:]) == 2
    assert traj.input_ids == list(engine.log[-1][0].input_ids) + list(engine.log[-1][1].output_ids)
    assert (
        engine.tokenizer.decode([t for t, m in zip(traj.input_ids, traj.loss_mask, strict=True) if m]).count(
            "<tool_call>"
        )
        == 1
    )


@in_module_loop
async def test_a_rewritten_history_starts_a_new_segment_and_a_weight_update_shows_in_versions(proxied):
    proxy, engine = proxied
    record, client = episode(proxy)
    question = [{"role": "user", "content": "Name a river."}]
    reply = await client.chat.completions.create(model=NAME, messages=question, max_tokens=5, temperature=1.0)
    await engine.update_weights(engine.inner.model.state_dict(), engine.version + 1)  # a new policy version mid-episode
    # the agent drops its history and asks afresh: not an extension of what came before
    rewritten = [{"role": "user", "content": "Forget that. Name a mountain, please."}]
    await client.chat.completions.create(model=NAME, messages=rewritten, max_tokens=5, temperature=1.0)
    # and puts words in the model's mouth: an assistant turn it never wrote is no extension either
    follow = [*rewritten, {"role": "assistant", "content": "x"}, {"role": "user", "content": "Another."}]
    await client.chat.completions.create(model=NAME, messages=follow, max_tokens=5, temperature=1.0)
    await client.close()
    assert reply.choices[0].message.content is not None

    traj = Trajectory(task_id="t")
    proxy.close_episode(record.key).link(traj)
    log = engine.log[-3:]
    assert check_against_engine(traj, log) == 3
    assert traj.num_segments == 3 and [s.end for s in traj.segments] == [REWRITE, REWRITE]
    assert traj.context_events[0]["reason"] == REWRITE and traj.context_events[0]["call"] == 1
    assert traj.segments[0].input_ids == list(log[0][0].input_ids) + list(log[0][1].output_ids)
    first_version, later = set(log[0][1].versions), set(log[1][1].versions) | set(log[2][1].versions)
    assert len(first_version) == 1 and later == {next(iter(first_version)) + 1}
    trained_versions = {v for s in traj.token_segments() for v, m in zip(s.versions, s.loss_mask, strict=True) if m}
    assert trained_versions == first_version | later


@in_module_loop
async def test_calls_it_cannot_train_on_are_answered_or_refused_and_recorded_with_the_reason(proxied):
    proxy, engine = proxied
    record, client = episode(proxy)
    messages = [{"role": "user", "content": "Hello"}]
    logged = len(engine.log)
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        await client.chat.completions.create(model=NAME, messages=messages, n=2, max_tokens=3)
    other = await client.chat.completions.create(model="gpt-4o", messages=messages, max_tokens=3)
    assert other.choices[0].message.content is not None  # answered, by the policy, but not trained on
    edited = await client.chat.completions.create(
        model=NAME, messages=messages, max_tokens=3, extra_body={"chat_template_kwargs": {"flavour": "x"}}
    )
    assert edited.choices[0].message.content is not None
    kept = await client.chat.completions.create(model=NAME, messages=messages, max_tokens=3)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        await client.chat.completions.create(model=NAME, messages=messages, max_tokens=10**6)
    await client.close()

    traj = Trajectory(task_id="t")
    proxy.close_episode(record.key).link(traj)
    reasons = [c["untrainable"] for c in traj.proxy_calls]
    assert reasons[0].startswith("refused (400)") and "n must be 1" in reasons[0]
    assert "'gpt-4o' is not the policy" in reasons[1]
    assert "chat_template_kwargs" in reasons[2]
    assert reasons[3] == "" and reasons[4].startswith("refused (400)")
    assert [c["segment"] for c in traj.proxy_calls] == [None, None, None, 0, None]
    # only the one trainable call's tokens are trained: it is the fourth generation the engine ran
    assert len(engine.log) - logged == 3 and check_against_engine(traj, engine.log[-1:]) == 1
    assert traj.generated_tokens == kept.usage.completion_tokens


@in_module_loop
async def test_episodes_are_kept_apart_and_an_ended_one_is_a_404(proxied):
    proxy, engine = proxied
    (a, client_a), (b, client_b) = episode(proxy), episode(proxy)
    messages = [{"role": "user", "content": "Hello"}]
    await client_a.chat.completions.create(model=NAME, messages=messages, max_tokens=2)
    await client_b.chat.completions.create(model=NAME, messages=messages, max_tokens=2)
    await client_b.chat.completions.create(model=NAME, messages=messages, max_tokens=2)
    assert len(proxy.close_episode(a.key).calls) == 1 and len(proxy.close_episode(b.key).calls) == 2
    with pytest.raises(openai.NotFoundError, match="no episode"):
        await client_a.chat.completions.create(model=NAME, messages=messages, max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        await client_b.models.list()
    live, client_c = episode(proxy)
    assert [m.id for m in (await client_c.models.list()).data] == [NAME]
    proxy.close_episode(live.key)
    await client_c.close()
    await client_a.close()
    await client_b.close()
    with pytest.raises(ValueError, match="URL path"):
        proxy.open_episode("../x")


class WholeEngine(LoggedEngine):
    """An engine that answers whole, with no progress callback (as SGLangEngine does)."""

    async def agenerate(self, request: GenerateRequest) -> GenerateResponse:
        response = await self.inner.agenerate(request)
        self.log.append((request, response))
        return response


@in_module_loop
async def test_an_engine_without_progress_streams_its_answer_in_one_piece(proxied):
    proxy, logged = proxied
    engine = WholeEngine(logged.inner)
    async with RecordingProxy(engine, logged.tokenizer, served_model_name=NAME, context_length=1024) as whole:
        record, client = episode(whole)
        first, _ = exchange()
        plain = await client.chat.completions.create(model=NAME, messages=first, temperature=0, max_tokens=12)
        stream = await client.chat.completions.create(
            model=NAME, messages=first, temperature=0, max_tokens=12, stream=True
        )
        text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
        await client.close()
        assert text == plain.choices[0].message.content
        traj = Trajectory(task_id="t")
        whole.close_episode(record.key).link(traj)
    assert [c["streamed"] for c in traj.proxy_calls] == [False, True] and traj.num_segments == 2
    assert check_against_engine(traj, engine.log) == 2


# ---- linking, as an invariant over any sequence of calls ---------------------------------------------------------


def calls_strategy():
    """Calls whose prompts either extend everything so far (with some env tokens) or start afresh, some untrainable."""
    from hypothesis import strategies as st

    step = st.tuples(
        st.booleans(),
        st.lists(st.integers(1, 50), min_size=1, max_size=4),
        st.lists(st.integers(51, 99), min_size=0, max_size=4),
        st.sampled_from(["", "", "", "n=2"]),
    )
    return st.lists(step, min_size=1, max_size=8)


def test_linking_keeps_every_trained_token_after_exactly_its_prompt():
    from hypothesis import given, settings

    from searchgym.serve.proxy import EpisodeRecord

    @settings(max_examples=200, deadline=None)
    @given(calls_strategy())
    def check(steps):
        record, sequence, expected_segments, log = EpisodeRecord("k"), [], 1, []
        for extend, new, output, reason in steps:
            prompt = sequence + new if extend else [100 + len(log)] + new  # a fresh start never extends
            call = record.new_call()
            call.output_ids, call.untrainable = output, reason
            record.keep_prompt(call, prompt)
            call.logprobs, call.versions = [-0.5] * len(output), [len(log)] * len(output)
            log.append(
                (GenerateRequest(prompt), GenerateResponse(output, call.logprobs, call.versions, FinishReason("stop")))
            )
            if call.trainable:
                if sequence and not extend:
                    expected_segments += 1
                sequence = prompt + output
        traj = Trajectory(task_id="t")
        record.link(traj)
        trained = [c for c in record.calls if c.trainable]
        assert check_against_engine(traj, log) == len(trained)
        assert traj.num_segments == (expected_segments if trained else 1)
        assert traj.generated_tokens == sum(len(c.output_ids) for c in trained)
        assert [c["segment"] is None for c in traj.proxy_calls] == [not c.trainable for c in record.calls]

    check()


@in_module_loop
async def test_a_generation_aborted_by_a_pause_is_retried_by_the_client_and_only_the_retry_is_trained(proxied):
    import asyncio

    proxy, engine = proxied
    record = proxy.open_episode()
    client = openai.AsyncOpenAI(base_url=proxy.base_url(record.key), api_key="unused", max_retries=2)
    await engine.inner.pause()  # a weight update is coming: the request waits
    try:
        reply = asyncio.ensure_future(
            client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hello"}], max_tokens=4)
        )
        for _ in range(200):
            if engine.inner.stats()["waiting"]:
                break
            await asyncio.sleep(0.01)
        assert await engine.inner.abort(None) == 1  # ... and the trainer aborts what is in flight
    finally:
        await engine.inner.resume()
    answered = await reply  # the 503 and its Retry-After made the client send the request again
    await client.close()
    assert answered.choices[0].message.content is not None
    traj = Trajectory(task_id="t")
    proxy.close_episode(record.key).link(traj)
    assert [c["finish_reason"] for c in traj.proxy_calls] == ["abort", "length"]
    assert traj.proxy_calls[0]["status"] == 503 and "aborted" in traj.proxy_calls[0]["untrainable"]
    assert [c["segment"] for c in traj.proxy_calls] == [None, 0] and traj.generated_tokens == 4
    assert check_against_engine(traj, engine.log) == 1


@in_module_loop
async def test_junk_requests_are_4xx_in_openais_envelope_and_recorded(proxied):
    import aiohttp

    proxy, _ = proxied
    record = proxy.open_episode()
    url = proxy.base_url(record.key) + "/chat/completions"
    async with aiohttp.ClientSession() as http:
        for data in (
            b"{not json",
            b"[1, 2]",
            json.dumps({"model": NAME, "messages": "hi"}).encode(),
            json.dumps({"model": NAME, "messages": [{"role": "user", "content": "x"}], "sise": 1}).encode(),
        ):
            async with http.post(url, data=data, headers={"Content-Type": "application/json"}) as response:
                body = await response.json()
                assert response.status == 400 and body["error"]["type"] == "invalid_request_error", body
    calls = proxy.close_episode(record.key).calls
    assert [c.status for c in calls] == [400] * 4 and all(c.untrainable.startswith("refused (400)") for c in calls)
    assert "sise" in calls[3].untrainable
