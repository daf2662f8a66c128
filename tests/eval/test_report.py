"""The report as a tool: the trajectory filters and sorts in headless Chromium, the turn table, per-hop breakdowns."""

import json
import shutil
import subprocess
from html.parser import HTMLParser
from urllib.parse import quote

import pytest

from searchgym.eval.harness import summarize_rows
from searchgym.eval.report import html_report, markdown, write_report

CHROMIUM = shutil.which("chromium")
#            task, sample, prediction,      em,  f1,  turns, stop,          hops
SAMPLES = [
    ("q1", 0, "Paris", 1.0, 1.0, 2, "answer", 1),
    ("q1", 1, "Paris in France", 0.0, 0.5, 3, "answer", 1),  # f1 > 0.5? no (0.5): judges agree
    ("q1", 2, "the city of Paris", 0.0, 0.8, 4, "answer", 1),  # judges disagree
    ("q2", 0, None, 0.0, 0.0, 5, "turn budget", 2),
    ("q2", 1, "Lyon", 0.0, 0.0, 1, "answer", 2),
    ("q2", 2, None, 0.0, 0.0, 5, "turn budget", 2),
    ("q3", 0, "Rome or Paris", 0.0, 0.67, 2, "answer", 2),  # judges disagree
    ("q3", 1, "Paris", 1.0, 1.0, 1, "answer", 2),
    ("q3", 2, "Paris", 1.0, 1.0, 1, "answer", 2),
    ("q4", 0, "Oslo", 0.0, 0.0, 3, "answer", 3),
    ("q4", 1, None, 0.0, 0.0, 5, "turn budget", 3),
    ("q4", 2, "Paris, yes", 0.0, 0.67, 4, "answer", 3),
]  # judges disagree


def rows():
    out = []
    for task, sample, prediction, em, f1, turns, stop, hops in SAMPLES:
        verdicts = {
            "em": {"score": em, "correct": em == 1.0, "error": None},
            "f1": {"score": f1, "correct": em == 1.0, "error": None},
        }
        steps = [{"action": "<search>Paris</search>", "tool": "search", "observation": "<information>…</information>"}]
        out.append(
            {
                "task_id": task,
                "sample": sample,
                "question": f"Question {task}?",
                "answers": ["Paris"],
                "prediction": prediction,
                "reward": f1,
                "subset": {"hops": hops},
                "verdicts": verdicts,
                "stats": {
                    "turns": turns,
                    "searches": turns - 1,
                    "accesses": 0,
                    "generated_tokens": 5,
                    "answered": prediction is not None,
                    "stop_reason": stop,
                },
                "trajectory": {"turns": steps * turns, "messages": [{"role": "user", "content": "prompt"}]},
            }
        )
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    summary = summarize_rows(rows(), 3, env_id="searchgym/SyntheticQA-v0", engine="tiny", judges=["em", "f1"])
    write_report(out, summary, rows())
    return out, summary


class Viewer(HTMLParser):
    """Question order, each sample's (task, sample, hidden), cells of the turn table, the shown-count text."""

    def __init__(self):
        super().__init__()
        self.questions, self.samples, self.turn_cells, self.shown, self._in = [], [], [], "", None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = attrs.get("class", "").split()
        if tag == "details" and "question" in classes:
            self.questions.append((attrs["data-id"], "hidden" in attrs))
        if tag == "details" and "sample" in classes:
            self.samples.append((self.questions[-1][0], "hidden" in attrs, attrs))
        if tag == "table" and "by-turns" in classes:
            self._in = "turns"
        if tag == "output":
            self._in = "output"

    def handle_endtag(self, tag):
        if tag in ("table", "output"):
            self._in = None

    def handle_data(self, data):
        if self._in == "turns":
            self.turn_cells.append(data)
        elif self._in == "output":
            self.shown += data


def view(path, fragment=""):
    page = Viewer()
    page.feed(
        subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", path.as_uri() + fragment],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
    )
    return page


def visible(page):
    return sorted(
        (task, int(attrs["data-turns"]), attrs["data-outcome"]) for task, hidden, attrs in page.samples if not hidden
    )


def expected(keep):
    return sorted(
        (t, turns, "unanswered" if p is None else ("correct" if em == 1.0 else "wrong"))
        for t, _, p, em, f1, turns, stop, _ in SAMPLES
        if keep(p, em, f1, turns, stop)
    )


needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium package is not installed")


@needs_chromium
def test_the_unfiltered_viewer_shows_everything_by_question_id_with_the_turn_table(report):
    page = view(report[0] / "report.html")
    assert visible(page) == expected(lambda *_: True) and page.shown == "12 of 12 samples shown, in 4 of 4 questions"
    assert [task for task, _ in page.questions] == ["q1", "q2", "q3", "q4"]
    cells = page.turn_cells  # samples and mean score per number of turns, what the turns plot draws
    assert [cells[i : i + 3] for i in range(0, len(cells), 3)] == [
        ["turns", "samples", "mean em"],
        ["1", "3", "0.667"],
        ["2", "2", "0.500"],
        ["3", "2", "0.000"],
        ["4", "2", "0.000"],
        ["5", "3", "0.000"],
    ]


@needs_chromium
@pytest.mark.parametrize(
    "fragment, keep",
    [
        ("#outcome=disagree", lambda p, em, f1, turns, stop: p is not None and em == 0.0 and f1 > 0.5),
        ("#outcome=wrong&stop=" + quote("answer"), lambda p, em, f1, turns, stop: p is not None and em == 0.0),
        ("#stop=" + quote("turn budget"), lambda p, em, f1, turns, stop: stop == "turn budget"),
        ("#min_turns=2&max_turns=3", lambda p, em, f1, turns, stop: 2 <= turns <= 3),
    ],
)
def test_the_filters_show_exactly_the_matching_samples(report, fragment, keep):
    page = view(report[0] / "report.html", fragment)
    want = expected(keep)
    assert visible(page) == want
    shown_questions = {task for task, _, _ in want}
    assert {task for task, hidden in page.questions if not hidden} == shown_questions  # empty questions hide
    assert page.shown == f"{len(want)} of 12 samples shown, in {len(shown_questions)} of 4 questions"


@needs_chromium
@pytest.mark.parametrize(
    "fragment, order",
    [
        ("#sort=turns-desc", ["q4", "q2", "q1", "q3"]),  # mean turns 4, 3.67, 3, 1.33
        ("#sort=score-asc&outcome=correct", ["q2", "q4", "q1", "q3"]),  # mean em 0, 0 (ties by id; hidden), 1/3, 2/3
    ],
)
def test_the_viewer_sorts_questions(report, fragment, order):
    assert [task for task, _ in view(report[0] / "report.html", fragment).questions] == order


def test_scores_break_down_by_hops(report):
    out, summary = report
    hops = summary["breakdowns"]["hops"]
    assert list(hops) == ["1", "2", "3"]
    assert [int(hops[h]["samples"]) for h in hops] == [3, 6, 3]
    assert hops["1"]["avg@3/em"] == pytest.approx(1 / 3) and hops["2"]["avg@3/em"] == pytest.approx(2 / 6)
    assert hops["3"]["pass@3/f1"] == 0.0 and hops["1"]["pass@3/em"] == 1.0
    assert "## By hops" in markdown(summary) and (out / "score_by_hops.png").read_bytes()[:4] == b"\x89PNG"
    page = html_report(summary, rows(), {})
    assert 'class="breakdown breakdown-hops"' in page


def test_a_single_valued_key_gives_no_breakdown():
    same = [{**r, "subset": {"hops": 2}} for r in rows()]
    assert summarize_rows(same, 3, env_id="x", engine="y", judges=["em"])["breakdowns"] == {}
    old = [{k: v for k, v in r.items() if k != "subset"} for r in rows()]  # samples stored before subsets existed
    summary = summarize_rows(old, 3, env_id="x", engine="y", judges=["em"])
    assert summary["breakdowns"] == {} and json.dumps(summary)


# --- the headline judge, and nothing off the page ----------------------------------------------------------------


def carded(summary, reward_judge="f1"):
    """`summary` with a protocol card whose env rewards with `reward_judge` (as a SyntheticQA env's default, F1)."""
    card = {
        "hash": "9" * 64,
        "protocol": {"reward_judge": reward_judge, "primary": "em", "k": summary["k"]},
        "agent": {"engine": "/runs/quickstart/rl/checkpoints/" + "step-00060/" * 12, "model": {"sha256": "a" * 64}},
        "run": {"env_kwargs": {"size": 20000, "judge": reward_judge, "instructions": "brief"}, "commit": "b" * 40},
    }
    return {**summary, "card": card}


def test_the_plots_and_turn_table_draw_the_env_reward_judge_the_headline_names(report, tmp_path, monkeypatch):
    """A quickstart evaluation judges em then f1, and its env rewards F1: the report's headline, plots and per-turn
    table are F1's (they had drawn EM, the first judge, under a headline figure of F1)."""
    import searchgym.eval.report as report_module

    summary = carded(report[1])
    assert report_module.headline_judge(summary) == "f1" and report_module.headline_judge(report[1]) == "em"
    drawn = []
    real_plots = report_module.plots
    monkeypatch.setattr(
        report_module, "plots", lambda out, rows, judge, b=None: drawn.append(judge) or real_plots(out, rows, judge, b)
    )
    write_report(tmp_path, summary, rows())
    assert drawn == ["f1"]
    page = (tmp_path / "report.html").read_text()
    assert "<th>mean f1</th>" in page and "<th>mean em</th>" not in page
    f1 = summary["metrics"]
    assert f'<p id="headline"><b>f1 Avg@3: {f1["avg@3/f1"]:.3f}, Pass@3: {f1["pass@3/f1"]:.3f} over 4 questions' in page
    assert f"**f1 Avg@3: {f1['avg@3/f1']:.3f}" in markdown(summary)


def test_nothing_runs_off_the_report_at_1280_or_800_px(report, tmp_path):
    from tests.eval.browser import assert_nothing_runs_off, layout

    long = [
        {**r, "prediction": "https://world.searchgym.test/wiki/" + "Sadesh_Whispers_" * 40}
        if i == 0
        else {**r, "question": "Which river flows through the city of " * 12 + "?"}
        for i, r in enumerate(rows())
    ]
    write_report(tmp_path, carded(report[1]), long)
    found = layout(
        tmp_path / "report.html",
        prepare="() => document.querySelectorAll('details').forEach(d => { d.open = true; })",  # every trajectory
        evaluate="() => document.querySelectorAll('details[open]').length",
    )
    assert found[800]["value"] > 12
    assert_nothing_runs_off(found)
