"""An agent program that reaches its tools over MCP (serve/mcp_endpoint.py, examples/mcp_agent_program.py): the
official `mcp` client on `task.mcp_url`, the official `openai` client on the recording proxy, a real tiny model made
to write the tool calls; the calls reach the env being played, its verdict is the reward, and every trained token is
the engine's."""

import importlib.util
import json
from pathlib import Path

import pytest

from searchgym.agents.engines.torch_engine import TorchEngine
from searchgym.agents.engines.types import SamplingParams
from searchgym.agents.workflow import WorkflowSettings
from searchgym.envs.factory import make_unwrapped
from searchgym.serve.program import AgentProgramWorkflow
from tests.agents.forced_engine import ForcedEngine
from tests.conftest import SMALL
from tests.stock_commands import eval_small, train_small

pytest.importorskip("mcp")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mcp_agent_program.py"
ENV = {**SMALL, "max_turns": 4, "top_k": 1, "doc_chars": 120}


def load_example():
    spec = importlib.util.spec_from_file_location("mcp_agent_program", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tool_call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.mark.asyncio
async def test_the_example_agent_searches_and_answers_over_mcp_and_is_judged_and_recorded(tiny_model_dir):
    env = make_unwrapped("searchgym/SyntheticQA-v0", **ENV)
    inner = TorchEngine(tiny_model_dir, seed=0)
    task = env.tasks[3]
    gold = task.answers[0]
    turns: dict[str, int] = {}

    def script(rid: str, input_ids: list[int]) -> tuple[str, bool]:
        turns[rid] = turns.get(rid, 0) + 1
        if turns[rid] == 1:
            return tool_call("search", query=task.question), True
        return tool_call("answer", answer=gold), True

    forced = ForcedEngine(inner, inner.tokenizer, script)
    settings = WorkflowSettings(SamplingParams(max_new_tokens=96, temperature=1.0), max_context=4096)
    seen = {}

    async def agent(t, client):  # the example, plus a look at the endpoint it was given
        seen["url"] = t.mcp_url
        return await load_example().agent(t, client)

    workflow = AgentProgramWorkflow(agent, forced, inner.tokenizer, settings)
    try:
        traj = await workflow.arun_episode(env, options={"task_id": task.id})
        assert workflow._proxy is None and workflow._tool_server is None  # both stop with the last episode
    finally:
        env.close()
        await inner.close()
    assert [turn.tool for turn in traj.turns] == ["search", "answer"], traj.stop_reason
    assert traj.terminated and traj.reward == 1.0 and traj.prediction == gold
    assert seen["url"].startswith("http://127.0.0.1:") and seen["url"].endswith("/mcp")
    trainable = [c for c in traj.proxy_calls if not c["untrainable"]]
    assert len(trainable) == 2
    # every trained token is one the engine produced, with its log-prob
    produced = [(c.response.output_ids[0], c.response.logprobs[0]) for c in forced.calls]
    trained = [
        (token, logprob)
        for segment in traj.token_segments()
        for token, mask, logprob in zip(segment.input_ids, segment.loss_mask, segment.logprobs, strict=True)
        if mask
    ]
    assert trained == produced


@pytest.mark.asyncio
async def test_the_episode_endpoint_checks_arguments_and_serves_only_a_running_episode(tiny_model_dir):
    import asyncio

    import aiohttp
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    env, other_env = (make_unwrapped("searchgym/SyntheticQA-v0", **ENV) for _ in range(2))
    inner = TorchEngine(tiny_model_dir, seed=0)
    found = {}
    other_done = asyncio.Event()

    async def agent(t, client):
        if "first" in found:  # the other episode: it gives its endpoint and ends
            found["other"] = t.mcp_url
            return "x"
        found["first"] = t.mcp_url
        async with streamable_http_client(t.mcp_url) as (read, write, _), ClientSession(read, write) as session:
            await session.initialize()
            found["tools"] = {tool.name: tool.inputSchema for tool in (await session.list_tools()).tools}
            found["junk"] = await session.call_tool("search", {"query": 7})
            found["extra"] = await session.call_tool("access", {"url": "x", "more": 1})
            found["unknown"] = await session.call_tool("start", {})
            found["search"] = await session.call_tool("search", {"query": t.question})
        await other_done.wait()  # the other episode ended while this one runs: its path is gone
        async with aiohttp.ClientSession() as http, http.post(found["other"], json={}) as resp:
            found["ended"] = resp.status
        return "not the answer"

    settings = WorkflowSettings(SamplingParams(max_new_tokens=4))
    workflow = AgentProgramWorkflow(agent, inner, inner.tokenizer, settings)

    async def play_other():
        while "first" not in found:
            await asyncio.sleep(0.01)
        try:
            return await workflow.arun_episode(other_env, seed=2)  # same workflow: the same endpoint server
        finally:
            other_done.set()

    try:
        traj, other_traj = await asyncio.gather(workflow.arun_episode(env, seed=1), play_other())
    finally:
        env.close()
        other_env.close()
        await inner.close()
    assert found["ended"] == 404 and found["other"] != found["first"] and other_traj.prediction == "x"
    assert set(found["tools"]) == {"search", "access", "answer"}
    assert found["tools"]["search"]["required"] == ["query"]
    assert found["junk"].isError and "query must be a string" in found["junk"].content[0].text
    assert found["extra"].isError and "no argument 'more'" in found["extra"].content[0].text
    assert found["unknown"].isError and "unknown tool 'start'" in found["unknown"].content[0].text
    assert not found["search"].isError and "<information>" in found["search"].content[0].text
    assert [turn.tool for turn in traj.turns] == ["search", "answer"] and traj.reward == 0.0


def test_searchgym_eval_and_train_run_the_mcp_agent_program_whose_model_calls_the_mcp_tools(tiny_model_dir, tmp_path):
    """`searchgym eval --agent examples/mcp_agent_program.py:agent`, on a tiny model taught to open each of the
    eval's questions with a `search` tool call: every sample's first turn is that search, run through the MCP
    endpoint by the official client, and the proxy recorded the model's calls; the summary has Avg@k. Then
    `searchgym train rollout.agent=` trains the same program for a step on the tokens the proxy recorded."""
    from transformers import AutoTokenizer

    from searchgym.agents.mcp_tools import DESCRIPTIONS, ENV_TOOLS, input_schema
    from tests.agents.tool_model import teach_replies

    env_kwargs = {**ENV, "split": "test", "max_turns": 3}
    probe = make_unwrapped("searchgym/SyntheticQA-v0", **env_kwargs)
    questions = [task.question for task in list(probe.tasks)[:2]]
    probe.close()
    tools = [
        {"type": "function", "function": {"name": n, "description": DESCRIPTIONS[n], "parameters": input_schema(n, 1)}}
        for n in ENV_TOOLS
    ]  # what the example offers the model: the MCP server's list, passed through
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    pairs = [
        (
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}],
                tools=tools,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            ),
            tool_call("search", query=q),
        )
        for q in questions
    ]
    model_dir = teach_replies(tiny_model_dir, tmp_path / "model", pairs, max_steps=120)
    out = tmp_path / "eval"
    flags = ["--temperature", "0", "--max-new-tokens", "160", "--agent", f"{EXAMPLE}:agent"]
    rows = [row["trajectory"] for row in eval_small(model_dir, out, *flags, env_kwargs=env_kwargs, k=2)]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metrics"]["samples"] == 4 and "avg@2" in json.dumps(summary).lower()
    for row in rows:
        first = row["turns"][0]  # the env's action text for the MCP call: <tool_call>{name, arguments}</tool_call>
        call = json.loads(first["action"].removeprefix("<tool_call>").removesuffix("</tool_call>"))
        assert first["tool"] == "search" and call["arguments"]["query"] in questions, first
        assert first["observation"].startswith("<information>")
        assert row["proxy_calls"] and row["input_ids"]

    run = tmp_path / "run"
    # train questions: not taught, so any reply
    trained = train_small(model_dir, run, "rollout.max_new_tokens=160", f"rollout.agent={EXAMPLE}:agent", steps=1)
    assert len(trained) == 4 and all(t.proxy_calls and sum(t.loss_mask) > 0 for t in trained)
    assert (run / "checkpoints" / "step-00001").is_dir()
