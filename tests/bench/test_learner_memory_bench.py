"""`searchgym bench learner` on a CPU: both heads measured in their own processes, ratios and agreement recorded."""

import json

from searchgym.bench.learner_memory import LearnerBenchSettings, estimate_gib, run_learner_memory_bench
from searchgym.cli import main


def test_the_bench_measures_both_heads_and_skips_what_cannot_fit(tmp_path):
    out = tmp_path / "bench.json"
    result = run_learner_memory_bench(
        LearnerBenchSettings(out=out, lengths="256", steps=1, chunk_tokens=64, agreement_length=256)
    )
    assert json.loads(out.read_text()) == result and result["vocab_size"] == 151_936
    measured = {r["head"]: r for r in result["rows"] if r["length"] == 256}
    assert set(measured) == {"chunked", "whole_logits"}
    for row in measured.values():
        assert not row["oom"] and row["peak_bytes"] > 0 and row["step_s_median"] > 0
        assert row["trained_tokens_per_trajectory"] == 64  # a quarter of 256 generated
    assert [r["length"] for r in result["ratios"]] == [256]
    agreement = result["agreement_fp32"]
    assert agreement["logprob_max_abs_diff"] < 1e-5 and agreement["grad_max_abs_diff"] < 1e-4


def test_runs_that_cannot_fit_are_skipped_by_their_estimate(tmp_path):
    # 40k tokens of whole logits (10k trained x 151,936 x 16 B, ~23 GiB) are not run under --max-gib 4; chunked ones are
    assert estimate_gib("whole_logits", 40_000, 0.25, 512, 4) > 4 > estimate_gib("chunked", 40_000, 0.25, 512, 4)


def test_bad_flags_name_themselves(capsys, tmp_path):
    assert main(["bench", "learner", "--trained-share", "0", "--out", str(tmp_path / "x.json")]) == 2
    assert "--trained-share" in capsys.readouterr().err
    assert main(["bench", "learner", "--lengths", "1", "--out", str(tmp_path / "x.json")]) == 2
    assert "--lengths" in capsys.readouterr().err
