"""`searchgym bench scale-out` end to end on a small world: both layouts start, answer every query under
concurrent clients, find the queried page, and the report holds the side-by-side figures (never asserted as
speeds)."""

from __future__ import annotations

import json

from searchgym.cli import main


def test_scale_out_bench_runs_both_layouts_side_by_side(tmp_path):
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
    assert report["shards"] == 2 and len(report["startup_s"]["sharded"]["servers"]) == 2
    for layout in ("single", "sharded"):
        rows = report["rounds_by_layout"][layout]
        assert len(rows) == 2 and all(r["answered"] > 0 for r in rows)
        assert report["summary"][layout]["errors"] == 0
        assert report["summary"][layout]["page_in_top_k"] >= 0.9  # a title query finds its page in either layout
    assert len(report["rss_mb"]["sharded"]) == 2 and report["summary"]["sharded_over_single_qps"] > 0
