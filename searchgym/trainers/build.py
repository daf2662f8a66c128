"""How a run's parts are built from their configs: envs and tasks, the rollout workflow and controller, the learner."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from searchgym.agents.context import ContextPolicy, context_policy
from searchgym.agents.engines.open import EngineHandle
from searchgym.agents.engines.types import SamplingParams
from searchgym.agents.hf_bars import no_hf_bars
from searchgym.agents.workflow import Workflow, WorkflowSettings, load_object
from searchgym.envs.factory import make_unwrapped
from searchgym.envs.search_env import SearchEnv
from searchgym.serve.program import build_player
from searchgym.trainers.algorithm.learner import Learner
from searchgym.trainers.config import EnvConfig, LearnerConfig, ModelConfig, RolloutConfig
from searchgym.trainers.rollout.controller import GroupLimits, RolloutController


def make_env_factory(env: EnvConfig) -> Callable[[], SearchEnv]:
    """A function that makes one fresh env of the configured id and kwargs (`make_unwrapped`)."""
    env_id, kwargs = env.id, dict(env.kwargs)

    def make_env() -> SearchEnv:
        return make_unwrapped(env_id, **kwargs)

    return make_env


def task_ids(make_env: Callable[[], SearchEnv], only: Sequence[str] | None = None) -> list[str]:
    """The ids of the env's task pool in the pool's order, or `only` (checked to be in the pool) in its order."""
    env = make_env()
    try:
        ids = [task.id for task in env.tasks]
    finally:
        env.close()
    if only is None:
        return ids
    missing = sorted(set(only) - set(ids))
    if missing:
        raise ValueError(f"{len(missing)} of the configured tasks are not in the env's pool, e.g. {missing[:3]}")
    return list(only)


def workflow_settings(rollout: RolloutConfig) -> WorkflowSettings:
    """How the run's episodes are generated (sampling, context budget and policy, observation role)."""
    return WorkflowSettings(
        SamplingParams(max_new_tokens=rollout.max_new_tokens, temperature=rollout.temperature),
        max_context=rollout.max_context,
        observation_role=rollout.observation_role,
        context=rollout_context_policy(rollout),
        max_segments=rollout.max_segments,
        system_prompt=rollout.system_prompt,
    )


def rollout_context_policy(rollout: RolloutConfig) -> ContextPolicy:
    """The run's context policy: a built-in name, or a ContextPolicy subclass named "module:Class" / "file.py:Class"."""
    if ":" not in rollout.context_policy:
        return context_policy(rollout.context_policy, summary_tokens=rollout.summary_tokens)
    cls = load_object(rollout.context_policy)
    if not (isinstance(cls, type) and issubclass(cls, ContextPolicy)):
        raise ValueError(
            f"rollout.context_policy {rollout.context_policy!r} is not a ContextPolicy subclass "
            "(searchgym.agents.context)"
        )
    return cls()


def rollout_workflow(rollout: RolloutConfig, handle: EngineHandle) -> Workflow:
    """The run's workflow on its engine: `rollout.workflow` names a custom Workflow class, `rollout.agent` an agent
    program played through the recording proxy (serve/program.py); the env's own `tool_format` decides the stop
    strings."""
    if rollout.agent is not None and rollout.workflow is not None:
        raise ValueError("rollout.agent and rollout.workflow both name what plays the episodes: set one")
    settings = workflow_settings(rollout)
    return build_player(handle, workflow=rollout.agent or rollout.workflow, settings=settings)


def build_controller(
    rollout: RolloutConfig,
    handle: EngineHandle,
    tasks: Sequence[str],
    *,
    make_env: Callable[[], SearchEnv],
    synchronous: bool,
    seed: int,
    shares: int = 1,
) -> RolloutController:
    """A rollout controller playing the run's workflow on `handle`'s engine, with the run's rollout settings, on
    `1/shares` of the batch and of the concurrency.

    `synchronous` (`mode: sync`) means staleness 0: no group starts before the previous batch is trained.
    """
    workflow = rollout_workflow(rollout, handle)
    limits = GroupLimits(
        group_size=rollout.group_size,
        batch_size=rollout.batch_size // shares,
        max_staleness=0 if synchronous else rollout.max_staleness,
        max_concurrent_rollouts=rollout.max_concurrent_rollouts // shares,
    )
    return RolloutController(make_env, workflow, list(tasks), limits, engine=handle.engine, seed=seed)


def torch_dtype(name: str) -> torch.dtype:
    """ "bfloat16" -> torch.bfloat16; refuses names that are not torch floating dtypes."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"model.dtype {name!r} is not a torch floating-point dtype")
    return dtype


def load_learner(
    model: ModelConfig,
    settings: LearnerConfig,
    model_dir: Path | str,
    *,
    pad_id: int | None,
    state: dict[str, Any] | None = None,
    device: str | None = None,
) -> Learner:
    """The learner on `model_dir`'s weights (on `device`, default model.device; in model.dtype), with optimizer state
    from `state`."""
    from transformers import AutoModelForCausalLM

    if state and "sharded_ranks" in state["learner"]:
        raise ValueError(
            f"the checkpoint was written by a sharded learner of {state['learner']['sharded_ranks']} "
            f"ranks: resume it with learner.ranks={state['learner']['sharded_ranks']}"
        )
    with no_hf_bars():
        weights = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype(model.dtype))
    learner = Learner(
        weights.to(device or model.device),
        settings,
        pad_id=pad_id or 0,
        version=int(state["learner"]["version"]) if state else 0,
    )
    if state:
        learner.load_state_dict(state["learner"])
    return learner
