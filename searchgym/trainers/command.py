"""`searchgym train`: the command's own flags (the training settings themselves are `TrainConfig`, loaded from
`--config` and dotted overrides) and what it runs: the training, or with `dry_run` only its resource plan."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

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
    """Train (locally or on Ray, as the config says) and print the last step's episode figures; or plan only.

    The config is loaded and checked once and its deployment resolved once, here; the plan and the launchers take
    both as they are."""
    from searchgym.trainers.config import load_config
    from searchgym.trainers.deployment import resolve_deployment

    config = load_config(command.config, command.overrides)
    deployment = resolve_deployment(config)
    if command.dry_run:
        from searchgym.trainers.plan import PlanRequest, print_plan

        print_plan(config, deployment, PlanRequest(command.gpu_memory_gib, command.host_memory_gib, command.json))
        return
    if command.json or command.gpu_memory_gib is not None or command.host_memory_gib is not None:
        raise ValueError("--json, --gpu-memory-gib and --host-memory-gib describe a plan: add --dry-run")
    if deployment.launcher == "local":
        from searchgym.trainers.launchers.local import run_local

        history = run_local(config, deployment, resume=command.resume)
    else:
        from searchgym.trainers.launchers.ray_cluster import run_ray

        history = run_ray(config, deployment, resume=command.resume)
    last = history[-1] if history else {}
    shown = {k: last[k] for k in sorted(last) if k.startswith("episode/") or k in ("loss", "version")}
    print(json.dumps(shown, indent=2))
