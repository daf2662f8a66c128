"""`searchgym bench reliability`: its tables in README and docs are renderings of results/reliability.json (never
typed by hand), the committed report shows no crash and no lost item, and the bench counts a fault that gets
through (a guard that lets an address pass, a server that answers 500) as the failure it is."""

import asyncio
import json
import random
from pathlib import Path

import pytest

from searchgym.bench import reliability
from searchgym.bench.reliability import (
    DOCS_MARK,
    README_MARK,
    ReliabilitySettings,
    generated_block,
    markdown_table,
    readme_table,
    run_reliability,
)
from searchgym.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "results" / "reliability.json"


def test_readme_and_docs_tables_are_the_committed_report_rendered():
    report = json.loads(REPORT.read_text())
    load = json.loads((ROOT / "results" / "bench_load.json").read_text())
    assert generated_block((ROOT / "README.md").read_text(), README_MARK) == readme_table(report, load)
    assert generated_block((ROOT / "docs" / "reliability.md").read_text(), DOCS_MARK) == markdown_table(report)


def test_the_committed_report_has_no_crash_and_loses_nothing():
    report = json.loads(REPORT.read_text())
    names = [row["class"] for row in report["classes"]]
    for kind in (
        "ssrf",
        "agent turns",
        "web pages",
        "server",
        "damaged caches",
        "kill: eval",
        "kill: synthesize (agent)",
        "kill: synthesize (kbwalk)",
        "kill: train",
    ):
        assert any(name.startswith(kind) for name in names), kind
    for row in report["classes"]:
        assert row["crashes"] == 0 and row["items_lost"] == 0, row
        assert row["handled"] == row["faults_injected"] > 0, row
    assert sum(row["kills_survived"] for row in report["classes"]) >= 8
    assert report["total"]["faults_injected"] == sum(row["faults_injected"] for row in report["classes"])


def test_markdown_flag_prints_the_tables_of_a_report(tmp_path, capsys):
    report = {
        "seed": 1,
        "classes": [
            {
                "class": "ssrf url forms",
                "forms_tried": 1200,
                "faults_injected": 1200,
                "handled": 1200,
                "kills_survived": 0,
                "crashes": 0,
                "items_lost": 0,
            },
            {
                "class": "kill: train",
                "forms_tried": 4,
                "faults_injected": 4,
                "handled": 4,
                "kills_survived": 2,
                "crashes": 0,
                "items_lost": 0,
            },
            {
                "class": "kill: eval",
                "forms_tried": 3,
                "faults_injected": 3,
                "handled": 3,
                "kills_survived": 1,
                "crashes": 0,
                "items_lost": 0,
            },
        ],
        "total": {
            "forms_tried": 1207,
            "faults_injected": 1207,
            "handled": 1207,
            "kills_survived": 3,
            "crashes": 0,
            "items_lost": 0,
        },
    }
    (tmp_path / "r.json").write_text(json.dumps(report))
    assert (
        cli_main(
            [
                "bench",
                "reliability",
                "--out",
                str(tmp_path / "r.json"),
                "--markdown",
                "readme",
                "--load",
                str(tmp_path / "absent.json"),
            ]
        )
        == 0
    )
    short = capsys.readouterr().out
    assert short == readme_table(report)
    assert short.splitlines()[-1] == "| 1,207 | 3 | 0 | 0 |"
    assert cli_main(["bench", "reliability", "--out", str(tmp_path / "r.json"), "--markdown", "docs"]) == 0
    assert "| **total** | 1,207 | 1,207 | 1,207 | 3 | 0 | 0 |" in capsys.readouterr().out


def test_a_guard_that_lets_an_address_through_is_counted(monkeypatch):
    import searchgym.envs.tools.url_safety as url_safety

    honest = asyncio.run(reliability.ssrf(random.Random(0)))
    assert honest["crashes"] == 0 and honest["handled"] == honest["forms_tried"] > 1000
    monkeypatch.setattr(url_safety, "is_public", lambda ip: ip.version == 6)  # an IPv6 hole
    leaky = asyncio.run(reliability.ssrf(random.Random(0)))
    assert leaky["forms_tried"] == honest["forms_tried"] and leaky["crashes"] > 100
    assert any("let through" in note for note in leaky["notes"])


def test_agent_turns_and_damaged_caches_in_process(tmp_path, small_bundle):
    turns = reliability.actions(random.Random(1), 40)
    assert turns["forms_tried"] == 80 and turns["crashes"] == 0 and turns["handled"] == 80
    caches = asyncio.run(reliability.caches(random.Random(1), tmp_path))
    assert caches["crashes"] == 0 and caches["handled"] == caches["forms_tried"] == 2 * 7 + 1


@pytest.mark.parametrize("status", [500, 503])
def test_a_server_that_answers_5xx_is_counted(status, monkeypatch, tmp_path, small_bundle, tiny_model_dir):
    """The bench's server class must see a 5xx: a retrieval server whose /retrieve fails is counted, not passed."""
    from searchgym.envs.tools.local_index import LocalIndex
    from searchgym.serve.retrieval import _RetrievalServer

    async def broken(self, request):
        from aiohttp import web

        return web.json_response({"error": "boom"}, status=status)

    monkeypatch.setattr(_RetrievalServer, "handle_retrieve", broken)
    row = asyncio.run(
        reliability.server_bodies(
            random.Random(2), 3, LocalIndex(small_bundle / "index"), tiny_model_dir, model_server=False
        )
    )
    assert row["crashes"] == 3 and all("/retrieve" in note for note in row["notes"])


def test_run_without_kills_writes_the_report(tmp_path, small_bundle, tiny_model_dir, monkeypatch):
    monkeypatch.setattr(reliability, "server_bodies", _no_servers)
    report = run_reliability(
        ReliabilitySettings(out=tmp_path / "r.json", workdir=tmp_path / "w", n=10, kills=False), model=tiny_model_dir
    )
    assert json.loads((tmp_path / "r.json").read_text()) == report
    assert [row["class"] for row in report["classes"]][:3] == [
        "ssrf url forms",
        "agent turns (env.step)",
        "web pages (fetch, env.step)",
    ]
    assert report["total"]["crashes"] == 0 and report["total"]["faults_injected"] > 1000


async def _no_servers(rng, n, index, model_dir):
    return reliability._Row("server request bodies", 0, 0, 0, 0).as_dict()


def test_round_threes_surfaces_are_counted_with_no_crash_and_a_hole_is_a_crash(monkeypatch):
    """The bench's classes for issue 44's surfaces run clean, and a budget check that lets any unit through is
    counted as the crash it is."""
    from searchgym.bench import reliability_sources

    rows = reliability.round_three(random.Random(44), 4)
    assert [row["class"].split(" (")[0] for row in rows] == ["damaged sources", "budgets and replies"]
    for row in rows:
        assert row["crashes"] == 0 and row["handled"] == row["faults_injected"] >= 12, row
    import searchgym.envs.tools.costs as costs

    monkeypatch.setattr(costs, "check_cost_budget", lambda budget, key="cost_budget": dict(budget))
    leaky = reliability._Tally("leaky")
    reliability_sources.cost_budgets(leaky, random.Random(44), 30)
    assert leaky.crashes > 0 and any("was accepted" in note for note in leaky.notes)


def test_a_shard_merge_that_ranks_a_nan_is_counted_as_a_crash(monkeypatch):
    """The shard-scores drill runs against Ray Serve's ingress merge: one that ranks non-finite scores is caught."""
    from searchgym.bench import reliability_sources
    from searchgym.serve import ray_search

    clean = reliability._Tally("clean")
    asyncio.run(reliability_sources.shard_scores(clean, random.Random(44), 40))
    assert clean.crashes == 0 and clean.handled == 40
    monkeypatch.setattr(
        ray_search, "merge_shards", lambda parts, k: [sorted(sum((p[0] for p in parts), []), key=lambda r: -r[1])[:k]]
    )
    leaky = reliability._Tally("leaky")
    asyncio.run(reliability_sources.shard_scores(leaky, random.Random(44), 40))
    assert leaky.crashes > 0 and any("were merged" in note for note in leaky.notes)
