"""`searchgym quickstart`: the whole pipeline on one CPU box, start to finish in minutes.

    1. world      a synthetic encyclopedia, its BM25 index and a validated task pool (cached bundle)
    2. demos      the oracle plays half of the training tasks through the env: tool-use demonstrations
    3. base model a tiny Qwen2 (tokenizer trained on the world) learns to copy from its context on
                  repeated random tokens: the induction heads a real base LM brings from pretraining
    4. warm start it learns the demonstrations (supervised)
    5. RL         fully asynchronous decoupled PPO from the warm start, on the other half of the training
                  tasks (the warm start memorises its own; RL on those did not carry over to held-out ones)
    6. evaluate   warm start and RL policy on held-out test tasks, k samples each: the table, a
                  reward-curve PNG, TensorBoard logs and everything else under the output directory

Every stage is the library's own code path (gym.make, the oracle's demonstrations, sft, train, run_eval), so
the quickstart is also an end-to-end check that the pieces fit. The stages and their config live in
searchgym/pipeline/stages.py, shared with `searchgym bench learning`, which runs them once per seed.

Same seed and config, same result: every stage but RL is bit for bit reproducible (fixed torch threads,
deterministic torch kernels, seeded batches and per-episode sampling seeds). Async RL depends on timing: which
weight version sampled each token and which groups made each batch; the run records both
(rl/trajectories/, rl/provenance.jsonl). One run's gain is one draw: the summary says whether its paired
interval excludes zero, and points to `searchgym bench learning` (these stages over several seeds, pooled with a
hierarchical bootstrap) for the multi-seed figure.

Measured with these defaults on 2 cores: 10 minutes end to end. The RL gain of one run is not
established: one run gained +0.087 held-out F1, two later ones gained amounts indistinguishable from
zero (docs/benchmarks.md, Quickstart).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from searchgym.eval.compare import compare_runs, write_comparison
from searchgym.pipeline.stages import (
    QuickstartConfig,
    build_base_model,
    deterministic_torch,
    evaluate_policy,
    make_demos,
    make_env,
    run_rl,
    say,
)
from searchgym.trainers.warm_start.sft import sft

BENCHMARK = (
    "docs/benchmarks.md#learning"  # `searchgym bench learning`: the gain over seeds (one quickstart run is one draw)
)
POLICIES = ("warm start (SFT)", "warm start + async RL")  # the compared runs' names, in eval-sft, eval-rl order


def run_quickstart(config: QuickstartConfig, *, progress: bool = True) -> dict[str, Any]:
    """Run the five stages into `config.out_dir`; returns (and writes to summary.json) the before/after table."""
    with deterministic_torch(config.torch_threads):
        return _run_stages(config, progress=progress)


def _run_stages(config: QuickstartConfig, *, progress: bool) -> dict[str, Any]:
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(stage: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[stage] = round(now - clock, 1)
        clock = now
        say(progress, f"[quickstart] {stage}: {timings[stage]} s")

    test_kwargs = {**config.env.kwargs, "split": "test"}
    env = make_env(config.env.id, config.env.kwargs, "train")
    lap("world")

    train_tasks = list(env.tasks)
    cut = round(config.demos.fraction * len(train_tasks))
    chats = make_demos(
        env,
        train_tasks[:cut],
        out / "demos.jsonl",
        question_query=config.demos.question_query,
        limit=config.demos.limit,
    )
    lap("demos")

    base, copy_history = build_base_model(
        env, chats, out, config.model, config.copy, seed=config.seed, progress=progress, base=config.base
    )
    lap("base model")
    warm = out / "sft-model"
    device = config.rl.model.device  # every stage runs where RL does (rl.model.device=cuda on a GPU)
    sft_history = sft(base, chats, warm, config.sft, progress=progress, device=device)
    lap("warm start")

    rl = config.rl
    rl_tasks = [task.id for task in train_tasks[cut:]] or None  # all of them when every task was demonstrated
    history = run_rl(
        rl,
        warm,
        out / "rl",
        env_id=config.env.id,
        env_kwargs=config.env.kwargs,
        tasks=rl_tasks,
        seed=config.seed,
        progress=progress,
    )
    lap("rl")

    before = evaluate_policy(
        warm,
        out / "eval-sft",
        config.eval,
        env_id=config.env.id,
        env_kwargs=test_kwargs,
        seed=config.seed,
        progress=progress,
        device=device,
    )
    after = evaluate_policy(
        out / "rl" / "checkpoints" / f"step-{rl.steps:05d}",
        out / "eval-rl",
        config.eval,
        env_id=config.env.id,
        env_kwargs=test_kwargs,
        seed=config.seed,
        progress=progress,
        device=device,
    )
    comparison = compare_policies(out, seed=config.seed)
    gain = next(d for d in comparison["deltas"] if d["metric"] == "reward")
    lap("evaluate")

    table = {run["name"]: run["metrics"] for run in comparison["runs"]}
    summary = {
        "table": table,
        "rl_gain": gain,
        "rl_gain_significant": bool(gain.get("significant")),
        "benchmark": BENCHMARK,
        "comparison": str(out / "compare" / "compare.html"),
        "timings_s": timings,
        "demos": len(chats),
        "copy_accuracy": copy_history[-1]["copy_accuracy"] if copy_history else None,
        "sft_steps": len(sft_history),
        "rl_steps": len(history),
        "env": {"id": config.env.id, "kwargs": config.env.kwargs},
        "out_dir": str(out),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    report = format_table(table, config.eval.k) + "\n\n" + format_gain(gain) + "\n\n" + format_scope(gain)
    (out / "summary.md").write_text(report + "\n")
    plot_reward_curve(history, before, after, config.eval.k, out / "reward_curve.png")
    say(progress, report)
    return summary


def compare_policies(out: Path, *, seed: int = 0) -> dict[str, Any]:
    """OUT/eval-sft against OUT/eval-rl with `searchgym eval compare`'s code, written to OUT/compare/compare.html.

    Their protocol cards must agree (same questions, judges, sampling, budgets, tools), or this refuses;
    the RL gain is the reward delta paired by question with its bootstrap interval."""
    comparison = compare_runs([out / "eval-sft", out / "eval-rl"], names=POLICIES, seed=seed)
    write_comparison(comparison, out / "compare")
    return comparison


def format_gain(gain: dict[str, float]) -> str:
    """One line on whether RL helped, with its interval (paired by question, from `eval compare`)."""
    verdict = "the interval excludes zero" if gain.get("significant") else "not distinguishable from zero"
    return (
        f"RL gain in held-out reward: {gain['gain']:+.3f} (95% bootstrap interval over {gain['tasks']} tasks "
        f"{gain['ci95_low']:+.3f} to {gain['ci95_high']:+.3f}, {verdict}; {gain['tasks_better']} tasks better, "
        f"{gain['tasks_worse']} worse; side by side in compare/compare.html)"
    )


def format_scope(gain: dict[str, Any]) -> str:
    """What this one run can and cannot show, and where the multi-seed figure is."""
    if gain.get("significant"):
        verdict = (
            f"In this run the gain is significant (its paired 95% interval excludes zero, "
            f"{'above' if gain['ci95_low'] > 0 else 'below'} it)."
        )
    else:
        verdict = "In this run the gain is not significant (its paired 95% interval includes zero)."
    return (
        f"{verdict} This is one seed: the warm start and evaluation repeat bit for bit with the same seed, "
        f"async RL varies with timing. For the gain over seeds run `searchgym bench learning --preset quickstart` "
        f"(method and figures: {BENCHMARK})."
    )


def format_table(table: dict[str, dict[str, float]], k: int) -> str:
    """The before/after table in markdown."""
    columns = [
        (f"avg@{k}/reward", "F1 (avg@k)"),
        (f"avg@{k}/correct", "EM (avg@k)"),
        (f"pass@{k}/correct", "EM (pass@k)"),
        ("answered", "answered"),
        ("turns", "turns"),
        ("searches", "searches"),
    ]
    lines = ["| policy | " + " | ".join(name for _, name in columns) + " |", "|---|" + "---|" * len(columns)]
    for policy, row in table.items():
        lines.append(
            f"| {policy} | "
            + " | ".join(
                f"{row[key]:.3f}" if key.startswith(("avg", "pass", "answered")) else f"{row[key]:.2f}"
                for key, _ in columns
            )
            + " |"
        )
    return "\n".join(lines)


def plot_reward_curve(
    history: list[dict[str, float]], before: dict[str, float], after: dict[str, float], k: int, path: Path
) -> None:
    """Training reward per learner step, with the held-out reward before and after as reference lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    rewards = [h["episode/reward"] for h in history]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    ax.plot(steps, rewards, marker="o", markersize=3, alpha=0.5, label="training episodes (mean F1 per step)")
    window = min(10, len(rewards))
    if window > 1:
        smooth = np.convolve(rewards, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1 :], smooth, linewidth=2, label=f"{window}-step running mean")
    ax.axhline(before[f"avg@{k}/reward"], color="grey", linestyle="--", label="held-out, warm start")
    ax.axhline(after[f"avg@{k}/reward"], color="green", linestyle="--", label="held-out, after RL")
    ax.set_xlabel("learner step (weight version)")
    ax.set_ylabel("reward (F1)")
    ax.set_title("searchgym quickstart: async decoupled PPO on SyntheticQA")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
