"""`searchgym bench levers` on the tiny model: each lever's arm does what it says to the learner step (two threads
and half the micro-batch give the baseline's update, bf16 nearly, frozen layers a different one that leaves the
lower layers alone), every figure is paired with the baseline's, and an RL run's step costs are read."""

from __future__ import annotations

import json
import re
from pathlib import Path

from searchgym.bench.levers import LeversConfig, format_levers, run_levers_bench, step_costs
from searchgym.cli import main
from tests.conftest import SMALL


def test_each_lever_changes_the_step_as_it_says(tiny_model_dir, small_bundle, tmp_path, one_torch_thread):
    run = tmp_path / "rl"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        "\n".join(
            json.dumps(
                {
                    "step": s,
                    "elapsed_s": 10.0 * s,  # the engine's counters and the clock are cumulative
                    "engine/busy_s": 5.0 * s,
                    "learner/step_s": 6.0 if s < 3 else 0.0,  # step 3 had no group with spread: no update
                    "trained_tokens": 100 if s < 3 else 0,
                }
            )
            for s in (1, 2, 3)
        )
    )
    config = LeversConfig(
        model=str(tiny_model_dir),
        groups=2,
        group_size=2,
        max_new_tokens=8,
        repeats=2,
        trainable_layers=1,
        micro_batch_tokens=256,
        lr=1e-3,
        world_size=SMALL["size"],
        world_tasks=SMALL["n_tasks"],
        run=str(run),
    )
    report = run_levers_bench(config, out=tmp_path / "levers.json")
    assert json.loads((tmp_path / "levers.json").read_text())["arms"].keys() == report["arms"].keys()
    arms = report["arms"]
    assert list(arms) == [
        "fp32, 1 thread", "fp32, 2 threads", "bf16 autocast", "top 1 layers trainable", "half micro-batch",
    ]  # fmt: skip
    assert abs(arms["fp32, 1 thread"]["update_cosine_vs_baseline"] - 1.0) < 1e-9
    assert arms["fp32, 1 thread"]["logprob_mean_abs_diff_after_step"] == 0.0
    for exact in ("fp32, 2 threads", "half micro-batch"):  # the same update, summed in another order
        assert arms[exact]["update_cosine_vs_baseline"] > 0.999, exact
        assert arms[exact]["logprob_mean_abs_diff_after_step"] < 1e-4, exact
    assert 0.9 < arms["bf16 autocast"]["update_cosine_vs_baseline"] < 1.0
    frozen = arms["top 1 layers trainable"]["update_cosine_vs_baseline"]
    assert 0.0 < frozen < 0.99  # it learns something else: only the top layer moves
    assert all(len(arm["seconds"]) == 2 and arm["median_seconds"] > 0 for arm in arms.values())
    assert report["batch"]["episodes"] == 4 and report["batch"]["trained_tokens"] > 0
    costs = report["preset_step_costs"]
    assert costs["wall_s_per_step"] == 10.0 and costs["steps"] == 3 and costs["updated_steps"] == 2
    assert costs["learner_s_per_step"] == 4.0 and costs["learner_s_per_update"] == 6.0
    assert "| bf16 autocast |" in format_levers(report)
    assert step_costs(run)["engine_busy_s_per_step"] == 5.0


def test_the_command_checks_its_settings(capsys):
    assert main(["bench", "levers", "repeats=0"]) == 2
    assert "repeats" in capsys.readouterr().err


def test_benchmarks_md_quotes_the_committed_levers_file():
    """docs/benchmarks.md's CPU levers table and step-cost bullet are the committed SmolLM2 report, column by column
    (a rerun that changes the file must change the page)."""
    root = Path(__file__).resolve().parents[2]
    report = json.loads((root / "results" / "bench_levers_smollm2.json").read_text())
    page = (root / "docs" / "benchmarks.md").read_text()
    section = page[page.index("## CPU levers") : page.index("## Async vs sync training")]
    rows = {
        re.sub(r" \(.*\)| of \d+", "", cells[0]): cells[1:]
        for line in section.splitlines()
        if line.startswith("| ") and not line.startswith("| arm")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert set(rows) == set(report["arms"]), (set(rows), set(report["arms"]))

    def shown(cell: str) -> list[str]:
        return re.findall(r"\[([\d.]+)x?\]", cell) or [cell]

    def same(value: float, figure: str) -> bool:
        return f"{value:.{len(figure.partition('.')[2])}f}" == figure

    for name, arm in report["arms"].items():
        seconds, speed, peak, cosine, drift = (shown(c) for c in rows[name])
        s = arm["speedup_vs_baseline"]
        columns = [
            (seconds, [arm["median_seconds"]]),
            (speed, [s["median"], s["min"], s["max"]]),
            (peak, [arm["peak_gib_over_start"]]),
            (cosine, [arm["update_cosine_vs_baseline"]]),
            (drift, [arm["logprob_mean_abs_diff_after_step"]]),
        ]
        if name == "fp32, 1 thread":  # the baseline against itself: 1x, cosine 1, no change
            assert (speed, cosine, drift) == (["1"], ["1"], ["0"])
            columns = [columns[0], columns[2]]
        for figures, values in columns:
            assert len(figures) == len(values) and all(map(same, values, figures)), (name, figures, values)
    costs = report["preset_step_costs"]
    bullet = section[section.index("- **What an RL step costs**") :]
    quoted = [float(x) for x in re.findall(r"\[([\d.]+)\]", bullet)]
    expected = [
        costs["wall_s_per_step"],
        costs["engine_busy_s_per_step"],
        costs["generated_tokens_per_step"],
        costs["learner_s_per_step"],
        costs["updated_steps"],
        costs["learner_s_per_update"],
    ]
    assert quoted == [round(v) for v in expected], (quoted, expected)
