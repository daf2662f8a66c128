"""`searchgym bench proxy`: the recording proxy at ASearcher's depth. One agent-program episode per row, the agent
asking the model every turn and the model searching every turn (then answering), for 8 to 128 turns.

The model is testing's `ScriptedEngine`: it writes the scripted reply at once, so the time and memory measured are
the proxy's and the workflow's (HTTP, chat-template rendering of the whole history, recording, linking), not a
model's.
Numbers go to results/bench_proxy_long.json, never into asserts.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import platform
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchgym.agents.engines.types import GenerateRequest, SamplingParams
from searchgym.agents.trajectory import Trajectory
from searchgym.agents.workflow import WorkflowSettings
from searchgym.bench.provenance import machine
from searchgym.envs.factory import make_unwrapped
from searchgym.serve.program import AgentProgramWorkflow, AgentTask
from searchgym.settings import setting
from searchgym.testing.scripted_engine import ScriptedEngine

TURNS = (8, 16, 32, 64, 128)
ENV_KWARGS = {"size": 1000, "seed": 0, "n_tasks": 200, "top_k": 1, "doc_chars": 120}
CONTEXT = 1 << 20  # no context limit: depth, not truncation, is measured


def searching_script(tokenizer: Any, searches: int) -> Callable[[GenerateRequest], str]:
    """The model's script: a search tool call while the prompt holds fewer than `searches` tool results, then an
    answer in text."""

    def reply(request: GenerateRequest) -> str:
        done = tokenizer.decode(request.input_ids).count("<tool_response>")
        if done < searches:
            call = {"name": "search", "arguments": {"query": f"river city {done}"}}
            return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        return "final answer"

    return reply


async def search_every_turn(task: AgentTask, client: Any) -> str:
    """An agent program: the model with the env's tools, each tool call run on the env, until it answers in text."""
    messages: list[Any] = [{"role": "user", "content": task.question}]
    while True:
        reply = await client.chat.completions.create(model=task.model, messages=messages, tools=task.tools)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return str(message.content or "")
        for call in message.tool_calls:
            result = await task.call_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})


async def play_long_episode(
    tokenizer: Any, turns: int, *, seed: int = 0, keep_prompts: bool = True
) -> tuple[Trajectory, ScriptedEngine]:
    """One episode of `turns` searches and an answer, through the proxy: the trajectory and the engine's record
    (without the prompts' ids when `keep_prompts` is False: the memory measured is then the proxy's, not the test
    engine's)."""
    engine = ScriptedEngine(
        tokenizer, searching_script(tokenizer, turns), max_context=CONTEXT, keep_prompts=keep_prompts
    )
    settings = WorkflowSettings(SamplingParams(max_new_tokens=64, temperature=1.0), max_context=CONTEXT)
    env = make_unwrapped("searchgym/SyntheticQA-v0", **ENV_KWARGS, max_turns=turns + 1)
    try:
        workflow = AgentProgramWorkflow(search_every_turn, engine, tokenizer, settings)
        return await workflow.arun_episode(env, seed=seed), engine
    finally:
        env.close()


def run_proxy_long_bench(
    model: str | os.PathLike,
    *,
    turns: tuple[int, ...] = TURNS,
    repeats: int = 3,
    out: str | os.PathLike = "results/bench_proxy_long.json",
) -> dict[str, Any]:
    """Time (median of `repeats`) and Python peak memory (tracemalloc, one more run) of an episode per depth."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    load_before = os.getloadavg()[0]  # the machine may be shared: its load is part of the numbers
    rows = []
    for n in turns:
        seconds = []
        for r in range(repeats):
            gc.collect()
            t0 = time.perf_counter()
            traj, engine = asyncio.run(play_long_episode(tokenizer, n, seed=r, keep_prompts=False))
            seconds.append(time.perf_counter() - t0)
        gc.collect()
        tracemalloc.start()
        asyncio.run(play_long_episode(tokenizer, n, keep_prompts=False))
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        median = sorted(seconds)[len(seconds) // 2]
        row = {
            "turns": n,
            "model_calls": len(engine.calls),
            "segments": traj.num_segments,
            "trajectory_tokens": len(traj.input_ids),
            "trained_tokens": traj.generated_tokens,
            "episode_s_median": round(median, 3),
            "episode_s_all": [round(s, 3) for s in seconds],
            "ms_per_model_call": round(1000 * median / len(engine.calls), 2),
            "python_peak_mib": round(peak / 2**20, 2),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    results = {
        "what": "one agent-program episode through the recording proxy per row: the model searches every turn, "
        "then answers; ScriptedEngine (no model) so the cost is the proxy's and the workflow's",
        "machine": machine(
            cpu=platform.processor() or platform.machine(),
            load_average_1min={"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
        ),
        "command": f"searchgym bench proxy --repeats {repeats} (tokenizer: {Path(model).name})",
        "env": {"id": "searchgym/SyntheticQA-v0", **ENV_KWARGS},
        "rows": rows,
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(results, indent=2) + "\n")
    return results


@dataclass
class ProxyBenchSettings:
    """`searchgym bench proxy`: the recording proxy at depth, an agent-program episode of 8 to 128 turns."""

    model: Path | None = setting(None, help="tokenizer's model directory (default: a fresh tiny model)")
    repeats: int = setting(3, at_least=1, help="timed episodes per depth (the median is reported)")
    out: Path = setting(Path("results/bench_proxy_long.json"), help="the results JSON")


def proxy_bench_command(settings: ProxyBenchSettings) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        model = settings.model
        if model is None:
            from searchgym.agents.tiny_model import build_tiny_model

            model = build_tiny_model(tmp)
        run_proxy_long_bench(model, repeats=settings.repeats, out=settings.out)
