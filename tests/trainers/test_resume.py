"""Checkpoints and --resume: a run killed with SIGKILL continues with the same versions, losing and repeating no
group."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from searchgym.trainers.config import load_config
from searchgym.trainers.launchers.local import train
from searchgym.trainers.run.checkpoint import latest_checkpoint, load_trainer_state, rollout_states, save_checkpoint
from tests.conftest import SMALL

STEPS = 5


def _overrides(run_dir: Path) -> list[str]:
    return [
        f"out_dir={run_dir}",
        f"steps={STEPS}",
        "save_every=1",
        "keep_checkpoints=2",
        f"env.kwargs.size={SMALL['size']}",
        f"env.kwargs.n_tasks={SMALL['n_tasks']}",
        "env.kwargs.max_turns=2",
        "rollout.group_size=2",
        "rollout.batch_size=2",
        "rollout.max_new_tokens=12",
        "rollout.max_staleness=1",
        "learner.drop_no_spread=false",
        "learner.lr=1e-3",
    ]


def _trained_groups(run_dir: Path) -> list[int]:
    """The data position of every group the run's learner steps trained on, in step order."""
    positions = []
    for path in sorted((run_dir / "trajectories").glob("version-*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        positions += sorted({row["group"] for row in rows})
    return positions


def test_sigkill_then_resume_loses_no_group_and_repeats_none(tmp_path, small_bundle, tiny_model_dir):
    run_dir = tmp_path / "run"
    overrides = _overrides(run_dir) + [f"model.path={tiny_model_dir}"]
    # The first run is a real process, killed without warning once it has written its second checkpoint.
    proc = subprocess.Popen(
        [sys.executable, "-m", "searchgym.cli", "train", *overrides],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        checkpoint = latest_checkpoint(run_dir) if (run_dir / "checkpoints" / "latest").exists() else None
        if checkpoint is not None and load_trainer_state(checkpoint)["step"] >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read()[-2000:]}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = load_trainer_state(latest_checkpoint(run_dir))["step"]
    assert 2 <= killed_at < STEPS

    history = train(load_config(None, overrides), resume=True, progress=False)

    assert [h["step"] for h in history] == list(range(1, STEPS + 1))
    assert [h["version"] for h in history] == [float(v) for v in range(1, STEPS + 1)]
    trained = _trained_groups(run_dir)
    assert len(trained) == STEPS * 2 and len(set(trained)) == len(trained), trained  # none repeated
    final = load_trainer_state(latest_checkpoint(run_dir))
    assert final["step"] == STEPS and final["learner"]["version"] == STEPS
    [rollout] = rollout_states(final)
    owed = rollout["replay"]  # started and not yet trained when the last checkpoint was taken
    assert not set(owed) & set(trained)
    assert sorted(set(trained) | set(owed)) == list(range(rollout["position"]))  # none lost
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step-*")) == ["step-00004", "step-00005"]


def test_resume_without_a_checkpoint_starts_fresh(tmp_path, small_bundle, tiny_model_dir):
    overrides = _overrides(tmp_path) + [f"model.path={tiny_model_dir}", "steps=1"]
    history = train(load_config(None, overrides), resume=True, progress=False)
    assert [h["version"] for h in history] == [1.0]
    resumed = train(load_config(None, [*overrides[:-1], "steps=2"]), resume=True, progress=False)
    assert [h["step"] for h in resumed] == [1, 2]  # the first step is kept, not trained again


def test_a_partial_checkpoint_never_replaces_the_last_whole_one(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    first = save_checkpoint(tmp_path, 1, model=model, tokenizer=tokenizer, state={"x": 1})
    (tmp_path / "checkpoints" / ".partial-step-00002-123").mkdir()  # what a kill mid-write leaves
    assert latest_checkpoint(tmp_path) == first
    assert load_trainer_state(first) == {"x": 1, "step": 1}
    reloaded = AutoModelForCausalLM.from_pretrained(first)  # a checkpoint is a usable model directory
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), reloaded.state_dict().values(), strict=True)
    )
    (tmp_path / "checkpoints" / "latest").write_text("step-00009\n")
    with pytest.raises(FileNotFoundError, match="damaged"):
        latest_checkpoint(tmp_path)
