"""The local launcher: fully asynchronous decoupled-PPO training in one process, one event loop.

Rollouts never wait for training: the rollout controller keeps episode groups in flight under the
staleness rule while the learner trains on the oldest finished groups in a worker thread. After each
learner step the new weights go to the engine in-process, between its decode steps; in-flight
generations continue and their later tokens carry the new version. `mode: sync` is the same code
with staleness 0, so no group starts before the previous batch is trained (the baseline).
"""
from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import gymnasium as gym
import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM

import searchgym  # noqa: F401  (registers the env ids)
from searchgym.agents.engines.torch_engine import TorchEngine
from searchgym.agents.engines.types import SamplingParams
from searchgym.agents.tiny_model import build_tiny_model
from searchgym.trainers.checkpoint import latest_checkpoint, load_trainer_state, save_checkpoint
from searchgym.trainers.config import TrainConfig, config_dict
from searchgym.trainers.learner import Learner
from searchgym.trainers.rollout import RolloutController
from searchgym.trainers.run_log import RunLog, episode_metrics

log = logging.getLogger(__name__)


def train(config: TrainConfig, *, resume: bool = False, progress: bool = True) -> list[dict[str, float]]:
    """Train until step `config.steps`; returns every step's metrics (also in TensorBoard and metrics.jsonl).

    With `resume`, continue from the run directory's latest checkpoint (same version numbering, same
    data order, unfinished groups replayed); without a checkpoint it starts from scratch.
    """
    return asyncio.run(_train(config, resume, progress))


async def _train(config: TrainConfig, resume: bool, progress: bool) -> list[dict[str, float]]:
    out = Path(config.out_dir)
    checkpoint = latest_checkpoint(out) if resume else None
    state = load_trainer_state(checkpoint) if checkpoint else {}
    if checkpoint is None:
        model_dir = config.model.path or build_tiny_model(out / "init-model", seed=config.seed)
    else:
        model_dir = checkpoint
        log.info("resuming from %s (step %d, version %d)", checkpoint, state["step"], state["learner"]["version"])
    version = state["learner"]["version"] if state else 0
    engine = TorchEngine(model_dir, device=config.model.device, seed=config.seed, version=version)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(config.model.device)
    learner = Learner(model, config.learner, pad_id=engine.tokenizer.pad_token_id or 0, version=version)
    if state:
        learner.load_state_dict(state["learner"])

    def make_env():
        return gym.make(config.env.id, **config.env.kwargs).unwrapped

    rollout = config.rollout
    controller = RolloutController(
        make_env, engine, engine.tokenizer, make_env().tasks, group_size=rollout.group_size,
        batch_size=rollout.batch_size, max_staleness=0 if config.mode == "sync" else rollout.max_staleness,
        max_concurrent_rollouts=rollout.max_concurrent_rollouts,
        sampling=SamplingParams(max_new_tokens=rollout.max_new_tokens, temperature=rollout.temperature),
        max_context=rollout.max_context, tool_format=rollout.tool_format, seed=config.seed)
    if state:
        controller.load_state_dict(state["rollout"])
    first_step = state.get("step", 0) + 1
    run_log = RunLog(out, config_dict(config), resume_step=first_step - 1)
    rollouts = asyncio.create_task(controller.run())
    started = time.perf_counter()
    try:
        for step in tqdm(range(first_step, config.steps + 1), desc=f"training ({config.mode})",
                         disable=not progress, initial=first_step - 1, total=config.steps):
            batch = await controller.get_batch()
            trained_version = learner.version
            stats = await asyncio.to_thread(learner.step, batch)
            await engine.update_weights(learner.model.state_dict(), learner.version)
            controller.trained_version = learner.version
            elapsed = time.perf_counter() - started
            stats.update(episode_metrics(batch), elapsed_s=elapsed,
                         trajectories_per_s=(step - first_step + 1) * rollout.batch_size * rollout.group_size / elapsed)
            stats.update(_rollout_metrics(controller))
            run_log.record(step, stats, batch, trained_version)
            if step % config.save_every == 0 or step == config.steps:
                save_checkpoint(out, step, model=learner.model, tokenizer=engine.tokenizer, keep=config.keep_checkpoints,
                                state={"learner": learner.trainer_state(), "rollout": controller.state_dict()})
    finally:
        controller.stop()
        await rollouts
        run_log.close()
        await engine.close()
    return run_log.history()


def _rollout_metrics(controller: RolloutController) -> dict[str, float]:
    """The rollout side's counters: throughput, engine idle fraction, dropped and failed groups."""
    r = controller.stats()
    out = {"rollout/episodes": float(r.episodes), "rollout/failed_groups": float(r.failed_groups),
           "rollout/rejected_groups": float(r.rejected_groups),
           "rollout/generated_tokens_per_s": r.generated_tokens / r.elapsed_s if r.elapsed_s else 0.0}
    if r.engine_idle_fraction is not None:
        out["rollout/engine_idle_fraction"] = r.engine_idle_fraction
    return out
