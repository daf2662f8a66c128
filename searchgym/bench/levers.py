"""`searchgym bench levers`: what each CPU lever does to one learner step of a real model, measured in one run.

    searchgym bench levers --model smollm2-135m-instruct --repeats 3 [--run runs/.../rl-async]

The model plays one batch of episodes on the real-model preset's env (4 groups of 4, rewards set to alternate so
every group has spread). Then `Learner.step` runs on that same batch from the same weights under each lever. The
arms are interleaved within every repeat:

- fp32 on one thread (the baseline);
- two threads;
- bf16 autocast (`learner.autocast=bf16`);
- only the top decoder layers trainable (`learner.trainable_layers`);
- half the micro-batch (`learner.micro_batch_tokens`).

Each arm reports its seconds per step (median, and per-repeat paired ratio to the baseline), its peak memory over
the step's start (sampled from /proc after `gc.collect()` and a heap trim, so memory an earlier arm freed is not
reused unseen; run with MALLOC_ARENA_MAX=2, as the reproduce script does, or other threads' arenas keep some), and
how far its update is from the baseline's: the cosine between the two parameter updates, and the mean |difference|
of the trained tokens' log-probs after the step.
Prefix reuse and concurrency are the engine's levers, measured by `searchgym bench engine`. `--run` adds what an
RL run's own steps cost (its metrics.jsonl: learner seconds, engine busy seconds, wall seconds per step).
"""

from __future__ import annotations

import asyncio
import copy
import gc
import json
import os
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from searchgym.agents.engines.torch_engine import TorchEngine
from searchgym.agents.engines.types import SamplingParams
from searchgym.agents.trajectory import Trajectory
from searchgym.agents.workflow import TokenWorkflow, WorkflowSettings
from searchgym.bench.provenance import git_commit, machine
from searchgym.core.heap import release_free_heap
from searchgym.pipeline.stages import make_env, resolve_model
from searchgym.settings import setting
from searchgym.trainers.algorithm.learner import Learner
from searchgym.trainers.config import LearnerConfig

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
ENV = {"hops": 1, "top_k": 2, "doc_chars": 200, "max_turns": 4, "judge": "f1", "instructions": "full"}  # the preset's


@dataclass
class LeversConfig:
    """One levers run: the model, the batch it plays, and the arms' settings."""

    model: str = setting("smollm2-135m-instruct", help="a model directory or a packaged model's name")
    groups: int = setting(4, at_least=1, help="groups in the batch played")
    group_size: int = setting(4, at_least=2, help="episodes per group")
    max_new_tokens: int = setting(48, at_least=1, help="tokens per turn")
    repeats: int = setting(3, at_least=1, help="interleaved repetitions of every arm")
    trainable_layers: int = setting(6, at_least=1, help="the top layers trained in the frozen-layers arm")
    micro_batch_tokens: int = setting(2048, at_least=2, help="the baseline's micro-batch (one arm halves it)")
    lr: float = setting(1e-5, help="learning rate of the step")
    seed: int = setting(0, help="the torch seed and the episodes'")
    world_size: int = setting(20000, at_least=10, help="the preset's world (bench learning --preset smollm2)")
    world_tasks: int = setting(20000, at_least=10, help="the world's tasks")
    run: str | None = setting(None, help="an RL run dir whose metrics.jsonl gives the preset's own step costs")
    out: str = setting("results/bench_levers.json", help="the report JSON")


def arms(config: LeversConfig) -> dict[str, dict[str, Any]]:
    """Each arm's learner settings and torch threads; "fp32, 1 thread" is the baseline."""
    base = {"lr": config.lr, "micro_batch_tokens": config.micro_batch_tokens, "grad_clip": 1.0}
    return {
        "fp32, 1 thread": {"learner": base, "threads": 1},
        "fp32, 2 threads": {"learner": base, "threads": 2},
        "bf16 autocast": {"learner": {**base, "autocast": "bf16"}, "threads": 1},
        f"top {config.trainable_layers} layers trainable": {
            "learner": {**base, "trainable_layers": config.trainable_layers},
            "threads": 1,
        },
        "half micro-batch": {"learner": {**base, "micro_batch_tokens": config.micro_batch_tokens // 2}, "threads": 1},
    }


def play_batch(model_dir: Path, config: LeversConfig) -> list[list[Trajectory]]:
    """`groups` groups of `group_size` episodes of the preset's env, rewards alternating 1, 0 within each group."""
    env_kwargs = {**ENV, "size": config.world_size, "n_tasks": config.world_tasks, "seed": config.seed}
    engine = TorchEngine(model_dir, seed=config.seed)
    settings = WorkflowSettings(SamplingParams(max_new_tokens=config.max_new_tokens), max_context=4096)

    async def play() -> list[list[Trajectory]]:
        workflow = TokenWorkflow(engine, engine.tokenizer, settings)
        groups = []
        for g in range(config.groups):
            envs = [make_env("searchgym/SyntheticQA-v0", env_kwargs, "train") for _ in range(config.group_size)]
            task = envs[0].tasks[g]
            groups.append(
                await asyncio.gather(
                    *(workflow.arun_episode(env, options={"task_id": task.id}, seed=i) for i, env in enumerate(envs))
                )
            )
        return groups

    groups = asyncio.run(play())
    for group in groups:
        for i, traj in enumerate(group):
            traj.reward = float(i % 2 == 0)
    return groups


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


@contextmanager
def peak_memory(every_s: float = 0.02) -> Iterator[dict[str, int]]:
    """The process's RSS at the start and its sampled peak inside the block (bytes)."""
    found = {"start": _rss(), "peak": _rss()}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(every_s):
            found["peak"] = max(found["peak"], _rss())

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    try:
        yield found
    finally:
        done.set()
        watcher.join()
        found["peak"] = max(found["peak"], _rss())


def trained_logprobs(learner: Learner, groups: list[list[Trajectory]]) -> torch.Tensor:
    """fp32 log-probs of every trained token of the batch under the learner's current weights."""
    samples, _ = learner._samples(groups)
    autocast = learner.config.autocast
    learner.config.autocast = "off"
    try:
        with torch.no_grad():
            logp, _, where = learner._logprobs(learner._layout(samples))
    finally:
        learner.config.autocast = autocast
    return logp[where]


def run_arm(base: torch.nn.Module, arm: dict[str, Any], groups: list[list[Trajectory]]) -> dict[str, Any]:
    """One learner step of one arm from the base weights: seconds, peak memory, its update and log-probs after."""
    model = copy.deepcopy(base)
    learner = Learner(model, LearnerConfig(**arm["learner"]))
    before = [p.detach().clone() for p in model.parameters()]
    threads = torch.get_num_threads()
    torch.set_num_threads(arm["threads"])
    gc.collect()
    release_free_heap()  # the earlier arms' freed heap back to the system, so this arm's peak counts its own
    try:
        with peak_memory() as memory:
            start = time.perf_counter()
            learner.step(groups)
            seconds = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
    update = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before, strict=True)])
    return {
        "seconds": seconds,
        "peak_gib": (memory["peak"] - memory["start"]) / 2**30,
        "update": update,
        "logprobs": trained_logprobs(learner, groups),
    }


def step_costs(run: Path) -> dict[str, Any]:
    """What an RL run's steps cost on average (its metrics.jsonl): wall time, the learner's time (over all steps,
    and over the steps that updated: groups without reward spread are dropped, and a step without any skips the
    learner), and the engine's busy time and generated tokens (cumulative counters there, divided by the steps)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"{run / 'metrics.jsonl'} has no steps")
    last, steps = rows[-1], len(rows)

    def per_step(key: str) -> float | None:
        value = last.get(key)
        return float(value) / steps if isinstance(value, (int, float)) else None

    learner = [float(r["learner/step_s"]) for r in rows if isinstance(r.get("learner/step_s"), (int, float))]
    updates = [t for t, r in zip(learner, rows, strict=False) if float(r.get("trained_tokens") or 0) > 0]
    return {
        "run": str(run),
        "steps": steps,
        "updated_steps": len(updates),
        "wall_s_per_step": per_step("elapsed_s"),
        "learner_s_per_step": statistics.fmean(learner) if learner else None,
        "learner_s_per_update": statistics.fmean(updates) if updates else None,
        "engine_busy_s_per_step": per_step("engine/busy_s"),
        "generated_tokens_per_step": per_step("engine/generated_tokens"),
    }


def run_levers_bench(config: LeversConfig, out: str | os.PathLike | None = None) -> dict[str, Any]:
    """Every arm `repeats` times, interleaved, on one batch from one set of weights; the report written to `out`."""
    from transformers import AutoModelForCausalLM

    load_before = list(os.getloadavg())
    torch.manual_seed(config.seed)
    torch.set_num_threads(1)
    model_dir = resolve_model(config.model)
    groups = play_batch(model_dir, config)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    plan = arms(config)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in plan}
    for _ in range(config.repeats):
        for name, arm in plan.items():
            runs[name].append(run_arm(base, arm, groups))
    baseline = runs["fp32, 1 thread"]
    report = {
        "benchmark": "searchgym bench levers",
        "commit": git_commit(),
        "machine": machine(load_average_before=load_before, load_average_after=list(os.getloadavg())),
        "config": asdict(config),
        "model": str(model_dir),
        "batch": {
            "episodes": sum(len(g) for g in groups),
            "tokens": sum(len(t.input_ids) for g in groups for t in g),
            "trained_tokens": sum(sum(t.loss_mask) for g in groups for t in g),
        },
        "arms": {name: summarise(name, plan[name], results, baseline) for name, results in runs.items()},
    }
    if config.run:
        report["preset_step_costs"] = step_costs(Path(config.run))
    path = Path(config.out if out is None else out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    return report


def summarise(
    name: str, arm: dict[str, Any], results: list[dict[str, Any]], baseline: list[dict[str, Any]]
) -> dict[str, Any]:
    """One arm's figures over the repeats, each paired with the baseline's run of the same repeat."""
    ratios = [b["seconds"] / r["seconds"] for r, b in zip(results, baseline, strict=True)]
    cosines = [
        float(torch.nn.functional.cosine_similarity(r["update"].double(), b["update"].double(), dim=0))
        for r, b in zip(results, baseline, strict=True)
    ]
    drift = [float((r["logprobs"] - b["logprobs"]).abs().mean()) for r, b in zip(results, baseline, strict=True)]
    return {
        "learner": arm["learner"],
        "threads": arm["threads"],
        "seconds": [r["seconds"] for r in results],
        "median_seconds": statistics.median(r["seconds"] for r in results),
        "speedup_vs_baseline": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
        "peak_gib_over_start": statistics.median(r["peak_gib"] for r in results),
        "update_cosine_vs_baseline": statistics.median(cosines),
        "logprob_mean_abs_diff_after_step": statistics.median(drift),
    }


def format_levers(report: dict[str, Any]) -> str:
    """The arms as a table: seconds, speed-up, memory, and how close each update is to the baseline's."""
    lines = [
        f"batch: {report['batch']['episodes']} episodes, {report['batch']['tokens']} tokens "
        f"({report['batch']['trained_tokens']} trained)",
        "| arm | s/step | speed-up (min-max) | peak GiB | update cosine | mean abs logprob diff |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, arm in report["arms"].items():
        s = arm["speedup_vs_baseline"]
        lines.append(
            f"| {name} | {arm['median_seconds']:.1f} | {s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f}) | "
            f"{arm['peak_gib_over_start']:.2f} | {arm['update_cosine_vs_baseline']:.3f} | "
            f"{arm['logprob_mean_abs_diff_after_step']:.2e} |"
        )
    return "\n".join(lines)


def levers_bench_command(config: LeversConfig) -> None:
    print(format_levers(run_levers_bench(config)))
