"""Same seed, same config, same bytes: the world, demonstrations, copy pretraining, warm start and evaluation.

Each stage runs twice at toy scale and its outputs are compared byte for byte (evaluation samples minus
their timings); a different seed must change them, so the comparison is not vacuous. Async RL depends on
timing by nature: its run directory records what it depended on (provenance.jsonl).
"""

import asyncio
import hashlib
import json
from pathlib import Path

import gymnasium as gym
import pytest

import searchgym  # noqa: F401
from searchgym.agents.scripted import demonstrations
from searchgym.envs.tools.local_index import LocalIndex
from searchgym.eval.harness import run_eval
from searchgym.pipeline.stages import deterministic_torch
from searchgym.trainers.config import load_config
from searchgym.trainers.launchers.local import train
from searchgym.trainers.warm_start.copy_pretrain import CopyPretrainConfig, copy_pretrain
from searchgym.trainers.warm_start.sft import SFTConfig, sft
from searchgym.world.bundle import build_bundle
from tests.conftest import SMALL

ENV = {**SMALL, "hops": 1, "top_k": 2, "doc_chars": 200, "max_turns": 3}
TIMINGS = ("generate_seconds", "env_seconds")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def without_timings(x):
    """A stored sample with its wall-clock fields removed (everything else must repeat exactly)."""
    if isinstance(x, dict):
        return {k: without_timings(v) for k, v in x.items() if k not in TIMINGS}
    if isinstance(x, list):
        return [without_timings(v) for v in x]
    return x


def samples(run_dir: Path) -> list[str]:
    """The run's samples, timing-free, as canonical JSON in (task, sample) order (they finish in any order)."""
    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    rows.sort(key=lambda r: (r["task_id"], r["sample"]))
    return [json.dumps(without_timings(r), sort_keys=True) for r in rows]


@pytest.fixture(scope="module")
def demos(small_bundle):
    env = gym.make("searchgym/SyntheticQA-v0", **ENV).unwrapped
    return asyncio.run(demonstrations(env, list(env.tasks)[:24], question_query=True))


def test_the_world_its_tasks_and_its_search_results_repeat(tmp_path):
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        build_bundle(tmp_path / name, size=300, n_tasks=40, seed=seed)
    for name in ("world.json", "corpus.jsonl", "kb.jsonl", "tasks.jsonl", "report.json"):
        assert digest(tmp_path / "a" / name) == digest(tmp_path / "b" / name), name
    assert digest(tmp_path / "a" / "corpus.jsonl") != digest(tmp_path / "c" / "corpus.jsonl")
    # The index's segment files are named at random, but what a search answers is the same, ties included.
    first, second = LocalIndex(tmp_path / "a" / "index"), LocalIndex(tmp_path / "b" / "index")
    questions = [json.loads(line)["question"] for line in (tmp_path / "a" / "tasks.jsonl").read_text().splitlines()]
    assert questions
    for query in questions + ["the", "born in"]:
        assert first.search_sync(query, 5) == second.search_sync(query, 5), query


def test_demonstrations_repeat(small_bundle, demos):
    env = gym.make("searchgym/SyntheticQA-v0", **ENV).unwrapped
    again = asyncio.run(demonstrations(env, list(env.tasks)[:24], question_query=True))
    assert demos and json.dumps(again) == json.dumps(demos)


def test_copy_pretraining_and_the_warm_start_repeat_bit_for_bit(tiny_model_dir, demos, tmp_path):
    copy = CopyPretrainConfig(steps=3, batch_size=4, warmup_steps=2, max_segment=8, max_gap=4)
    warm = SFTConfig(epochs=1.0, lr=2e-3, batch_tokens=1024, warmup_steps=2)
    demos = demos[:6]
    with deterministic_torch(2):
        for run in ("a", "b"):
            copy_pretrain(tiny_model_dir, tmp_path / run / "base", copy, progress=False)
            sft(tmp_path / run / "base", demos, tmp_path / run / "sft", warm, progress=False)
        copy_pretrain(
            tiny_model_dir,
            tmp_path / "reseeded" / "base",
            CopyPretrainConfig(**{**vars(copy), "seed": 1}),
            progress=False,
        )
        sft(
            tmp_path / "a" / "base",
            demos,
            tmp_path / "reseeded" / "sft",
            SFTConfig(**{**vars(warm), "seed": 1}),
            progress=False,
        )
    for stage, history in (("base", "copy_pretrain_history.jsonl"), ("sft", "sft_history.jsonl")):
        a, b, reseeded = (tmp_path / run / stage for run in ("a", "b", "reseeded"))
        assert digest(a / "model.safetensors") == digest(b / "model.safetensors"), stage
        assert (a / history).read_text() == (b / history).read_text()
        assert digest(a / "model.safetensors") != digest(reseeded / "model.safetensors"), stage


def test_evaluation_repeats_whatever_order_the_episodes_finish_in(tiny_model_dir, small_bundle, tmp_path):
    """Samples are seeded per (question, sample), not by the order requests reach the engine.

    One at a time, a rerun is the same bytes. Concurrently, which episodes share an engine batch depends on
    timing; that changes the float summation order and so the recorded behaviour logprobs in their last
    bits (about 1e-5), never a token, an answer, a verdict or a score."""

    def evaluate(name: str, *, seed: int = 0, concurrency: int = 1) -> list[dict]:
        run_eval(
            "searchgym/SyntheticQA-v0",
            str(tiny_model_dir),
            tmp_path / name,
            k=2,
            env_kwargs=ENV,
            max_tasks=4,
            concurrency=concurrency,
            max_new_tokens=12,
            seed=seed,
            progress=False,
            report=False,
        )
        return [json.loads(row) for row in samples(tmp_path / name)]

    def metrics(name: str) -> dict:
        return json.loads((tmp_path / name / "summary.json").read_text())["metrics"]

    def without_logprobs(rows: list[dict]) -> list[dict]:
        return [{**row, "trajectory": {**row["trajectory"], "logprobs": None}} for row in rows]

    serial = evaluate("a")
    assert serial == evaluate("b") and metrics("a") == metrics("b")
    concurrent = evaluate("c", concurrency=8)
    assert without_logprobs(concurrent) == without_logprobs(serial) and metrics("c") == metrics("a")
    for x, y in zip(concurrent, serial, strict=True):
        assert x["trajectory"]["logprobs"] == pytest.approx(y["trajectory"]["logprobs"], abs=1e-4)
    assert without_logprobs(evaluate("reseeded", seed=1, concurrency=8)) != without_logprobs(serial)


def test_async_rl_records_the_versions_and_group_order_it_trained_on(tmp_path, small_bundle):
    config = load_config(
        None,
        [
            f"out_dir={tmp_path}",
            "steps=3",
            f"env.kwargs.size={SMALL['size']}",
            f"env.kwargs.n_tasks={SMALL['n_tasks']}",
            "env.kwargs.max_turns=2",
            "rollout.group_size=2",
            "rollout.batch_size=2",
            "rollout.max_new_tokens=16",
            "rollout.max_staleness=1",
            "learner.drop_no_spread=false",
        ],
    )
    train(config, progress=False)
    records = [json.loads(line) for line in (tmp_path / "provenance.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3] and [r["trained_version"] for r in records] == [0, 1, 2]
    positions = []
    for record in records:
        rows = [
            json.loads(line)
            for line in (tmp_path / "trajectories" / f"version-{record['trained_version']:05d}.jsonl")
            .read_text()
            .splitlines()
        ]
        assert [g["position"] for g in record["groups"]] == list(dict.fromkeys(r["group"] for r in rows))
        runs = [run for g in record["groups"] for run in g["versions"]]
        assert len(runs) == len(rows) == 4
        for row, trajectory_runs in zip(rows, runs, strict=True):
            generated = [v for v, m in zip(row["versions"], row["loss_mask"], strict=True) if m]
            assert [v for v, n in trajectory_runs for _ in range(n)] == generated
            assert all(record["trained_version"] - 1 <= v <= record["trained_version"] for v, _ in trajectory_runs)
        positions += [g["position"] for g in record["groups"]]
    assert len(set(positions)) == len(positions)  # each group trained once
