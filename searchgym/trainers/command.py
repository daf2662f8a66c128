"""`searchgym train`: the command's own flags (the training settings themselves are `TrainConfig`, loaded from
`--config` and dotted overrides) and what it runs: the training, or with `dry_run` only its resource plan."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchgym.settings import setting


@dataclass
class TrainCommand:
    """Which training settings (a YAML and dotted overrides of `TrainConfig`), and whether to run or only plan."""

    config: Path | None = setting(None, help="a YAML config (see configs/)")
    resume: bool = setting(
        False, help="continue from out_dir's latest checkpoint (same versions and data order); none: start fresh"
    )
    dry_run: bool = setting(
        False, help="start nothing: print the resource plan and a per-GPU memory estimate; exit 2 if it cannot fit"
    )
    json: bool = setting(False, help="with --dry-run: the plan as JSON")
    gpu_memory_gib: float | None = setting(None, help="with --dry-run: memory of one GPU (default 80)")
    host_memory_gib: float | None = setting(
        None,
        help="with --dry-run and a CPU learner: the host memory to fit (default: this machine's available memory)",
    )
    overrides: list[str] = setting(
        default_factory=list, help="dotted overrides, e.g. learner.lr=1e-6 rollout.max_staleness=2"
    )


def train_command(command: TrainCommand) -> None:
    """Train (locally or on Ray, as the config says) and print the last step's episode figures; or plan only."""
    from searchgym.trainers.config import load_config

    config = load_config(command.config, command.overrides)
    if command.dry_run:
        print_plan(config, command)
        return
    if command.json or command.gpu_memory_gib is not None or command.host_memory_gib is not None:
        raise ValueError("--json, --gpu-memory-gib and --host-memory-gib describe a plan: add --dry-run")
    if config.launcher == "ray":
        from searchgym.trainers.launchers.ray_cluster import train_ray as train
    else:
        from searchgym.trainers.launchers.local import train
    history = train(config, resume=command.resume)
    last = history[-1] if history else {}
    shown = {k: last[k] for k in sorted(last) if k.startswith("episode/") or k in ("loss", "version")}
    print(json.dumps(shown, indent=2))


def print_plan(config: Any, command: TrainCommand) -> None:
    """`train --dry-run`: print the resource plan and the per-GPU (or, on CPU, host) memory estimate; refuse
    (status 2) what cannot fit."""
    from searchgym.trainers.plan import PlanError, make_plan, plan_text

    gpu = 80.0 if command.gpu_memory_gib is None else command.gpu_memory_gib
    plan = make_plan(config, gpu_memory_gib=gpu, host_memory_gib=command.host_memory_gib)
    if command.json:
        print(json.dumps(plan.to_json(), indent=2))
    else:
        print("dry run: nothing started, nothing written\n")
        print(plan_text(plan))
    if plan.refusal:
        raise PlanError(f"this plan does not fit: {plan.refusal}")
