"""`searchgym bench trl`: does README's TRL recipe (examples/train_with_trl.py) learn, over seeds?

Per seed, the example itself runs with that seed (the tiny model's init and TRL's seed): the warm start on the
oracle's demonstrations, then GRPO with the env as TRL's `environment_factory`, with held-out tasks (never trained
on) played greedily before and after GRPO and judged by the env. Recorded per GRPO step: TRL's logged mean reward,
reward spread and tool calls per rollout. The held-out gain is paired per question and bootstrapped over seeds,
then questions (bench/bootstrap.py). Each finished seed is one line of OUT's `.seeds.jsonl`: a rerun skips it.
"""

from __future__ import annotations

import json
import runpy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchgym.bench.bootstrap import hierarchical_bootstrap, seed_list
from searchgym.bench.provenance import accelerator, git_commit, machine
from searchgym.core.jsonl_log import JsonlLog
from searchgym.settings import setting

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_with_trl.py"
TRL_ARGS = ["--tasks", "16", "--held-out", "12", "--steps", "80"]  # the default setting


def run_trl_bench(seeds: list[int], example_args: list[str], *, out: Path) -> dict[str, Any]:
    """Run the example once per seed (skipping seeds already in OUT's seed log) and write OUT's summary."""
    if not EXAMPLE.exists():
        raise FileNotFoundError(f"{EXAMPLE} is missing: `bench trl` runs the example from a source checkout")
    if "--held-out" not in example_args:
        raise ValueError("bench trl needs --held-out N among the example's arguments (the before/after accuracy)")
    log = JsonlLog(out.with_suffix(".seeds.jsonl"), check=lambda row: (row["seed"], row["steps"], row["args"]))
    done = {row["seed"] for row in log if row["args"] == example_args}
    main = runpy.run_path(str(EXAMPLE))["main"]
    for seed in seeds:
        if seed in done:
            continue
        start = time.time()
        result = main([*example_args, "--seed", str(seed)])
        log.append({"seed": seed, "args": example_args, "seconds": round(time.time() - start, 1), **result})
    rows = [row for row in log if row["args"] == example_args and row["seed"] in seeds]
    summary = summarize(rows)
    summary.update(
        command="searchgym bench trl --seeds " + ",".join(map(str, seeds)) + " -- " + " ".join(example_args),
        commit=git_commit(),
        machine=machine(torch_threads=_threads(example_args), device=accelerator()),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _threads(example_args: list[str]) -> int:
    """The torch threads the example ran with (its --threads N or --threads=N, default 1)."""
    for i, arg in enumerate(example_args):
        value = arg.removeprefix("--threads=") if arg.startswith("--threads=") else None
        if arg == "--threads" and i + 1 < len(example_args):
            value = example_args[i + 1]
        if value is not None and value.isdigit():
            return int(value)
    return 1


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per GRPO step the mean over seeds of TRL's reward and tool calls; held-out accuracy before/after with the
    paired gain's hierarchical interval."""
    n_steps = min(len(row["steps"]) for row in rows)
    per_step = []
    for i in range(n_steps):
        at = [row["steps"][i] for row in rows]
        per_step.append(
            {
                "step": i + 1,
                "reward": [s["reward"] for s in at],
                "mean_reward": sum(s["reward"] for s in at) / len(at),
                "tool_calls_per_rollout": sum(s["tool_calls"] for s in at) / len(at),
                "groups_with_spread": sum(s["groups_with_spread"] for s in at) / len(at),
            }
        )

    def accuracy(row: dict[str, Any], when: str) -> dict[str, float]:
        return {t["task_id"]: float(t["reward"] or 0.0) for t in row[f"held_out_{when}"]["tasks"]}

    gains = {}
    for row in rows:
        before, after = accuracy(row, "before"), accuracy(row, "after")
        gains[row["seed"]] = [after[t] - before[t] for t in before]
    return {
        "seeds": [row["seed"] for row in rows],
        "sizing": {str(row["seed"]): row["sizing"] for row in rows},
        "per_step": per_step,
        "reward_rise": rise(rows, "reward"),
        "tool_calls_rise": rise(rows, "tool_calls"),
        "held_out": {
            "before": sum(row["held_out_before"]["accuracy"] for row in rows) / len(rows),
            "after": sum(row["held_out_after"]["accuracy"] for row in rows) / len(rows),
            "gain": hierarchical_bootstrap(gains),
        },
        "seconds_per_seed": [row["seconds"] for row in rows],
    }


def rise(rows: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    """TRL's logged `key` (the reward, or tool calls per rollout) in the second half of the GRPO steps less the first
    half's mean, per seed, with a 95% interval over seeds then late steps (None under 2 steps): above 0 when it
    rose."""
    n_steps = min(len(row["steps"]) for row in rows)
    if n_steps < 2:
        return None
    half = n_steps // 2
    rises = {}
    for row in rows:
        values = [float(s[key]) for s in row["steps"][:n_steps]]
        early = sum(values[:half]) / half
        rises[row["seed"]] = [v - early for v in values[n_steps - half :]]
    return {"early_steps": half, "late_steps": half, **hierarchical_bootstrap(rises)}


@dataclass
class TrlBenchCommand:
    """`searchgym bench trl`: the seeds, the report, and the example's arguments (after --)."""

    seeds: str = setting("0,1,2", help="comma-separated seeds; finished ones are reused")
    out: Path = setting(Path("results/bench_trl.json"), help="the report JSON")
    example_args: list[str] = setting(default_factory=list, help="after --: examples/train_with_trl.py's arguments")


def trl_bench_command(command: TrlBenchCommand) -> None:
    example_args = [a for a in command.example_args if a != "--"] or TRL_ARGS
    print(json.dumps(run_trl_bench(seed_list(command.seeds), example_args, out=command.out)["held_out"], indent=2))
