"""Scripted agents: the oracle's script as a workflow (demonstrations), and baselines that read only observations."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Generator, Sequence
from typing import Any, cast

from searchgym.agents.trajectory import Trajectory
from searchgym.agents.workflow import Workflow, WorkflowSettings
from searchgym.envs.search_env import SearchEnv
from searchgym.envs.tasks import Task
from searchgym.world.oracle import OracleAgent

ScriptFactory = Callable[[SearchEnv, Task], Generator[str, tuple[str, dict[str, Any]], "str | None"]]


class ScriptedWorkflow(Workflow):
    """Plays a scripted policy into a Trajectory (messages and turns; no tokens, nothing to train on directly).

    `script(env, task)` is a generator that yields each turn's action and is sent the env's
    (observation, info); its return value says why it stopped early (kept as `stop_reason`).
    """

    def __init__(self, script: ScriptFactory, settings: WorkflowSettings | None = None):
        super().__init__(settings)
        self.script = script

    async def arun_episode(
        self, env: SearchEnv, *, seed: int | None = None, options: dict[str, Any] | None = None, rid: str | None = None
    ) -> Trajectory:
        obs, traj = await self.start_episode(env, seed, options)
        script = self.script(env, cast(Task, env.task))  # start_episode reset it
        try:
            action = next(script)
            while True:
                step = await self.step_env(env, traj, action, 0.0)
                if step.done:
                    return traj
                traj.messages.append({"role": "user", "content": await self.observe(env, traj, step)})
                action = script.send((step.observation, step.info))
        except StopIteration as stop:
            traj.stop_reason = f"script: {stop.value}"
            return traj


class OracleWorkflow(ScriptedWorkflow):
    """The validation oracle as a workflow: it walks each task's known path with the env's tools."""

    def __init__(self, oracle: OracleAgent | None = None, settings: WorkflowSettings | None = None):
        self.oracle = oracle or OracleAgent()
        super().__init__(lambda env, task: self.oracle.script(task, env.max_page_chunks), settings)


async def demonstrations(
    env: SearchEnv,
    tasks: Sequence[Task] | None = None,
    *,
    workflow: Workflow | None = None,
    skim: bool = True,
    think: bool = False,
    question_query: bool = False,
    limit: int | None = None,
) -> list[list[dict[str, str]]]:
    """The solved episodes of `workflow` (default: the oracle, writing the env's tool format, playing min-calls
    questions by their path, never by a proof's answer-guessing witness) on `tasks` (default: the env's pool; played
    in order until `limit` are solved) as chats, for a supervised warm start."""
    workflow = workflow or OracleWorkflow(
        OracleAgent(
            skim=skim, think=think, question_query=question_query, tool_format=env.tool_format, replay_proofs=False
        )
    )
    chats = []
    for task in env.tasks if tasks is None else tasks:
        traj = await workflow.arun_episode(env, options={"task_id": task.id})
        if (traj.verdict or {}).get("correct"):
            chats.append(traj.messages)
            if limit is not None and len(chats) >= limit:
                break
    return chats


_FIRST_HIT = re.compile(r"\[Doc 1\]\((?P<url>[^)]*)\):\n(?P<title>[^\n]*)")


class SearchOnceAgent:
    """Searches the question once and answers with the top hit's title: the floor any learner should beat."""

    async def arun(self, env: SearchEnv, question: str) -> float:
        obs, *_ = await env.astep(f"<search>{question}</search>")
        match = _FIRST_HIT.search(obs)
        guess = match.group("title") if match else "unknown"
        _, reward, *_ = await env.astep(f"<answer>{guess}</answer>")
        return reward


class RandomAgent:
    """Seeded random tool use drawn from what it has read: searches words, opens seen urls, answers a word.

    A floor for learning curves, and a fuzzer of env episodes (it also writes malformed turns).
    """

    def __init__(self, seed: int = 0, max_turns: int = 16):
        self.rng = random.Random(seed)
        self.max_turns = max_turns

    async def arun(self, env: SearchEnv, obs: str) -> float:
        for _ in range(self.max_turns):
            obs, reward, terminated, truncated, _ = await env.astep(self.act(obs))
            if terminated or truncated:
                return reward
        return 0.0

    def act(self, obs: str) -> str:
        words = re.findall(r"[A-Z][a-z]+", obs) or ["river"]
        urls = re.findall(r"\]\((https?://[^)\s]+|doc://[^)\s]+)\)", obs)
        roll = self.rng.random()
        if roll < 0.45:
            return f"<search>{' '.join(self.rng.sample(words, min(2, len(words))))}</search>"
        if roll < 0.75 and urls:
            return f"<access>{self.rng.choice(urls)}</access>"
        if roll < 0.9:
            return f"<answer>{self.rng.choice(words)}</answer>"
        return self.rng.choice(["<search>unclosed", "", "<answer></answer>", "<think>only thinking</think>"])
