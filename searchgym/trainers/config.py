"""Training configs: dataclasses loaded with OmegaConf from YAML plus dotted command-line overrides.

`load_config("configs/quickstart-cpu.yaml", ["learner.lr=1e-6", "rollout.max_staleness=2"])` gives a
typed `TrainConfig`; unknown keys and wrong types are errors that name the key.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

from searchgym.trainers.learner import LearnerConfig


@dataclass
class EnvConfig:
    """Which env trains the agent, and its kwargs (as for gym.make)."""

    id: str = "searchgym/SyntheticQA-v0"
    kwargs: dict[str, Any] = field(default_factory=lambda: {"size": 1000, "n_tasks": 200, "split": "train",
                                                              "max_turns": 4})


@dataclass
class ModelConfig:
    """The policy: a Hugging Face model directory, or None for a fresh tiny model built into the run."""

    path: str | None = None
    device: str = "cpu"


@dataclass
class RolloutConfig:
    """How episodes are generated (units: groups of `group_size` episodes of one task)."""

    group_size: int = 4
    batch_size: int = 4
    max_staleness: int = 1
    max_concurrent_rollouts: int = 32
    max_new_tokens: int = 64
    temperature: float = 1.0
    max_context: int = 4096
    tool_format: str = "tags"


@dataclass
class TrainConfig:
    """One training run. mode "sync" is the same code with staleness 0: generate a batch, then train."""

    steps: int = 10
    mode: str = "async"
    seed: int = 0
    out_dir: str = "runs/train"
    save_every: int = 10  # learner steps between checkpoints (the last step always saves one)
    keep_checkpoints: int = 2
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Defaults, then the YAML file, then `key.sub=value` overrides; validated against the dataclasses."""
    merged = OmegaConf.structured(TrainConfig)
    if path is not None:
        merged = OmegaConf.merge(merged, OmegaConf.load(path))
    merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(list(overrides)))
    config: TrainConfig = OmegaConf.to_object(merged)
    if config.save_every < 1 or config.keep_checkpoints < 1:
        raise ValueError("save_every and keep_checkpoints must be at least 1")
    if config.mode not in ("async", "sync"):
        raise ValueError(f"mode must be 'async' or 'sync', got {config.mode!r}")
    return config


def config_dict(config: TrainConfig) -> dict[str, Any]:
    """The config as plain JSON-ready data (what a run directory's config.json holds)."""
    return OmegaConf.to_container(OmegaConf.structured(config))
