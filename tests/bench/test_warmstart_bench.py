"""`searchgym bench warmstart` at toy scale: each arm's demonstrations and episodes are in its own tool format, the
arms of a seed share their questions, and a rerun reuses every finished (seed, arm) unit."""

import json

import pytest

from searchgym.bench.warm_start import ARMS, run_warm_start_bench
from searchgym.cli import main
from tests.bench.test_learning_bench import TOY

WARM_TOY = [o for o in TOY if not o.startswith(("rl.", "bootstrap"))]
ARM_PAIR = ["tags-brief", "hermes-full"]


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    root = tmp_path_factory.mktemp("warmstart")
    overrides = [f"out_dir={root / 'runs'}", *WARM_TOY]
    report = run_warm_start_bench(
        ARM_PAIR, [0], preset="quickstart", overrides=overrides, out=root / "w.json", progress=False
    )
    return root, overrides, report


def test_each_arm_demonstrates_and_plays_in_its_own_format(bench):
    root, _, report = bench
    assert [u["arm"] for u in report["units"]] == ARM_PAIR
    for arm, fmt in zip(ARM_PAIR, ("<search>", "<tool_call>"), strict=True):
        demos = (root / "runs_warmstart" / "seed-0" / arm / "demos.jsonl").read_text()
        assert fmt in demos and (("<tool_call>" in demos) == (arm.startswith("hermes")))
        prompt = json.loads(demos.splitlines()[0])["messages"][0]["content"]
        assert ("Each turn, make exactly one tool call" in prompt) == arm.endswith("full")
    units = {u["arm"]: u for u in report["units"]}
    assert units["tags-brief"]["metrics"]["all"]["tasks"] == units["hermes-full"]["metrics"]["all"]["tasks"] > 0
    paired = report["pooled"]["hermes-full"]["minus_tags-brief"]
    assert paired["seeds"] == 1 and paired["questions"] == units["tags-brief"]["metrics"]["all"]["tasks"]
    assert 0 <= units["hermes-full"]["well_formed_turns"] <= 1


def test_a_rerun_reuses_finished_units_and_refuses_unknown_arms(bench, capsys):
    root, overrides, report = bench
    rows = (root / "runs_warmstart" / "rows.jsonl").read_text()
    again = run_warm_start_bench(ARM_PAIR, [0], preset="quickstart", overrides=overrides, out=root / "w2.json")
    assert "done before, reused" in capsys.readouterr().out
    assert (root / "runs_warmstart" / "rows.jsonl").read_text() == rows and again["pooled"] == report["pooled"]
    assert set(ARMS) >= set(ARM_PAIR)
    assert main(["bench", "warmstart", "--arms", "tags-full,json-5"]) == 2
    assert "arms: expected distinct names" in capsys.readouterr().err
