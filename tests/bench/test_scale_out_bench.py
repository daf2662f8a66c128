"""`searchgym bench scale-out` end to end on a small world: every arm (one server, Ray Serve with 1 and 2 replicas and
over the shards) starts, answers every query under concurrent clients and finds the queried page, and the report holds
the side-by-side figures (never asserted as speeds); no arm searches shards from the client any more."""

from __future__ import annotations

import json

import pytest

from searchgym.cli import main

# under pytest-xdist, the tests that start a local Ray cluster run on one worker, one cluster at a time
pytestmark = pytest.mark.xdist_group("ray")


def test_scale_out_bench_runs_every_arm_side_by_side(tmp_path):
    out = tmp_path / "scale_out.json"
    assert main(
        [
            "bench",
            "scale-out",
            "--size",
            "400",
            "--shards",
            "2",
            "--clients",
            "20",
            "--seconds",
            "1",
            "--rounds",
            "2",
            "--world",
            str(tmp_path / "world"),
            "--out",
            str(out),
        ]
    ) in (0, None)
    report = json.loads(out.read_text())
    assert report["shards"] == 2
    ray_arms = () if "ray_skipped" in report else ("ray_1", "ray_2", "ray_sharded")  # Ray Serve, same rounds
    assert sorted(report["rounds_by_layout"]) == sorted(("single", *ray_arms))  # the ShardedSearch arm is gone
    for arm in ("single", *ray_arms):
        rows = report["rounds_by_layout"][arm]
        assert len(rows) == 2 and all(r["answered"] > 0 for r in rows)
        assert report["summary"][arm]["errors"] == 0
        assert report["summary"][arm]["page_in_top_k"] >= 0.9  # a title query finds its page in every arm
    assert len(report["rss_mb"]["single"]) == 1
    assert all(report["summary"][f"{arm}_over_single_qps"] > 0 for arm in ray_arms)
