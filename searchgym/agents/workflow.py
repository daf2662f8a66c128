"""Rollout workflows: the one owner of an episode between an env and a model.

A workflow holds everything about *how* an episode is played (the engine or chat model, the tokenizer,
sampling, the context budget) and reads the tool-call format from the env it is given. Training,
evaluation, QA synthesis, the oracle's warm start and the quickstart all take a workflow and call
`arun_episode`, so a custom agent is a workflow (usually a subclass overriding `observe` or `act`),
never an edit of the trainer or the evaluator.

- `TokenWorkflow`: token in, token out. It appends the engine's exact output ids (loss mask 1, their
  behaviour logprobs and weight versions), tokenizes only environment text through the chat
  template's delta (loss mask 0) and never re-tokenizes model output, so the learner trains on the
  very sequence the policy sampled.
- `ChatWorkflow`: text in, text out, for OpenAI-compatible endpoints (evaluation, synthesis); its
  trajectories hold messages and turns, no token arrays.

The caller owns the engine: it opens one from a spec (`agents/engines/open.py`: a model dir,
`sglang:HOST:PORT[,...]`, `openai:URL[:model]`), keeps the handle for weight updates and closing, and
builds workflows on it with `build_workflow(handle, workflow=..., settings=...)`, optionally a custom class
named `module:Class` or `path/to/file.py:Class`. A workflow never opens or closes an engine.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchgym.agents.context import ContextPolicy, EndPolicy, Entry, History, stub_for
from searchgym.agents.engines.open import EngineHandle
from searchgym.agents.engines.types import GenerateRequest, GenerateResponse, InferenceEngine, SamplingParams
from searchgym.agents.formats import ChatTemplateDelta, ToolFormat
from searchgym.agents.trajectory import Trajectory, Turn
from searchgym.core.llm_calls import ChatModel
from searchgym.envs.search_env import SearchEnv

INFO_KEYS = (
    "tool",
    "query",
    "url",
    "hits",
    "page",
    "error",
    "format_errors",
    "evidence",
    "truncation",
    "simulated",
    "cost",
)


@dataclass(frozen=True)
class WorkflowSettings:
    """How episodes are generated, whatever plays them: sampling, context budget, observation role."""

    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_context: int = 32_768
    observation_role: str = "user"  # "user", "tool" (the template's tool role) or "inline" (Search-R1 style)
    context: ContextPolicy = field(default_factory=EndPolicy)  # what to do when the window fills (agents/context.py)
    max_segments: int = 64  # an episode needing more context segments ends truncated ("segment budget")
    # the system message of every episode; None: none, or formats.SEARCH_AGENT_SYSTEM where the chat template would
    # write a default of its own (a template's "You are SmolLM" never reaches the policy)
    system_prompt: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.context, ContextPolicy):
            raise TypeError(f"context must be a ContextPolicy (agents/context.py), got {type(self.context).__name__}")
        if self.max_segments < 1:
            raise ValueError(f"max_segments must be at least 1, got {self.max_segments}")


@dataclass
class Step:
    """What the env answered to one turn, as a workflow sees it before deciding how to continue."""

    observation: str
    reward: float
    done: bool
    info: dict[str, Any]


class Workflow:
    """The one workflow contract: `arun_episode(env, seed=, options=, rid=)` plays one episode and returns its
    Trajectory (the only thing trainers, evaluators and synthesis call), on an engine its caller owns.

    This base holds the shared mechanics (reset, step the env with a turn, record it, close the trajectory);
    subclasses implement `arun_episode`. Two hooks are for custom agents: `act` (what text of the model's
    turn goes to the env; default: all of it) and `observe` (what the model sees of the env's answer;
    default: the observation as it is). `from_handle` says how the class is built on an opened engine.
    """

    def __init__(self, settings: WorkflowSettings | None = None):
        self.settings = settings or WorkflowSettings()

    async def act(self, env: SearchEnv, traj: Trajectory, text: str) -> str:
        """The action sent to the env for the model's turn `text`."""
        return text

    async def observe(self, env: SearchEnv, traj: Trajectory, step: Step) -> str:
        """The text the model reads next, from the env's observation (e.g. a summary of a long page)."""
        return step.observation

    async def start_episode(
        self, env: SearchEnv, seed: int | None, options: dict[str, Any] | None
    ) -> tuple[str, Trajectory]:
        """Reset the env and open the trajectory with its first observation."""
        obs, info = await env.areset(seed=seed, options=options)
        return obs, Trajectory(task_id=info["task_id"], messages=[{"role": "user", "content": obs}])

    async def step_env(self, env: SearchEnv, traj: Trajectory, text: str, generate_seconds: float, **turn: Any) -> Step:
        """Step the env with the turn, record it, and close the trajectory if the episode ended."""
        action = await self.act(env, traj, text)
        traj.messages.append({"role": "assistant", "content": text})
        t0 = time.perf_counter()
        obs, reward, terminated, truncated, info = await env.astep(action)
        traj.turns.append(
            Turn(
                action=action,
                tool=info.get("tool", "invalid"),
                observation=obs,
                reward=reward,
                info={k: info[k] for k in INFO_KEYS if k in info},
                generate_seconds=generate_seconds,
                env_seconds=time.perf_counter() - t0,
                **turn,
            )
        )
        traj.reward += reward
        done = terminated or truncated
        if done:
            traj.terminated, traj.truncated = terminated, truncated
            traj.stop_reason = "answer" if terminated else info.get("truncation", "env budget")
            traj.verdict = info.get("verdict")
            traj.prediction = info.get("prediction")
        return Step(obs, reward, done, info)

    async def arun_episode(
        self, env: SearchEnv, *, seed: int | None = None, options: dict[str, Any] | None = None, rid: str | None = None
    ) -> Trajectory:
        raise NotImplementedError

    @classmethod
    def from_handle(cls, handle: EngineHandle, settings: WorkflowSettings) -> Workflow:
        """This workflow over an opened engine: token-level where the engine gives tokens, else chat."""
        if issubclass(cls, TokenWorkflow):
            if handle.engine is None:
                raise ValueError(
                    f"{cls.__name__} needs a token-level engine (a model dir or sglang:...); "
                    f"{handle.spec!r} is a chat endpoint"
                )
            return cls(handle.engine, handle.tokenizer, settings)
        if issubclass(cls, ChatWorkflow):
            return cls(handle.chat, settings)
        raise TypeError(f"{cls.__name__} is neither a TokenWorkflow nor a ChatWorkflow: override from_handle")


class TokenWorkflow(Workflow):
    """Token in, token out: exact ids, behaviour logprobs and weight versions for RL."""

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer: Any,
        settings: WorkflowSettings | None = None,
        *,
        template: ChatTemplateDelta | None = None,
    ):
        super().__init__(settings)
        self.engine, self.tokenizer = engine, tokenizer
        self.template = template or ChatTemplateDelta(
            tokenizer, self.settings.observation_role, self.settings.system_prompt
        )
        self.eos_ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()

    async def generate(self, traj: Trajectory, sampling: SamplingParams, rid: str) -> GenerateResponse:
        """The model's next turn from the whole token sequence so far (one engine call)."""
        return await self.engine.agenerate(GenerateRequest(list(traj.input_ids), sampling, rid))

    @property
    def max_context(self) -> int:
        """The context budget: the setting, or the engine's positions where fewer (beyond them it writes nothing)."""
        engine_context = getattr(self.engine, "max_context", None)
        if isinstance(engine_context, int) and engine_context > 0:
            return min(self.settings.max_context, engine_context)
        return self.settings.max_context

    async def arun_episode(
        self, env: SearchEnv, *, seed: int | None = None, options: dict[str, Any] | None = None, rid: str | None = None
    ) -> Trajectory:
        """Play one episode; stops on an answer, an env budget, or the context budget.

        With a managed context policy (`settings.context`), an observation that would leave no room for the next
        turn makes the policy rebuild the prompt, and the episode goes on in a new segment of the trajectory.
        """
        sampling = _with_stops(self.settings.sampling, env)
        if seed is not None and sampling.seed is None:  # the episode's tokens come from its seed, not arrival order
            sampling = dataclasses.replace(sampling, seed=seed)
        max_context, rid, policy = self.max_context, rid or uuid.uuid4().hex, self.settings.context
        obs, traj = await self.start_episode(env, seed, options)
        traj.extend(self.template.prompt_ids(obs), generated=False)
        traj.prompt_length = len(traj.input_ids)
        history = History(obs)
        # a managed context keeps every turn within a quarter of the window, so a segment always has room for it
        turn_tokens = min(sampling.max_new_tokens, max_context // 4) if policy.managed else sampling.max_new_tokens
        while True:
            budget = min(turn_tokens, max_context - len(traj.input_ids))
            if budget <= 0:
                traj.truncated, traj.stop_reason = True, "context budget"
                return traj
            t0 = time.perf_counter()
            response = await self.generate(traj, dataclasses.replace(sampling, max_new_tokens=budget), rid)
            seconds = time.perf_counter() - t0
            if not response.output_ids and response.finish_reason.type == "length":  # the engine's context is full
                traj.truncated, traj.stop_reason = True, "context budget"
                return traj
            traj.extend(response.output_ids, generated=True, logprobs=response.logprobs, versions=response.versions)
            if response.output_ids:
                traj.run_turns.append(len(traj.turns))  # the turn step_env is about to record
            step = await self.step_env(
                env,
                traj,
                self.turn_text(response.output_ids),
                seconds,
                generated_tokens=len(response.output_ids),
                finish_reason=response.finish_reason.type,
            )
            if step.done:
                return traj
            seen = await self.observe(env, traj, step)
            ended_with_eos = bool(response.output_ids) and response.output_ids[-1] in self.eos_ids
            delta = self.template.observation_ids(seen, ended_with_eos)
            traj.turns[-1].observation_tokens = len(delta)
            history.entries.append(
                Entry(list(response.output_ids), ended_with_eos, seen, stub_for(traj.turns[-1].tool, step.info))
            )
            role = self.settings.observation_role
            if not policy.managed:
                if len(traj.input_ids) + len(delta) >= max_context:
                    traj.truncated, traj.stop_reason = True, "context budget"
                    return traj
                traj.extend(delta, generated=False)
                traj.messages.append({"role": role if role != "inline" else "user", "content": seen})
                continue
            # keep room for the next turn and for the policy's own work (a summary) in every segment
            headroom = turn_tokens + policy.reserve(self)
            message = {"role": role if role != "inline" else "user", "content": seen}
            if len(traj.input_ids) + len(delta) + headroom <= max_context:
                traj.extend(delta, generated=False)
                traj.messages.append(message)
                continue
            if not await self.next_segment(traj, history, target=max_context - headroom, sampling=sampling, rid=rid):
                return traj
            traj.messages.append(message)  # the transcript: after a summary exchange, as the new segment shows it

    async def next_segment(
        self, traj: Trajectory, history: History, *, target: int, sampling: SamplingParams, rid: str
    ) -> bool:
        """Have the context policy rebuild the prompt (at most `target` tokens) and open a new segment from it;
        False when the episode ends instead (truncated: the segment budget is spent, or nothing fits)."""
        if traj.num_segments >= self.settings.max_segments:
            traj.truncated, traj.stop_reason = True, "segment budget"
            return False
        rebuilt = await self.settings.context.rebuild(self, traj, history, target=target, sampling=sampling, rid=rid)
        if rebuilt is None:
            traj.truncated, traj.stop_reason = True, "context budget"
            return False
        traj.context_events.append({"segment": traj.num_segments, "turn": len(traj.turns), **rebuilt.event})
        traj.start_segment(rebuilt.prompt_ids, rebuilt.end)
        return True

    def turn_text(self, output_ids: list[int]) -> str:
        """The turn as text, special tokens kept (so transcript and tokens agree), a final eos dropped."""
        ids = output_ids[:-1] if output_ids and output_ids[-1] in self.eos_ids else output_ids
        return self.tokenizer.decode(ids, skip_special_tokens=False)


class ChatWorkflow(Workflow):
    """Text in, text out through any chat model (an OpenAI-compatible endpoint or EngineChat)."""

    def __init__(self, chat: ChatModel, settings: WorkflowSettings | None = None):
        super().__init__(settings)
        self.chat = chat

    async def arun_episode(
        self, env: SearchEnv, *, seed: int | None = None, options: dict[str, Any] | None = None, rid: str | None = None
    ) -> Trajectory:
        """Play one episode with messages only; the endpoint drops the stop string, so it is put back."""
        fmt = ToolFormat.get(env.tool_format)
        sampling = self.settings.sampling
        obs, traj = await self.start_episode(env, seed, options)
        system = self.settings.system_prompt
        while True:
            t0 = time.perf_counter()
            text = await self.chat.achat(
                ([{"role": "system", "content": system}] if system is not None else []) + traj.messages,
                stop=list(fmt.stops),
                temperature=sampling.temperature,
                max_tokens=sampling.max_new_tokens,
            )
            step = await self.step_env(env, traj, close_stopped_call(text, fmt), time.perf_counter() - t0)
            if step.done:
                return traj
            traj.messages.append({"role": "user", "content": await self.observe(env, traj, step)})


def _with_stops(sampling: SamplingParams, env: SearchEnv) -> SamplingParams:
    """The sampling params plus the stop strings of the tool format the env teaches."""
    stops = ToolFormat.get(env.tool_format).stops
    return dataclasses.replace(sampling, stop=tuple(dict.fromkeys(sampling.stop + stops)))


def close_stopped_call(text: str, fmt: ToolFormat) -> str:
    """OpenAI-style endpoints drop the stop string; put back the closing tag of the call left open."""
    if any(text.rstrip().endswith(stop) for stop in fmt.stops):
        return text
    openings = {stop: text.rfind(stop.replace("</", "<", 1)) for stop in fmt.stops}
    stop, position = max(openings.items(), key=lambda kv: kv[1])
    if position >= 0 and stop not in text[position:]:
        return text + stop
    return text


# --- building workflows from specs ---------------------------------------------------------------


def load_object(path: str) -> Any:
    """`package.module:Name` or `path/to/file.py:Name` -> the object (for custom workflows in configs and CLIs)."""
    module_name, sep, name = path.rpartition(":")
    if not sep or not module_name or not name:
        raise ValueError(f"{path!r}: expected 'package.module:Name' or 'path/to/file.py:Name'")
    if module_name.endswith(".py"):
        file = Path(module_name)
        if not file.is_file():
            raise FileNotFoundError(f"{path!r}: no file {file}")
        key = f"searchgym_user_{abs(hash(str(file.resolve())))}"
        module = sys.modules.get(key)
        if module is None:
            spec = importlib.util.spec_from_file_location(key, file)
            if spec is None or spec.loader is None:
                raise ImportError(f"{path!r}: cannot load {file} as a module")
            module = importlib.util.module_from_spec(spec)
            sys.modules[key] = module
            spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    try:
        return getattr(module, name)
    except AttributeError:
        raise ValueError(f"{path!r}: module {module_name} has no {name!r}") from None


def workflow_class(workflow: str | type[Workflow] | None, handle: EngineHandle) -> type[Workflow]:
    """The class to build: the given one (or its import path), else token-level where tokens exist, else chat."""
    if workflow is None:
        return TokenWorkflow if handle.engine is not None else ChatWorkflow
    cls = load_object(workflow) if isinstance(workflow, str) else workflow
    if not (isinstance(cls, type) and issubclass(cls, Workflow)):
        raise TypeError(f"workflow {workflow!r} is not a searchgym.agents.workflow.Workflow subclass")
    return cls


def build_workflow(
    handle: EngineHandle, *, workflow: str | type[Workflow] | None = None, settings: WorkflowSettings | None = None
) -> Workflow:
    """The workflow over an engine the caller opened (and will close): `workflow` names a custom class, else
    token-level where the engine gives tokens, else chat.

    Every command (train, eval, synthesize, quickstart) builds its workflow here, so a custom class
    (`workflow="my_agents.py:SummarizingWorkflow"`) runs under all of them unchanged.
    """
    return workflow_class(workflow, handle).from_handle(handle, settings or WorkflowSettings())
