"""verifiers 0.4: any searchgym env id as a verifiers taskset, its env and an offline harness (`vf-eval`, prime-rl).

verifiers 0.4 (`verifiers.v1`) finds a taskset by a top-level module name, so `vf-eval searchgym_verifiers` (or
`--env.taskset.id searchgym_verifiers`) imports `searchgym_verifiers`, which re-exports this module, and takes the
one `Taskset`, `Env` and `Harness` subclass each that its `__all__` lists.

- `SearchGymTaskset`: one task per task of the env's pool (`id` = the searchgym task id, `question`, and the
  env's opening observation as the prompt). Its config is `env_id` and `env_kwargs`
  (`--env.taskset.env-id`, `--env.taskset.env-kwargs '{"size": 1000}'`), checked by name and type when given.
- `SearchGymVfEnv`: each episode plays a `gym.make(env_id, **env_kwargs)` env in process, as TextArena's
  taskset does: each model reply is the env's action (the tools `search`, `access`, `answer`, written as the
  env's instructions teach, e.g. Hermes `<tool_call>` blocks), each observation the next user turn. The
  reward `judge` is the env judge's verdict (0 without an answer). A judge failure is an error the rollout
  carries (`trace.errors`, `ok` false, reward `judge` null), never a 0.
- `OfflineChatHarness`: verifiers' `null` chat program run with this venv's own Python, not `uv` (which
  fetches the program's packages from the network); verifiers' own dependencies are the program's. It runs in
  the local `subprocess` runtime only.

Needs `pip install 'searchgym[verifiers]'` in a venv of its own (verifiers 0.4 needs mcp 2, OpenEnv mcp<2).
Tested with verifiers 0.4.0.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
from pydantic import Field, model_validator

import searchgym  # noqa: F401 - registers the env ids
from searchgym.core.extras import needs
from searchgym.envs.env_ids import SYNTHETIC_QA
from searchgym.envs.env_kwargs import check_env_kwargs
from searchgym.envs.factory import make_unwrapped
from searchgym.envs.rewards import JudgeFailed, episode_reward, judge_error

with needs("searchgym.integrations.verifiers"):
    import verifiers.v1 as vf
    from verifiers.v1.harnesses.null import NullHarness
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

__all__ = [
    "JudgeFailed",
    "OfflineChatHarness",
    "SearchGymTaskset",
    "SearchGymTasksetConfig",
    "SearchGymVfEnv",
    "SearchGymVfEnvConfig",
    "score_episode",
]

REWARD = "judge"  # the trace's reward key: the env judge's verdict


class SearchGymTasksetConfig(vf.TasksetConfig):
    """Which searchgym env the tasks come from: its registered id and its kwargs (checked when given)."""

    env_id: str = SYNTHETIC_QA
    env_kwargs: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_env(self) -> SearchGymTasksetConfig:
        if self.env_id not in gym.registry:
            raise ValueError(
                f"env_id: unknown env id {self.env_id!r}; registered searchgym ids: "
                f"{sorted(i for i in gym.registry if i.startswith('searchgym/'))}"
            )
        check_env_kwargs(self.env_id, self.env_kwargs)  # a misspelt kwarg fails here, naming it
        return self


class SearchGymTaskData(vf.TaskData):
    """A searchgym task: `id` is its task id, `prompt` the env's opening observation (question and instructions)."""

    question: str
    env_id: str


class SearchGymTask(vf.Task[SearchGymTaskData, vf.State, vf.TaskConfig]):
    """One searchgym task; its key is the env id and task id (stable across runs and load orders)."""

    @property
    def key(self) -> str:
        return f"{self.data.env_id}:{self.data.id}"


class SearchGymTaskset(vf.Taskset[SearchGymTask, SearchGymTasksetConfig]):
    """The env's task pool as verifiers tasks, in pool order (loaded lazily: `--select.limit` reads only those)."""

    def load(self) -> Iterator[SearchGymTask]:
        env = make_unwrapped(self.config.env_id, **self.config.env_kwargs)
        try:
            for task in env.tasks:
                opening, _ = env.reset(options={"task_id": task.id})
                data = SearchGymTaskData(
                    id=task.id, name=task.id, question=task.question, prompt=opening, env_id=self.config.env_id
                )
                yield SearchGymTask(data, self.config.task)
        finally:
            env.close()


def score_episode(trace: Any, step_infos: list[dict[str, Any]]) -> float:
    """Record the env judge's verdict on `trace` as reward `judge`; raise `JudgeFailed` if the judge failed."""
    trace.info["searchgym_steps"] = len(step_infos)
    error = judge_error(step_infos)
    if error is not None:
        trace.rewards[REWARD] = None  # the signal that should have run, unscored
        trace.info["judge_error"] = error
        raise JudgeFailed(f"the env's judge could not score the answer: {error}")
    reward = episode_reward(step_infos)
    assert reward is not None  # None only on a judge error
    trace.record_reward(REWARD, reward)
    answers = [i["prediction"] for i in step_infos if "prediction" in i]
    if answers:
        trace.info["answer"] = answers[-1]  # what the judge scored
    return reward


class SearchGymVfEnvConfig(vf.EnvConfig):
    """The one seat, `agent` (`--env.agent.*`), as verifiers' single-agent env names it."""

    agent: vf.AgentConfig = vf.AgentConfig()


class SearchGymVfEnv(vf.Env[SearchGymVfEnvConfig]):
    """Each episode: the searchgym env steps host-side, in process, as the run's user; the model's replies are
    actions."""

    def __init__(self, config: SearchGymVfEnvConfig) -> None:
        super().__init__(config)
        self._idle: list[gym.Env] = []  # built envs between episodes (building one loads the world)

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        env = self._idle.pop() if self._idle else await asyncio.to_thread(self._make)
        try:
            await self._play(env, task, agents)
        finally:
            self._idle.append(env)

    def _make(self) -> gym.Env:
        config = self.taskset.config
        return gym.make(config.env_id, **config.env_kwargs)

    async def _play(self, env: gym.Env, task: vf.Task, agents: vf.Agents) -> None:
        """One episode on `task`: a reply per turn until the env ends it or the agent stops; then the verdict."""
        await asyncio.to_thread(env.reset, options={"task_id": task.data.id})
        infos: list[dict[str, Any]] = []
        async with agents.agent.interaction(task) as interaction:
            segment = await interaction.turn()  # the task's prompt is the env's opening observation
            while not segment.terminated:
                obs, _reward, terminated, truncated, info = await asyncio.to_thread(env.step, segment.last_reply)
                infos.append(info)
                if terminated or truncated:
                    break
                segment = await interaction.turn(obs)
        trace = interaction.trace
        try:
            score_episode(trace, infos)
        except JudgeFailed as e:
            trace.record_error(e)

    async def stop(self) -> None:
        while self._idle:
            await asyncio.to_thread(self._idle.pop().close)  # a searchgym env closes its own loop: not on this one


class OfflineChatHarness(NullHarness):
    """verifiers' tool-less chat program (`null`) run with `sys.executable` instead of `uv`: no network, no `uv`."""

    async def setup(self, runtime: Any) -> None:
        _check_local(runtime)

    async def launch(self, ctx: Any, trace: Any, runtime: Any, *args: Any, **kwargs: Any) -> Any:
        _check_local(runtime)
        return await super().launch(ctx, trace, _ThisPython(runtime), *args, **kwargs)


def _check_local(runtime: Any) -> None:
    """This venv's Python exists only on this machine: refuse a container or remote runtime."""
    if not isinstance(runtime, SubprocessRuntime):
        raise vf.HarnessError(
            f"the offline harness runs this venv's Python ({sys.executable}), so it needs the "
            f"subprocess runtime, not {type(runtime).__name__}; use verifiers' `null` harness there"
        )


class _ThisPython:
    """The runtime, except that a PEP 723 script runs with this Python (the chat program's packages are
    verifiers' own dependencies, installed here) instead of an environment `uv` builds from the network."""

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    async def prepare_uv_script(
        self, script: str | bytes, env: dict[str, str] | None = None, *, activate: bool = True
    ) -> list[str]:
        data = script.encode() if isinstance(script, str) else script
        name = f".searchgym-vf-chat-{hashlib.sha256(data).hexdigest()[:16]}.py"
        await self._runtime.write(name, data)
        return [sys.executable, str(self._runtime.workdir / name)]
