"""`searchgym train` with a sharded learner (learner.ranks=2: FSDP2 on gloo, rank 0 the training process, rank 1 a
follower it spawns): each step's weights equal the single-rank learner's on the same batches, a leader killed with
SIGKILL takes its follower with it and the run resumes sharded, and a dead follower fails the run with its name."""

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from searchgym.agents.trajectory import Trajectory
from searchgym.trainers.algorithm.learner import Learner
from searchgym.trainers.build import load_learner
from searchgym.trainers.config import load_config
from searchgym.trainers.launchers.local import train
from searchgym.trainers.run.checkpoint import latest_checkpoint, load_trainer_state
from searchgym.trainers.run.start import check_resume
from tests.conftest import SMALL
from tests.test_quickstart import SHAPED_ID  # a SyntheticQA whose unanswered episodes earn different rewards

STEPS = 3
REPO = Path(__file__).parents[2]


def _overrides(run_dir: Path, model_dir: Path, steps: int = STEPS) -> list[str]:
    return [
        f"out_dir={run_dir}",
        f"steps={steps}",
        "mode=sync",
        "seed=3",
        "save_every=1",
        f"keep_checkpoints={STEPS}",
        f"model.path={model_dir}",
        f"env.id={SHAPED_ID}",
        f"env.kwargs.size={SMALL['size']}",
        f"env.kwargs.n_tasks={SMALL['n_tasks']}",
        "env.kwargs.max_turns=2",
        "rollout.group_size=2",
        "rollout.batch_size=2",
        "rollout.max_new_tokens=12",
        "learner.drop_no_spread=false",
        "learner.lr=1e-3",
        "learner.ranks=2",
    ]


def _train_process(overrides: list[str]) -> subprocess.Popen:
    """`searchgym train` as its own process, the shaped env registered (one torch thread per rank: two cores here)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.trainers.test_sharded_train", "train", *overrides],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
    )


def _wait_for_checkpoint(proc: subprocess.Popen, run_dir: Path, step: int) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if (run_dir / "checkpoints" / "latest").exists() and load_trainer_state(latest_checkpoint(run_dir))[
            "step"
        ] >= step:
            return
        time.sleep(0.05)
    raise AssertionError(
        f"no checkpoint of step {step}: {proc.stderr.read()[-3000:] if proc.poll() is not None else ''}"
    )


def _followers(pid: int) -> list[int]:
    """The learner ranks a training process spawned (its multiprocessing-spawn children)."""
    children = [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]
    return [c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _wait_gone(pids: list[int], seconds: float = 30) -> list[int]:
    """The pids still alive after up to `seconds` (a follower notices its parent's death within a second)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def _batch(run_dir: Path, version: int) -> list[list[Trajectory]]:
    """The groups the step from `version` trained on, in the order the run recorded them."""
    groups: dict[int, list[Trajectory]] = {}
    for line in (run_dir / "trajectories" / f"version-{version:05d}.jsonl").read_text().splitlines():
        traj = Trajectory.from_dict(json.loads(line))
        groups.setdefault(traj.group, []).append(traj)
    return list(groups.values())


def test_two_learner_ranks_train_like_one_and_a_killed_leader_resumes_sharded(
    tmp_path, small_bundle, tiny_model_dir, one_torch_thread
):
    run_dir = tmp_path / "run"
    overrides = _overrides(run_dir, tiny_model_dir)
    proc = _train_process(overrides)
    _wait_for_checkpoint(proc, run_dir, 2)
    followers = _followers(proc.pid)
    assert len(followers) == 1 and proc.poll() is None  # rank 1 runs beside the leader
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _wait_gone(followers) == []  # the follower died with its leader: no orphan holding the shards
    assert load_trainer_state(latest_checkpoint(run_dir))["step"] == 2
    assert (latest_checkpoint(run_dir) / "sharded").is_dir()

    history = train(load_config(None, overrides), resume=True, progress=False)
    assert [h["step"] for h in history] == [1, 2, 3] and [h["version"] for h in history] == [1.0, 2.0, 3.0]
    assert all(h["grad_norm"] > 0 for h in history)  # rewards differed in every batch: real gradients
    assert multiprocessing.active_children() == []  # the resumed run's follower exited with it

    # the single-rank learner on the batches the sharded run trained on reaches the same weights after each step
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    learner = Learner(model, load_config(None, overrides).learner)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    for version in range(STEPS):
        learner.step(_batch(run_dir, version))
        saved = AutoModelForCausalLM.from_pretrained(
            run_dir / "checkpoints" / f"step-{version + 1:05d}", dtype=torch.float32
        ).state_dict()
        want = model.state_dict()
        for name in want:
            torch.testing.assert_close(saved[name], want[name], msg=name)  # fp32 tolerance: summation order only
    assert max((want[k] - initial[k]).abs().max().item() for k in initial) > 1e-3  # 100x the tolerance
    state = load_trainer_state(latest_checkpoint(run_dir))
    assert state["step"] == STEPS and state["learner"]["version"] == STEPS and state["learner"]["sharded_ranks"] == 2


def test_a_dead_follower_fails_the_run_naming_it(tmp_path, small_bundle, tiny_model_dir):
    run_dir = tmp_path / "run"
    proc = _train_process(_overrides(run_dir, tiny_model_dir, steps=1000))
    _wait_for_checkpoint(proc, run_dir, 1)
    [follower] = _followers(proc.pid)
    os.kill(follower, signal.SIGKILL)
    try:
        proc.wait(timeout=180)  # a failure, not a wait on a dead peer
    finally:
        proc.kill()
    stderr = proc.stderr.read()
    assert proc.returncode != 0 and f"learner rank 1 (pid {follower}) exited with code -9" in stderr, stderr[-3000:]


def test_a_checkpoint_resumes_only_with_its_kind_of_learner(tmp_path, tiny_model_dir):
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    single.mkdir()
    (sharded / "sharded").mkdir(parents=True)
    check_resume(single, 1)
    check_resume(sharded, 2)
    with pytest.raises(ValueError, match="single-rank learner: resume it with learner.ranks=1"):
        check_resume(single, 2)  # refused before any follower starts
    with pytest.raises(ValueError, match="sharded learner"):
        check_resume(sharded, 1)
    config = load_config(None, _overrides(tmp_path, tiny_model_dir))
    with pytest.raises(ValueError, match="learner.ranks=2"):
        load_learner(
            config.model,
            config.learner,
            tiny_model_dir,
            pad_id=0,
            state={"learner": {"sharded_ranks": 2, "version": 2, "scheduler": {}}},
        )


if __name__ == "__main__":  # the training process of the tests above: the CLI, with the shaped env registered
    from searchgym.cli import main

    sys.exit(main(sys.argv[1:]))
