"""The local launcher: fully asynchronous decoupled-PPO training in one process, one event loop.

Rollouts never wait for training: the rollout controller keeps episode groups in flight under the
staleness rule while the learner trains on the oldest finished groups in a worker thread. After each
learner step the new weights go to the engine in-process, between its decode steps; in-flight
generations continue and their later tokens carry the new version. `mode: sync` is the same code
with staleness 0, so no group starts before the previous batch is trained (the baseline).
"""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM

import searchgym  # noqa: F401  (registers the env ids)
from searchgym.agents.engines.torch_engine import TorchEngine
from searchgym.agents.engines.types import SamplingParams
from searchgym.agents.tiny_model import build_tiny_model
from searchgym.agents.trajectory import Trajectory
from searchgym.trainers.config import TrainConfig
from searchgym.trainers.learner import Learner
from searchgym.trainers.rollout import RolloutController


def train(config: TrainConfig, *, progress: bool = True) -> list[dict[str, float]]:
    """Run `config.steps` learner steps; returns the per-step metrics (also in TensorBoard and JSONL)."""
    return asyncio.run(_train(config, progress))


async def _train(config: TrainConfig, progress: bool) -> list[dict[str, float]]:
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(_as_dict(config), indent=2) + "\n")
    model_dir = config.model.path or build_tiny_model(out / "init-model", seed=config.seed)
    engine = TorchEngine(model_dir, device=config.model.device, seed=config.seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(config.model.device)
    learner = Learner(model, config.learner, pad_id=engine.tokenizer.pad_token_id or 0)

    def make_env():
        return gym.make(config.env.id, **config.env.kwargs).unwrapped

    rollout = config.rollout
    controller = RolloutController(
        make_env, engine, engine.tokenizer, make_env().tasks, group_size=rollout.group_size,
        batch_size=rollout.batch_size, max_staleness=0 if config.mode == "sync" else rollout.max_staleness,
        max_concurrent_rollouts=rollout.max_concurrent_rollouts,
        sampling=SamplingParams(max_new_tokens=rollout.max_new_tokens, temperature=rollout.temperature),
        max_context=rollout.max_context, tool_format=rollout.tool_format, seed=config.seed)
    from torch.utils.tensorboard import SummaryWriter  # heavy import: only when training

    writer = SummaryWriter(str(out / "tensorboard"))
    history: list[dict[str, float]] = []
    rollouts = asyncio.create_task(controller.run())
    started = time.perf_counter()
    try:
        for step in tqdm(range(1, config.steps + 1), desc=f"training ({config.mode})", disable=not progress):
            batch = await controller.get_batch()
            stats = await asyncio.to_thread(learner.step, batch)
            await engine.update_weights(learner.model.state_dict(), learner.version)
            controller.trained_version = learner.version
            stats.update(_episode_metrics(batch), elapsed_s=time.perf_counter() - started)
            stats["trajectories_per_s"] = step * rollout.batch_size * rollout.group_size / stats["elapsed_s"]
            history.append(stats)
            for key, value in stats.items():
                writer.add_scalar(key, value, step)
            _dump(out / "trajectories" / f"version-{learner.version - 1:05d}.jsonl", batch)
            with open(out / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"step": step, **stats}) + "\n")
    finally:
        controller.stop()
        await rollouts
        writer.close()
        await engine.close()
    return history


def _episode_metrics(batch: list[list[Trajectory]]) -> dict[str, float]:
    """Means over the batch's episodes: reward, success, turns, tool use, generated tokens."""
    episodes = [t for group in batch for t in group]
    n = max(len(episodes), 1)
    return {
        "episode/reward": sum(t.reward for t in episodes) / n,
        "episode/success": sum(bool((t.verdict or {}).get("correct")) for t in episodes) / n,
        "episode/turns": sum(len(t.turns) for t in episodes) / n,
        "episode/searches": sum(t.counts.get("search", 0) for t in episodes) / n,
        "episode/accesses": sum(t.counts.get("access", 0) for t in episodes) / n,
        "episode/generated_tokens": sum(t.generated_tokens for t in episodes) / n,
    }


def _dump(path: Path, batch: list[list[Trajectory]]) -> None:
    """The trajectories a step trained on, one JSON line each."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for group in batch:
            for traj in group:
                f.write(json.dumps(traj.to_dict()) + "\n")


def _as_dict(config: TrainConfig) -> dict[str, Any]:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(config))
