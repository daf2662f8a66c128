"""The stock `searchgym train` and `searchgym eval` commands as tests run them on the small world and a tiny model,
so a test names only what it varies (its workflow or agent, the env kwargs, k) and reads back what the run wrote."""

import json
from pathlib import Path

from searchgym.agents.trajectory import Trajectory
from searchgym.cli import main as cli_main
from tests.conftest import SMALL


def train_small(model_dir: Path, run_dir: Path, *settings: str, max_turns: int = 3, steps: int = 2) -> list[Trajectory]:
    """`searchgym train` for `steps` steps of two groups of two on the small world's train split (12-token replies,
    no group dropped for lack of spread), plus `settings`; the trajectories it trained on."""
    env_kwargs = {**SMALL, "split": "train", "max_turns": max_turns}
    args = ["train", f"out_dir={run_dir}", f"steps={steps}", f"model.path={model_dir}"]
    args += [f"env.kwargs.{k}={v}" for k, v in env_kwargs.items()]
    args += [
        "rollout.group_size=2",
        "rollout.batch_size=2",
        "rollout.max_new_tokens=12",
        "learner.drop_no_spread=false",
    ]
    assert cli_main([*args, *settings]) == 0
    return [
        Trajectory.from_dict(json.loads(line))
        for path in sorted((run_dir / "trajectories").glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def eval_small(
    model_dir: Path, out: Path, *flags: str, env_kwargs: dict | None = None, k: int = 1, max_tasks: int = 2
) -> list[dict]:
    """`searchgym eval` on the small world's test split (max_turns 3 unless `env_kwargs` say otherwise, 12-token
    replies unless `flags` say otherwise), plus `flags`; the rows of samples.jsonl."""
    env_kwargs = {**SMALL, "split": "test", "max_turns": 3, **(env_kwargs or {})}
    args = ["eval", "--env", "searchgym/SyntheticQA-v0", "--engine", str(model_dir), "--out", str(out)]
    args += ["--env-kwargs", json.dumps(env_kwargs), "--k", str(k), "--max-tasks", str(max_tasks)]
    if "--max-new-tokens" not in flags:
        args += ["--max-new-tokens", "12"]
    assert cli_main([*args, *flags]) == 0
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
