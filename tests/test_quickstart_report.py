"""The quickstart's summary says what one run can show: whether its gain is significant, and where the multi-seed
figure is."""

from pathlib import Path

from searchgym.eval.compare import paired_delta
from searchgym.quickstart import (
    BENCHMARK,
    STAGES,
    format_gain,
    format_scope,
    format_table,
    judge_name,
    reward_curve_figure,
    stage_label,
)

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


def test_the_stages_are_numbered_and_named_as_the_summary_names_them():
    """Bars and lines said "copy pretraining", "sft" and "training (async, local)" where the summary said "base
    model", "warm start" and "rl"; each now opens with the stage's number and the summary's name."""
    assert [stage_label(stage) for stage in STAGES] == [
        "stage 1 of 6: world",
        "stage 2 of 6: demos",
        "stage 3 of 6: base model",
        "stage 4 of 6: warm start",
        "stage 5 of 6: RL",
        "stage 6 of 6: evaluate",
    ]
    assert stage_label("evaluate", "after RL") == "stage 6 of 6: evaluate, after RL"


def test_the_table_and_the_headline_name_the_judge_and_k():
    """The table said "F1 (avg@k)" without the k, and the headline "reward" where README says F1."""
    row = {"avg@4/reward": 0.5, "avg@4/correct": 0.25, "pass@4/correct": 0.5, "answered": 1.0, "turns": 2.0}
    table = format_table({"warm start (SFT)": {**row, "searches": 1.0}}, 4, judge_name({"judge": "f1"}))
    assert table.splitlines()[0] == ("| policy | F1 (Avg@4) | EM (Avg@4) | EM (Pass@4) | answered | turns | searches |")
    assert "@k" not in table.lower()
    before = {f"q{i}": 0.5 for i in range(40)}
    gain = paired_delta(before, {q: 0.6 for q in before})
    assert format_gain(gain, judge_name({}), 4).startswith("RL gain in held-out F1 (Avg@4): +0.100 (95% ")
    assert judge_name({"judge": "em"}) == "EM" and judge_name({"judge": "llm"}) == "llm"


def test_the_reward_curve_legend_covers_no_step():
    """The legend sat in the lower right, over steps 28-60 of a 60-step run; it now sits below the axes."""
    history = [{"step": s, "episode/reward": 0.2 + 0.01 * s} for s in range(1, 61)]
    fig = reward_curve_figure(history, {"avg@4/reward": 0.3}, {"avg@4/reward": 0.7}, 4)
    renderer = fig.canvas.get_renderer()
    (ax,) = fig.axes
    legend, axes = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
    assert not legend.overlaps(axes)
    assert fig.bbox.x0 <= legend.x0 and legend.x1 <= fig.bbox.x1 and fig.bbox.y0 <= legend.y0  # all of it drawn
    assert ax.get_ylabel() == "reward (F1)" and "held-out F1 (Avg@4), after RL" in [
        t.get_text() for t in ax.get_legend().get_texts()
    ]
