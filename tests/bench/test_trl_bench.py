"""`searchgym bench trl` without training: its per-seed resume, its summary of TRL's logs and the recorded command
(the example's own test trains for real)."""

import json
import shlex

import pytest

from searchgym.bench import trl as bench_trl
from searchgym.bench.trl import TrlBenchCommand
from searchgym.cli import build_parser
from searchgym.core.settings_flags import settings_values
from searchgym.settings import load_settings

ARGS = ["--tasks", "2", "--held-out", "2", "--steps", "4"]


def fake_result(seed: int) -> dict:
    """What examples/train_with_trl.py returns, with a reward that rises over the steps for every seed."""
    steps = [
        {
            "step": i + 1,
            "reward": 0.1 * i + 0.01 * seed,
            "reward_std": 0.2,
            "groups_with_spread": 0.5 * (i % 2),  # every other step, half the groups
            "tool_calls": 1.0 + i,
            "loss": 0.0,
        }
        for i in range(4)
    ]
    before = {"accuracy": 0.0, "tasks": [{"task_id": t, "reward": 0.0, "tool_calls": 1} for t in ("a", "b")]}
    # task b's judge failed (reward None): counted as 0, as the example counts it
    after = {"accuracy": 0.5, "tasks": [{"task_id": "a", "reward": 1.0, "tool_calls": 2}]}
    after["tasks"].append({"task_id": "b", "reward": None, "tool_calls": 0})
    sizing = {"max_completion_length": 100}
    return {"sizing": sizing, "steps": steps, "held_out_before": before, "held_out_after": after}


@pytest.fixture
def ran(monkeypatch):
    """Replace the example's `main` with `fake_result`, recording the seeds it was run with."""
    seeds: list[int] = []

    def main(argv: list[str]) -> dict:
        seed = int(argv[argv.index("--seed") + 1])
        seeds.append(seed)
        return fake_result(seed)

    monkeypatch.setattr(bench_trl.runpy, "run_path", lambda path: {"main": main})
    return seeds


def test_a_rerun_trains_only_the_seeds_not_yet_finished(tmp_path, ran):
    out = tmp_path / "bench_trl.json"
    bench_trl.run_trl_bench([0, 1], ARGS, out=out)
    summary = bench_trl.run_trl_bench([0, 1, 2], ARGS, out=out)
    assert ran == [0, 1, 2]
    assert summary["seeds"] == [0, 1, 2] and json.loads(out.read_text()) == summary
    bench_trl.run_trl_bench([0, 1, 2], [*ARGS, "--lr", "0.1"], out=out)  # other settings: trained again
    assert ran == [0, 1, 2, 0, 1, 2]


def test_the_summary_holds_tools_reward_rise_and_the_paired_held_out_gain(tmp_path, ran):
    summary = bench_trl.run_trl_bench([0, 1, 2], ARGS, out=tmp_path / "b.json")
    assert [s["tool_calls_per_rollout"] for s in summary["per_step"]] == [1.0, 2.0, 3.0, 4.0]
    assert summary["per_step"][0]["mean_reward"] == pytest.approx(0.01)
    assert [s["groups_with_spread"] for s in summary["per_step"]] == [0.0, 0.5, 0.0, 0.5]  # mean share over seeds
    rise = summary["reward_rise"]  # steps 3-4 against steps 1-2: +0.2 for every seed
    assert rise["gain"] == pytest.approx(0.2) and rise["ci95_low"] > 0 and rise["significant"]
    calls = summary["tool_calls_rise"]  # 3 and 4 calls against 1 and 2
    assert calls["gain"] == pytest.approx(2.0) and calls["significant"]
    held = summary["held_out"]
    assert (held["before"], held["after"]) == (0.0, 0.5)
    assert held["gain"]["gain"] == pytest.approx(0.5)  # task a: 0 -> 1; task b: 0 -> no verdict (0)


def test_the_recorded_command_is_one_the_cli_accepts(tmp_path, ran):
    summary = bench_trl.run_trl_bench([0, 2], ARGS, out=tmp_path / "b.json")
    argv = shlex.split(summary["command"])
    assert argv[:3] == ["searchgym", "bench", "trl"]
    args = build_parser().parse_args(argv[1:])
    command = load_settings(TrlBenchCommand, values=settings_values(args, TrlBenchCommand))
    assert command.seeds == "0,2" and [a for a in command.example_args if a != "--"] == ARGS
    assert summary["commit"] and summary["machine"]["torch_threads"] == 1


def test_no_held_out_tasks_is_refused_before_any_training(tmp_path, ran):
    with pytest.raises(ValueError, match="--held-out"):
        bench_trl.run_trl_bench([0], ["--steps", "2"], out=tmp_path / "b.json")
    assert ran == []


@pytest.mark.parametrize(
    "args, threads",
    [([], 1), (["--threads", "2"], 2), (["--threads=4"], 4), (["--steps", "3", "--threads=x"], 1), (["--threads"], 1)],
)
def test_the_machine_line_reads_the_examples_threads_in_either_spelling(args, threads):
    assert bench_trl._threads(args) == threads
