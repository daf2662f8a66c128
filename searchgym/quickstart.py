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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from searchgym.eval.compare import compare_runs, write_comparison
from searchgym.pipeline.commands import QuickstartCommand
from searchgym.pipeline.stages import (
    QuickstartConfig,
    StageRun,
    build_base_model,
    deterministic_torch,
    evaluate_policy,
    load_quickstart_config,
    make_demos,
    make_env,
    run_rl,
    say,
)
from searchgym.trainers.config import EnvConfig
from searchgym.trainers.warm_start.sft import sft

BENCHMARK = (
    "docs/benchmarks.md#learning"  # `searchgym bench learning`: the gain over seeds (one quickstart run is one draw)
)
POLICIES = ("warm start (SFT)", "warm start + async RL")  # the compared runs' names, in eval-sft, eval-rl order

# The stages in order, named as the module docstring, README and the summary (summary.json's timings_s) name them.
# Each stage's log lines and progress bars open with its `stage_label`: "stage 3 of 6: base model".
STAGES = ("world", "demos", "base model", "warm start", "RL", "evaluate")

# How the summary names the env's reward judge (env.kwargs.judge): as README does
JUDGE_NAMES = {"f1": "F1", "em": "EM", "cover_em": "cover EM", "asearcher_f1": "ASearcher F1"}


def stage_label(stage: str, detail: str = "") -> str:
    """The stage's number and name, as every bar and line of it says: "stage 6 of 6: evaluate, warm start"."""
    return f"stage {STAGES.index(stage) + 1} of {len(STAGES)}: {stage}" + (f", {detail}" if detail else "")


def judge_name(env_kwargs: dict[str, Any]) -> str:
    """The env's reward judge as the summary names it ("F1" for the default token F1)."""
    judge = str(env_kwargs.get("judge") or "f1")
    return JUDGE_NAMES.get(judge, judge)


def run_quickstart(config: QuickstartConfig, *, progress: bool = True) -> dict[str, Any]:
    """Run the six stages into `config.out_dir`; returns (and writes to summary.json) the before/after table."""
    with deterministic_torch(config.torch_threads):
        return _run_stages(config, progress=progress)


class _Laps:
    """Each stage's opening line, and its time when done (the summary's `timings_s`)."""

    def __init__(self, progress: bool) -> None:
        self.progress, self.clock = progress, time.perf_counter()
        self.timings: dict[str, float] = {}

    def begin(self, stage: str, what: str) -> None:
        say(self.progress, f"[quickstart] {stage_label(stage)}: {what}")

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.timings[stage] = round(now - self.clock, 1)
        self.clock = now
        say(self.progress, f"[quickstart] {stage_label(stage)}: done in {self.timings[stage]} s")


@dataclass
class _Outcome:
    """What the stages made that the summary reports: counts of each stage's work, RL's per-step history, the two
    policies' held-out metrics and their comparison."""

    demos: int
    copy_history: list[dict[str, Any]]
    sft_steps: int
    history: list[dict[str, float]]
    before: dict[str, float]
    after: dict[str, float]
    comparison: dict[str, Any]


def _run_stages(config: QuickstartConfig, *, progress: bool) -> dict[str, Any]:
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    laps = _Laps(progress)
    laps.begin(
        "world", "the fictional encyclopedia, its search index and validated questions (built once, then cached)"
    )
    env = make_env(config.env.id, config.env.kwargs, "train", progress=progress)
    laps.lap("world")

    train_tasks = list(env.tasks)
    cut = round(config.demos.fraction * len(train_tasks))
    laps.begin("demos", f"the oracle answers training questions through the env's tools ({cut:,} set aside for it)")
    demos = config.demos
    chats = make_demos(
        env, train_tasks[:cut], out / "demos.jsonl", question_query=demos.question_query, limit=demos.limit
    )
    laps.lap("demos")

    laps.begin(
        "base model",
        "a tiny Qwen2 learns to copy from its context, as a pretrained model can"
        if config.base == "tiny"
        else f"the pretrained {config.base}",
    )
    run = StageRun(seed=config.seed, progress=progress, label=stage_label("base model"))  # copy pretraining: on CPU
    base, copy_history = build_base_model(env, chats, out, config.model, config.copy, run, base=config.base)
    laps.lap("base model")
    warm = out / "sft-model"
    device = config.rl.model.device  # every later stage runs where RL does (rl.model.device=cuda on a GPU)
    laps.begin("warm start", f"supervised learning of the {len(chats):,} demonstrations")
    sft_history = sft(
        base, chats, warm, config.sft, progress=progress, device=device, progress_label=stage_label("warm start")
    )
    laps.lap("warm start")

    rl = config.rl
    rl_tasks = [task.id for task in train_tasks[cut:]] or None  # all of them when every task was demonstrated
    laps.begin(
        "RL", f"{rl.steps} steps of {rl.mode} decoupled PPO from the warm start, on the other training questions"
    )
    run = StageRun(seed=config.seed, device=device, progress=progress, label=stage_label("RL"))
    history = run_rl(rl, warm, out / "rl", config.env, rl_tasks, run)
    laps.lap("RL")

    laps.begin("evaluate", f"the warm start, then the RL policy, on held-out questions ({config.eval.k} samples each)")
    test_env = EnvConfig(id=config.env.id, kwargs={**config.env.kwargs, "split": "test"})
    run = replace(run, label=stage_label("evaluate", "warm start"))
    before = evaluate_policy(warm, out / "eval-sft", config.eval, test_env, run)
    run = replace(run, label=stage_label("evaluate", "after RL"))
    after = evaluate_policy(
        out / "rl" / "checkpoints" / f"step-{rl.steps:05d}", out / "eval-rl", config.eval, test_env, run
    )
    comparison = compare_policies(out, seed=config.seed)
    laps.lap("evaluate")
    outcome = _Outcome(len(chats), copy_history, len(sft_history), history, before, after, comparison)
    return _summarize(config, out, outcome, laps.timings, progress)


def _summarize(
    config: QuickstartConfig, out: Path, outcome: _Outcome, timings: dict[str, float], progress: bool
) -> dict[str, Any]:
    """summary.json, summary.md (the before/after table, the RL gain and its scope, the timings) and the reward
    curve, into `out`; returns the summary."""
    judge, k = judge_name(config.env.kwargs), config.eval.k
    gain = next(d for d in outcome.comparison["deltas"] if d["metric"] == "reward")
    table = {run["name"]: run["metrics"] for run in outcome.comparison["runs"]}
    copy_history = outcome.copy_history
    summary = {
        "table": table,
        "rl_gain": gain,
        "rl_gain_significant": bool(gain.get("significant")),
        "benchmark": BENCHMARK,
        "comparison": str(out / "compare" / "compare.html"),
        "timings_s": timings,
        "demos": outcome.demos,
        "copy_accuracy": copy_history[-1]["copy_accuracy"] if copy_history else None,
        "sft_steps": outcome.sft_steps,
        "rl_steps": len(outcome.history),
        "env": {"id": config.env.id, "kwargs": config.env.kwargs},
        "out_dir": str(out),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    report = "\n\n".join(
        [format_table(table, k, judge), format_gain(gain, judge, k), format_scope(gain), format_timings(timings)]
    )
    (out / "summary.md").write_text(report + "\n")
    plot_reward_curve(outcome.history, outcome.before, outcome.after, k, out / "reward_curve.png", judge=judge)
    say(progress, report)
    return summary


def compare_policies(out: Path, *, seed: int = 0) -> dict[str, Any]:
    """OUT/eval-sft against OUT/eval-rl with `searchgym eval compare`'s code, written to OUT/compare/compare.html.

    Their protocol cards must agree (same questions, judges, sampling, budgets, tools), or this refuses;
    the RL gain is the reward delta paired by question with its bootstrap interval."""
    comparison = compare_runs([out / "eval-sft", out / "eval-rl"], names=POLICIES, seed=seed)
    write_comparison(comparison, out / "compare")
    return comparison


def format_gain(gain: dict[str, float], judge: str = "F1", k: int | None = None) -> str:
    """One line on whether RL helped in the env's reward, named by its `judge` (mean of `k` samples per question),
    with its interval (paired by question, from `eval compare`)."""
    verdict = "the interval excludes zero" if gain.get("significant") else "not distinguishable from zero"
    measure = judge if k is None else f"{judge} (Avg@{k})"
    return (
        f"RL gain in held-out {measure}: {gain['gain']:+.3f} (95% bootstrap interval over {gain['tasks']} tasks "
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


def format_timings(timings: dict[str, float]) -> str:
    """Each stage's time, by the names its log lines gave it."""
    return "Stage times: " + ", ".join(f"{stage} {t} s" for stage, t in timings.items()) + "."


def format_table(table: dict[str, dict[str, float]], k: int, judge: str = "F1") -> str:
    """The before/after table in markdown: the env's reward by its `judge`'s name, exact matches, behaviour."""
    correct = "EM" if judge in ("F1", "EM") else f"{judge} correct"  # a token-F1 verdict is correct on an exact match
    columns = [
        (f"avg@{k}/reward", f"{judge} (Avg@{k})"),
        (f"avg@{k}/correct", f"{correct} (Avg@{k})"),
        (f"pass@{k}/correct", f"{correct} (Pass@{k})"),
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
    history: list[dict[str, float]],
    before: dict[str, float],
    after: dict[str, float],
    k: int,
    path: Path,
    *,
    judge: str = "F1",
) -> None:
    """Training reward per learner step, with the held-out reward before and after as reference lines."""
    import matplotlib.pyplot as plt

    fig = reward_curve_figure(history, before, after, k, judge=judge)
    fig.savefig(path)
    plt.close(fig)


def reward_curve_figure(
    history: list[dict[str, float]], before: dict[str, float], after: dict[str, float], k: int, *, judge: str = "F1"
) -> Any:
    """reward_curve.png's figure. Its legend sits below the axes: inside them it covered the curve's last steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    rewards = [h["episode/reward"] for h in history]
    fig, ax = plt.subplots(figsize=(6.4, 4.8), dpi=120)
    ax.plot(steps, rewards, marker="o", markersize=3, alpha=0.5, label=f"training episodes (mean {judge} per step)")
    window = min(10, len(rewards))
    if window > 1:
        smooth = np.convolve(rewards, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1 :], smooth, linewidth=2, label=f"{window}-step running mean")
    ax.axhline(before[f"avg@{k}/reward"], color="grey", linestyle="--", label=f"held-out {judge} (Avg@{k}), warm start")
    ax.axhline(after[f"avg@{k}/reward"], color="green", linestyle="--", label=f"held-out {judge} (Avg@{k}), after RL")
    ax.set_xlabel("learner step (weight version)")
    ax.set_ylabel(f"reward ({judge})")
    ax.set_title("searchgym quickstart: async decoupled PPO on SyntheticQA")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2, fontsize="small", frameon=False)
    fig.tight_layout()
    return fig


def quickstart_command(command: QuickstartCommand) -> None:
    """The quickstart with the command's settings; says where the results are."""
    out = command.out or (f"runs/quickstart-{command.preset}" if command.preset else None)
    values = {"out_dir": str(out)} if out else None
    config = load_quickstart_config(command.overrides, command.config, values, command.preset)
    summary = run_quickstart(config)
    print(f"results in {summary['out_dir']}: summary.md, reward_curve.png, rl/tensorboard")
