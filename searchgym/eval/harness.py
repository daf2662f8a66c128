"""`searchgym eval`: k judged samples per question from any engine, resumable, with a summary and report.

Each finished (question, sample) pair is appended to `samples.jsonl` as one line (flushed and
fsynced) holding the full trajectory and every judge's verdict. A rerun of the same command loads
that file, drops a last line cut by a kill (rewriting the file without it), and plays only the
pairs that are missing, so no pair is repeated or lost. `run.json` records what the samples were
made with; a rerun into the same directory with another env, engine, sampling or model weights is refused.

`summary.json` opens with the run's protocol card (`card.py`: suite and question-set hash, judges,
k, sampling, budgets, tool stack, model fingerprint, searchgym version; its hash covers the
score-relevant fields), then the scores, per-subset breakdowns (hops, ...) and the agreement between
judges (and with human labels, `labels=`), which `eval compare` and the report read.
"""
from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from searchgym.agents.context import context_policy as make_context_policy
from searchgym.agents.engines.open import open_engine
from searchgym.agents.engines.types import SamplingParams
from searchgym.agents.env_pool import EnvPool
from searchgym.agents.workflow import Workflow, WorkflowSettings, open_workflow
from searchgym.envs.judges import CompositeJudge, make_judge
from searchgym.envs.jsonl_log import JsonlLog
from searchgym.envs.search_env import SearchEnv
from searchgym.eval.agreement import judge_agreement, label_accuracy, load_labels
from searchgym.eval.card import build_card
from searchgym.eval.fingerprint import engine_fingerprint
from searchgym.eval.metrics import BREAKDOWN_KEYS, Sample, breakdown, summarize

SAMPLES = "samples.jsonl"
RUN = "run.json"
SUMMARY = "summary.json"


class SampleStore:
    """The append-only JSONL of finished samples, keyed by (task_id, sample); survives a kill mid-write.

    Reading repairs the file (`JsonlLog`): a line cut by a kill is dropped and its pair played again; a
    damaged line is set aside in `samples.damaged.jsonl` and reported by line; a repeated key keeps the first.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.log = JsonlLog(self.path, check=_sample_key)
        self.rows: dict[tuple[str, int], dict[str, Any]] = {}
        for row in self.log:
            self.rows.setdefault(_sample_key(row), row)
        self.damaged = self.log.damaged

    @property
    def dropped(self) -> int:
        return len(self.damaged)

    def __contains__(self, key: tuple[str, int]) -> bool:
        return key in self.rows

    def append(self, row: dict[str, Any]) -> None:
        key = _sample_key(row)
        if key in self.rows:
            raise ValueError(f"sample {key} is already stored")
        self.log.append(row)
        self.rows[key] = row


def _sample_key(row: dict[str, Any]) -> tuple[str, int]:
    """(task_id, sample) of a stored row; KeyError/TypeError/ValueError for a row that has none."""
    return str(row["task_id"]), int(row["sample"])


# --- judging ------------------------------------------------------------------------------------

def eval_judge(spec: str, chat: Any = None) -> CompositeJudge:
    """The envs' judges for a comma list (em, f1, cover_em, llm, ...), always as a composite so each is reported."""
    judge = make_judge(spec, chat)
    if isinstance(judge, CompositeJudge):
        return judge
    name = spec.split(",")[0].strip().lower()
    return CompositeJudge({name: judge}, primary=name)


async def judge_all(judge: CompositeJudge, prediction: str | None, answers: Sequence[str], question: str,
                    aug_answers: Sequence[str] = ()) -> dict[str, dict]:
    """Every judge's verdict as a dict; no answer is wrong for every judge (score 0), not a judge failure.
    `aug_answers` (a task's ASearcher `aug_answer`) reach only the judges that blend them (asearcher_*)."""
    if prediction is None:
        return {n: {"score": 0.0, "correct": False, "judge": n, "detail": {"reason": "no answer"}, "error": None}
                for n in judge.judges}
    verdicts = await judge.averdicts(prediction, list(answers), question=question, aug_references=list(aug_answers))
    return {name: verdict.to_dict() for name, verdict in verdicts.items()}


def sample_of(row: dict[str, Any]) -> Sample:
    st = row["stats"]
    return Sample(row["task_id"], row["sample"], row["reward"], bool(row.get("env_correct")), st["turns"],
                  st["searches"], st["accesses"], st["generated_tokens"], st["answered"], row["verdicts"])


# --- the run ------------------------------------------------------------------------------------

def run_eval(env_id: str, engine: str, out: str | os.PathLike, *, k: int = 4, judge: str | None = None,
             env_kwargs: dict[str, Any] | None = None, max_tasks: int | None = None, concurrency: int = 32,
             temperature: float = 1.0, max_new_tokens: int = 1024, max_context: int = 32_768, seed: int = 0,
             device: str = "cpu", tokenizer: str | None = None, judge_model: str | None = None,
             workflow: str | None = None, progress: bool = True, make_env: Callable[[], SearchEnv] | None = None,
             report: bool = True, labels: str | os.PathLike | None = None,
             context_policy: str = "end") -> dict[str, Any]:
    """Evaluate `engine` (any engine spec) on `env_id` into `out`; resumes a previous run there. Returns the summary.

    The episodes are played by the workflow `open_workflow` builds (`workflow` names a custom class), so
    what is evaluated is exactly what trains; the tool format is the env's (`env_kwargs["tool_format"]`).
    `labels` is a file of human verdicts (question id, prediction, verdict) that each judge is scored against.
    `context_policy` ("end", "fold", "summarise") says how an episode longer than `max_context` goes on
    (agents/context.py).
    """
    import gymnasium as gym

    import searchgym  # noqa: F401  (registers the env ids)
    from searchgym.envs.suites import suite_of

    if k < 1:
        raise ValueError("k must be at least 1")
    policy = make_context_policy(context_policy)  # an unknown name fails before any episode
    env_kwargs = dict(env_kwargs or {})
    suite = suite_of(env_id)
    judge = judge or (suite.judge if suite else "em,f1")
    human = load_labels(labels) if labels is not None else None  # a bad labels file fails before any episode
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = asyncio.run(engine_fingerprint(engine))
    judge_fp = asyncio.run(engine_fingerprint(judge_model)) if judge_model else None
    run = {"env": env_id, "env_kwargs": env_kwargs, "engine": engine, "seed": seed, "temperature": temperature,
           "max_new_tokens": max_new_tokens, "max_context": max_context, "workflow": workflow,
           "model": model["identity"]}
    if context_policy != "end":  # runs made before context policies existed keep resuming
        run["context_policy"] = context_policy
    run_path = out / RUN
    if run_path.exists():
        try:
            previous = json.loads(run_path.read_text())
            if not isinstance(previous, dict):
                raise ValueError("not a JSON object")
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"{run_path} is damaged ({e}); it records what {out}'s samples were made with: "
                             f"restore it, or evaluate into another --out") from None
        changed = {key: (previous.get(key), value) for key, value in run.items() if previous.get(key) != value
                   and (key != "model" or None not in (previous.get(key), value))}  # unknown (older run, server down)
        if changed:
            raise ValueError(f"{out} holds samples of another run (differs in {changed}); use another --out")
    else:
        run_path.write_text(json.dumps(run, indent=2))

    make_env = make_env or (lambda: gym.make(env_id, **env_kwargs).unwrapped)
    probe = make_env()
    try:
        tasks = list(probe.tasks)[:max_tasks]
        store = SampleStore(out / SAMPLES)
        todo = [(i, t, s) for i, t in enumerate(tasks) for s in range(k) if (t.id, s) not in store]
        sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature)
        settings = WorkflowSettings(sampling, max_context=max_context, context=policy)
        judges, judge_stats = asyncio.run(_evaluate(
            todo, make_env, store, judge, judge_model, engine, workflow=workflow, settings=settings,
            concurrency=concurrency, seed=seed, device=device, tokenizer=tokenizer, progress=progress,
            total=len(tasks) * k))
        if model["identity"] is None:  # servers that were not up yet answered while the run played
            model = asyncio.run(engine_fingerprint(engine))
        card = build_card(env_id=env_id, env=probe, tasks=tasks, judges=judges.judges, primary=judges.primary,
                          judge_model=judge_fp, k=k, sampling=sampling, max_context=max_context, engine=engine,
                          model=model, workflow=workflow,
                          run={"seed": seed, "env_kwargs": env_kwargs, "max_tasks": max_tasks,
                               "concurrency": concurrency, "device": device, "tokenizer": tokenizer})
    finally:
        probe.close()
    wanted = {(t.id, s) for t in tasks for s in range(k)}
    rows = [row for key, row in store.rows.items() if key in wanted]
    summary = {"card": card,
               **summarize_rows(rows, k, env_id=env_id, engine=engine, judges=list(judge_stats))}
    summary["agreement"] = judge_agreement(rows, summary["judges"])
    if human is not None:
        summary["labels"] = {"file": str(labels), **label_accuracy(rows, human, summary["judges"])}
    summary["judge_stats"] = {n: stats for n, stats in judge_stats.items() if stats is not None}
    (out / SUMMARY).write_text(json.dumps(_finite(summary), indent=2))  # NaN (no valid verdict) -> null
    if report:
        from searchgym.eval.report import write_report

        write_report(out, summary, rows)
    return summary


async def _evaluate(todo, make_env, store: SampleStore, judge_spec: str, judge_model: str | None, engine: str, *,
                    workflow, settings, concurrency, seed, device, tokenizer, progress, total
                    ) -> tuple[CompositeJudge, dict[str, Any]]:
    """Play and judge the missing samples; returns the judges and each one's counters (None if it keeps none)."""
    judge_handle = await open_engine(judge_model, device=device, seed=seed) if judge_model else None
    try:
        judge = eval_judge(judge_spec, judge_handle.chat if judge_handle else None)
        if todo:
            player = await open_workflow(engine, workflow=workflow, settings=settings, device=device, seed=seed,
                                         tokenizer=tokenizer)
            try:
                await _play(todo, make_env, store, judge, player, concurrency=concurrency, seed=seed,
                            progress=progress, total=total)
            finally:
                await player.aclose()
        return judge, {n: dict(j.stats) if hasattr(j, "stats") else None for n, j in judge.judges.items()}
    finally:
        if judge_handle is not None:
            await judge_handle.aclose()


async def _play(todo, make_env, store: SampleStore, judge: CompositeJudge, workflow: Workflow, *, concurrency, seed,
                progress, total) -> None:
    gate = asyncio.Semaphore(concurrency)
    envs = EnvPool(make_env)
    bar = tqdm(total=total, initial=total - len(todo), desc="evaluating", disable=not progress)

    async def one(index: int, task, sample: int) -> None:
        async with gate:
            with envs.env() as env:
                episode_seed = int(np.random.SeedSequence([seed, index, sample]).generate_state(1)[0])
                traj = await workflow.arun_episode(env, seed=episode_seed, options={"task_id": task.id},
                                                   rid=f"eval-{index}-{sample}")
            verdicts = await judge_all(judge, traj.prediction, task.answers, task.question, task.aug_answers)
            counts = traj.counts
            store.append({
                "task_id": task.id, "sample": sample, "question": task.question, "answers": list(task.answers),
                "prediction": traj.prediction, "reward": traj.reward, "subset": subset_of(task.metadata),
                "env_correct": bool((traj.verdict or {}).get("correct")), "verdicts": verdicts,
                "stats": {"turns": len(traj.turns), "searches": counts.get("search", 0),
                          "accesses": counts.get("access", 0), "generated_tokens": traj.generated_tokens,
                          "answered": traj.prediction is not None, "stop_reason": traj.stop_reason,
                          "segments": traj.num_segments},
                "trajectory": traj.to_dict(),
            })
            bar.update()

    try:
        results = await asyncio.gather(*[one(i, t, s) for i, t, s in todo], return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:  # every other episode was finished and stored: a rerun plays only the failed ones
            raise RuntimeError(f"{len(errors)} of {len(todo)} episodes failed (rerun the command to retry them); "
                               f"first: {type(errors[0]).__name__}: {errors[0]}") from errors[0]
    finally:
        bar.close()
        envs.close()


def subset_of(metadata: dict[str, Any]) -> dict[str, Any]:
    """The task metadata scores are broken down by (hops, level, ...): scalar values of BREAKDOWN_KEYS."""
    return {key: metadata[key] for key in BREAKDOWN_KEYS
            if isinstance(metadata.get(key), (str, int, float)) and not isinstance(metadata.get(key), bool)}


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not np.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def summarize_rows(rows: Sequence[dict[str, Any]], k: int, **meta: Any) -> dict[str, Any]:
    """summarize() of stored rows, per-subset breakdowns (where a key takes 2+ values) and stop reasons."""
    samples = [sample_of(r) for r in rows]
    metrics = summarize(samples, k)
    breakdowns = {}
    for key in BREAKDOWN_KEYS:
        groups = [(r.get("subset") or {}).get(key) for r in rows]
        if len({g for g in groups if g is not None}) > 1:
            breakdowns[key] = breakdown(samples, groups, k)
    return {**meta, "k": k, "metrics": metrics, "breakdowns": breakdowns,
            "stop_reasons": {reason: sum(r["stats"]["stop_reason"] == reason for r in rows)
                             for reason in sorted({r["stats"]["stop_reason"] for r in rows})}}
