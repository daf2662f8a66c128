"""The quickstart's summary says what one run can show: whether its gain is significant, and where the multi-seed
figure is."""

from pathlib import Path

from searchgym.eval.compare import paired_delta
from searchgym.quickstart import BENCHMARK, format_gain, format_scope

ROOT = Path(__file__).resolve().parents[1]


def test_a_gain_whose_interval_excludes_zero_is_called_significant():
    before = {f"q{i}": 0.1 * (i % 3) for i in range(40)}
    gain = paired_delta(before, {q: v + 0.3 + 0.01 * (i % 5) for i, (q, v) in enumerate(before.items())})
    assert gain["ci95_low"] > 0
    text = format_scope(gain)
    assert "the gain is significant" in text and "excludes zero, above it" in text and BENCHMARK in text
    assert "the interval excludes zero" in format_gain(gain)


def test_a_gain_indistinguishable_from_zero_is_called_so_and_points_to_the_benchmark():
    before = {f"q{i}": 0.5 for i in range(40)}
    gain = paired_delta(before, {q: 0.5 + (0.2 if i % 2 else -0.19) for i, q in enumerate(before)})
    assert gain["ci95_low"] < 0 < gain["ci95_high"]
    text = format_scope(gain)
    assert "not significant" in text and "includes zero" in text and BENCHMARK in text
    assert "not distinguishable from zero" in format_gain(gain)


def test_the_benchmark_the_summary_points_to_exists():
    page, anchor = BENCHMARK.split("#")
    assert f"\n## {anchor.capitalize()}\n" in (ROOT / page).read_text()
