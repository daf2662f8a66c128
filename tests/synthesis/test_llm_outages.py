"""Synthesis through LLM outages (issue 26): an endpoint that is down, fails intermittently or cuts its replies
at max_tokens burns no seed; the command says why it failed, and a rerun with the endpoint back finishes them."""

import json
import socket

import pytest

from searchgym.cli import main as cli_main
from searchgym.envs.tasks import TaskPool
from searchgym.synthesis.pool import summary_path
from searchgym.testing.stand_in_llm import StandInLLM, stand_in_server


@pytest.fixture
def fast_retries(monkeypatch):
    monkeypatch.setenv("SEARCHGYM_LLM_BACKOFF", "0.001")
    monkeypatch.setenv("SEARCHGYM_LLM_RETRIES", "2")


def closed_port_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


def synth(small_bundle, url, out, n, seeds, *extra):
    return cli_main(
        [
            "synthesize",
            "--corpus",
            str(small_bundle / "index"),
            "--engine",
            f"openai:{url}:stand-in",
            "--n",
            str(n),
            "--out",
            str(out),
            "--max-seeds",
            str(seeds),
            "--concurrency",
            "4",
            "--k",
            "2",
            *extra,
        ]
    )


def progress_rows(out):
    return [json.loads(line) for line in out.with_name(out.name + ".progress.jsonl").read_text().splitlines()]


def test_an_endpoint_that_is_down_burns_no_seed_and_the_rerun_finishes_them(
    small_bundle, tmp_path, fast_retries, capsys
):
    out = tmp_path / "pool.jsonl"
    down = closed_port_url()
    assert synth(small_bundle, down, out, 3, 12) == 1
    err = capsys.readouterr().err
    assert "all 12 seeds tried failed on an LLM call" in err
    assert f"read: call: LLM endpoint {down}/chat/completions: gave up after 3 attempts" in err
    assert "ClientConnectorError" in err or "Cannot connect" in err
    report = json.loads(summary_path(out).read_text())
    assert report["seeds_finished"] == 0 and report["rejections"] == {} and report["accepted"] == 0
    assert report["failed_calls"] == {"seeds_pending": 12, "tries_failed": 12, "by_reason": {"read: call": 12}}
    assert all("failed" in row for row in progress_rows(out))  # no seed recorded as finished
    with stand_in_server(StandInLLM()) as url:  # the endpoint is back
        assert synth(small_bundle, url, out, 3, 12) == 0
    again = json.loads(summary_path(out).read_text())
    assert again["accepted"] == 3 and len(TaskPool.from_jsonl(out)) == 3
    assert again["this_run"]["seeds_tried"] >= 3 and again["this_run"]["seeds_failed"] == 0
    assert again["failed_calls"]["tries_failed"] == 12  # counted across both processes
    assert again["failed_calls"]["seeds_pending"] < 12


def test_a_long_outage_stops_the_run_instead_of_trying_every_seed(small_bundle, tmp_path, fast_retries, capsys):
    out = tmp_path / "pool.jsonl"
    assert synth(small_bundle, closed_port_url(), out, 3, 60) == 1
    err = capsys.readouterr().err
    assert "stopped early: 16 seeds in a row failed on an LLM call; " in err and "seeds not tried" in err
    tried = json.loads(summary_path(out).read_text())["this_run"]["seeds_tried"]
    assert 16 <= tried < 24  # the workers in flight finish; no new seed is taken


def test_intermittent_failures_and_cut_replies_lose_nothing(small_bundle, tmp_path, fast_retries, capsys):
    """Every 5th request is a 503 or 429 (the client retries it) and every read of a seed whose title has an 'a'
    in second place is cut at max_tokens: those seeds are failures, the rest finish, the rerun finishes them."""

    def faults(n, prompt):
        if prompt.startswith("## Task: read a page") and "\nTitle: " in prompt:
            title = prompt.split("\nTitle: ", 1)[1].split("\n", 1)[0]
            if title[1:2] == "a":
                return "cut"
        return {0: "503", 1: "429"}.get(n % 10) if n % 5 == 0 else None

    double = StandInLLM(faults=faults)
    out = tmp_path / "pool.jsonl"
    with stand_in_server(double) as url:
        code = synth(small_bundle, url, out, 30, 20)
        first = json.loads(summary_path(out).read_text())
        cut = first["failed_calls"]["by_reason"].get("read: cut off", 0)
        assert cut > 0 and set(first["failed_calls"]["by_reason"]) == {"read: cut off"}  # 503/429 were retried
        assert code == 1 and "read: cut off" in capsys.readouterr().err
        finished = {row["url"] for row in progress_rows(out) if "failed" not in row}
        assert len(finished) == 20 - cut and first["seeds_finished"] == 20 - cut
        double.faults = None  # the endpoint is healthy again
        synth(small_bundle, url, out, 30, 20)
    second = json.loads(summary_path(out).read_text())
    assert second["this_run"]["seeds_tried"] == cut and second["failed_calls"]["seeds_pending"] == 0
    assert second["seeds_finished"] == 20 and second["failed_calls"]["tries_failed"] == cut
    rows = progress_rows(out)
    done = [row["url"] for row in rows if "failed" not in row]
    assert len(done) == len(set(done)) == 20  # every seed finished exactly once


def test_retry_settings_are_checked_naming_the_key():
    from searchgym.synthesis.qa_agent import QAConfig

    for key, bad in [("reply_attempts", 0), ("reply_attempts", "3"), ("retry_backoff", -1.0)]:
        with pytest.raises(ValueError, match=key):
            QAConfig(**{key: bad})
