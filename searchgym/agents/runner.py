"""The episode runner: an env plus an engine in, a token-level Trajectory out.

Each turn: generate from the whole token sequence so far until a tool call closes, append the
engine's exact output ids (loss mask 1, behaviour logprobs, weight versions), hand the decoded text
to the env, and append the env's observation as chat-template tokens (loss mask 0). Model output is
never re-tokenized, so the sequence the learner trains on is the one the policy sampled.
Hundreds of episodes run concurrently in one event loop; the engine batches their requests.
"""
from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any

from searchgym.agents.engines.types import GenerateRequest, InferenceEngine, SamplingParams
from searchgym.agents.formats import ChatTemplateDelta, ToolFormat
from searchgym.agents.trajectory import Trajectory, Turn
from searchgym.envs.judges import ChatModel
from searchgym.envs.search_env import SearchEnv

INFO_KEYS = ("tool", "query", "url", "hits", "page", "error", "format_errors", "evidence", "truncation")


async def run_episode(
    env: SearchEnv,
    engine: InferenceEngine,
    tokenizer: Any,
    *,
    tool_format: str = "tags",
    sampling: SamplingParams = SamplingParams(),
    max_context: int = 32_768,
    observation_role: str = "user",
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    rid: str | None = None,
    template: ChatTemplateDelta | None = None,
) -> Trajectory:
    """Play one episode token in, token out; stops on an answer, an env budget, or the context budget."""
    fmt = ToolFormat.get(tool_format)
    template = template or ChatTemplateDelta(tokenizer, observation_role)
    sampling = dataclasses.replace(sampling, stop=tuple(dict.fromkeys(sampling.stop + fmt.stops)))
    rid = rid or uuid.uuid4().hex
    obs, info = await env.areset(seed=seed, options=options)
    traj = Trajectory(task_id=info["task_id"], messages=[{"role": "user", "content": obs}])
    traj.extend(template.prompt_ids(obs), generated=False)
    traj.prompt_length = len(traj.input_ids)
    eos_ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    while True:
        budget = min(sampling.max_new_tokens, max_context - len(traj.input_ids))
        if budget <= 0:
            traj.truncated, traj.stop_reason = True, "context budget"
            break
        t0 = time.perf_counter()
        response = await engine.agenerate(GenerateRequest(
            list(traj.input_ids), dataclasses.replace(sampling, max_new_tokens=budget), rid))
        t1 = time.perf_counter()
        traj.extend(response.output_ids, generated=True, logprobs=response.logprobs, versions=response.versions)
        action = _action_text(tokenizer, response.output_ids, eos_ids)
        obs, done = await _act(env, traj, action, t1 - t0, generated_tokens=len(response.output_ids),
                               finish_reason=response.finish_reason.type)
        if done:
            break
        ended_with_eos = bool(response.output_ids) and response.output_ids[-1] in eos_ids
        delta = template.observation_ids(obs, ended_with_eos)
        traj.turns[-1].observation_tokens = len(delta)
        if len(traj.input_ids) + len(delta) >= max_context:
            traj.truncated, traj.stop_reason = True, "context budget"
            break
        traj.extend(delta, generated=False)
        traj.messages.append({"role": observation_role if observation_role != "inline" else "user", "content": obs})
    return traj


def _action_text(tokenizer: Any, output_ids: list[int], eos_ids: set[int]) -> str:
    """The turn as text, special tokens kept (so transcript and tokens agree), a final eos dropped."""
    ids = output_ids[:-1] if output_ids and output_ids[-1] in eos_ids else output_ids
    return tokenizer.decode(ids, skip_special_tokens=False)


async def run_chat_episode(
    env: SearchEnv,
    model: ChatModel,
    *,
    tool_format: str = "tags",
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    **sampling: Any,
) -> Trajectory:
    """Play one episode through a text-only chat endpoint (OpenAI-compatible): messages, no token ids."""
    fmt = ToolFormat.get(tool_format)
    obs, info = await env.areset(seed=seed, options=options)
    traj = Trajectory(task_id=info["task_id"], messages=[{"role": "user", "content": obs}])
    while True:
        t0 = time.perf_counter()
        action = close_stopped_call(await model.achat(traj.messages, stop=list(fmt.stops), **sampling), fmt)
        obs, done = await _act(env, traj, action, time.perf_counter() - t0)
        if done:
            return traj
        traj.messages.append({"role": "user", "content": obs})


async def _act(env: SearchEnv, traj: Trajectory, action: str, generate_seconds: float, **turn: Any) -> tuple[str, bool]:
    """Step the env with the turn's text, record the turn, and close the trajectory if the episode ended."""
    traj.messages.append({"role": "assistant", "content": action})
    t0 = time.perf_counter()
    obs, reward, terminated, truncated, info = await env.astep(action)
    traj.turns.append(Turn(action=action, tool=info.get("tool", "invalid"), observation=obs, reward=reward,
                           info={k: info[k] for k in INFO_KEYS if k in info}, generate_seconds=generate_seconds,
                           env_seconds=time.perf_counter() - t0, **turn))
    traj.reward += reward
    if terminated or truncated:
        traj.terminated, traj.truncated = terminated, truncated
        traj.stop_reason = "answer" if terminated else info.get("truncation", "env budget")
        traj.verdict = info.get("verdict")
    return obs, terminated or truncated


def close_stopped_call(text: str, fmt: ToolFormat) -> str:
    """OpenAI-style endpoints drop the stop string; put back the closing tag of the call left open."""
    if any(text.rstrip().endswith(stop) for stop in fmt.stops):
        return text
    openings = {stop: text.rfind(stop.replace("</", "<", 1)) for stop in fmt.stops}
    stop, position = max(openings.items(), key=lambda kv: kv[1])
    if position >= 0 and stop not in text[position:]:
        return text + stop
    return text
