"""verifiers 0.4 (`searchgym.integrations.verifiers`): `vf-eval` plays a searchgym env against `searchgym serve model`.

verifiers 0.4 needs mcp 2 and OpenEnv mcp<2, so these tests run only in a venv of their own (`.ci/run` makes
one); elsewhere they are skipped. The end-to-end test runs verifiers' own CLI, offline, on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

vf = pytest.importorskip("verifiers.v1", reason="verifiers 0.4 lives in its own venv (.ci/run)")

import gymnasium as gym  # noqa: E402
from pydantic import ValidationError  # noqa: E402
from verifiers.v1.agent import Segment  # noqa: E402
from verifiers.v1.trace import AgentInfo, Trace, TraceTask  # noqa: E402
from verifiers.v1.types import AssistantMessage  # noqa: E402

from searchgym.integrations.verifiers import (  # noqa: E402
    SearchGymTaskset,
    SearchGymTasksetConfig,
    SearchGymVfEnv,
    SearchGymVfEnvConfig,
)
from tests.conftest import WARM_ENV, WARM_TASKS  # noqa: E402
from tests.integrations.conftest import ENV_KWARGS, BrokenJudge, free_port, wait_until  # noqa: E402

ENV_ID = "searchgym/SyntheticQA-v0"
TASKSET = "searchgym_verifiers"  # the plugin id vf-eval resolves (a top-level module re-exporting the adapter)


# --- the env's episode loop, with a scripted agent (no model) --------------------------------------------------


class ScriptedInteraction:
    """verifiers' `Interaction` surface with canned replies: each turn answers the next reply; a real `Trace`."""

    def __init__(self, task, replies: list[str]) -> None:
        self.replies, self.seen = list(replies), []
        self.trace = Trace(
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key),
            agent=AgentInfo(config=vf.AgentConfig()),
        )

    async def turn(self, message: str | None = None) -> Segment:
        self.seen.append(message)
        if not self.replies:
            return Segment(messages=[], terminated=True)
        return Segment(messages=[AssistantMessage(content=self.replies.pop(0))])


class ScriptedAgents:
    """`agents.agent.interaction(task)` handing out one `ScriptedInteraction`."""

    def __init__(self, replies: list[str]) -> None:
        self.replies, self.last = replies, None
        self.agent = self

    @contextlib.asynccontextmanager
    async def interaction(self, task):
        self.last = ScriptedInteraction(task, self.replies)
        yield self.last


def vf_env(**env_kwargs) -> SearchGymVfEnv:
    taskset = SearchGymTasksetConfig(id=TASKSET, env_id=ENV_ID, env_kwargs=env_kwargs)
    return SearchGymVfEnv(SearchGymVfEnvConfig(taskset=taskset))


def play(env: SearchGymVfEnv, replies: list[str], index: int = 0):
    """One episode of the env on its `index`-th task with `replies`; the trace and the task."""
    task = list(env.taskset.take(index + 1))[index]
    agents = ScriptedAgents(replies)
    asyncio.run(env.run(task, agents))
    return agents.last, task


def test_tasks_are_the_env_pool_with_its_opening_observation():
    taskset = SearchGymTaskset(SearchGymTasksetConfig(id=TASKSET, env_id=ENV_ID, env_kwargs=ENV_KWARGS))
    tasks = list(taskset.take(3))
    env = gym.make(ENV_ID, **ENV_KWARGS).unwrapped
    pool = list(env.tasks)[:3]
    assert [t.data.id for t in tasks] == [t.id for t in pool]
    assert [t.data.question for t in tasks] == [t.question for t in pool]
    assert tasks[1].data.prompt == env.reset(options={"task_id": pool[1].id})[0]
    assert tasks[1].key == f"{ENV_ID}:{pool[1].id}"


def test_reward_is_the_judges_verdict_and_observations_are_the_users_turns():
    env = vf_env(**ENV_KWARGS)
    task = list(env.taskset.take(1))[0]
    right = gym.make(ENV_ID, **ENV_KWARGS).unwrapped.tasks.by_id(task.data.id).answers[0]
    interaction, _ = play(env, ["<search>anything</search>", f"<answer>{right}</answer>"])
    assert not interaction.trace.errors and interaction.trace.rewards["judge"].score == 1.0
    assert interaction.seen[0] is None and "<information>" in interaction.seen[1]  # the search result came back
    interaction, _ = play(env, ["<answer>certainly not the answer</answer>"])
    assert interaction.trace.rewards["judge"].score == 0.0 and not interaction.trace.errors
    interaction, _ = play(env, ["no tool call at all"])  # the agent stopped without answering: the env's 0
    assert interaction.trace.rewards["judge"].score == 0.0 and interaction.trace.info["searchgym_steps"] == 1


def test_a_judge_failure_is_an_error_on_the_rollout_not_a_zero():
    interaction, _ = play(vf_env(**ENV_KWARGS, judge=BrokenJudge()), ["<answer>anything</answer>"])
    trace = interaction.trace
    assert not trace.ok
    assert trace.errors[-1].type == "JudgeFailed" and "timed out" in trace.errors[-1].message
    assert trace.rewards["judge"] is None  # unscored, not 0
    assert trace.info["judge_error"] == "judge endpoint timed out"


def test_env_kwargs_are_checked_when_configured_naming_the_key():
    with pytest.raises(ValidationError, match="sise"):
        SearchGymTasksetConfig(id=TASKSET, env_kwargs={"sise": 1000})
    with pytest.raises(ValidationError, match="env_id"):
        SearchGymTasksetConfig(id=TASKSET, env_id="searchgym/NoSuch-v0")


def test_the_plugin_id_resolves_to_the_adapters_taskset_env_and_harness():
    from verifiers.v1.utils.loaders import default_harness_id, environment_class, harness_class, taskset_class

    from searchgym.integrations.verifiers import OfflineChatHarness

    assert taskset_class(TASKSET) is SearchGymTaskset and environment_class(TASKSET) is SearchGymVfEnv
    assert default_harness_id(TASKSET) == TASKSET and harness_class(TASKSET) is OfflineChatHarness


# --- vf-eval against `searchgym serve model`, on loopback ----------------------------------------------------------


@pytest.fixture(scope="module")
def served_model(answering_model_dir):
    """`searchgym serve model` over the warm-started tiny model (it searches, then answers), on 127.0.0.1."""
    port = free_port()
    log = open(answering_model_dir / "serve.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "searchgym.cli",
            "serve",
            "model",
            "--model",
            str(answering_model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-reply-tokens",
            "48",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )

    def up() -> bool:
        assert proc.poll() is None, (answering_model_dir / "serve.log").read_text()[-3000:]
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200
        except OSError:
            return False

    try:
        wait_until(up, "serve model", limit=120)
        yield f"http://127.0.0.1:{port}/v1", str(answering_model_dir)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:  # a starved box (CI beside a training run) can miss the grace: kill it
            proc.kill()
            proc.wait(timeout=60)
        log.close()


def replay(env_kwargs: dict, task_id: str, replies: list[str]) -> tuple[float, int]:
    """The env's own reward for `replies` played on `task_id` (its verdict on the recorded answer), and the steps."""
    env = gym.make(ENV_ID, **env_kwargs)
    env.reset(options={"task_id": task_id})
    reward, steps = 0.0, 0
    for reply in replies:
        _, reward, terminated, truncated, _ = env.step(reply)
        steps += 1
        if terminated or truncated:
            break
    env.close()
    return reward, steps


def test_vf_eval_completes_rollouts_against_serve_model_with_the_judges_rewards(served_model, tmp_path):
    base_url, model = served_model
    env_kwargs = {**WARM_ENV, "tool_format": "tags"}  # the tasks the model was warm-started on
    out = tmp_path / "vf-out"
    command = [
        str(Path(sys.executable).parent / "vf-eval"),
        TASKSET,
        "-m",
        model,
        "--client.base-url",
        base_url,
        "--client.api-key-var",
        "SEARCHGYM_VF_KEY",
        "--no-push",
        "-o",
        str(out),
        "-n",
        str(WARM_TASKS),
        "-r",
        "1",
        "-c",
        "4",
        "--sampling.temperature",
        "0",
        "--sampling.max-tokens",
        "24",
        "--env.agent.runtime.type",
        "subprocess",
        "--env.taskset.env-kwargs",
        json.dumps(env_kwargs),
    ]
    offline = {"HF_HUB_OFFLINE": "1", "NO_PROXY": "127.0.0.1,localhost", "SEARCHGYM_VF_KEY": "unused"}
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**os.environ, **offline}
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    [traces_file] = out.glob("*/traces.jsonl")
    episodes = [json.loads(line) for line in traces_file.read_text().splitlines()]
    assert len(episodes) == WARM_TASKS
    rewards = []
    for episode in episodes:
        assert episode["ok"] and not episode["errors"], episode["errors"]
        [trace] = episode["traces"]
        replies = [n["message"]["content"] for n in trace["nodes"] if n["message"]["role"] == "assistant"]
        assert replies, "the model was never asked"
        reward, steps = replay(env_kwargs, episode["task"]["data"]["id"], replies)
        assert trace["rewards"]["judge"]["score"] == reward  # the env judge's verdict, through verifiers
        assert trace["info"]["searchgym_steps"] == steps
        assert reward == 0.0 or trace["info"]["answer"]  # a judged answer is recorded with its verdict
        rewards.append(reward)
    assert max(rewards) == 1.0, rewards  # the warm-started model answers some right: a verdict, not a constant


def test_the_offline_harness_refuses_a_runtime_other_than_this_machines():
    from verifiers.v1.harnesses.null import NullHarnessConfig

    from searchgym.integrations.verifiers import OfflineChatHarness

    harness = OfflineChatHarness(NullHarnessConfig(id=TASKSET))
    with pytest.raises(vf.HarnessError, match="subprocess runtime"):
        asyncio.run(harness.setup(object()))
