"""`searchgym eval`: metrics, suites, the resumable sample store, end to end with the tiny model, and the HTML
report."""

import asyncio
import itertools
import json
import queue
import shutil
import subprocess
import threading
from html.parser import HTMLParser

import gymnasium as gym
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import searchgym  # noqa: F401
from searchgym.agents.engines.openai_engine import parse_openai_spec
from searchgym.cli import main
from searchgym.envs.actions import parse_action
from searchgym.envs.judges import exact_match, token_f1
from searchgym.envs.suites import SUITES, resolve_data
from searchgym.eval.harness import STATS_FIELDS, SampleStore, run_eval
from searchgym.eval.metrics import Sample, pass_at_k, summarize
from searchgym.eval.report import SCRIPT, html_report
from tests.conftest import WARM_ENV

SYN = "searchgym/SyntheticQA-v0"
FAST = {"max_new_tokens": 8, "max_context": 320, "progress": False}


# --- metrics ---------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_matches_brute_force_enumeration(nck):
    n, c, k = nck
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    expected = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def verdict(score, correct=None, error=None):
    return {"score": score, "correct": bool(score == 1.0) if correct is None else correct, "error": error}


def sample(task, i, em, llm=None):
    verdicts = {"em": verdict(em)}
    if llm is not None:
        verdicts["llm"] = llm
    return Sample(task, i, em, em == 1.0, 3, 2, 1, 50, True, verdicts)


def test_avg_and_pass_at_k_on_hand_made_samples():
    samples = [
        sample("a", 0, 1.0, verdict(1.0)),
        sample("a", 1, 0.0, verdict(0.0, error="no verdict")),
        sample("b", 0, 0.0, verdict(0.0)),
        sample("b", 1, 0.0, verdict(0.0)),
    ]
    m = summarize(samples, 2)
    assert m["avg@2/em"] == 0.25 and m["pass@2/em"] == 0.5  # a: 1 of 2 -> 1.0; b: 0 of 2 -> 0.0
    assert m["avg@2/correct"] == 0.25 and m["pass@2/correct"] == 0.5  # the keys quickstart reads
    # the failed llm verdict is left out (a: 1 of 1 valid), and counted apart, not as wrong
    assert m["failures/llm"] == 1 and m["avg@2/llm"] == pytest.approx(1 / 3) and m["pass@2/llm"] == 0.5
    assert m["turns"] == 3 and m["searches"] == 2 and m["accesses"] == 1 and m["generated_tokens"] == 50


def test_openai_spec_parsing():
    assert parse_openai_spec("openai:http://h:8000/v1") == ("http://h:8000/v1", "default")
    assert parse_openai_spec("openai:https://api.x.com/v1:qwen/QwQ-32B") == ("https://api.x.com/v1", "qwen/QwQ-32B")
    assert parse_openai_spec("openai:http://h:11434/v1:llama3:8b") == ("http://h:11434/v1", "llama3:8b")
    assert parse_openai_spec("openai:http://h/openai/v1/") == ("http://h/openai/v1", "default")
    for bad in ("openai:http://h:8000", "openai:http://h:8000/", "openai:ftp://h/v1", "openai:"):
        with pytest.raises(ValueError, match="/v1"):
            parse_openai_spec(bad)


# --- suites ----------------------------------------------------------------------------------------


def test_every_suite_is_a_gym_id_and_missing_data_says_where_to_put_it(tmp_path, monkeypatch):
    for suite in SUITES.values():
        assert suite.env_id in gym.registry
    monkeypatch.delenv("SEARCHGYM_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="SEARCHGYM_DATA"):
        gym.make("searchgym/MuSiQue-v0", index="x")
    with pytest.raises(FileNotFoundError) as e:
        resolve_data(SUITES["Bamboogle"], tmp_path)
    assert str(tmp_path / "bamboogle" / "test.jsonl") in str(e.value) and "'gt'" in str(e.value)


def asearcher_layout(root, pool, name="hotpotqa", n=3):
    """ASearcher test data: {root}/{name}/test.jsonl, `question` + `answer` (list) or `gt` (string)."""
    (root / name).mkdir(parents=True)
    with open(root / name / "test.jsonl", "w") as f:
        for i, task in enumerate(pool.tasks[:n]):
            row = {"id": task.id, "question": task.question}
            row.update({"answer": list(task.answers)} if i % 2 else {"gt": task.answers[0]})
            f.write(json.dumps(row) + "\n")
    return root


def test_local_suite_reads_the_asearcher_layout(tmp_path, small_bundle, small_pool):
    root = asearcher_layout(tmp_path / "data", small_pool)
    env = gym.make("searchgym/HotpotQA-v0", data_root=str(root), index=str(small_bundle / "index")).unwrapped
    assert [t.id for t in env.tasks] == [t.id for t in small_pool.tasks[:3]]
    assert env.tasks[0].answers[0] == small_pool.tasks[0].answers[0]
    with pytest.raises(ValueError, match="search backend"):
        gym.make("searchgym/HotpotQA-v0", data_root=str(root))


# --- the sample store ------------------------------------------------------------------------------


def stored_row(i, **extra):
    return {
        "task_id": "t",
        "sample": i,
        "reward": 0.0,
        "verdicts": {},
        "stats": {**dict.fromkeys(STATS_FIELDS, 0), "answered": False, "stop_reason": "answer"},
        **extra,
    }


def test_store_drops_a_line_cut_by_a_kill_and_rewrites_the_file(tmp_path):
    path = tmp_path / "samples.jsonl"
    store = SampleStore(path)
    for i in range(3):
        store.append(stored_row(i, x="y" * 50))
    with pytest.raises(ValueError):
        store.append(stored_row(0))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 20])  # killed in the middle of writing the third line
    with pytest.warns(UserWarning, match="set aside 1 unusable"):
        again = SampleStore(path)
    assert set(again.rows) == {("t", 0), ("t", 1)}
    assert path.read_bytes() == data[: data.index(b"\n", data.index(b"\n") + 1) + 1]
    again.append(stored_row(2))
    assert [json.loads(line)["sample"] for line in path.read_text().splitlines()] == [0, 1, 2]


# --- end to end ------------------------------------------------------------------------------------


def keys(out):
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return [(r["task_id"], r["sample"]) for r in rows], rows


def check_judged(row):
    """The stored verdicts are the envs' judges applied to the answer the episode gave (none: wrong, not failed)."""
    turns = row["trajectory"]["turns"]
    if row["prediction"] is None:
        assert all(t["tool"] != "answer" for t in turns) and row["reward"] == 0.0
        assert all(v["score"] == 0.0 and not v["correct"] and v["error"] is None for v in row["verdicts"].values())
        return
    assert turns[-1]["tool"] == "answer" and parse_action(turns[-1]["action"]).argument == row["prediction"]
    em = max(exact_match(row["prediction"], a) for a in row["answers"])
    f1 = max(token_f1(row["prediction"], a) for a in row["answers"])
    assert row["verdicts"]["em"]["score"] == em and row["verdicts"]["em"]["correct"] == (em == 1.0)
    assert row["verdicts"]["f1"]["score"] == pytest.approx(f1) and row["verdicts"]["f1"]["correct"] == (em == 1.0)
    assert row["reward"] == pytest.approx(f1)  # the env's own judge is F1


def check_metrics_are_the_rows(m, rows, k):
    """Every number of the summary is recomputed from the stored samples."""
    by_task = {}
    for row in rows:
        by_task.setdefault(row["task_id"], []).append(row)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    for name in ("em", "f1"):
        assert m[f"avg@{k}/{name}"] == pytest.approx(mean([r["verdicts"][name]["score"] for r in rows]))
        assert m[f"pass@{k}/{name}"] == pytest.approx(
            mean([pass_at_k(len(g), sum(r["verdicts"][name]["correct"] for r in g), k) for g in by_task.values()])
        )
    assert m[f"avg@{k}/reward"] == pytest.approx(mean([r["reward"] for r in rows]))
    assert m["answered"] == mean([r["prediction"] is not None for r in rows])
    assert m["searches"] == mean([sum(t["tool"] == "search" for t in r["trajectory"]["turns"]) for r in rows])
    assert m["turns"] == mean([len(r["trajectory"]["turns"]) for r in rows])


def test_eval_end_to_end_with_torch_engine_then_kill_and_resume(tmp_path, answering_model_dir, one_torch_thread):
    """A warm-started policy that answers: the judges score its answers, and the tables are the stored samples."""
    out = tmp_path / "eval"
    args = dict(
        k=2,
        judge="em,f1",
        env_kwargs=WARM_ENV,
        max_tasks=4,
        concurrency=8,
        temperature=0.0,
        max_new_tokens=24,
        max_context=1024,
        progress=False,
    )
    summary = run_eval(SYN, str(answering_model_dir), out, **args)
    m = summary["metrics"]
    assert m["tasks"] == 4 and m["samples"] == 8 and m["failures/em"] == m["failures/f1"] == 0
    for name in (
        "samples.jsonl",
        "summary.json",
        "summary.md",
        "report.html",
        "score_vs_turns.png",
        "turns_searches.png",
    ):
        assert (out / name).exists(), name
    assert (out / "score_vs_turns.png").read_bytes()[:4] == b"\x89PNG"
    assert "| em |" in (out / "summary.md").read_text()
    done, rows = keys(out)
    assert sorted(done) == sorted({(t, s) for t, s in done}) and len(done) == 8
    answered = [r for r in rows if r["prediction"] is not None]
    assert len(answered) >= 5, "the warm start answers most episodes (one of these tasks it never saw solved)"
    assert any(r["verdicts"]["em"]["correct"] for r in answered), "and gets some right"
    assert all(r["stats"]["searches"] >= 1 for r in answered)  # it searched before answering, as shown
    for row in rows:
        assert set(row["verdicts"]) == {"em", "f1"} and row["trajectory"]["input_ids"]
        check_judged(row)
    check_metrics_are_the_rows(m, rows, 2)

    # killed mid-write: the last line is cut in half; a rerun plays exactly the lost pair again
    data = (out / "samples.jsonl").read_bytes()
    cut = data.rindex(b"\n", 0, len(data) - 1) + 1
    (out / "samples.jsonl").write_bytes(data[: cut + (len(data) - cut) // 2])
    with pytest.warns(UserWarning, match="set aside 1 unusable"):
        resumed = run_eval(SYN, str(answering_model_dir), out, **args)
    again, replayed = keys(out)
    assert sorted(again) == sorted(done) and len(set(again)) == 8
    assert again[:7] == done[:7] and replayed[:7] == rows[:7]
    assert replayed[7]["prediction"] == rows[7]["prediction"]  # greedy: the replayed pair plays the same episode
    assert resumed["metrics"] == m

    # a finished run reruns without playing anything; more samples per question extend it
    run_eval(SYN, str(answering_model_dir), out, **args)
    assert keys(out)[0] == again
    run_eval(SYN, str(answering_model_dir), out, **{**args, "k": 3})
    more, _ = keys(out)
    assert len(more) == 12 and len(set(more)) == 12 and more[:8] == again
    with pytest.raises(ValueError, match="another run"):
        run_eval(SYN, str(answering_model_dir), out, **{**args, "temperature": 0.5})


def serve_model(model_dir):
    """Our model server (SGLang's native API and /v1) for `model_dir` on a loopback port, in a thread with its own
    event loop; yields its URL."""
    from searchgym.agents.engines.torch_engine import TorchEngine
    from searchgym.serve.model.app import serving
    from searchgym.serve.settings import ModelServerSettings

    urls, stop = queue.Queue(), threading.Event()

    async def serve():
        engine = TorchEngine(model_dir, seed=0)
        try:
            async with serving(engine, ModelServerSettings(model_path=str(model_dir), port=0)) as url:
                urls.put(url)
                while not stop.is_set():
                    await asyncio.sleep(0.05)
        finally:
            await engine.close()

    def run():
        try:
            asyncio.run(serve())
        except BaseException as e:  # noqa: BLE001 - handed to the test instead of a 60 s wait
            urls.put(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    url = urls.get(timeout=60)
    if isinstance(url, BaseException):
        raise url
    yield url
    stop.set()
    thread.join(timeout=30)


@pytest.fixture
def answering_server(answering_model_dir):
    yield from serve_model(answering_model_dir)


def test_eval_cli_through_the_model_server_on_a_local_knowledge_suite(
    tmp_path, answering_server, small_bundle, capsys, one_torch_thread
):
    """`searchgym eval` on a suite in ASearcher's data layout over a local index, played through SGLang's API: the
    suite's default judges score the answers of a policy that gives them."""
    import types

    tasks = list(gym.make(SYN, **WARM_ENV).unwrapped.tasks)
    warm_tasks = [tasks[0], tasks[3]]  # questions the served policy learnt (the oracle could not solve tasks[1])
    root = asearcher_layout(tmp_path / "data", types.SimpleNamespace(tasks=warm_tasks), n=2)
    out = tmp_path / "eval"
    play = {k: WARM_ENV[k] for k in ("instructions", "top_k", "doc_chars", "max_turns")}
    env_kwargs = {"data_root": str(root), "index": str(small_bundle / "index"), **play}
    code = main(
        [
            "eval",
            "--env",
            "searchgym/HotpotQA-v0",
            "--engine",
            f"sglang:{answering_server}",
            "--k",
            "2",
            "--out",
            str(out),
            "--env-kwargs",
            json.dumps(env_kwargs),
            "--concurrency",
            "4",
            "--max-new-tokens",
            "24",
            "--max-context",
            "1024",
            "--temperature",
            "0",
        ]
    )
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["judges"] == ["em", "f1"] and summary["metrics"]["samples"] == 4  # the suite's default judges
    done, rows = keys(out)
    assert len(set(done)) == 4 and {t for t, _ in done} == {t.id for t in warm_tasks}
    assert all(r["trajectory"]["input_ids"] for r in rows)  # token in, token out through the server
    for row in rows:
        check_judged(row)  # the suite env's own reward is F1 too
    assert sum(r["prediction"] is not None for r in rows) >= 3 and any(r["verdicts"]["em"]["correct"] for r in rows)
    check_metrics_are_the_rows(summary["metrics"], rows, 2)
    assert "| f1 |" in capsys.readouterr().out


# --- the HTML report -------------------------------------------------------------------------------

EVIL = '<script>document.title="pwned"</script><img src=x onerror=alert(1)> & "quotes"'


def report_fixture(tmp_path):
    turns = [
        {"action": f"<search>{EVIL}</search>", "tool": "search", "observation": f"<information>{EVIL}</information>"},
        {"action": "<answer>Paris</answer>", "tool": "answer", "observation": "over"},
    ]
    rows = [
        {
            "task_id": f"q{t}",
            "sample": s,
            "question": f"Question {t} {EVIL}",
            "answers": ["Paris"],
            "prediction": "Paris",
            "reward": 1.0,
            "verdicts": {"em": verdict(float(s == 0)), "llm": verdict(0.0, error="no verdict")},
            "stats": {
                "turns": 2,
                "searches": 1,
                "accesses": 0,
                "generated_tokens": 9,
                "answered": True,
                "stop_reason": "answer",
            },
            "trajectory": {"turns": turns, "messages": [{"role": "user", "content": "prompt"}]},
        }
        for t in range(2)
        for s in range(2)
    ]
    from searchgym.eval.harness import summarize_rows

    summary = summarize_rows(rows, 2, env_id=SYN, engine="tiny", judges=["em", "llm"])
    path = tmp_path / "report.html"
    path.write_text(html_report(summary, rows, {}), encoding="utf-8")
    return path


class Structure(HTMLParser):
    """Cells of the scores table, <pre> texts inside the trajectory viewer, script texts and event-handler
    attributes."""

    def __init__(self):
        super().__init__()
        self.stack, self.cells, self.pres, self.handlers, self.details, self.title = [], [], [], 0, 0, ""
        self.scripts = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.stack.append((tag, attrs))
        self.handlers += any(k.startswith("on") for k in attrs)
        self.scripts += [""] if tag == "script" else []
        self.details += tag == "details"

    def handle_endtag(self, tag):
        while self.stack and self.stack.pop()[0] != tag:
            pass

    def handle_data(self, data):
        tags = [t for t, _ in self.stack]
        inside_scores = any(t == "table" and a.get("class") == "scores" for t, a in self.stack)
        if tags and tags[-1] == "td" and inside_scores:
            self.cells.append(data)
        if tags and tags[-1] == "pre" and any(a.get("id") == "trajectories" for _, a in self.stack):
            self.pres.append(data)
        if tags and tags[-1] == "title":
            self.title += data
        if tags and tags[-1] == "script":
            self.scripts[-1] += data


def check_structure(text):
    doc = Structure()
    doc.feed(text)
    assert doc.handlers == 0 and doc.scripts == [SCRIPT], (
        "untrusted text became markup (only the report's own script runs)"
    )
    assert doc.title == f"searchgym eval: {SYN}"
    assert doc.cells[:5] == ["em", "0.500", "0.500", "1.000", "0"] and doc.cells[5] == "llm" and doc.cells[-1] == "4"
    assert any(f"<search>{EVIL}</search>" in p for p in doc.pres)
    assert doc.details >= 2 + 4 + 8  # questions, samples, turns (+ prompts)


def test_report_escapes_untrusted_text(tmp_path):
    check_structure(report_fixture(tmp_path).read_text())


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium package is not installed")
def test_report_renders_in_headless_chromium(tmp_path):
    path = report_fixture(tmp_path)
    dom = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", path.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    check_structure(dom)  # the browser's DOM: the table rendered, the trajectory is text, nothing ran


def test_eval_through_an_openai_compatible_endpoint(tmp_path, answering_server, one_torch_thread):
    """Text in, text out: the endpoint drops the stop string, the workflow puts the call's close back, the env
    parses it, and the judges score the answers of a policy that gives them."""
    out = tmp_path / "eval"
    summary = run_eval(
        SYN,
        f"openai:{answering_server}/v1",
        out,
        k=2,
        judge="em,f1",
        max_tasks=4,
        concurrency=8,
        env_kwargs=WARM_ENV,
        temperature=0.0,
        max_new_tokens=24,
        progress=False,
    )
    m = summary["metrics"]
    assert m["samples"] == 8 and m["generated_tokens"] == 0  # text only: no token arrays
    done, rows = keys(out)
    assert len(set(done)) == 8
    for row in rows:
        traj = row["trajectory"]
        assert traj["input_ids"] == [] and [msg["role"] for msg in traj["messages"][:2]] == ["user", "assistant"]
        for turn in traj["turns"]:
            if turn["tool"] != "invalid":  # a call that ran ends at its close, as the token path's do
                assert turn["action"].rstrip().endswith(f"</{turn['tool']}>"), turn["action"]
        check_judged(row)
    assert sum(r["prediction"] is not None for r in rows) >= 5 and any(r["verdicts"]["em"]["correct"] for r in rows)
    check_metrics_are_the_rows(m, rows, 2)


async def test_the_judged_answer_is_the_one_the_env_recorded(small_pool, small_index):
    """The prediction the judges see is the answer the env judged; no answer is wrong, not a judge failure."""
    from searchgym.agents.workflow import Workflow
    from searchgym.envs.search_env import SearchEnv
    from searchgym.eval.harness import eval_judge, judge_all

    task = small_pool[0]
    env = SearchEnv(small_pool, small_index, max_turns=2)
    workflow = Workflow()
    _, answered = await workflow.start_episode(env, 0, {"task_id": task.id})
    await workflow.step_env(env, answered, "<search> x </search>", 0.0)
    await workflow.step_env(env, answered, f"<think>sure</think><answer> {task.answers[0]} </answer>", 0.0)
    _, silent = await workflow.start_episode(env, 0, {"task_id": task.id})
    for _ in range(2):
        await workflow.step_env(env, silent, "<search> x </search>", 0.0)
    assert answered.prediction == task.answers[0] and silent.prediction is None and silent.truncated
    judge = eval_judge("em,f1")
    right = await judge_all(judge, answered.prediction, task.answers, task.question)
    assert right["em"]["score"] == 1.0 and right["f1"]["correct"]
    wrong = await judge_all(judge, silent.prediction, task.answers, task.question)
    assert wrong["em"]["score"] == 0.0 and wrong["em"]["error"] is None


async def test_aug_answers_reach_only_the_judges_that_blend_them():
    """A task's ASearcher aug_answer counts 0.3 for asearcher_f1 in an evaluation, and nothing for searchgym's f1."""
    from searchgym.eval.harness import eval_judge, judge_all

    verdicts = await judge_all(eval_judge("asearcher_f1,f1"), "Lutetia", ["Paris"], "Capital of France?", ["Lutetia"])
    assert verdicts["asearcher_f1"]["score"] == pytest.approx(0.3) and verdicts["f1"]["score"] == 0.0
    assert not verdicts["asearcher_f1"]["correct"]


def test_a_damaged_run_record_is_one_error_naming_the_file(tmp_path):
    (tmp_path / "run.json").write_text('{"env": "searchgym/Synthe')  # cut by a kill
    with pytest.raises(ValueError, match=r"run\.json is damaged"):
        run_eval(SYN, "openai:http://127.0.0.1:9/v1", tmp_path, k=1)
    assert (tmp_path / "run.json").read_text() == '{"env": "searchgym/Synthe'  # left for the user to restore
