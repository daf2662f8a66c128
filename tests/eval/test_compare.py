"""`searchgym eval compare` on real runs: refused across protocols (fields named), paired intervals across seeds,
judge agreement and human labels on the card, and the report and comparison pages in headless Chromium."""

import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from searchgym.cli import main
from searchgym.eval.compare import ProtocolMismatch, compare_runs, load_run
from searchgym.eval.harness import run_eval
from tests.conftest import SMALL
from tests.eval.stubs import judge_app
from tests.servers import ThreadServer

SYN = "searchgym/SyntheticQA-v0"
NOISY = f"{Path(__file__).parent / 'stubs.py'}:NoisyOracle"
RUN = dict(
    k=2,
    env_kwargs=dict(SMALL),
    max_tasks=6,
    concurrency=6,
    max_new_tokens=8,
    max_context=320,
    progress=False,
    workflow=NOISY,
    judge="llm,em,f1",
)
CHROMIUM = shutil.which("chromium")


@pytest.fixture(scope="module")
def judge_server():
    requests = []
    with ThreadServer.app(judge_app(requests)) as url:
        yield url, requests


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir, small_bundle, judge_server):
    """Four evaluations of one model: seeds 0 and 1 of one protocol, another judge model, fewer questions."""
    url, _ = judge_server
    root = tmp_path_factory.mktemp("runs")

    def run(name, **changes):
        run_eval(SYN, str(tiny_model_dir), root / name, **{**RUN, "judge_model": f"openai:{url}/v1:judge-a", **changes})
        return root / name

    return {
        "seed0": run("seed0"),
        "seed1": run("seed1", seed=1),
        "judge_b": run("judge_b", judge_model=f"openai:{url}/v1:judge-b"),
        "fewer": run("fewer", max_tasks=4),
    }


def stored(run_dir):
    return [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]


def summary_of(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def per_question_reward(run_dir):
    rewards = {}
    for row in stored(run_dir):
        rewards.setdefault(row["task_id"], []).append(row["reward"])
    return {task: float(np.mean(r)) for task, r in rewards.items()}


# --- refusals ------------------------------------------------------------------------------------------


def test_another_judge_model_is_refused_with_the_field_named(runs, capsys):
    with pytest.raises(ProtocolMismatch) as refused:
        compare_runs([runs["seed0"], runs["judge_b"]])
    assert refused.value.differences == {"protocol.judges.llm.model": ["judge-a", "judge-b"]}
    assert main(["eval", "compare", str(runs["seed0"]), str(runs["judge_b"])]) == 2
    err = capsys.readouterr().err
    assert (
        "refusing to compare" in err
        and "protocol.judges.llm.model" in err
        and '"judge-a"' in err
        and '"judge-b"' in err
    )
    assert "--allow-different" in err


def test_another_question_set_is_refused_with_the_fields_named(runs, capsys):
    with pytest.raises(ProtocolMismatch) as refused:
        compare_runs([runs["seed0"], runs["fewer"]])
    assert set(refused.value.differences) == {"protocol.suite.questions", "protocol.suite.sha256"}
    assert refused.value.differences["protocol.suite.questions"] == [6, 4]
    assert main(["eval", "compare", str(runs["fewer"]), str(runs["seed0"])]) == 2
    assert "protocol.suite.sha256" in capsys.readouterr().err


def test_allow_different_compares_on_shared_questions_and_lists_every_differing_field(runs, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert (
        main(
            [
                "eval",
                "compare",
                str(runs["seed0"]),
                str(runs["judge_b"]),
                str(runs["fewer"]),
                "--allow-different",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert printed.startswith("## WARNING: the protocols differ")
    comparison = json.loads((out / "compare.json").read_text())
    assert set(comparison["protocol_differences"]) == {
        "protocol.judges.llm.model",
        "protocol.suite.questions",
        "protocol.suite.sha256",
    }
    assert comparison["protocol_differences"]["protocol.judges.llm.model"] == ["judge-a", "judge-b", "judge-a"]
    fewer = [d for d in comparison["deltas"] if d["run"] == "fewer"]
    assert {d["metric"] for d in fewer} == {"reward", "llm", "em", "f1"} and all(d["tasks"] == 4 for d in fewer)
    md = (out / "compare.md").read_text()
    for field in ("protocol.judges.llm.model", "protocol.suite.sha256", "protocol.suite.questions"):
        assert f"| {field} |" in md


# --- a paired interval across seeds -------------------------------------------------------------------


def test_two_seeds_of_one_protocol_compare_with_a_paired_interval(runs, tmp_path):
    a, b = summary_of(runs["seed0"]), summary_of(runs["seed1"])
    assert a["card"]["hash"] == b["card"]["hash"] and a["card"]["run"]["seed"] == 0 and b["card"]["run"]["seed"] == 1
    comparison = compare_runs([runs["seed0"], runs["seed1"]], seed=3)
    assert comparison["protocol_differences"] == {} and "run.seed" in comparison["other_differences"]
    before, after = per_question_reward(runs["seed0"]), per_question_reward(runs["seed1"])
    deltas = np.array([after[t] - before[t] for t in sorted(before)])
    assert np.any(deltas != 0), "the seeds played identically: the pairing would be untested"
    (reward,) = [d for d in comparison["deltas"] if d["metric"] == "reward"]
    assert reward["tasks"] == 6 and reward["gain"] == pytest.approx(deltas.mean())
    assert reward["before"] == pytest.approx(a["metrics"]["avg@2/reward"])
    assert reward["after"] == pytest.approx(b["metrics"]["avg@2/reward"])
    # the percentile bootstrap of the stored per-question deltas (questions resampled, pairs kept together)
    means = np.random.default_rng(3).choice(deltas, size=(10_000, len(deltas))).mean(axis=1)
    assert [reward["ci95_low"], reward["ci95_high"]] == pytest.approx(np.percentile(means, [2.5, 97.5]).tolist())
    assert deltas.min() <= reward["ci95_low"] < reward["gain"] < reward["ci95_high"] <= deltas.max()
    assert reward["tasks_better"] == int((deltas > 0).sum()) and reward["tasks_worse"] == int((deltas < 0).sum())
    assert reward["significant"] == (reward["ci95_low"] > 0 or reward["ci95_high"] < 0)
    assert compare_runs([runs["seed0"], runs["seed1"]], seed=3)["deltas"] == comparison["deltas"]  # reproducible


# --- the card: judges, agreement, labels ------------------------------------------------------------------


def test_the_card_records_what_the_llm_judge_was_sent(runs, judge_server):
    _, requests = judge_server
    llm = summary_of(runs["seed0"])["card"]["protocol"]["judges"]["llm"]
    assert llm["model"] == "judge-a" and len(llm["prompt_sha256"]) == 64
    sent = [r for r in requests if r["model"] == "judge-a"]
    assert sent and all({k: r[k] for k in llm["decoding"]} == llm["decoding"] for r in sent)


def test_judge_agreement_names_the_samples_where_judges_split(runs):
    summary = summary_of(runs["seed0"])
    agreement = summary["agreement"]
    hedged = [r for r in stored(runs["seed0"]) if (r["prediction"] or "").endswith(" or so")]
    assert hedged, "NoisyOracle gave no partly right answer in this run"
    # the stub LLM judge accepts an answer that contains the label; exact match does not
    assert agreement["disagreements"] == len(hedged)
    assert {(d["task_id"], d["sample"]) for d in agreement["disagreeing"]} == {
        (r["task_id"], r["sample"]) for r in hedged
    }
    assert all(d["calls"]["llm"] and not d["calls"]["em"] for d in agreement["disagreeing"])
    pair = next(p for p in agreement["pairs"] if (p["a"], p["b"]) == ("llm", "em"))
    answered = sum(r["prediction"] is not None for r in stored(runs["seed0"]))
    assert pair["n"] == answered and pair["agreement"] == pytest.approx(1 - len(hedged) / answered)
    assert "| llm | em |" in (runs["seed0"] / "summary.md").read_text()


def test_labels_score_each_judge_without_replaying_a_sample(runs, tiny_model_dir, judge_server, tmp_path):
    url, _ = judge_server
    run_dir = tmp_path / "labelled"
    shutil.copytree(runs["seed0"], run_dir)
    before = (run_dir / "samples.jsonl").read_bytes()
    rows = [r for r in stored(run_dir) if r["prediction"] is not None]
    labels = tmp_path / "labels.csv"  # a human who accepts hedged answers, like the LLM judge
    labels.write_text(
        "question_id,prediction,human_verdict\n"
        + "".join(
            f'{r["task_id"]},"{r["prediction"]}",{"no" if r["prediction"] == "nobody knows" else "yes"}\n' for r in rows
        )
    )
    summary = run_eval(
        SYN, str(tiny_model_dir), run_dir, **{**RUN, "judge_model": f"openai:{url}/v1:judge-a"}, labels=labels
    )
    assert (run_dir / "samples.jsonl").read_bytes() == before
    raters = summary["labels"]["raters"]
    assert summary["labels"]["unmatched_labels"] == 0 and raters["llm"]["accuracy"] == 1.0
    hedged = sum(r["prediction"].endswith(" or so") for r in rows)
    assert raters["em"]["accuracy"] == pytest.approx(1 - hedged / len(rows))


def test_a_run_without_a_card_is_one_clear_error_and_a_rerun_writes_it(runs, tiny_model_dir, judge_server, tmp_path):
    url, _ = judge_server
    old = tmp_path / "old"
    shutil.copytree(runs["seed0"], old)
    summary = summary_of(old)
    del summary["card"]
    (old / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match="no protocol card.*rerun the same `searchgym eval` command"):
        load_run(old)
    with pytest.raises(FileNotFoundError, match="not a finished `searchgym eval` run"):
        load_run(tmp_path / "nothing")
    run_eval(SYN, str(tiny_model_dir), old, **{**RUN, "judge_model": f"openai:{url}/v1:judge-a"})
    assert compare_runs([runs["seed0"], old])["protocol_differences"] == {}


# --- in a browser ------------------------------------------------------------------------------------------


def dom(url: str) -> str:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout


class Page(HTMLParser):
    """Section order, table cells by table class, and which samples are hidden."""

    def __init__(self):
        super().__init__()
        self.stack, self.order, self.cells, self.samples = [], [], {}, []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag not in ("br", "img", "input", "meta", "link"):
            self.stack.append((tag, attrs))
        if tag in ("h1", "h2") or attrs.get("id") in ("card", "trajectories"):
            self.order.append(attrs.get("id") or tag)
        if tag == "details" and "sample" in attrs.get("class", "").split():
            self.samples.append((attrs, "hidden" in attrs))

    def handle_endtag(self, tag):
        while self.stack and self.stack.pop()[0] != tag:
            pass

    def handle_data(self, data):
        tables = [a.get("class", "") for t, a in self.stack if t == "table"]
        if tables and self.stack[-1][0] == "td":
            self.cells.setdefault(tables[-1], []).append(data)
        if self.stack and self.stack[-1][0] == "h2":
            self.order[-1] = f"h2:{data}"


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium package is not installed")
def test_a_real_report_opens_with_the_card_first_and_filters_by_disagreement(runs):
    page = Page()
    page.feed(dom((runs["seed0"] / "report.html").as_uri() + "#outcome=disagree"))
    assert page.order[:3] == ["h1", "card", "h2:Protocol card"]  # the card comes before any score
    card = dict(zip(page.cells["card"][::2], page.cells["card"][1::2], strict=True))
    assert card["card hash"] == summary_of(runs["seed0"])["card"]["hash"]
    assert card["protocol.judges.llm.model"] == "judge-a" and card["protocol.k"] == "2"
    shown = [a for a, hidden in page.samples if not hidden]
    hedged = sum((r["prediction"] or "").endswith(" or so") for r in stored(runs["seed0"]))
    assert len(page.samples) == 12 and len(shown) == hedged and all(a["data-disagree"] == "1" for a in shown)


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium package is not installed")
def test_the_comparison_page_renders_in_chromium(runs, tmp_path):
    assert main(["eval", "compare", str(runs["seed0"]), str(runs["seed1"]), "--out", str(tmp_path)]) == 0
    page = Page()
    page.feed(dom((tmp_path / "compare.html").as_uri()))
    assert page.order[0] == "h1" and "h2:The protocols differ" not in page.order
    deltas = page.cells["deltas"]
    assert len(deltas) == 4 * 10 and deltas[:3] == ["seed1", "seed0", "reward"]  # reward, llm, em, f1
    scores = page.cells["scores"]
    assert [c for c in scores if "@" in c] == [  # k (2) is in every @k header
        "reward Avg@2",
        *(f"{judge} {measure}@2" for judge in ("llm", "em", "f1") for measure in ("Avg", "Pass")),
    ]
    assert scores[:3] == [
        "reward Avg@2",
        f"{summary_of(runs['seed0'])['metrics']['avg@2/reward']:.3f}",
        f"{summary_of(runs['seed1'])['metrics']['avg@2/reward']:.3f}",
    ]


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium package is not installed")
def test_the_quickstart_comparison_of_two_policies_renders_in_chromium(tiny_model_dir, small_bundle, tmp_path):
    from searchgym.quickstart import POLICIES, compare_policies

    rl_model = Path(shutil.copytree(tiny_model_dir, tmp_path / "rl-model"))
    data = bytearray((rl_model / "model.safetensors").read_bytes())
    data[-1] ^= 1  # other weights: another policy
    (rl_model / "model.safetensors").write_bytes(bytes(data))
    args = {**RUN, "judge": "em,f1"}
    run_eval(SYN, str(tiny_model_dir), tmp_path / "eval-sft", **args)
    run_eval(SYN, str(rl_model), tmp_path / "eval-rl", **{**args, "seed": 1})
    comparison = compare_policies(tmp_path, seed=0)
    assert [r["name"] for r in comparison["runs"]] == list(POLICIES)
    assert "agent.model.identity" in comparison["other_differences"] and not comparison["protocol_differences"]
    page = Page()
    page.feed(dom((tmp_path / "compare" / "compare.html").as_uri()))
    assert page.cells["runs"][0] == POLICIES[0] and POLICIES[1] in page.cells["runs"]
    deltas = page.cells["deltas"]
    assert len(deltas) == 3 * 10 and [deltas[i] for i in (0, 1, 2)] == [POLICIES[1], POLICIES[0], "reward"]
    reward = next(d for d in comparison["deltas"] if d["metric"] == "reward")
    assert deltas[7] == f"{reward['ci95_low']:+.3f} to {reward['ci95_high']:+.3f}"
    assert "agent.model.identity" in page.cells["other-differences"]
    assert "f1 Avg@2" in page.cells["scores"] and "Avg@k" not in str(page.cells)


def test_the_quickstart_comparison_page_fits_1280_and_800_px_with_text_read_from_the_left(tmp_path):
    """compare.html's "Other differences" (long JSON: model fingerprints, env kwargs) ran off the page at 1,280 px,
    and its questions were right-aligned; every value now wraps within the page, and text reads from the left."""
    from searchgym.eval.compare import comparison_html
    from tests.eval.browser import assert_nothing_runs_off, layout

    def run(name, engine):
        metrics = {"tasks": 128, "samples": 512, "avg@4/reward": 0.5, "avg@4/em": 0.4, "pass@4/em": 0.6}
        return {
            "name": name,
            "path": f"runs/quickstart/{name}",
            "k": 4,
            "judges": ["em"],
            "card_hash": "c" * 64,
            "model": {"sha256": "d" * 64},
            "engine": engine,
            "metrics": metrics,
            "breakdowns": {},
        }

    runs = [run("warm start (SFT)", "runs/quickstart/sft-model"), run("warm start + async RL", "runs/quickstart/rl")]
    identity = {"sha256": "e" * 64, "files": {"model.safetensors": "f" * 64, "tokenizer.json": "0" * 64}}
    question = "Which river flows through the city where the author of The Sadesh Whispers was born? " * 3
    comparison = {
        "baseline": runs[0]["name"],
        "metrics": ["reward", "em"],
        "seed": 0,
        "resamples": 1000,
        "protocol_differences": {},
        "allowed_different": False,
        "runs": runs,
        "deltas": [],
        "other_differences": {
            "agent.model.identity": [identity, {**identity, "sha256": "1" * 64}],
            "agent.engine": ["/home/someone/searchgym/runs/quickstart/rl/checkpoints/step-00060" * 2] * 2,
            "run.env_kwargs": [{"size": 20000, "n_tasks": 20000, "hops": 1, "judge": "f1", "split": "test"}] * 2,
        },
        "questions": [
            {
                "run": runs[1]["name"],
                "metric": "em",
                "questions": [
                    {"task_id": f"syn0-0-{i:07d}", "question": question, "before": 0.0, "after": 1.0, "delta": 1.0}
                    for i in range(3)
                ],
            }
        ],
    }
    (tmp_path / "compare.html").write_text(comparison_html(comparison))
    found = layout(
        tmp_path / "compare.html",
        evaluate="""() => ["table.questions td:nth-child(2)", "table.other-differences td:nth-child(2)",
            "table.questions td:nth-child(5)"].map(s => getComputedStyle(document.querySelector(s)).textAlign)""",
    )
    assert_nothing_runs_off(found)
    assert found[1280]["value"] == found[800]["value"] == ["left", "left", "right"]  # question, JSON value, a number
