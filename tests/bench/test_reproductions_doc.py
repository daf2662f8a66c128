"""docs/reproductions.md is the committed results rendered: its tables and verdicts change only with the files."""

import json
import re
from pathlib import Path

import pytest

from searchgym.bench.reliability import generated_block
from searchgym.bench.reproduce import (
    CLAIMS,
    README_MARK,
    THROUGHPUT_FILE,
    THROUGHPUT_MARK,
    committed_reports,
    docs_mark,
    markdown_table,
    readme_row,
    readme_table,
    render_pages,
    short_verdict,
    throughput_table,
    update_doc,
    verdict,
)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reproductions.md"


@pytest.mark.parametrize("path", sorted((ROOT / "results").glob("reproduce_*.json")), ids=lambda p: p.stem)
def test_each_results_files_table_and_verdict_are_rendered_in_the_doc(path):
    report = json.loads(path.read_text())
    doc = DOC.read_text()
    mark = docs_mark(report["claim"], path.stem)
    assert generated_block(doc, mark) == markdown_table(report)
    assert f"{mark}\n{markdown_table(report)}\n**Verdict: {verdict(report)}**" in doc


@pytest.mark.parametrize("claim", list(CLAIMS))
def test_a_claim_without_its_results_file_shows_no_table(claim):
    if (ROOT / "results" / f"reproduce_{claim}.json").exists():
        return
    assert docs_mark(claim) not in DOC.read_text()


def test_the_throughput_table_is_bench_trainers_results_rendered():
    trainer = json.loads((ROOT / THROUGHPUT_FILE).read_text())
    assert set(trainer["sweep_by_proximal"]) == {"recompute", "behaviour"}  # both objectives, as the claim asks
    assert generated_block(DOC.read_text(), THROUGHPUT_MARK) == throughput_table(trainer)


def test_readmes_table_of_the_claims_is_the_results_files_rendered():
    readme = (ROOT / "README.md").read_text()
    assert generated_block(readme, README_MARK) == readme_table(committed_reports(ROOT / "results"))
    assert len(readme_table(committed_reports(ROOT / "results")).splitlines()) == 2 + len(CLAIMS)  # a row per claim


def test_render_pages_rewrites_a_stale_table_and_leaves_the_committed_pages_as_they_are(tmp_path):
    for name in (
        "README.md",
        "docs/reproductions.md",
        *(f"results/{p.name}" for p in (ROOT / "results").glob("reproduce_*.json")),
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((ROOT / name).read_text())
    assert render_pages(tmp_path) == []  # the committed pages are the files rendered
    results = tmp_path / "results" / "reproduce_shaping.json"
    stale = json.loads(results.read_text())
    stale["pooled"]["raw"]["tool_calls"] = 9.99
    results.write_text(json.dumps(stale))
    assert render_pages(tmp_path) == [tmp_path / "README.md", tmp_path / "docs" / "reproductions.md"]
    assert "raw [9.99](results/reproduce_shaping.json)" in (tmp_path / "README.md").read_text()
    assert "| raw | 8 | " in (tmp_path / "docs" / "reproductions.md").read_text()
    assert "| 9.99 |" in (tmp_path / "docs" / "reproductions.md").read_text()


def test_readme_rows_link_every_number_with_its_sign_outside():
    gain = {"gain": -0.0123, "ci95_low": -0.05, "ci95_high": 0.0251}
    calls = {"tool_calls": 1.5, "avg@2/reward": 0.2, "vs_baseline": gain}
    pooled = {
        "warm": {"tool_calls": 1.0, "avg@2/reward": 0.2},
        "success-only": dict(calls),
        "raw": calls,
        "clip": calls,
        "delta": calls,
    }
    row = readme_table({"shaping": report("shaping", pooled, seeds=3)}).splitlines()[-1]
    file = "(results/reproduce_shaping.json)"
    assert f"raw minus success-only -[0.050]{file} to +[0.025]{file}" in row
    assert f"raw [1.50]{file}" in row and f"[3]{file} seeds" in row and "preliminary" in row
    bare = re.sub(r"\[[^\]]*\]\([^)]*\)", "", row)
    assert not re.search(r"\d", bare), bare  # every number is a link's text
    # every verdict, preliminary or not, comes out of short_verdict without a digit, and keeps its cause
    floor_arm = {"avg@2/reward": 0.0, "vs_baseline": gain}
    for seeds in (3, 5):
        floor = report("staleness", {"warm": floor_arm, "eta4-decoupled": floor_arm, "eta4-plain": floor_arm}, seeds)
        assert short_verdict(verdict(floor)).endswith("inconclusive (every arm at the floor)")
        sync = {**calls, "vs_warm": {"gain": -0.05, "ci95_low": -0.09, "ci95_high": -0.01}}  # below its warm start
        diverged = report(
            "staleness", {"warm": calls, "eta0-decoupled": sync, "eta4-decoupled": calls, "eta4-plain": calls}, seeds
        )
        assert short_verdict(verdict(diverged)).endswith("inconclusive (the sync baseline diverged)")
        for r in (floor, diverged, report("shaping", pooled, seeds)):
            assert not re.search(r"\d", short_verdict(verdict(r)))
    assert "inconclusive (every arm at the floor)" in readme_row("staleness", floor)
    # a claim whose arms are not all run is a row that says so, not a crash
    assert readme_row("shaping", report("shaping", {"success-only": calls})).endswith("| not yet run |")
    assert readme_row("long_horizon", report("long_horizon", {"warm": calls})).endswith("| not yet run |")


def test_long_horizons_row_gives_the_held_out_tool_calls_change_its_interval_when_rows_recorded_it():
    warm = {"tool_calls": 1.0, "avg@2/reward": 0.2, "avg@2/correct": 0.2, "seeds": [0], "curve": []}
    rl = {**warm, "tool_calls": 1.6, "vs_warm": {"gain": 0.01, "ci95_low": -0.02, "ci95_high": 0.04}, "curve": []}
    change = {"gain": 0.6, "ci95_low": 0.41, "ci95_high": 0.83}
    file = "(results/reproduce_long_horizon.json)"
    with_change = readme_row(
        "long_horizon", report("long_horizon", {"warm": warm, "rl": {**rl, "tool_calls_vs_warm": change}})
    )
    assert f"tool calls [1.00]{file} -> [1.60]{file} (change +[0.410]{file} to +[0.830]{file})" in with_change
    assert "(no interval)" in readme_row("long_horizon", report("long_horizon", {"warm": warm, "rl": rl}))
    table = markdown_table(
        {**report("long_horizon", {"warm": warm, "rl": {**rl, "tool_calls_vs_warm": change}}), "k": 2}
    )
    assert "| +0.600 (+0.410 to +0.830) |" in table.splitlines()[3]


def report(claim, pooled, seeds=5):
    return {"claim": claim, "k": 2, "baseline": CLAIMS[claim].baseline, "seeds": list(range(seeds)), "pooled": pooled}


def arm(calls, low, high=None):
    d = {"gain": (low + (high if high is not None else low + 0.1)) / 2, "ci95_low": low, "ci95_high": high or low + 0.1}
    return {"tool_calls": calls, "avg@2/reward": 0.2, "vs_baseline": d, "vs_warm": d, "seeds": [0], "curve": []}


def test_the_verdicts_follow_their_rules():
    base = {"tool_calls": 1.0, "avg@2/reward": 0.2, "seeds": [0], "curve": []}
    hacked = report(
        "shaping", {"success-only": base, "raw": arm(2.0, -0.1), "clip": arm(1.0, -0.05), "delta": arm(1.1, -0.05)}
    )
    assert verdict(hacked) == "reproduced"
    no_hack = report(
        "shaping",
        {"success-only": base, "raw": arm(1.1, -0.1), "clip": arm(1.0, -0.05), "delta": arm(1.0, -0.05)},
        seeds=3,
    )
    assert verdict(no_hack).startswith("preliminary (3 of 5 seeds): partly reproduced (Clip and Delta do not hurt")
    stale = report(
        "staleness", {"eta0-decoupled": base, "eta4-decoupled": arm(1, -0.05), "eta4-plain": arm(1, -0.3, -0.1)}
    )
    assert verdict(stale) == "reproduced"
    stale["pooled"]["eta4-plain"] = arm(1, -0.05)
    assert verdict(stale).startswith("partly reproduced")
    stale["pooled"]["eta0-decoupled"] = {**base, "vs_warm": arm(1, -0.09, -0.01)["vs_baseline"]}  # sync diverged
    assert verdict(stale) == "inconclusive: the synchronous baseline itself falls below its warm start (RL diverged)"
    assert verdict(report("shaping", {"success-only": base})) == "not yet run"
    hops = {"2": {"avg@2/reward": 0.05, "tool_calls": 1.5}, "3": {"avg@2/reward": 0.0, "tool_calls": 1.5}}
    rising = [{"step": i, "episode/tool_calls": 1.0 + i / 10} for i in range(12)]
    warm = {**base, "tool_calls": 1.4, "by_hops": hops}
    rl = {**arm(1.6, 0.01), "curve": rising, "by_hops": {**hops, "2": {"avg@2/reward": 0.08, "tool_calls": 1.7}}}
    deep = report("long_horizon", {"warm": warm, "rl": rl})
    assert verdict(deep) == (
        "partly reproduced (held-out accuracy rises, held-out tool calls rise, training tool calls rise; "
        "not: the deepest questions are solved more)"
    )
    rl["by_hops"]["3"] = {"avg@2/reward": 0.01, "tool_calls": 2.0}
    assert verdict(deep) == "reproduced"
    # where the rows record each question's calls, a higher mean whose paired interval reaches zero does not count
    rl["tool_calls_vs_warm"] = {"gain": 0.2, "ci95_low": -0.01, "ci95_high": 0.4}
    assert verdict(deep) == (
        "partly reproduced (held-out accuracy rises, training tool calls rise, the deepest questions are solved more; "
        "not: held-out tool calls rise)"
    )
    rl["tool_calls_vs_warm"] = {"gain": 0.2, "ci95_low": 0.05, "ci95_high": 0.4}
    assert verdict(deep) == "reproduced"
    rl["vs_warm"] = arm(1.6, -0.01)["vs_warm"]
    assert verdict(deep) == (  # searching longer without answering better is not the claim
        "not reproduced (held-out accuracy does not rise; held: held-out tool calls rise, training tool calls rise, "
        "the deepest questions are solved more)"
    )
    floor = report(
        "staleness", {"eta0-decoupled": base, "eta4-decoupled": arm(1, 0.0, 0.0), "eta4-plain": arm(1, 0.0, 0.0)}
    )
    for p in floor["pooled"].values():
        p["avg@2/reward"] = 0.004
    assert verdict(floor).startswith("preliminary") is False and verdict(floor).startswith("inconclusive")


def test_update_doc_replaces_only_the_block_after_its_mark():
    text = "intro\nMARK\n| a |\n|---|\n\n**Verdict: old**\n\nafter\n"
    assert update_doc(text, "MARK", "| b |\n\n**Verdict: new**") == "intro\nMARK\n| b |\n\n**Verdict: new**\n\nafter\n"
