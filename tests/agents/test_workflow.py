"""Workflows play episodes token in, token out with the real tiny model in-process (TorchEngine), and text in,
text out through chat endpoints."""

import asyncio
import dataclasses

import pytest
import torch

from searchgym.agents.engines.torch_engine import TorchEngine
from searchgym.agents.engines.types import SamplingParams
from searchgym.agents.formats import ChatTemplateDelta
from searchgym.agents.workflow import ChatWorkflow, TokenWorkflow, WorkflowSettings
from searchgym.envs.search_env import SearchEnv

SAMPLING = SamplingParams(max_new_tokens=40, temperature=1.0)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return TorchEngine(tiny_model_dir, seed=0)


def play_many(engine, pool, index, n, *, sampling=SAMPLING, max_turns=4, max_context=4096, during=None):
    async def main():
        envs = [SearchEnv(pool, index, max_turns=max_turns) for _ in range(n)]
        workflow = TokenWorkflow(engine, engine.tokenizer, WorkflowSettings(sampling, max_context))
        episodes = [workflow.arun_episode(env, seed=i) for i, env in enumerate(envs)]
        if during is None:
            return await asyncio.gather(*episodes)
        tasks = [asyncio.ensure_future(e) for e in episodes]
        await during()
        return await asyncio.gather(*tasks)

    return asyncio.run(main())


def teacher_forced_logprobs(model, ids, temperature):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_32_concurrent_episodes_are_exact_token_sequences(engine, small_pool, small_index):
    trajectories = play_many(engine, small_pool, small_index, 32)
    template = ChatTemplateDelta(engine.tokenizer)
    for traj in trajectories:
        n = len(traj.input_ids)
        assert n == len(traj.loss_mask) == len(traj.logprobs) == len(traj.versions)
        assert traj.turns and (traj.terminated or traj.truncated) and traj.stop_reason
        generated = [i for i, m in enumerate(traj.loss_mask) if m]
        assert len(generated) == sum(t.generated_tokens for t in traj.turns) == traj.generated_tokens
        assert all(traj.versions[i] == 0 for i in generated)
        assert all(v == -1 for v, m in zip(traj.versions, traj.loss_mask, strict=True) if not m)
        assert traj.loss_mask[: traj.prompt_length] == [0] * traj.prompt_length
        # decoding the tokens gives back the conversation, as the chat template renders it
        decoded = engine.tokenizer.decode(traj.input_ids, skip_special_tokens=False)
        rendered = engine.tokenizer.apply_chat_template(traj.messages, tokenize=False)
        assert rendered.startswith(decoded) and len(rendered) - len(decoded) <= len(template._close)
        # behaviour logprobs are exactly the model's (fp32, temperature 1)
        reference = teacher_forced_logprobs(engine.model, traj.input_ids, 1.0)
        got = torch.tensor(traj.logprobs)[1:]
        mask = torch.tensor(traj.loss_mask[1:], dtype=torch.bool)
        assert torch.allclose(got[mask], reference[mask], atol=1e-4)


def test_a_weight_update_mid_episode_versions_later_tokens(engine, small_pool, small_index):
    original = {k: v.clone() for k, v in engine.model.state_dict().items()}
    perturbed = {k: v + 0.02 * torch.randn_like(v) for k, v in original.items()}

    async def update_soon():
        await asyncio.sleep(0.3)
        await engine.update_weights(perturbed, version=1)

    sampling = dataclasses.replace(SAMPLING, max_new_tokens=120)
    try:
        trajectories = play_many(engine, small_pool, small_index, 8, sampling=sampling, max_turns=6, during=update_soon)
    finally:
        asyncio.run(engine.update_weights(original, version=0))
    seen = set()
    for traj in trajectories:
        versions = [v for v, m in zip(traj.versions, traj.loss_mask, strict=True) if m]
        assert versions == sorted(versions), "a token never carries an older version than the one before it"
        seen.update(versions)
    assert seen == {0, 1}


def test_context_budget_truncates(engine, small_pool, small_index):
    traj = play_many(engine, small_pool, small_index, 1, max_context=300, max_turns=30)[0]
    assert traj.truncated and traj.stop_reason == "context budget" and len(traj.input_ids) <= 300


def test_32_episodes_through_the_model_server_with_sglang_and_openai_clients(tiny_model_dir, small_pool, small_index):
    """(b) SGLangEngine and (c) OpenAIEngine against `searchgym serve model` on loopback."""
    from searchgym.agents.engines.openai_engine import OpenAIEngine
    from searchgym.agents.engines.sglang_engine import SGLangEngine
    from searchgym.serve.model.app import serving
    from searchgym.serve.settings import ModelServerSettings

    served = TorchEngine(tiny_model_dir, seed=3)

    async def main():
        async with serving(
            served, ModelServerSettings(model_path=str(tiny_model_dir), host="127.0.0.1", port=0)
        ) as url:
            sglang = await SGLangEngine([url]).start(timeout=60)
            chat = OpenAIEngine(f"{url}/v1", model=str(tiny_model_dir))
            token_envs = [SearchEnv(small_pool, small_index, max_turns=4) for _ in range(32)]
            chat_envs = [SearchEnv(small_pool, small_index, max_turns=4) for _ in range(32)]
            token_workflow = TokenWorkflow(sglang, served.tokenizer, WorkflowSettings(SAMPLING, 2048))
            chat_workflow = ChatWorkflow(chat, WorkflowSettings(SAMPLING))
            tokens = await asyncio.gather(
                *(token_workflow.arun_episode(env, seed=i) for i, env in enumerate(token_envs))
            )
            chats = await asyncio.gather(*(chat_workflow.arun_episode(env, seed=i) for i, env in enumerate(chat_envs)))
            await sglang.close()
            await chat.close()
            return tokens, chats

    tokens, chats = asyncio.run(main())
    for traj in tokens:
        mask = torch.tensor(traj.loss_mask[1:], dtype=torch.bool)
        assert mask.any() and all(v == 0 for v, m in zip(traj.versions, traj.loss_mask, strict=True) if m)
        reference = teacher_forced_logprobs(served.model, traj.input_ids, 1.0)
        assert torch.allclose(torch.tensor(traj.logprobs)[1:][mask], reference[mask], atol=1e-4)
        decoded = served.tokenizer.decode(traj.input_ids, skip_special_tokens=False)
        assert served.tokenizer.apply_chat_template(traj.messages, tokenize=False).startswith(decoded)
    for traj in chats:
        roles = [m["role"] for m in traj.messages]
        assert roles[0] == "user" and roles[1::2] == ["assistant"] * len(roles[1::2])
        assert traj.turns and (traj.terminated or traj.truncated) and traj.input_ids == []


# --- the env's tool format and the observation roles ----------------------------------------------


def spy_on(engine, monkeypatch):
    """Record every (request, response) the workflow exchanges with the real engine, by trajectory id."""
    calls: dict[str, list] = {}
    original = engine.agenerate

    async def agenerate(request):
        response = await original(request)
        calls.setdefault(request.rid, []).append((request, response))
        return response

    monkeypatch.setattr(engine, "agenerate", agenerate)
    return calls


def play_recorded(engine, envs, monkeypatch, role="user", sampling=SAMPLING):
    """Play one episode per env (rid = its index) and return the trajectories with each one's engine calls."""
    calls = spy_on(engine, monkeypatch)
    workflow = TokenWorkflow(engine, engine.tokenizer, WorkflowSettings(sampling, 4096, observation_role=role))

    async def main():
        return await asyncio.gather(*(workflow.arun_episode(env, seed=i, rid=str(i)) for i, env in enumerate(envs)))

    trajectories = asyncio.run(main())
    return [(traj, calls[str(i)]) for i, traj in enumerate(trajectories)]


@pytest.mark.parametrize(
    "tool_format, stops", [("tags", ("</search>", "</access>", "</answer>")), ("hermes", ("</tool_call>",))]
)
def test_generation_stops_at_the_close_of_the_envs_own_tool_call_format(
    engine, small_pool, small_index, monkeypatch, one_torch_thread, tool_format, stops
):
    envs = [SearchEnv(small_pool, small_index, max_turns=3, tool_format=tool_format) for _ in range(4)]
    sampling = dataclasses.replace(SAMPLING, stop=("STOP HERE",))  # the caller's own stops are kept too
    for traj, calls in play_recorded(engine, envs, monkeypatch, sampling=sampling):
        assert len(calls) == len(traj.turns) >= 1
        for request, _ in calls:
            assert request.sampling.stop == ("STOP HERE", *stops)


def check_generated_tokens_are_exactly_the_engines(traj, calls):
    """Each engine call continued the sequence so far, and its output sits right after it with mask 1;
    nothing else has mask 1, and logprobs and versions are the engine's."""
    generated = 0
    for request, response in calls:
        start, end = len(request.input_ids), len(request.input_ids) + len(response.output_ids)
        assert traj.input_ids[:start] == request.input_ids
        assert traj.input_ids[start:end] == response.output_ids and traj.loss_mask[start:end] == [1] * (end - start)
        assert traj.logprobs[start:end] == response.logprobs and traj.versions[start:end] == response.versions
        generated += end - start
    assert sum(traj.loss_mask) == generated and calls[0][0].input_ids == traj.input_ids[: traj.prompt_length]


def ended_with_eos(tokenizer, calls):
    output = calls[-1][1].output_ids
    return bool(output) and output[-1] == tokenizer.eos_token_id


@pytest.mark.parametrize("role", ["user", "tool"])
def test_observations_enter_as_chat_template_messages_of_their_role(
    engine, small_pool, small_index, monkeypatch, one_torch_thread, role
):
    tokenizer = engine.tokenizer
    if role == "tool" and "tool" not in (tokenizer.chat_template or ""):
        pytest.skip(
            "the tiny model's chat template has no tool role (ChatTemplateDelta would render it as a "
            "made-up role); searchgym.agents.tiny_model should ship a Qwen2.5-style tool template"
        )
    envs = [SearchEnv(small_pool, small_index, max_turns=3) for _ in range(6)]
    close = ChatTemplateDelta(tokenizer, role)._close  # what the template writes after an assistant message
    for traj, calls in play_recorded(engine, envs, monkeypatch, role=role):
        assert len(traj.turns) >= 2, "an episode with no observation turn tests nothing here"
        roles = [m["role"] for m in traj.messages]
        assert roles[0] == "user" and roles[1::2] == ["assistant"] * len(roles[1::2])
        assert roles[2::2] == [role] * len(roles[2::2])
        assert [m["content"] for m in traj.messages[2::2]] == [t.observation for t in traj.turns[: len(roles[2::2])]]
        decoded = tokenizer.decode(traj.input_ids, skip_special_tokens=False)
        if roles[-1] == "assistant":  # the template closes the last message; the tokens end at the model's last one
            rendered = tokenizer.apply_chat_template(traj.messages, tokenize=False)
            tail = close[len(tokenizer.eos_token) :] if ended_with_eos(tokenizer, calls) else close
            assert decoded + tail == rendered
        else:  # stopped by the context budget right after an observation
            assert decoded == tokenizer.apply_chat_template(traj.messages, tokenize=False, add_generation_prompt=True)
        check_generated_tokens_are_exactly_the_engines(traj, calls)


def test_inline_observations_continue_the_assistant_message(
    engine, small_pool, small_index, monkeypatch, one_torch_thread
):
    """Search-R1's layout: one assistant message in which each tool result follows the call as plain text."""
    tokenizer = engine.tokenizer
    envs = [SearchEnv(small_pool, small_index, max_turns=3) for _ in range(6)]
    for traj, calls in play_recorded(engine, envs, monkeypatch, role="inline"):
        assert len(traj.turns) >= 2
        prompt = tokenizer.apply_chat_template(traj.messages[:1], tokenize=False, add_generation_prompt=True)
        expected = prompt + "".join(
            tokenizer.decode(response.output_ids, skip_special_tokens=False)
            + (f"\n\n{turn.observation}\n\n" if i + 1 < len(calls) else "")
            for i, ((_, response), turn) in enumerate(zip(calls, traj.turns, strict=True))
        )
        assert tokenizer.decode(traj.input_ids, skip_special_tokens=False) == expected
        assert tokenizer.decode(traj.input_ids[: traj.prompt_length], skip_special_tokens=False) == prompt
        check_generated_tokens_are_exactly_the_engines(traj, calls)


def test_the_models_own_context_ends_the_episode_instead_of_empty_turns(tiny_model_dir, small_pool, small_index):
    """An engine whose model has fewer positions than the workflow's budget ends the episode at its limit."""
    short = TorchEngine(tiny_model_dir, seed=0)
    short.max_context = 300  # as a model with 300 positions
    traj = play_many(short, small_pool, small_index, 1, max_context=4096, max_turns=30)[0]
    assert traj.truncated and traj.stop_reason == "context budget" and len(traj.input_ids) <= 300
    assert all(turn.generated_tokens > 0 for turn in traj.turns)
