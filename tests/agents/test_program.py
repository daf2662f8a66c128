"""Agent programs (serve/program.py): an `async def agent(task, client)` played on a real env through the recording
proxy over a real tiny model; its tool calls reach the env, its answer is judged, its tokens are the engine's, and
the learner trains on them; `searchgym eval --agent` and `train rollout.agent=` run the example program."""

import asyncio
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from searchgym.agents.engines.torch_engine import TorchEngine
from searchgym.agents.engines.types import SamplingParams
from searchgym.agents.trajectory import Trajectory
from searchgym.agents.workflow import WorkflowSettings
from searchgym.envs.factory import make_unwrapped
from searchgym.serve.program import AgentProgramWorkflow, tool_argument
from searchgym.trainers.algorithm.learner import Learner, LearnerConfig
from tests.agents.test_proxy import LoggedEngine, check_against_engine
from tests.conftest import SMALL
from tests.stock_commands import eval_small, train_small

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent_program.py"
ENV = {**SMALL, "max_turns": 4, "top_k": 1, "doc_chars": 120}  # short search results: prompts fit the context


def scripted_agent(answers: dict[str, str], right: bool):
    """An agent that searches through `call_tool`, asks the model twice (the second call continuing the first), and
    answers right or wrong."""

    async def agent(task, client):
        found = await task.call_tool("search", json.dumps({"query": task.question}))
        assert "<information>" in found or "http" in found
        messages = [{"role": "user", "content": task.question}]
        first = await client.chat.completions.create(model=task.model, messages=messages, tools=task.tools)
        messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": found}]
        await client.chat.completions.create(model=task.model, messages=messages, tools=task.tools)
        await client.chat.completions.create(model=task.model, messages=messages, temperature=0.5)  # not trainable
        return answers[task.task_id] if right else "certainly not the answer"

    return agent


@pytest.mark.asyncio
async def test_an_agent_program_plays_the_env_and_the_learner_trains_its_tokens(tiny_model_dir, small_bundle):
    inner = TorchEngine(tiny_model_dir, seed=0)
    engine = LoggedEngine(inner)
    env = make_unwrapped("searchgym/SyntheticQA-v0", **ENV)
    answers = {task.id: task.answers[0] for task in env.tasks}
    settings = WorkflowSettings(SamplingParams(max_new_tokens=8, temperature=1.0), max_context=1024)
    try:
        group = []
        for right in (True, False):
            workflow = AgentProgramWorkflow(scripted_agent(answers, right), engine, inner.tokenizer, settings)
            group.append(await workflow.arun_episode(env, seed=3))
            assert workflow._proxy is None  # the proxy stops when its last episode ends
    finally:
        env.close()
        await inner.close()
    good, bad = group
    for traj in group:
        assert [turn.tool for turn in traj.turns] == ["search", "answer"] and traj.terminated, traj.stop_reason
        assert traj.stop_reason == "answer" and traj.verdict is not None
        assert [c["untrainable"] == "" for c in traj.proxy_calls] == [True, True, False]
        assert "temperature=0.5" in traj.proxy_calls[2]["untrainable"]
        assert check_against_engine(traj, engine.log) == 2  # the two trainable calls, linked or in two segments
        assert traj.run_turns and all(turn == 1 for turn in traj.live_run_turns())  # the calls came after the search
    assert good.prediction == answers[good.task_id] and good.reward == 1.0 and bad.reward == 0.0

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    learner = Learner(model, LearnerConfig(lr=1e-3))
    before = [p.detach().clone() for p in model.parameters()]
    stats = learner.step([group])
    assert stats["trained_tokens"] == sum(t.generated_tokens for t in group) > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.asyncio
async def test_a_failing_or_hanging_agent_ends_its_episode_truncated_and_tools_after_the_end_do_not_run(
    tiny_model_dir, small_bundle
):
    inner = TorchEngine(tiny_model_dir, seed=0)
    env = make_unwrapped("searchgym/SyntheticQA-v0", **{**ENV, "max_turns": 1})
    seen = []

    async def over_budget(task, client):
        seen.append(await task.call_tool("search", {"query": task.question}))
        seen.append(await task.call_tool("search", {"query": "again"}))
        return "x"

    async def broken(task, client):
        raise KeyError("oops")

    async def hangs(task, client):
        await asyncio.Event().wait()

    try:
        settings = WorkflowSettings(SamplingParams(max_new_tokens=4))
        traj = await AgentProgramWorkflow(over_budget, inner, inner.tokenizer, settings).arun_episode(env, seed=0)
        assert traj.truncated and len(traj.turns) == 1 and "episode is over" in seen[1]
        failed = await AgentProgramWorkflow(broken, inner, inner.tokenizer, settings).arun_episode(env, seed=0)
        assert failed.truncated and failed.stop_reason == "agent error: KeyError: 'oops'" and not failed.turns
        stuck = AgentProgramWorkflow(hangs, inner, inner.tokenizer, settings, episode_timeout=0.5)
        late = await stuck.arun_episode(env, seed=0)
        assert late.truncated and late.stop_reason.startswith("agent timeout") and stuck._proxy is None
    finally:
        env.close()
        await inner.close()


@pytest.mark.asyncio
@pytest.mark.timeout(30)  # on main the old wait_for waited for the agent forever
async def test_an_agent_that_swallows_cancellation_is_abandoned_in_time_and_its_late_answer_never_judged(
    tiny_model_dir, small_bundle
):
    """An agent that catches CancelledError in a loop is abandoned within 2x `episode_timeout`: the episode ends
    truncated, its late `answer` call is refused and its late return value is not judged; `raise SystemExit(3)`
    inside an agent ends the episode truncated, not the run."""
    inner = TorchEngine(tiny_model_dir, seed=0)
    env = make_unwrapped("searchgym/SyntheticQA-v0", **ENV)
    answers = {task.id: task.answers[0] for task in env.tasks}
    stop, late = asyncio.Event(), []
    started: list[float] = []

    async def stubborn(task, client):
        started.append(asyncio.get_running_loop().time())
        while not stop.is_set():
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                late.append(await task.call_tool("answer", {"answer": answers[task.task_id]}))
        return answers[task.task_id]

    async def exits(task, client):
        raise SystemExit(3)

    try:
        settings = WorkflowSettings(SamplingParams(max_new_tokens=4))
        workflow = AgentProgramWorkflow(stubborn, inner, inner.tokenizer, settings, episode_timeout=1.0)
        traj = await workflow.arun_episode(env, seed=0)
        elapsed = asyncio.get_running_loop().time() - started[0]
        assert elapsed < 2 * 1.0, elapsed  # stopped at 1.5x, the episode's teardown included
        assert traj.truncated and not traj.terminated and traj.stop_reason.startswith("agent timeout")
        assert traj.verdict is None and traj.reward == 0.0 and not traj.turns
        assert late and all("episode is over" in text for text in late) and workflow._proxy is None
        assert workflow.abandoned == 1  # still running: it ignores cancellation
        stop.set()
        await asyncio.sleep(0.1)
        assert workflow.abandoned == 0

        failed = await AgentProgramWorkflow(exits, inner, inner.tokenizer, settings).arun_episode(env, seed=0)
        assert failed.truncated and failed.stop_reason == "agent error: SystemExit: 3" and not failed.turns
        for bad in (0, -1.0, float("nan"), float("inf"), True, "60"):
            with pytest.raises(ValueError, match="episode_timeout must be a number of seconds"):
                AgentProgramWorkflow(exits, inner, inner.tokenizer, settings, episode_timeout=bad)
    finally:
        stop.set()
        env.close()
        await inner.close()


def test_tool_arguments_are_read_as_the_model_wrote_them():
    assert tool_argument("search", '{"query": "Aldra"}') == "Aldra"
    assert tool_argument("search", {"q": "Aldra"}) == "Aldra"
    assert tool_argument("access", '{"link": "http://x"}') == "http://x"
    assert tool_argument("search", "plain text") == "plain text"
    assert tool_argument("search", '{"other": "v"}') == "v"
    assert json.loads(tool_argument("search", '{"a": 1, "b": 2}')) == {"a": 1, "b": 2}


def test_eval_and_train_run_the_example_agent_program(tiny_model_dir, small_bundle, tmp_path):
    """`searchgym eval --agent examples/agent_program.py:agent` gives Avg@k; `train rollout.agent=` trains its
    tokens."""

    agent = f"{EXAMPLE}:agent"
    out = tmp_path / "eval"
    rows = eval_small(tiny_model_dir, out, "--agent", agent, k=2)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metrics"]["samples"] == 4 and "avg@2" in json.dumps(summary).lower()
    assert all(row["trajectory"]["proxy_calls"] and row["trajectory"]["input_ids"] for row in rows)

    trained = train_small(tiny_model_dir, tmp_path / "run", f"rollout.agent={agent}")
    assert len(trained) == 2 * 2 * 2 and all(t.proxy_calls and t.generated_tokens > 0 for t in trained)
    assert all(t.stop_reason for t in trained)
    assert (tmp_path / "run" / "checkpoints" / "step-00002").is_dir()
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    metrics = [m for m in metrics if "trained_tokens" in m]
    assert sum(m["trained_tokens"] for m in metrics) == sum(t.generated_tokens for t in trained)
    # the learner's own log-probs of the proxy's tokens are the behaviour ones: no token was re-tokenized
    assert all(abs(m["behav_weight_mean"] - 1.0) < 1e-2 for m in metrics)


def test_agent_settings_are_refused_when_given_naming_the_setting(tiny_model_dir, tmp_path, capsys):
    from searchgym.cli import main as cli_main
    from searchgym.trainers.config import load_config

    base = ["eval", "--env", "searchgym/SyntheticQA-v0", "--engine", str(tiny_model_dir), "--out", str(tmp_path)]
    assert cli_main([*base, "--agent", f"{EXAMPLE}:agent", "--workflow", "x.py:W"]) == 2
    assert "--agent and --workflow" in capsys.readouterr().err
    assert cli_main([*base, "--agent", "searchgym.agents.workflow:TokenWorkflow"]) == 2
    assert "a Workflow class goes to --workflow" in capsys.readouterr().err
    base[base.index("--engine") + 1] = "openai:http://127.0.0.1:9/v1"
    assert cli_main([*base, "--agent", f"{EXAMPLE}:agent"]) == 2
    assert "token-level engine" in capsys.readouterr().err and not any(tmp_path.iterdir())
    with pytest.raises(ValueError, match="rollout.agent and rollout.workflow"):
        load_config(None, ["rollout.agent=a.py:agent", "rollout.workflow=b.py:W"])
    with pytest.raises(ValueError, match="rollout.agent must be"):
        load_config(None, ["rollout.agent=agent"])
    assert load_config(None, [f"rollout.agent={EXAMPLE}:agent"]).rollout.agent == f"{EXAMPLE}:agent"


def test_an_openai_agents_sdk_agent_is_evaluated_through_the_proxy_unmodified(tiny_model_dir, tmp_path):
    """An agent written with the OpenAI Agents SDK (its Agent, function_tool and Runner) plays through the proxy:
    every model call it makes is recorded token-exact in the episode's trajectory."""
    pytest.importorskip("agents")

    example = Path(__file__).resolve().parents[2] / "examples" / "openai_agents_program.py"
    rows = eval_small(tiny_model_dir, tmp_path / "eval", "--agent", f"{example}:agent")
    assert len(rows) == 2
    for row in rows:
        traj = Trajectory.from_dict(row["trajectory"])
        assert traj.proxy_calls and traj.generated_tokens > 0  # the SDK's calls went through the recording proxy
        assert sum(traj.loss_mask) == traj.generated_tokens  # only the model's own tokens are trainable


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_an_agent_past_its_deadline_gets_no_tool_over_mcp_either(tiny_model_dir, small_bundle):
    """The deadline shuts the episode's MCP tools too: an agent that swallows its cancellation and then answers
    over its open MCP session is told the episode is over, and nothing it says is judged."""
    pytest.importorskip("mcp")
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    inner = TorchEngine(tiny_model_dir, seed=0)
    env = make_unwrapped("searchgym/SyntheticQA-v0", **ENV)
    answers = {task.id: task.answers[0] for task in env.tasks}
    late: list[str] = []

    async def over_mcp(task, client):
        async with streamable_http_client(task.mcp_url) as (read, write, _), ClientSession(read, write) as session:
            await session.initialize()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                result = await session.call_tool("answer", {"answer": answers[task.task_id]})
                late.append(result.content[0].text)
        return answers[task.task_id]

    try:
        settings = WorkflowSettings(SamplingParams(max_new_tokens=4))
        workflow = AgentProgramWorkflow(over_mcp, inner, inner.tokenizer, settings, episode_timeout=1.0)
        traj = await workflow.arun_episode(env, seed=0)
        assert traj.truncated and traj.stop_reason.startswith("agent timeout") and traj.verdict is None
        assert late == ["The episode is over (agent timeout); no more tools run. Return your final answer."]
        assert not traj.turns and workflow.abandoned == 0
    finally:
        env.close()
        await inner.close()
