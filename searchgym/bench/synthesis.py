"""`searchgym bench synthesis`: ASearcher's QA-synthesis agent end to end on a real model, stage by stage.

The agent (`synthesis/qa_agent.py`) runs with one local model (by default the packaged SmolLM2-135M-Instruct) as
both reasoner and judge over the first `seeds` pages (in seeded order) of a synthetic world's index, through
`synthesis.run.synthesize`: the same code as `searchgym synthesize --method agent`, with the run never stopped by
failed calls (each is a figure here). The pool, its progress file (a row per seed: the last stage it passed, the
candidate's question and answer, why it ended) and summary stay in `--work`; a rerun resumes.
The results file keeps the yield at each stage (seeds tried, a candidate proposed, after the FUZZ/INJECT turns,
past quality, difficulty and uniqueness, accepted), each stage's losses split into judged rejections and failed
LLM calls (counted apart: a failed call is never a rejection), rejections and failures by reason, a sample of
accepted and rejected questions with each rejection's reason, and, when a task was accepted, one episode of the
pool played in `searchgym/LocalQA-v0` over the same index.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchgym.bench.provenance import git_commit, machine, peak_rss_bytes
from searchgym.core.atomic_file import write_atomic
from searchgym.core.settings_flags import settings_argv
from searchgym.settings import setting

WORLD_TASKS = 200  # the world bundle's own KB-walk pool (only its index is used here)


@dataclass
class SynthesisBenchSettings:
    """`searchgym bench synthesis`: one model reasons and judges over the first N seed pages of a world."""

    model: str = setting(
        "smollm2-135m-instruct",
        help="a packaged model name (converted on first use), a model directory, or openai:http://host/v1[:model]",
    )
    seeds: int = setting(64, at_least=1, help="seed pages tried (the first N in seeded order)")
    world_size: int = setting(1000, at_least=100, help="pages of the synthetic world the seeds come from")
    seed: int = setting(0, help="seed of the world, the seed pages' order and the model's sampling")
    k: int = setting(4, at_least=1, help="tool-free solver attempts per candidate (the difficulty check)")
    max_turns: int = setting(3, at_least=1, help="FUZZ/INJECT actions at most")
    max_tokens: int = setting(512, at_least=16, help="the model's reply budget per call")
    concurrency: int = setting(4, at_least=1, help="seeds in flight")
    threads: int = setting(1, at_least=1, help="torch threads of the model")
    work: str = setting(
        "runs/bench_synthesis",
        help="directory of the pool, its progress file and summary (a rerun resumes: finished seeds are kept, seeds "
        "whose LLM call failed are tried again)",
    )
    examples: int = setting(8, at_least=0, help="accepted and rejected questions kept in the results file, each")
    difficulty_judge: str = setting(
        "llm",
        help="grades the solver's answers: 'llm' (the model, as ASearcher) or a rule judge (em, f1, cover_em, ...); "
        "each choice writes a pool of its own",
    )
    sft_demos: int = setting(
        0,
        at_least=0,
        help="fine-tune the model first on the agent's calls over this many other seed pages, every reply written "
        "from the world's KB (synthesis/kb_demos.py); 0: the model as it is",
    )
    sft_epochs: float = setting(2.0, above=0, help="passes over the demonstrations")
    sft_lr: float = setting(1e-4, above=0, help="the fine-tune's learning rate")
    sft_batch_tokens: int = setting(8192, at_least=1, help="tokens (padded) per fine-tune step")
    sft_micro_batch_tokens: int = setting(
        1024, at_least=1, help="tokens per forward/backward pass of a fine-tune step (the same update in less memory)"
    )
    out: str = setting("results/synthesis_smollm2.json", help="the results file")


def model_record(model_dir: Path, name: str) -> dict[str, Any]:
    """The model as `model get` recorded it: name, the source file's sha256, versions (a plain dir: its path)."""
    from searchgym.agents.packaged_models import read_manifest

    meta = read_manifest(model_dir) or {}
    return {
        "name": meta.get("name", name),
        "source_sha256": meta.get("source_sha256"),
        "dtype": meta.get("dtype"),
        "versions": meta.get("versions"),
        "dir": str(model_dir),
    }


def progress_rows(pool: Path) -> list[dict[str, Any]]:
    """The pool's progress rows, read as the synthesis run keeps them (`JsonlLog`: a cut last line set aside)."""
    from searchgym.core.jsonl_log import JsonlLog
    from searchgym.synthesis.pool import progress_path

    return list(JsonlLog(progress_path(pool)).rows)


def samples(rows: list[dict[str, Any]], tasks: list[Any], limit: int) -> dict[str, list[dict[str, Any]]]:
    """Up to `limit` accepted tasks, rejected candidates (question, answer and reason) and failed seeds each."""
    accepted = [
        {
            "question": t.question,
            "answer": t.answers[0],
            "actions": [h["action"] for h in t.metadata["history"][1:]],
            "solver_answers": [s["answer"] for s in t.metadata["solver"]],
            "seed_page": t.metadata["seed_page"],
        }
        for t in tasks[:limit]
    ]
    keys = ("stage", "question", "answer", "actions", "reason", "detail", "solver", "url")
    finished = [r for r in rows if "failed" not in r and r.get("reason")]
    # candidates that were proposed first: they say more than seeds lost before a question existed
    rejected = sorted(finished, key=lambda r: "question" not in r)[:limit]
    failed = sorted([r for r in rows if "failed" in r], key=lambda r: "question" not in r)[:limit]
    return {
        "accepted": accepted,
        "rejected": [{k: r[k] for k in keys if k in r} for r in rejected],
        "failed_calls": [{k: r[k] for k in ("stage", "question", "failed", "detail", "url") if k in r} for r in failed],
    }


def play_one(pool: Path, index: Path, task: Any) -> dict[str, Any]:
    """One episode of `task` from the pool in LocalQA-v0 over `index`: search its answer, then answer it."""
    import gymnasium as gym

    import searchgym  # noqa: F401  (registers the env ids)

    env = gym.make("searchgym/LocalQA-v0", tasks=str(pool), index=str(index), max_turns=4)
    try:
        obs, _ = env.reset(options={"task_id": task.id})
        played: dict[str, Any] = {"task_id": task.id, "question_in_first_observation": task.question in obs}
        steps = []
        for action in (f"<search>{task.answers[0]}</search>", f"<answer>{task.answers[0]}</answer>"):
            obs, reward, terminated, truncated, _ = env.step(action)
            steps.append({"action": action, "reward": reward, "terminated": terminated, "observation": obs[:300]})
        return {**played, "steps": steps}
    finally:
        env.close()


def run_synthesis_bench(settings: SynthesisBenchSettings) -> dict[str, Any]:
    """Run the agent over the seeds (resuming `work`), write `settings.out`; returns the report."""
    import torch

    from searchgym.bench.synthesis_sft import kb_check, pool_name, tuned_run
    from searchgym.envs.tasks import TaskPool
    from searchgym.pipeline.stages import resolve_model
    from searchgym.synthesis.qa_agent import QAConfig
    from searchgym.synthesis.run import SynthesisSettings, synthesize
    from searchgym.world.bundle import ensure_bundle
    from searchgym.world.world import World

    torch.set_num_threads(settings.threads)
    served = settings.model.startswith("openai:")  # an endpoint is used as it is (the tests' stand-in LLM)
    if served and settings.sft_demos:
        raise ValueError("sft_demos fine-tunes a local model; an openai: endpoint cannot be fine-tuned here")
    engine = base_engine = settings.model if served else str(resolve_model(settings.model))
    index = ensure_bundle(size=settings.world_size, seed=settings.seed, n_tasks=WORLD_TASKS, progress=True) / "index"
    pool, sft_info, demo_questions = Path(settings.work) / pool_name(settings), None, set[str]()
    if settings.sft_demos:  # the fine-tuned model writes into a pool of its own, beside it
        engine, pool, sft_info, demo_questions = tuned_run(settings, Path(base_engine), index)
    qa = QAConfig(
        max_turns=settings.max_turns,
        k=settings.k,
        max_tokens=settings.max_tokens,
        difficulty_judge=settings.difficulty_judge,
    )
    run = SynthesisSettings(
        str(index),
        engine,
        settings.seeds,
        str(pool),
        concurrency=settings.concurrency,
        seed=settings.seed,
        max_seeds=settings.seeds,
        stop_after=None,
        qa=qa,
    )
    load_before, start = os.getloadavg(), time.perf_counter()
    summary = synthesize(run, progress=True, raise_failures=False)
    seconds = time.perf_counter() - start
    tasks = list(TaskPool.from_jsonl(pool)) if pool.exists() else []
    report = {
        "bench": "synthesis",
        "command": " ".join(["searchgym bench synthesis", *settings_argv(settings)]),
        "settings": {k: getattr(settings, k) for k in settings.__dataclass_fields__},
        "model": {"name": engine} if served else model_record(Path(base_engine), settings.model),
        "sft": sft_info,
        "corpus": {"world_size": settings.world_size, "seed": settings.seed, "index": str(index)},
        "seeds_tried": summary["stages"][0]["seeds"],
        "stages": summary["stages"],
        "accepted": summary["accepted"],
        "rejections": summary["rejections"],
        "failed_calls": summary["failed_calls"],
        "llm_calls": summary["this_run"]["llm_calls"],
        "samples": samples(progress_rows(pool), tasks, settings.examples),
        "played_in_localqa": play_one(pool, index, tasks[0]) if tasks else None,
        "kb_check": kb_check(tasks, World(settings.world_size, settings.seed), demo_questions),
        "seconds": round(seconds, 1),
        "this_run": summary["this_run"],
        "peak_rss_mb": round(peak_rss_bytes() / 2**20),
        "commit": git_commit(),
        "machine": machine(torch_threads=settings.threads, load_before=load_before, load_after=os.getloadavg()),
    }
    write_atomic(Path(settings.out), json.dumps(report, indent=2) + "\n")
    return report


def format_report(report: dict[str, Any]) -> str:
    """The stage yields as lines of text."""
    lines = [f"{report['model']['name']}: {report['seeds_tried']} seeds, {report['accepted']} accepted"]
    for row in report["stages"]:
        lost = (
            f"  (lost on the way: {row['rejected']} rejected, {row['failed_call']} failed calls)"
            if "rejected" in row
            else ""
        )
        lines.append(f"  {row['stage']:<11} {row['seeds']:>5}{lost}")
    if report["played_in_localqa"]:
        lines.append(f"  played in LocalQA-v0: reward {report['played_in_localqa']['steps'][-1]['reward']}")
    return "\n".join(lines)


def synthesis_bench_command(settings: SynthesisBenchSettings) -> None:
    """`searchgym bench synthesis`: run it and print the stage yields."""
    report = run_synthesis_bench(settings)
    print(format_report(report))
    print(f"results in {settings.out}")
