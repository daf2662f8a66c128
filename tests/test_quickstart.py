"""`searchgym quickstart` end to end at a toy scale: every stage runs and leaves its outputs."""
import json

import pytest

from searchgym.quickstart import load_quickstart_config, run_quickstart
from tests.conftest import SMALL


def test_quickstart_runs_every_stage_and_writes_its_results(tmp_path, small_bundle):
    config = load_quickstart_config([
        f"out_dir={tmp_path}", f"env.kwargs.size={SMALL['size']}", f"env.kwargs.n_tasks={SMALL['n_tasks']}", "env.kwargs.hops=null",
        "model.hidden_size=32", "model.intermediate_size=64", "model.vocab_size=512", "copy.steps=3", "copy.batch_size=4",
        "sft.epochs=0.3", "rl.steps=2", "rl.rollout.group_size=2", "rl.rollout.batch_size=2",
        "rl.rollout.max_new_tokens=16", "rl.learner.drop_no_spread=false",
        "eval.max_tasks=4", "eval.k=2", "eval.max_new_tokens=16",
    ])
    summary = run_quickstart(config, progress=False)

    table = summary["table"]
    assert set(table) == {"warm start (SFT)", "warm start + async RL"}
    for row in table.values():
        assert row["tasks"] == 4 and row["samples"] == 8
        assert 0.0 <= row["avg@2/reward"] <= 1.0 and 0.0 <= row["pass@2/correct"] <= 1.0
    assert summary["demos"] > 0 and summary["rl_steps"] == 2 and 0.0 <= summary["copy_accuracy"] <= 1.0
    gain = summary["rl_gain"]
    assert gain["tasks"] == 4 and gain["ci95_low"] <= gain["gain"] <= gain["ci95_high"]
    assert gain["gain"] == pytest.approx(table["warm start + async RL"]["avg@2/reward"] - table["warm start (SFT)"]["avg@2/reward"])
    assert json.loads((tmp_path / "summary.json").read_text())["table"] == table
    assert "| warm start + async RL |" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((tmp_path / "rl" / "tensorboard").glob("events.out.tfevents.*"))
    assert (tmp_path / "rl" / "checkpoints" / "step-00002" / "model.safetensors").exists()
    assert (tmp_path / "demos.jsonl").read_text().count("\n") == summary["demos"]
