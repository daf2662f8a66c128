"""Evaluation through failing dependencies (issue 26): a judge endpoint whose replies are cut at max_tokens, an
agent endpoint that is down, and a stored row that lacks fields. Nothing is scored from a failure, nothing is
lost, failures are counted apart across resumed processes, and a rerun with the endpoints back completes them."""

import json
import socket

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchgym.cli import main as cli_main
from searchgym.core.llm_calls import DependencyFailed
from searchgym.eval.harness import ROW_FIELDS, STATS_FIELDS, SampleStore, run_eval
from searchgym.testing.stand_in_llm import StandInLLM, serve_in_thread, stand_in_server
from tests.conftest import WARM_ENV

SYN = "searchgym/SyntheticQA-v0"


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    monkeypatch.setenv("SEARCHGYM_LLM_BACKOFF", "0.001")
    monkeypatch.setenv("SEARCHGYM_LLM_RETRIES", "1")


def answering_agent(fails=None):
    """TEST DOUBLE: an OpenAI-compatible agent endpoint that answers every question at once with 'Velmora';
    `fails(prompt)` true makes it refuse that request with a 503 (as an overloaded server does)."""

    async def chat(request):
        body = await request.json()
        if fails is not None and fails(body["messages"][-1]["content"]):
            return web.json_response({"error": {"message": "overloaded"}}, status=503, headers={"Retry-After": "0"})
        return web.json_response(
            {
                "id": "a",
                "object": "chat.completion",
                "created": 0,
                "model": "agent",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "<answer>Velmora</answer>"},
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return serve_in_thread(app)


def closed_port_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


def evaluate(agent_url, judge_url, out):
    return run_eval(
        SYN,
        f"openai:{agent_url}/v1",
        out,
        k=2,
        judge="em,llm",
        judge_model=f"openai:{judge_url}",
        max_tasks=3,
        concurrency=4,
        env_kwargs=WARM_ENV,
        temperature=0.0,
        max_new_tokens=16,
        progress=False,
        report=False,
    )


def rows(out):
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]


def test_cut_judge_replies_are_failures_rejudged_by_the_rerun_and_counted_across_processes(tmp_path):
    out = tmp_path / "eval"
    judge = StandInLLM(faults=lambda n, prompt: "cut")
    with answering_agent() as agent, stand_in_server(judge) as judge_url:
        with pytest.raises(DependencyFailed, match=r"judge 'llm' failed on 6 of 6 samples.*cut off"):
            evaluate(agent, judge_url, out)
        first = json.loads((out / "summary.json").read_text())
        assert first["metrics"]["failures/llm"] == 6 and first["metrics"]["avg@2/llm"] is None  # never Incorrect
        assert first["judge_stats"]["llm"] == {"calls": 18, "cache_hits": 0, "failures": 6, "pending": 6}
        judge.faults = None  # the judge endpoint is healthy again
        summary = evaluate(agent, judge_url, out)
    assert summary["metrics"]["failures/llm"] == 0 and summary["metrics"]["samples"] == 6
    # the 18 failed calls of the first process count on; each of the 6 samples took one call or a cache hit now
    stats = summary["judge_stats"]["llm"]
    assert stats["calls"] - 18 + stats["cache_hits"] == 6 and (stats["failures"], stats["pending"]) == (6, 0)
    assert summary["card"]["run"]["llm_calls"]["judges"]["llm"] == stats
    stored = rows(out)
    assert len(stored) == 12 and sum(r.get("revision", 0) == 1 for r in stored) == 6  # appended, nothing rewritten
    assert all(r["verdicts"]["llm"]["error"] is None for r in stored if r.get("revision"))


def test_an_agent_endpoint_that_is_down_is_a_failure_of_each_sample_never_a_wrong_answer(tmp_path):
    out = tmp_path / "eval"
    judge = StandInLLM()
    down = closed_port_url()
    with stand_in_server(judge) as judge_url:
        with pytest.raises(DependencyFailed, match="all 6 episodes failed .*rerun"):
            evaluate(down.removesuffix("/v1"), judge_url, out)
        assert not (out / "samples.jsonl").exists() or rows(out) == []  # nothing scored
        failures = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
        assert len(failures) == 6 and all(f["stage"] == "agent" and "OpenAIError" in f["error"] for f in failures)
        with answering_agent() as agent:
            run = out / "run.json"  # the agent came back on another port: the same run otherwise
            run.write_text(run.read_text().replace(down.removesuffix("/v1"), agent))
            summary = evaluate(agent, judge_url, out)
    assert summary["metrics"]["samples"] == 6 and summary["failed_calls"]["agent"] == {"failures": 6, "pending": 0}


def test_a_row_missing_fields_is_reported_and_played_again_without_losing_the_others(tmp_path):
    out = tmp_path / "eval"
    with answering_agent() as agent, stand_in_server(StandInLLM()) as judge_url:
        evaluate(agent, judge_url, out)
        lines = (out / "samples.jsonl").read_text().splitlines()
        broken = json.loads(lines[2])
        del broken["stats"]
        lines[2] = json.dumps(broken)
        (out / "samples.jsonl").write_text("\n".join(lines) + "\n")
        with pytest.warns(UserWarning, match=r"line 3: damaged \(missing field 'stats'\)"):
            summary = evaluate(agent, judge_url, out)
    assert summary["metrics"]["samples"] == 6
    kept = rows(out)
    assert len(kept) == 6 and [json.loads(line) for line in lines[:2]] == kept[:2]
    aside = [json.loads(line) for line in (out / "samples.damaged.jsonl").read_text().splitlines()]
    assert aside[0]["line"] == 3 and json.loads(aside[0]["text"]) == broken  # the user's row is kept, not lost


def test_the_eval_command_exits_non_zero_naming_an_agent_outage_and_its_rerun_completes(tmp_path, capsys):
    """The agent endpoint keeps failing for one question: its samples are failures (logged, counted, not scored),
    the others are stored, the command exits 1 naming the cause; with the endpoint healthy the rerun plays them."""
    import gymnasium as gym

    out = tmp_path / "eval"
    first = gym.make(SYN, **WARM_ENV).unwrapped.tasks[0].question
    args = [
        "eval",
        "--env",
        SYN,
        "--k",
        "2",
        "--judge",
        "em",
        "--max-tasks",
        "3",
        "--out",
        str(out),
        "--env-kwargs",
        json.dumps(WARM_ENV),
        "--max-new-tokens",
        "16",
        "--temperature",
        "0",
    ]
    with answering_agent(fails=lambda prompt: first in prompt) as agent:
        assert cli_main([*args, "--engine", f"openai:{agent}/v1"]) == 1
        err = capsys.readouterr().err
        assert "2 of 6 episodes failed (rerun the command to retry them)" in err and "HTTP 503: overloaded" in err
        summary = json.loads((out / "summary.json").read_text())
        assert summary["metrics"]["samples"] == 4 and summary["failed_calls"]["agent"] == {"failures": 2, "pending": 2}
        assert "2 samples whose agent failed are not stored" in (out / "summary.md").read_text()
    with answering_agent() as agent:
        run = out / "run.json"
        run.write_text(run.read_text().replace(json.loads(run.read_text())["engine"], f"openai:{agent}/v1"))
        assert cli_main([*args, "--engine", f"openai:{agent}/v1"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metrics"]["samples"] == 6 and summary["failed_calls"]["agent"] == {"failures": 2, "pending": 0}
    assert len(rows(out)) == 6 and "## Incomplete" not in (out / "summary.md").read_text()


def _complete_row(i):
    return {
        "task_id": "t",
        "sample": i,
        "reward": 0.5,
        "verdicts": {"em": {"score": 0.0, "correct": False}},
        "stats": {**dict.fromkeys(STATS_FIELDS, 0), "answered": False, "stop_reason": "answer"},
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.sampled_from([*ROW_FIELDS, *(f"stats.{k}" for k in STATS_FIELDS)]), min_size=1, max_size=4, unique=True)
)
def test_any_missing_field_is_named_and_the_other_rows_load(tmp_path_factory, gone):
    path = tmp_path_factory.mktemp("store") / "samples.jsonl"
    broken = _complete_row(1)
    for field in gone:
        if field.startswith("stats.") and isinstance(broken.get("stats"), dict):
            broken["stats"].pop(field.split(".", 1)[1])
        else:
            broken.pop(field, None)
    path.write_text("".join(json.dumps(r) + "\n" for r in (_complete_row(0), broken, _complete_row(2))))
    with pytest.warns(UserWarning, match="line 2: damaged \\(missing field"):
        store = SampleStore(path)
    assert set(store.rows) == {("t", 0), ("t", 2)} and store.damaged[0].line == 2
    named = store.damaged[0].reason
    assert any(repr(f) in named for f in gone if not f.startswith("stats.") or "stats" not in gone)
