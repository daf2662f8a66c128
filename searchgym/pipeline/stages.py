"""The pipeline's stages, one function each: world, demonstrations, base model, warm start, RL, evaluation.

`searchgym quickstart` (searchgym/quickstart.py) runs them once; `searchgym bench learning`
(searchgym/bench/learning.py) runs them once per seed. Their config is `QuickstartConfig`, whose defaults
configs/quickstart.yaml spells out (a test asserts they are equal).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import searchgym  # noqa: F401  (registers the env ids)
from searchgym.agents.scripted import demonstrations
from searchgym.agents.tiny_model import TinyShape, build_tiny_model
from searchgym.envs.factory import make_unwrapped
from searchgym.eval.eval_settings import EvalSettings
from searchgym.eval.harness import run_eval
from searchgym.settings import load_settings, setting
from searchgym.trainers.config import EnvConfig, LearnerConfig, RolloutConfig, TrainConfig
from searchgym.trainers.launchers.local import train
from searchgym.trainers.warm_start.copy_pretrain import CopyPretrainConfig, copy_pretrain
from searchgym.trainers.warm_start.sft import SFTConfig
from searchgym.world.bundle import world_build_progress

ENV_KWARGS = {
    "size": 20000,
    "n_tasks": 20000,
    "hops": 1,
    "top_k": 2,
    "doc_chars": 200,
    "max_turns": 4,
    "judge": "f1",
    "instructions": "brief",
}


# The quickstart on a real pretrained model: overrides of QuickstartConfig, shared by `searchgym quickstart --preset
# smollm2` and `searchgym bench learning --preset smollm2` (which runs them over seeds). A real chat model reads
# ASearcher's full instructions and searches the entity's name; it warm-starts on 128 demonstrations (a CPU budget)
# at a fine-tuning learning rate, and RL takes 20 small steps (4 groups of 8 episodes) at PPO's usual 1e-5, in
# learner micro-batches of 2,048 tokens (at 4,096 a 2-hop run's process reached 22.4 GB beside its engine). One-hop
# questions, as the tiny quickstart's. Over 5 seeds RL gained +0.048 held-out F1 (95% +0.025 to +0.073); with 2
# groups a step one seed in five fell and the interval included zero (docs/benchmarks.md, real-model quickstart).
REAL_MODEL_PRESETS: dict[str, list[str]] = {
    "smollm2": [
        "base=smollm2-135m-instruct",
        "env.kwargs.instructions=full",
        "demos.question_query=false",
        "demos.limit=128",
        "sft.epochs=1.0",
        "sft.lr=1e-4",
        "sft.warmup_steps=2",
        "sft.batch_tokens=4096",
        "sft.micro_batch_tokens=1024",
        "rl.steps=20",
        "rl.save_every=20",
        "rl.rollout.group_size=8",
        "rl.rollout.batch_size=4",
        "rl.rollout.max_concurrent_rollouts=32",
        "rl.learner.lr=1e-5",
        "rl.learner.micro_batch_tokens=2048",
        "eval.k=2",
        "eval.max_tasks=128",
        "eval.concurrency=32",
    ]
}


@dataclass
class TinyModelConfig:
    """The policy's shape: small enough to train on a CPU in minutes, big enough to learn to copy."""

    vocab_size: int = setting(
        8192, at_least=1
    )  # a larger vocabulary keeps the world's names to few tokens, easier to copy
    hidden_size: int = setting(128, at_least=1)
    num_layers: int = setting(2, at_least=1)
    num_heads: int = setting(4, at_least=1)
    num_kv_heads: int = setting(2, at_least=1)
    intermediate_size: int = setting(384, at_least=1)
    init_std: float = 0.02  # Hugging Face's Qwen2 init; the tiny-model default (0.3) is for untrained test models


@dataclass
class DemoConfig:
    """Which training tasks the oracle demonstrates (the first `fraction`; RL trains on the rest, which the
    warm start has not memorised) and how: search the question verbatim (a copy a tiny model learns) or
    the entity's name."""

    fraction: float = setting(0.5, at_least=0, at_most=1)
    question_query: bool = True
    limit: int | None = setting(None, at_least=1)  # at most this many of them (a real model learns from hundreds)


@dataclass
class EvalConfig:
    """Held-out evaluation: k samples per test task at the sampling temperature the policy trains with."""

    k: int = setting(4, at_least=1)
    max_tasks: int = setting(128, at_least=1)
    temperature: float = setting(1.0, at_least=0)
    max_new_tokens: int = setting(48, at_least=1)
    concurrency: int = setting(64, at_least=1)


@dataclass
class QuickstartConfig:
    """The quickstart's stages; any field can be overridden from the command line (e.g. rl.steps=10)."""

    out_dir: str = "runs/quickstart"
    seed: int = 0
    # the policy to warm-start: "tiny" (a Qwen2 built and copy-pretrained here, `model` and `copy` below), a packaged
    # real model's name (`searchgym model get` converts it: smollm2-135m-instruct) or a model dir
    base: str = "tiny"
    torch_threads: int = setting(2, at_least=1)
    env: EnvConfig = field(default_factory=lambda: EnvConfig(kwargs=dict(ENV_KWARGS)))
    demos: DemoConfig = field(default_factory=DemoConfig)
    model: TinyModelConfig = field(default_factory=TinyModelConfig)
    copy: CopyPretrainConfig = field(default_factory=CopyPretrainConfig)
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(epochs=4.0, lr=2e-3, batch_tokens=4096, warmup_steps=20))
    rl: TrainConfig = field(
        default_factory=lambda: TrainConfig(
            steps=60,
            save_every=20,
            rollout=RolloutConfig(
                group_size=8,
                batch_size=6,
                max_staleness=2,
                max_concurrent_rollouts=96,
                max_new_tokens=48,
                max_context=2048,
            ),
            learner=LearnerConfig(
                lr=3e-4, warmup_steps=2, eps_clip=0.2, eps_clip_high=0.28, micro_batch_tokens=16384, std_normalize=True
            ),
        )
    )
    eval: EvalConfig = field(default_factory=EvalConfig)


def load_quickstart_config(
    overrides: list[str] | tuple[str, ...] = (),
    path: str | os.PathLike | None = None,
    values: dict[str, Any] | None = None,
    preset: str | None = None,
) -> QuickstartConfig:
    """Defaults (which `configs/quickstart.yaml` spells out), the file at `path`, `values`, then the preset's and the
    dotted overrides: `load_settings`, so every range and choice check names its dotted key (`rl.mode`)."""
    if preset is not None and preset not in REAL_MODEL_PRESETS:
        raise ValueError(f"preset: unknown {preset!r}; known: {', '.join(REAL_MODEL_PRESETS)}")
    chosen = REAL_MODEL_PRESETS[preset] if preset is not None else []
    return load_settings(QuickstartConfig, path, [*chosen, *overrides], values)


@contextlib.contextmanager
def deterministic_torch(threads: int) -> Iterator[None]:
    """Fixed thread count and deterministic torch kernels for the block, so a seed fixes every float; restored after."""
    import torch

    previous = (
        torch.get_num_threads(),
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(previous[0])
        torch.use_deterministic_algorithms(previous[1], warn_only=previous[2])


def make_env(env_id: str, kwargs: dict[str, Any], split: str, *, progress: bool = False) -> Any:
    """The env (unwrapped) for one split of the task pool; building it builds the world on first use (its steps
    shown on stderr with `progress`)."""
    with world_build_progress(progress):
        return make_unwrapped(env_id, **{**kwargs, "split": split})


def make_demos(
    env: Any, tasks: list[Any], path: Path, *, question_query: bool = True, limit: int | None = None
) -> list[list[dict[str, str]]]:
    """The oracle's solved episodes on `tasks` (the first `limit` solved, if given) as chats, also written to `path`
    (one {"messages"} per line)."""
    chats = asyncio.run(demonstrations(env, tasks, question_query=question_query, limit=limit))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats))
    return chats


@dataclass
class StageRun:
    """How a stage runs, whatever it builds: its seed, its device, and whether it shows progress, its bars and lines
    opening with `label` ("stage 3 of 6: base model", "seed 3: RL (async)")."""

    seed: int = 0
    device: str = "cpu"
    progress: bool = True
    label: str = ""


def build_base_model(
    env: Any,
    chats: list[list[dict[str, str]]],
    out: Path,
    model: TinyModelConfig,
    copy: CopyPretrainConfig,
    run: StageRun,
    *,
    base: str = "tiny",
) -> tuple[Path, list[dict[str, Any]]]:
    """The model the warm start begins from: for `base` "tiny", a fresh tiny model of `model`'s shape (tokenizer
    trained on the world and `chats`) copy-pretrained into OUT/base-model; else the real model `base` names, as it
    is (no history)."""
    if base != "tiny":
        return resolve_model(base), []
    texts = tokenizer_texts(env, chats)
    fresh = build_tiny_model(out / "init-model", TinyShape(**vars(model)), texts=texts, seed=run.seed)
    copied = out / "base-model"
    label = run.label or "copy pretraining"
    return copied, copy_pretrain(fresh, copied, copy, device=run.device, progress=run.progress, progress_label=label)


def resolve_model(name: str) -> Path:
    """A packaged model's name (converted into the cache on first use) or a model dir, as a checked model dir."""
    from searchgym.agents.model_dir import check_policy_dir
    from searchgym.agents.packaged_models import MODELS, get_model

    if name in MODELS:
        return get_model(name)
    if not Path(name).is_dir():
        raise ValueError(
            f"base {name!r}: expected 'tiny', a packaged model ({', '.join(sorted(MODELS))}) or a model dir"
        )
    return check_policy_dir(name)


def run_rl(
    rl: TrainConfig,
    model: Path,
    out: Path,
    env: EnvConfig,
    tasks: list[str] | None,
    run: StageRun,
    *,
    resume: bool = False,
) -> list[dict[str, float]]:
    """`train()` from `model` into `out` on `env`'s train split, its `tasks` (None: all); a previous run there is
    removed, unless `resume` and it is this very run (`resumable_step`): then it goes on from its latest checkpoint.
    The device is `rl.model.device`'s."""
    configure_rl(rl, model, out, env, tasks, run.seed)
    step = resumable_step(rl, out) if resume else None
    if step is None:
        shutil.rmtree(out, ignore_errors=True)  # these stages redo their own work; train() refuses old runs
    else:
        say(run.progress, f"[{run.label or 'RL'}] resuming from the checkpoint of step {step} in {out}")
    return train(rl, resume=step is not None, progress=run.progress, progress_label=run.label or None)


def configure_rl(rl: TrainConfig, model: Path, out: Path, env: EnvConfig, tasks: list[str] | None, seed: int) -> None:
    """Point `rl` at its run: `model`, out dir `out`, `env`'s train split and its `tasks`, `seed`."""
    rl.seed, rl.out_dir, rl.model.path = seed, str(out), str(model)
    rl.env = EnvConfig(id=env.id, kwargs={**env.kwargs, "split": "train"})
    rl.tasks = tasks


def resumable_step(rl: TrainConfig, out: Path) -> int | None:
    """The step of `out`'s latest checkpoint when `out` holds a run of exactly `rl` (its config.json, the same
    settings, paths and seed), else None: a run of another config, or one cut before its first checkpoint, starts
    over."""
    from searchgym.trainers.config import config_dict
    from searchgym.trainers.run.checkpoint import checkpoint_step, latest_checkpoint

    try:
        checkpoint = latest_checkpoint(out)
        recorded = json.loads((out / "config.json").read_text())
    except (OSError, ValueError):  # no run, no config, a damaged pointer or config: nothing to go on from
        return None
    if checkpoint is None or recorded != json.loads(json.dumps(config_dict(rl))):
        return None
    return checkpoint_step(checkpoint)


def evaluate_policy(model_dir: Path, out: Path, config: EvalConfig, env: EnvConfig, run: StageRun) -> dict[str, float]:
    """`run_eval` of `model_dir` into `out` on `env` (k samples per question, EM and F1 judges) on `run.device`;
    returns its metrics."""
    shutil.rmtree(out, ignore_errors=True)  # run_eval resumes: a rerun's new model must not reuse old samples
    settings = EvalSettings(
        env=env.id,
        engine=str(model_dir),
        k=config.k,
        judge="em,f1",
        env_kwargs=env.kwargs,
        max_tasks=config.max_tasks,
        concurrency=config.concurrency,
        temperature=config.temperature,
        max_new_tokens=config.max_new_tokens,
        seed=run.seed,
        device=run.device,
    )
    summary = run_eval(settings, out, progress=run.progress, progress_label=run.label or "evaluating")
    return summary["metrics"]


def tokenizer_texts(env: Any, chats: list[list[dict[str, str]]]) -> Iterator[str]:
    """What the tiny model's tokenizer is trained on: the corpus's pages (when the backend can list them)
    and the demonstrations (questions, tool tags, results), so the world's names become few tokens."""
    iter_docs = getattr(env.page_backend, "iter_docs", None)
    if iter_docs is not None:
        for doc in iter_docs():
            yield f"{doc.title}\n{doc.text}"
    for chat in chats:
        for message in chat:
            yield message["content"]


def say(progress: bool, text: str) -> None:
    """Print a pipeline's progress line when it was asked to."""
    if progress:
        print(text, flush=True)
