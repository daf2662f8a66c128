"""The QA-synthesis agent: control flow, defensive parsing and every rejection path, driven through
OpenAIEngine against a rule-based stand-in LLM (searchgym.testing.stand_in_llm: a test double speaking the
OpenAI chat completions wire format on loopback, shared with the reliability bench), plus the real tiny
model through our model server, the CLI, resuming, and loading a synthesized pool into LocalQA-v0."""

import asyncio
import json
import re

import gymnasium as gym
import pytest

import searchgym  # noqa: F401  (registers the env ids)
from searchgym.agents.engines.openai_engine import OpenAIEngine
from searchgym.cli import main as cli_main
from searchgym.core.llm_calls import DependencyFailed
from searchgym.envs.tasks import TaskPool
from searchgym.synthesis.pool import NearDuplicates, PoolOptions, asynthesize, stage_yields, summary_path
from searchgym.synthesis.qa_agent import QAConfig, QASynthesisAgent, Rejected, parse_json_object
from searchgym.synthesis.run import SynthesisSettings, synthesize
from searchgym.testing.stand_in_llm import StandInLLM, stand_in_server

SCENARIOS = ["accept", "malformed", "missing", "quality", "easy", "nonunique", "answer_changed"]


@pytest.fixture(scope="module")
def seed_docs(small_index):
    """Seven person pages with links, one per scenario."""
    docs = [d for d in small_index.iter_docs() if d.links and re.search(r"\(born \d{4}\)", d.text[:80])]
    return docs[: len(SCENARIOS)]


def _run(index, url, urls, out, n, *, concurrency=3, config=None):
    async def go():
        model = OpenAIEngine(
            url, "stand-in", api_key_env="SEARCHGYM_TEST_NO_SUCH_KEY", backoff_base=0.001, max_retries=2
        )
        agent = QASynthesisAgent(index, index, model, model, config or QAConfig(max_turns=3, k=3, retry_backoff=0.001))
        try:
            return await asynthesize(agent, urls, out, n, PoolOptions(concurrency=concurrency))
        finally:
            await model.close()

    return asyncio.run(go())


def test_parse_json_object_defensive():
    req = {"question": str, "answer": str}
    assert parse_json_object('blah {"x": 1} then {"question": "q?", "answer": "a"} bye', req, "s")["answer"] == "a"
    assert parse_json_object('{"question": "new", "answer": "b"} {"other": 1}', req, "s")["question"] == "new"
    for text, reason in [
        ("no json here", "s: malformed JSON"),
        ('{"question": "q"', "s: malformed JSON"),
        (None, "s: malformed JSON"),
        ('{"question": "q"}', "s: missing fields"),
        ('{"question": "q", "answer": 3}', "s: missing fields"),
        ('{"question": "q", "answer": "  "}', "s: missing fields"),
        ("[1, 2]", "s: malformed JSON"),
    ]:
        with pytest.raises(Rejected) as e:
            parse_json_object(text, req, "s")
        assert e.value.reason == reason


async def test_engine_specs_open_as_every_command_opens_them():
    """synthesize, eval and train share one spec parser: bad specs fail the same clear way everywhere."""
    from searchgym.agents.engines.open import engine_kind, open_engine

    assert engine_kind("openai:http://h:8000/v1:gpt-x") == "openai" and engine_kind("sglang:h:1") == "sglang"
    handle = await open_engine("openai:http://h:8000/v1:gpt-x")
    assert (handle.chat.url, handle.chat.model, handle.engine) == ("http://h:8000/v1/chat/completions", "gpt-x", None)
    await handle.aclose()
    with pytest.raises(ValueError, match="/v1"):
        await open_engine("openai:http://h:8000")
    with pytest.raises(ValueError, match="model directory"):
        await open_engine("no-such-dir-or-spec")


def test_near_duplicates():
    d = NearDuplicates(0.8)
    d.add("Who wrote the book The Sadesh Whispers in 1900?")
    assert d.is_duplicate("who wrote the book the sadesh whispers in 1900")
    assert not d.is_duplicate("Which city hosted the Grand Fair of 1900?")


def test_stage_yields_count_each_seed_once_by_how_it_ended():
    """A retried seed counts by its finishing row, a pending one by its latest failed try; rows of older runs
    without a stage and a seed pooled without its row (a kill between the two writes) are still counted."""
    rows = [
        {"url": "a", "failed": "read: cut off", "stage": "tried"},
        {"url": "a", "reason": "quality: failed", "stage": "edited", "question": "q?"},
        {"url": "b", "failed": "act: unparseable", "stage": "tried"},
        {"url": "b", "failed": "act: unparseable", "stage": "proposed"},
        {"url": "c", "reason": None, "stage": "accepted"},
        {"url": "d", "reason": "near-duplicate question", "stage": "uniqueness"},
        {"url": "e", "reason": "quality: failed"},  # an older run's row
    ]
    table = {row["stage"]: row for row in stage_yields(rows, {"a", "c", "d", "e", "f"})}
    assert table["tried"] == {"stage": "tried", "seeds": 6, "unknown_stage": 1}
    assert [(s, r["seeds"], r["rejected"], r["failed_call"]) for s, r in list(table.items())[1:]] == [
        ("proposed", 5, 0, 0),
        ("edited", 4, 0, 1),  # b: its act step failed
        ("quality", 3, 1, 0),  # a: retried, then rejected
        ("difficulty", 3, 0, 0),
        ("uniqueness", 3, 0, 0),
        ("accepted", 2, 1, 0),  # c and f (pooled, row lost); d a near-duplicate
    ]


def test_every_path_with_the_stand_in(small_index, seed_docs, tmp_path):
    double = StandInLLM({d.title: s for d, s in zip(seed_docs, SCENARIOS, strict=True)})
    out = tmp_path / "pool.jsonl"
    with stand_in_server(double) as url:
        report = _run(small_index, url, [d.url for d in seed_docs], out, n=10)
    # malformed and missing-field replies are asked 3 times, then failures of that call: not finished seeds
    assert report["accepted"] == 1 and report["seeds_finished"] == len(SCENARIOS) - 2
    assert report["rejections"] == {
        "quality: failed": 1,
        "difficulty: too easy": 1,
        "uniqueness: another answer fits": 1,
        "fuzz: answer changed": 1,
    }
    assert report["failed_calls"] == {
        "seeds_pending": 2,
        "tries_failed": 2,
        "by_reason": {"propose: unparseable": 1, "read: unparseable": 1},
    }
    assert json.loads(summary_path(out).read_text())["accepted"] == 1
    assert [row["seeds"] for row in report["stages"]] == [7, 5, 4, 3, 2, 1, 1]
    (task,) = TaskPool.from_jsonl(out)
    meta = task.metadata
    assert task.answers == (seed_docs[0].title,)
    assert [h["action"] for h in meta["history"]] == ["PROPOSE", "FUZZ", "INJECT", "EXIT"]
    fuzz, inject = meta["history"][1], meta["history"][2]
    assert "a certain year" in fuzz["question"] and fuzz["before"] != fuzz["question"]
    assert inject["page"] in seed_docs[0].links and inject["question"] == task.question
    assert meta["pages"] == [seed_docs[0].url, inject["page"]] and len(meta["statements"]) == 2
    assert meta["solve_rate"] == 0.0 and len(meta["solver"]) == 3
    assert all(not s["correct"] and s["answer"] == "Nobody Known" for s in meta["solver"])


def test_resume_skips_finished_seeds(small_index, seed_docs, tmp_path):
    docs = [seed_docs[0], seed_docs[1], seed_docs[3], *[d for d in small_index.iter_docs() if d.links][50:52]]
    double = StandInLLM({seed_docs[1].title: "malformed", seed_docs[3].title: "quality"})
    out = tmp_path / "pool.jsonl"
    urls = [d.url for d in docs]
    with stand_in_server(double) as url:
        first = _run(small_index, url, urls, out, n=1, concurrency=1)
        calls = double.requests
        again = _run(small_index, url, urls, out, n=1, concurrency=1)
        assert double.requests == calls and again["this_run"]["seeds_tried"] == 0  # nothing redone
        more = _run(small_index, url, urls, out, n=2, concurrency=1)
    assert first["accepted"] == 1 and again["accepted"] == 1 and more["accepted"] == 2
    assert more["rejections"] == {"quality: failed": 1}
    assert more["failed_calls"]["seeds_pending"] == 1  # the malformed seed is tried by every run, never finished
    logged = [json.loads(line) for line in out.with_name(out.name + ".progress.jsonl").read_text().splitlines()]
    finished = [row["url"] for row in logged if "failed" not in row]
    assert len(finished) == len(set(finished)) == 3
    assert len(TaskPool.from_jsonl(out)) == 2


def test_a_kill_mid_write_and_a_damaged_line_are_repaired_on_resume(small_index, seed_docs, tmp_path):
    """A pool row cut by a kill and a damaged progress line: the rerun redoes exactly that seed, the pool
    loads, nothing is duplicated, and the damaged line is set aside and reported by line."""
    docs = [d for d in small_index.iter_docs() if d.links][60:66]
    out, urls = tmp_path / "pool.jsonl", [d.url for d in docs]
    with stand_in_server(StandInLLM({})) as url:
        first = _run(small_index, url, urls, out, n=3, concurrency=1)
        assert first["accepted"] == 3
        pool = out.read_bytes()
        out.write_bytes(pool[: len(pool) - 15])  # killed while writing the third task row
        progress = out.with_name(out.name + ".progress.jsonl")
        lines = progress.read_text().splitlines()
        progress.write_text("\n".join([lines[0], '{"url": "glued', *lines[1:]]) + "\n")
        with pytest.warns(UserWarning, match="set aside 1 unusable"):
            again = _run(small_index, url, urls, out, n=3, concurrency=1)
    assert again["accepted"] == 3 and again["this_run"]["seeds_tried"] == 1  # only the lost seed again
    assert again["resumed_from"]["accepted"] == 2 and again["resumed_from"]["damaged_lines"]
    tasks = TaskPool.from_jsonl(out)
    assert len(tasks) == 3 and len({t.metadata["seed_page"] for t in tasks}) == 3
    assert "glued" in (tmp_path / "pool.jsonl.progress.damaged.jsonl").read_text()


def test_cli_pool_loads_into_localqa(small_bundle, tmp_path):
    out = tmp_path / "agent.jsonl"
    with stand_in_server(StandInLLM()) as url:
        code = cli_main(
            [
                "synthesize",
                "--corpus",
                str(small_bundle / "index"),
                "--engine",
                f"openai:{url}:stand-in",
                "--judge-engine",
                f"openai:{url}",
                "--n",
                "3",
                "--out",
                str(out),
                "--max-seeds",
                "30",
                "--concurrency",
                "4",
                "--k",
                "2",
            ]
        )
    assert code == 0
    pool = TaskPool.from_jsonl(out)
    assert len(pool) == 3 and all(t.metadata["source"] == "qa_agent" for t in pool)
    env = gym.make("searchgym/LocalQA-v0", tasks=str(out), index=str(small_bundle / "index"), max_turns=4)
    task = pool[0]
    obs, info = env.reset(options={"task_id": task.id})
    assert task.question in obs
    obs, reward, terminated, truncated, info = env.step(f"<search>{task.answers[0]}</search>")
    assert not terminated and "<information>" in obs
    obs, reward, terminated, truncated, info = env.step(f"<answer>{task.answers[0]}</answer>")
    assert terminated and reward == 1.0
    env.close()


def test_cli_kbwalk_method(small_bundle, tmp_path):
    out = tmp_path / "kb.jsonl"
    assert (
        cli_main(["synthesize", "--method", "kbwalk", "--corpus", str(small_bundle), "--n", "5", "--out", str(out)])
        == 0
    )
    assert len(TaskPool.from_jsonl(out)) == 5 and (tmp_path / "kb.summary.json").exists()
    before = out.read_bytes()  # a second run onto the pool must not replace it unasked
    assert (
        cli_main(["synthesize", "--method", "kbwalk", "--corpus", str(small_bundle), "--n", "2", "--out", str(out)])
        != 0
    )
    assert out.read_bytes() == before
    assert (
        cli_main(
            [
                "synthesize",
                "--method",
                "kbwalk",
                "--corpus",
                str(small_bundle),
                "--n",
                "2",
                "--out",
                str(out),
                "--overwrite",
            ]
        )
        == 0
    )
    assert len(TaskPool.from_jsonl(out)) == 2


def test_tiny_model_never_crashes(small_bundle, tiny_model_dir, tmp_path):
    """The tiny model's replies are cut at max_tokens: each read is asked 3 times, then the seed is a failure of
    that call (not a rejection), the summary says so, and the command's error names the cause."""
    out = tmp_path / "tiny.jsonl"
    fast = {"max_tokens": 24, "k": 2, "max_turns": 2, "retry_backoff": 0.001}
    with pytest.raises(DependencyFailed, match=r"all 3 seeds tried failed .* read: cut off: .*max_tokens=24"):
        synthesize(
            SynthesisSettings(
                str(small_bundle / "index"),
                str(tiny_model_dir),
                2,
                str(out),
                concurrency=2,
                max_seeds=3,
                qa=QAConfig(**fast),
            )
        )
    report = json.loads(summary_path(out).read_text())
    assert report["seeds_finished"] == 0 and report["rejections"] == {} and report["accepted"] == 0
    assert report["failed_calls"]["seeds_pending"] == 3 and report["this_run"]["llm_calls"]["read"] == 9
    # the stand-in reasons, the tiny model judges: its verdicts are cut off, so the seeds stay unfinished
    with stand_in_server(StandInLLM()) as url:
        with pytest.raises(DependencyFailed, match="quality: cut off"):
            settings = SynthesisSettings(
                str(small_bundle / "index"),
                f"openai:{url}",
                1,
                str(tmp_path / "mixed.jsonl"),
                judge_engine=str(tiny_model_dir),
                concurrency=2,
                max_seeds=2,
                qa=QAConfig(**fast),
            )
            synthesize(settings)
    mixed = json.loads(summary_path(tmp_path / "mixed.jsonl").read_text())
    assert mixed["accepted"] == 0 and mixed["rejections"] == {}
    assert mixed["failed_calls"]["by_reason"] == {"quality: cut off": 2}
