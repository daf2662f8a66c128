"""`searchgym view` over HTTP: it finds the runs, filters episodes from the URL, steps through an episode, shows
tokens and pages on demand, compares two runs, and answers bad input (missing, half-written, damaged, older or
huge runs, bad parameters) with a page that says why; it never writes to a run folder."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from urllib.parse import parse_qsl

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchgym.cli import main
from searchgym.serve.http import serve_app
from searchgym.view.app import viewer_app
from searchgym.view.episode_filter import PAGE_SIZE, EpisodeFilter
from searchgym.view.runs import OUTCOMES, EpisodeSummary, find_runs
from tests.conftest import SMALL
from tests.view.runs import sample_row, write_eval, write_training


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under root and its sha256: what 'never writes' is checked against."""
    files = (p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture
def quickstart_shaped(tmp_path):
    """OUT/eval-sft and OUT/eval-rl on the same 12 questions (k=2), OUT/rl a training run: the quickstart's layout."""
    root = tmp_path / "quickstart"
    sft = [sample_row(i, sample=s, turns=2) for i in range(12) for s in range(2)]
    rl = [sample_row(i + (1 if i % 4 == 0 else 0), sample=s, turns=3) for i in range(12) for s in range(2)]
    for row, i in zip(rl, [i for i in range(12) for _ in range(2)], strict=True):
        row["task_id"], row["question"] = f"q{i}", f"What is thing {i}?"  # same questions, other outcomes
    write_eval(root / "eval-sft", sft, k=2)
    write_eval(root / "eval-rl", rl, k=2)
    write_training(root / "rl")
    return root


async def fetch(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url) as response:
        return response.status, await response.text()


def rows_of(page: str) -> list[str]:
    return re.findall(r'data-episode="(\d+)"', page)


async def test_runs_are_found_and_listed_with_their_scores(quickstart_shaped, tmp_path):
    runs, problems = find_runs([quickstart_shaped, tmp_path / "missing"])
    assert [(r.label, r.kind) for r in runs] == [
        ("quickstart/eval-rl", "eval"),
        ("quickstart/eval-sft", "eval"),
        ("quickstart/rl", "train"),
    ]
    assert [p.why for p in problems] == ["does not exist"]
    async with serve_app(viewer_app([quickstart_shaped])) as url, aiohttp.ClientSession() as s:
        status, page = await fetch(s, url + "/")
        assert status == 200
        assert "Avg@2: EM 0.500, F1 0.625" in page and page.count("data-run=") == 3
        assert all(f"/run/{i}/chart/turns.svg" in page for i in range(3)) and "/run/2/chart/steps.svg" in page


async def test_the_list_filters_and_sorts_from_the_url(quickstart_shaped):
    async with serve_app(viewer_app([quickstart_shaped / "eval-sft"])) as url, aiohttp.ClientSession() as s:
        _, everything = await fetch(s, url + "/run/0")
        assert len(rows_of(everything)) == 24
        _, wrong = await fetch(s, url + "/run/0?outcome=wrong")
        assert len(rows_of(wrong)) == 12 and 'class="episode wrong"' in wrong and 'class="episode correct"' not in wrong
        _, split = await fetch(s, url + "/run/0?disagree=1")
        assert rows_of(split) == []  # eval-sft's judges agree on every sample
        _, hops = await fetch(s, url + "/run/0?hops=2&sort=reward-desc")
        assert len(rows_of(hops)) == 8 and "12 of 24" not in hops and "8 of 24 episodes" in hops
        status, bad = await fetch(s, url + "/run/0?min_turns=lots&outcome=maybe&judge=gpt")
        assert status == 200 and len(rows_of(bad)) == 24  # each bad value is named and dropped, the rest applies
        for message in ("min_turns: 'lots' is not a whole number", "outcome: 'maybe'", "judge: 'gpt' is not a judge"):
            assert message in bad.replace("&#39;", "'")


async def test_an_episode_steps_turn_by_turn_and_shows_its_context_segments(tmp_path):
    rows = [sample_row(0, turns=4), sample_row(1, turns=2, folded=True, disagree=True)]
    run = write_eval(tmp_path / "eval", rows)
    async with serve_app(viewer_app([run])) as url, aiohttp.ClientSession() as s:
        _, first = await fetch(s, url + "/run/0/episode/0")
        assert 'id="turn-0"' in first and 'id="turn-1"' not in first and "turn 0 of 3" in first
        assert "entity 0 part 0" in first and "/run/0/page?url=https%3A%2F%2Fworld.searchgym.test%2Fwiki%2FE0" in first
        _, last = await fetch(s, url + "/run/0/episode/0?turn=3")
        assert 'id="turn-3"' in last and "<answer> Answer 0 </answer>".replace("<", "&lt;").replace(">", "&gt;") in last
        assert 'id="next-turn"' not in last and 'id="prev-turn"' in last
        _, every = await fetch(s, url + "/run/0/episode/0?turn=all")
        assert all(f'id="turn-{t}"' in every for t in range(4))
        _, folded = await fetch(s, url + "/run/0?folded=1")
        assert rows_of(folded) == ["1"]
        _, split = await fetch(s, url + "/run/0?disagree=1")
        assert rows_of(split) == ["1"]
        _, episode = await fetch(s, url + "/run/0/episode/1?turn=1")
        assert "Context rebuilt before this turn (fold)" in episode and "context rebuilt here (fold)" in episode
        assert "2 segments" in episode and "ended by fold" in episode
        status, tokens = await fetch(s, url + "/run/0/episode/1/tokens?segment=0")
        assert status == 200 and tokens.count('class="written"') == 5 and "-0.500" in tokens
        status, tokens = await fetch(s, url + "/run/0/episode/1/tokens?segment=1")
        assert status == 200 and tokens.count('class="written"') == 4 and "-0.250" in tokens
        for path, code in (("/run/0/episode/1/tokens?segment=5", 404), ("/run/0/episode/0?turn=9", 400)):
            assert (await fetch(s, url + path))[0] == code


async def test_a_training_run_lists_episodes_by_version_with_its_step_chart(quickstart_shaped):
    async with serve_app(viewer_app([quickstart_shaped / "rl"])) as url, aiohttp.ClientSession() as s:
        _, page = await fetch(s, url + "/run/0")
        assert len(rows_of(page)) == 6 and "q0 v0" in page and "q10 v1" in page
        assert "What is thing 11?" in page  # the question read off the trajectory's first user message
        async with s.get(url + "/run/0/chart/steps.svg") as chart:
            assert chart.status == 200 and chart.content_type == "image/svg+xml"
            assert b"Reward and tool calls per step" in await chart.read()


async def test_two_runs_side_by_side_on_the_same_questions(quickstart_shaped):
    async with serve_app(viewer_app([quickstart_shaped])) as url, aiohttp.ClientSession() as s:
        _, page = await fetch(s, url + "/compare?a=1&b=0")  # eval-sft against eval-rl
        assert "12 questions in both runs" in page
        _, changed = await fetch(s, url + "/compare?a=1&b=0&changed=1")
        tasks = re.findall(r'data-task="([^"]+)"', changed)
        assert tasks and len(tasks) < 12  # only the questions whose reward moved
        _, both = await fetch(s, url + f"/compare/episode?a=1&b=0&task={tasks[0]}")
        assert both.count('class="side"') == 2 and "quickstart/eval-sft" in both and "quickstart/eval-rl" in both
        assert (await fetch(s, url + "/compare?a=0&b=0"))[0] == 400
        assert (await fetch(s, url + "/compare/episode?a=0&b=1&task=nope"))[0] == 404


async def test_a_hit_links_to_the_page_text_of_the_runs_own_world(tmp_path, small_bundle):
    from searchgym.world.synthetic_env import make_synthetic_qa

    env = make_synthetic_qa(**SMALL, split="test")
    run = write_eval(tmp_path / "eval", [sample_row(0)])
    (run / "run.json").write_text(json.dumps({"env": "searchgym/SyntheticQA-v0", "env_kwargs": {**SMALL}}))
    url_of_page = env.page_backend.get_page("0").url
    async with serve_app(viewer_app([run])) as url, aiohttp.ClientSession() as s:
        async with s.get(url + "/run/0/page", params={"url": url_of_page}) as r:
            page = await r.text()
        assert r.status == 200 and 'id="page-text"' in page
        assert env.page_backend.get_page(url_of_page).text.split("\n")[0][:40] in page
        async with s.get(url + "/run/0/page", params={"url": "https://elsewhere.test/x"}) as r:
            missing = await r.text()
        assert 'id="page-why"' in missing and "could not be opened" in missing


async def test_run_text_is_escaped_and_the_pages_run_no_script(tmp_path):
    hostile = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    row = sample_row(0, question=hostile)
    row["trajectory"]["turns"][0]["observation"] = hostile
    run = write_eval(tmp_path / "eval", [row])
    async with serve_app(viewer_app([run])) as url, aiohttp.ClientSession() as s:
        for path in ("/run/0", "/run/0/episode/0"):
            async with s.get(url + path) as r:
                page = await r.text()
                assert "script-src" not in r.headers["Content-Security-Policy"]  # default-src 'none': no script
                assert "default-src 'none'" in r.headers["Content-Security-Policy"]
            assert "<script>" not in page and "&lt;script&gt;" in page and "<img src=x" not in page


async def test_bad_runs_get_pages_that_say_why_and_nothing_is_written(tmp_path):
    half = write_eval(tmp_path / "half", [sample_row(i) for i in range(3)], summary=False)
    with (half / "samples.jsonl").open("a") as f:
        f.write("{broken json\n")  # a damaged line
        f.write(json.dumps({"task_id": "old", "verdicts": "em=1"}) + "\n")  # an older row's shape
        f.write(json.dumps([1, 2]) + "\n")
        f.write(json.dumps(sample_row(9))[:200])  # cut short: the run is still writing it
    empty = tmp_path / "empty"
    empty.mkdir()
    before = tree_digest(tmp_path)
    async with serve_app(viewer_app([half, empty, tmp_path / "gone"])) as url, aiohttp.ClientSession() as s:
        _, home = await fetch(s, url + "/")
        assert "gone</code>: does not exist" in home and "empty</code>: holds no run" in home
        assert "no summary.json yet" in home
        _, page = await fetch(s, url + "/run/0")
        assert len(rows_of(page)) == 4  # the three good rows, and the older row read as far as it goes
        for what in ("line 4</code>: not JSON", "line 6</code>: not a JSON object", "line 7</code>: cut short"):
            assert what in page
        for path in ("/run/7", "/run/0/episode/99", "/run/x", "/run/0/chart/pie.svg", "/run/0/page", "/nowhere"):
            status, body = await fetch(s, url + path)
            assert status in (400, 404) and "Traceback" not in body, (path, status)
        for i in range(4):
            for path in (f"/run/0/episode/{i}", f"/run/0/episode/{i}?turn=all", f"/run/0/episode/{i}/tokens"):
                status, body = await fetch(s, url + path)
                assert status == 200, (path, body[:500])
    assert tree_digest(tmp_path) == before


async def test_a_file_that_changes_under_the_viewer_is_reread_not_misread(tmp_path):
    run = write_eval(tmp_path / "eval", [sample_row(i) for i in range(2)])
    async with serve_app(viewer_app([run])) as url, aiohttp.ClientSession() as s:
        assert len(rows_of((await fetch(s, url + "/run/0"))[1])) == 2
        write_eval(run, [sample_row(i) for i in range(5, 8)])  # rewritten by a rerun
        _, page = await fetch(s, url + "/run/0")
        assert len(rows_of(page)) == 3 and "What is thing 5?" in page


async def test_ten_thousand_episodes_open_and_filter_a_page_at_a_time(tmp_path):
    rows = [sample_row(i, sample=0, tokens=200) for i in range(10_000)]
    run = write_eval(tmp_path / "big", rows)
    size = (run / "samples.jsonl").stat().st_size
    async with serve_app(viewer_app([run])) as url, aiohttp.ClientSession() as s:
        _, page = await fetch(s, url + "/run/0?outcome=correct&min_turns=2&sort=reward-desc")
        assert "5000 of 10000 episodes" in page and len(rows_of(page)) == PAGE_SIZE
        assert len(page) < 100_000 < size / 100  # one page of summaries, never the tokens
        _, last = await fetch(s, url + "/run/0?outcome=correct&page=100")
        assert len(rows_of(last)) == PAGE_SIZE and "page 100 of 100" in last


async def test_a_fifty_megabyte_trajectory_opens_cut_with_the_whole_text_a_link_away(tmp_path):
    observation = "x" * 50_000_000
    run = write_eval(tmp_path / "huge", [sample_row(0, observation=observation), sample_row(1)])
    async with serve_app(viewer_app([run])) as url, aiohttp.ClientSession() as s:
        _, page = await fetch(s, url + "/run/0/episode/0")
        assert len(page) < 100_000 and "showing 6000 of 50000000 characters" in page
        status, text = await fetch(s, url + "/run/0/episode/0/turn/0/observation.txt")
        assert status == 200 and len(text) == 50_000_000


SUMMARIES = st.builds(
    lambda i, turns, calls, prediction, em, f1, hops, folded: EpisodeSummary(
        i, f"q{i}", 0, None, f"question {i}", prediction, float(em or 0), turns, calls, 0, "answer", hops,
        {"em": em, "f1": f1}, folded, Path("x"), 0,
    ),
    st.integers(0, 10**6), st.integers(0, 70), st.integers(0, 70), st.none() | st.text(max_size=5),
    st.none() | st.booleans(), st.none() | st.booleans(), st.none() | st.integers(1, 4), st.booleans(),
)  # fmt: skip
QUERIES = st.dictionaries(
    st.sampled_from([f.name for f in EpisodeFilter.__dataclass_fields__.values()] + ["junk"]),
    st.text(max_size=6) | st.sampled_from([*OUTCOMES, "em", "f1", "1", "3", "-2", "turns-desc"]),
)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(QUERIES, st.lists(SUMMARIES, max_size=30))
def test_any_query_gives_a_filter_whose_episodes_each_pass_it(query, episodes):
    chosen, errors = EpisodeFilter.parse(query, ["em", "f1"])
    assert chosen.judge in ("em", "f1") and all(isinstance(e, str) for e in errors)
    shown = chosen.apply(episodes)
    kept = [e for e in episodes if chosen.keeps(e)]
    assert sorted(map(id, shown)) == sorted(map(id, kept))  # exactly the episodes that pass
    if chosen.sort == "file":
        assert shown == kept
    again, more = EpisodeFilter.parse(dict(parse_qsl(chosen.query())), ["em", "f1"])
    assert not more and again.apply(episodes) == shown  # the view's link reproduces the view


def test_the_command_refuses_folders_without_runs(tmp_path, capsys):
    assert main(["view", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "no run to show" in err


def test_the_command_names_a_port_that_is_taken(quickstart_shaped, capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["view", str(quickstart_shaped), "--port", str(port)]) == 2
    assert f"cannot serve on 127.0.0.1:{port}" in capsys.readouterr().err
