"""`searchgym quickstart`: the whole pipeline on one CPU box, start to finish in minutes.

    1. world      a synthetic encyclopedia, its BM25 index and a validated task pool (cached bundle)
    2. demos      the oracle plays the training tasks through the env: tool-use demonstrations
    3. warm start a tiny Qwen2 model learns the demonstrations (supervised)
    4. RL         fully asynchronous decoupled PPO from the warm start, on the same training tasks
    5. evaluate   warm start and RL policy on held-out test tasks, k samples each: the table, a
                  reward-curve PNG, TensorBoard logs and everything else under the output directory

Every stage is the library's own code path (gym.make, the oracle's demonstrations, sft, train, run_eval), so
the quickstart is also an end-to-end check that the pieces fit.

Status (measured on 2 busy cores): with these defaults the warm start takes about 10 minutes and
teaches the tool-call format (search, then answer: 73% of the demonstrations' action tokens right),
but not yet to copy a name from the question into the query or an answer from a result, which is
what earns reward (held-out F1 about 0.01). So the RL stage has almost no signal and the RL gain the
quickstart is meant to show is not there yet; see README's Status.
"""
from __future__ import annotations

import asyncio
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
from omegaconf import OmegaConf

import searchgym  # noqa: F401  (registers the env ids)
from searchgym.agents.tiny_model import build_tiny_model
from searchgym.benchmarks.harness import run_eval
from searchgym.synthesis.oracle import demonstrations
from searchgym.trainers.config import EnvConfig, LearnerConfig, RolloutConfig, TrainConfig
from searchgym.trainers.local import train
from searchgym.trainers.sft import SFTConfig, sft

ENV_KWARGS = {"size": 5000, "n_tasks": 4000, "hops": 1, "top_k": 2, "doc_chars": 200, "max_turns": 4, "judge": "f1"}


@dataclass
class TinyModelConfig:
    """The policy's shape: small enough to train on a CPU in minutes, big enough to learn to copy."""

    vocab_size: int = 8192  # a larger vocabulary keeps the world's names to few tokens, easier to copy
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    init_std: float = 0.02  # Hugging Face's Qwen2 init; the tiny-model default (0.3) is for untrained test models


@dataclass
class EvalConfig:
    """Held-out evaluation: k samples per test task at the sampling temperature the policy trains with."""

    k: int = 4
    max_tasks: int = 96
    temperature: float = 1.0
    max_new_tokens: int = 48
    concurrency: int = 64


@dataclass
class QuickstartConfig:
    """The quickstart's stages; any field can be overridden from the command line (e.g. rl.steps=10)."""

    out_dir: str = "runs/quickstart"
    seed: int = 0
    torch_threads: int = 1
    env: EnvConfig = field(default_factory=lambda: EnvConfig(kwargs=dict(ENV_KWARGS)))
    model: TinyModelConfig = field(default_factory=TinyModelConfig)
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(epochs=6.0, lr=2e-3, batch_tokens=4096, warmup_steps=20))
    rl: TrainConfig = field(default_factory=lambda: TrainConfig(
        steps=30, save_every=10,
        rollout=RolloutConfig(group_size=8, batch_size=6, max_staleness=2, max_concurrent_rollouts=96,
                              max_new_tokens=48, max_context=2048),
        learner=LearnerConfig(lr=3e-4, warmup_steps=2, eps_clip=0.2, eps_clip_high=0.28, micro_batch_tokens=16384)))
    eval: EvalConfig = field(default_factory=EvalConfig)


def load_quickstart_config(overrides: list[str] | tuple[str, ...] = ()) -> QuickstartConfig:
    """Defaults plus dotted overrides, validated against the dataclasses."""
    merged = OmegaConf.merge(OmegaConf.structured(QuickstartConfig), OmegaConf.from_dotlist(list(overrides)))
    return OmegaConf.to_object(merged)


def run_quickstart(config: QuickstartConfig, *, progress: bool = True) -> dict[str, Any]:
    """Run the five stages into `config.out_dir`; returns (and writes to summary.json) the before/after table."""
    import torch

    torch.set_num_threads(config.torch_threads)
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(stage: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[stage] = round(now - clock, 1)
        clock = now
        _say(progress, f"[quickstart] {stage}: {timings[stage]} s")

    train_kwargs = {**config.env.kwargs, "split": "train"}
    test_kwargs = {**config.env.kwargs, "split": "test"}
    env = gym.make(config.env.id, **train_kwargs).unwrapped
    lap("world")

    chats = asyncio.run(demonstrations(env))
    (out / "demos.jsonl").write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats))
    lap("demos")

    base = build_tiny_model(out / "base-model", seed=config.seed, **vars(config.model))
    lap("base model")
    warm = out / "sft-model"
    sft_history = sft(base, chats, warm, config.sft, progress=progress)
    lap("warm start")

    rl = config.rl
    rl.seed, rl.out_dir, rl.model.path = config.seed, str(out / "rl"), str(warm)
    rl.env = EnvConfig(id=config.env.id, kwargs=train_kwargs)
    history = train(rl, progress=progress)
    lap("rl")

    def evaluate(model_dir: Path, name: str) -> dict[str, float]:
        shutil.rmtree(out / name, ignore_errors=True)  # run_eval resumes: a rerun's new model must not reuse old samples
        summary = run_eval(config.env.id, str(model_dir), out / name, k=config.eval.k, judge="em,f1",
                           env_kwargs=test_kwargs, max_tasks=config.eval.max_tasks, concurrency=config.eval.concurrency,
                           temperature=config.eval.temperature, max_new_tokens=config.eval.max_new_tokens,
                           seed=config.seed, progress=progress)
        return summary["metrics"]

    before = evaluate(warm, "eval-sft")
    after = evaluate(out / "rl" / "checkpoints" / f"step-{rl.steps:05d}", "eval-rl")
    lap("evaluate")

    table = {"warm start (SFT)": before, "warm start + async RL": after}
    summary = {"table": table, "timings_s": timings, "demos": len(chats), "sft_steps": len(sft_history),
               "rl_steps": len(history), "env": {"id": config.env.id, "kwargs": config.env.kwargs},
               "out_dir": str(out)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "summary.md").write_text(format_table(table, config.eval.k) + "\n")
    plot_reward_curve(history, before, after, config.eval.k, out / "reward_curve.png")
    _say(progress, format_table(table, config.eval.k))
    return summary


def format_table(table: dict[str, dict[str, float]], k: int) -> str:
    """The before/after table in markdown."""
    columns = [(f"avg@{k}/reward", "F1 (avg@k)"), (f"avg@{k}/correct", "EM (avg@k)"),
               (f"pass@{k}/correct", "EM (pass@k)"), ("answered", "answered"), ("turns", "turns"),
               ("searches", "searches")]
    lines = ["| policy | " + " | ".join(name for _, name in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for policy, row in table.items():
        lines.append(f"| {policy} | " + " | ".join(f"{row[key]:.3f}" if key.startswith(("avg", "pass", "answered"))
                                                   else f"{row[key]:.2f}" for key, _ in columns) + " |")
    return "\n".join(lines)


def plot_reward_curve(history: list[dict[str, float]], before: dict[str, float], after: dict[str, float], k: int,
                      path: Path) -> None:
    """Training reward per learner step, with the held-out reward before and after as reference lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    rewards = [h["episode/reward"] for h in history]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    ax.plot(steps, rewards, marker="o", markersize=3, label="training episodes (mean F1)")
    ax.axhline(before[f"avg@{k}/reward"], color="grey", linestyle="--", label="held-out, warm start")
    ax.axhline(after[f"avg@{k}/reward"], color="green", linestyle="--", label="held-out, after RL")
    ax.set_xlabel("learner step (weight version)")
    ax.set_ylabel("reward (F1)")
    ax.set_title("searchgym quickstart: async decoupled PPO on SyntheticQA")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _say(progress: bool, text: str) -> None:
    if progress:
        print(text, flush=True)
