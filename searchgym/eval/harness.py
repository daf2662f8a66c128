"""`searchgym eval`: k judged samples per question from any engine, resumable, with a summary and report.

Each finished (question, sample) pair is appended to `samples.jsonl` as one line (flushed and
fsynced) holding the full trajectory and every judge's verdict. A rerun of the same command loads
that file, drops a last line cut by a kill (rewriting the file without it), and plays only the
pairs that are missing, so no pair is repeated or lost. `run.json` records what the samples were
made with; a rerun into the same directory with another env, engine, sampling or model weights is refused.

A dependency's failure is never a result. An episode whose agent (or its endpoint) failed is not stored:
it is logged in `failures.jsonl`, counted apart, and played by the rerun, which exits non-zero naming the
cause. A sample whose judge failed (endpoint down, a reply cut at max_tokens or without a verdict, after
retries) is stored with the failure in its verdict, left out of that judge's scores, and judged again by
the rerun, which appends the row again with `revision` raised (the highest revision of a key counts).
A row that is valid JSON but lacks a field, or holds one of the wrong type (a reward that is text:
`sample_rows.py`), is set aside in `samples.damaged.jsonl` (reported with its line and the field) and its sample
played again. `judge_stats` and the card's `run.llm_calls` count calls and failures over every stored row, so
across every resumed process.

`summary.json` opens with the run's protocol card (`card.py`: suite and question-set hash, judges,
k, sampling, budgets, tool stack, model fingerprint, searchgym version; its hash covers the
score-relevant fields), then the scores, per-subset breakdowns (hops, ...) and the agreement between
judges (and with human labels, `labels=`), which `eval compare` and the report read.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from searchgym.agents.context import context_policy as make_context_policy
from searchgym.agents.engines.open import open_engine, opened_engine
from searchgym.agents.engines.types import SamplingParams
from searchgym.agents.env_pool import EnvPool
from searchgym.agents.workflow import Workflow, WorkflowSettings
from searchgym.core.jsonl_log import JsonlLog
from searchgym.core.llm_calls import DependencyFailed
from searchgym.envs.factory import make_unwrapped
from searchgym.envs.judges import (
    ASearcherEM,
    ASearcherF1,
    CompositeJudge,
    CoverExactMatch,
    ExactMatch,
    SearchR1EM,
    TokenF1,
    make_judge,
)
from searchgym.envs.search_env import SearchEnv
from searchgym.envs.tasks import Task
from searchgym.eval.agreement import judge_agreement, label_accuracy, load_labels
from searchgym.eval.card import CardFacts, build_card
from searchgym.eval.eval_settings import RESUME_KEYS, EvalSettings, run_record
from searchgym.eval.evidence import evidence_metrics, evidence_stats
from searchgym.eval.fingerprint import engine_fingerprint
from searchgym.eval.metrics import BREAKDOWN_KEYS, Sample, breakdown, summarize
from searchgym.eval.sample_rows import ROW_FIELDS, STATS_FIELDS, check_row  # noqa: F401 -- the row's fields, re-exported
from searchgym.eval.sample_rows import sample_key as _sample_key
from searchgym.serve.program import build_player
from searchgym.settings import check_settings

SAMPLES = "samples.jsonl"
RUN = "run.json"
SUMMARY = "summary.json"
FAILURES = "failures.jsonl"


class SampleStore:
    """The append-only JSONL of finished samples, keyed by (task_id, sample); survives a kill mid-write.

    Reading repairs the file (`JsonlLog`): a line cut by a kill is dropped and its pair played again; a
    damaged line is set aside in `samples.damaged.jsonl` and reported by line; a repeated key keeps the first.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.log = JsonlLog(self.path, check=check_row)
        self.rows: dict[tuple[str, int], dict[str, Any]] = {}
        for row in self.log:
            key = _sample_key(row)
            if key not in self.rows or row.get("revision", 0) > self.rows[key].get("revision", 0):
                self.rows[key] = row
        self.damaged = self.log.damaged

    @property
    def dropped(self) -> int:
        return len(self.damaged)

    @property
    def versions(self) -> list[dict[str, Any]]:
        """Every stored row, superseded revisions included (judge calls are counted over these)."""
        return self.log.rows

    def __contains__(self, key: tuple[str, int]) -> bool:
        return key in self.rows

    def append(self, row: dict[str, Any]) -> None:
        key = _sample_key(row)
        if key in self.rows:
            raise ValueError(f"sample {key} is already stored")
        self.log.append(row)
        self.rows[key] = row

    def revise(self, row: dict[str, Any]) -> None:
        """Store a new revision of a stored sample (e.g. judged again), appended: the old one stays in the file."""
        key = _sample_key(row)
        new = {**row, "revision": self.rows[key].get("revision", 0) + 1}
        self.log.append(new)
        self.rows[key] = new


def failed_judges(row: dict[str, Any]) -> list[str]:
    """The judges whose verdict on a stored row is a failure (to be judged again)."""
    return [name for name, v in row["verdicts"].items() if v.get("error")]


def call_stats(store: SampleStore, failures: JsonlLog, names: Sequence[str], wanted: set) -> dict[str, Any]:
    """Calls and failures of each model-backed judge and of the agent, over every stored row and failure record."""
    judges = {}
    for name in names:
        versions = [r["verdicts"][name] for r in store.versions if name in r["verdicts"]]
        judges[name] = {
            "calls": sum(int((v.get("detail") or {}).get("calls", 0) or 0) for v in versions),
            "cache_hits": sum(bool((v.get("detail") or {}).get("cached")) for v in versions),
            "failures": sum(bool(v.get("error")) for v in versions),
            "pending": sum(
                bool(row["verdicts"].get(name, {}).get("error")) for key, row in store.rows.items() if key in wanted
            ),
        }
    agent_rows = [r for r in failures if r.get("stage") == "agent"]
    pending = {(str(r["task_id"]), int(r["sample"])) for r in agent_rows} - set(store.rows)
    return {"judges": judges, "agent": {"failures": len(agent_rows), "pending": len(pending & wanted)}}


# --- judging ------------------------------------------------------------------------------------

# deterministic judges of the answer text alone: the env's verdict by one of them is the eval judge's too
REFERENCE_JUDGES = (ExactMatch, TokenF1, CoverExactMatch, ASearcherF1, ASearcherEM, SearchR1EM)


def eval_judge(spec: str, chat: Any = None) -> CompositeJudge:
    """The envs' judges for a comma list (em, f1, cover_em, llm, ...), always as a composite so each is reported."""
    judge = make_judge(spec, chat)
    if isinstance(judge, CompositeJudge):
        return judge
    name = spec.split(",")[0].strip().lower()
    return CompositeJudge({name: judge}, primary=name)


async def judge_all(
    judge: CompositeJudge,
    prediction: str | None,
    answers: Sequence[str],
    question: str,
    aug_answers: Sequence[str] = (),
    known: dict[str, dict] | None = None,
) -> dict[str, dict]:
    """Every judge's verdict as a dict; no answer is wrong for every judge (score 0), not a judge failure.
    `aug_answers` (a task's ASearcher `aug_answer`) reach only the judges that blend them (asearcher_*);
    `known` verdicts (the env's own, see `env_verdicts`) are used as they are, not asked again."""
    if prediction is None:
        return {
            n: {"score": 0.0, "correct": False, "judge": n, "detail": {"reason": "no answer"}, "error": None}
            for n in judge.judges
        }
    known = {n: v for n, v in (known or {}).items() if n in judge.judges}
    rest = [n for n in judge.judges if n not in known]
    verdicts: dict[str, Any] = {}
    if rest:
        ask = CompositeJudge({n: judge.judges[n] for n in rest}, primary=rest[0])
        verdicts = await ask.averdicts(prediction, list(answers), question=question, aug_references=list(aug_answers))
    return {name: known[name] if name in known else verdicts[name].to_dict() for name in judge.judges}


def env_verdicts(env_judge: Any, judge: CompositeJudge, verdict: dict[str, Any] | None) -> dict[str, dict]:
    """The env's verdict on an episode's answer under the eval judge's name, where that eval judge is the env's
    own reference judge (same kind and settings, so the same call): the answer is then judged once, not twice."""
    if verdict is None or type(env_judge) not in REFERENCE_JUDGES:
        return {}
    return {
        name: verdict
        for name, j in judge.judges.items()
        if type(j) is type(env_judge) and vars(j) == vars(env_judge) and verdict.get("judge") == j.name
    }


def sample_of(row: dict[str, Any]) -> Sample:
    st = row["stats"]
    return Sample(
        row["task_id"],
        row["sample"],
        row["reward"],
        bool(row.get("env_correct")),
        st["turns"],
        st["searches"],
        st["accesses"],
        st["generated_tokens"],
        st["answered"],
        row["verdicts"],
    )


# --- the run ------------------------------------------------------------------------------------


@dataclass
class EvalJob:
    """What `run_eval` works out on the way, from its settings and its run directory, for the steps that follow:
    the questions, the stores of samples and failures, the pairs wanted and those left to play or to judge again,
    the judges' spec (the suite's where the settings name none) and how episodes are played."""

    make_env: Callable[[], SearchEnv]
    tasks: list[Task]
    store: SampleStore
    failures: JsonlLog
    judge: str
    play: WorkflowSettings
    total: int = 0  # samples of the whole run (the progress bar's length): those stored count as done
    wanted: set[tuple[str, int]] = field(default_factory=set)
    todo: list[tuple[int, Task, int]] = field(default_factory=list)
    rejudge: list[dict[str, Any]] = field(default_factory=list)
    progress: bool = True
    progress_label: str = "evaluating"

    def rows(self) -> list[dict[str, Any]]:
        """The stored samples this run wants (a resumed run's store may hold more)."""
        return [row for key, row in self.store.rows.items() if key in self.wanted]


def run_eval(
    config: EvalSettings | str,
    *where: str | os.PathLike,
    progress: bool = True,
    make_env: Callable[[], SearchEnv] | None = None,
    report: bool = True,
    progress_label: str = "evaluating",
    **settings: Any,
) -> dict[str, Any]:
    """Evaluate with `config` into `out`, `run_eval(config, out)`; resumes a previous run there. Returns the summary.

    The keyword form `run_eval(env_id, engine, out, k=4, ...)` takes EvalSettings' fields as keywords. The
    episodes are played by the workflow `build_workflow` builds (`workflow` names a custom class), so what is
    evaluated is exactly what trains; the tool format is the env's (`env_kwargs["tool_format"]`). `labels` is a
    file of human verdicts (question id, prediction, verdict) that each judge is scored against. `context_policy`
    ("end", "fold", "summarise") says how an episode longer than `max_context` goes on (agents/context.py).
    `progress_label` names the progress bar. Settings that fail their checks are refused (ValueError naming the
    key) before anything starts.
    """
    config, out = _settings_and_out(config, where, settings)
    check_settings(config)
    human = load_labels(config.labels) if config.labels is not None else None  # a bad file fails before any episode
    out.mkdir(parents=True, exist_ok=True)
    with asyncio.Runner() as loop:  # one event loop for the whole command: fingerprints, episodes, judges
        model = loop.run(engine_fingerprint(config.engine))
        judge_fp = loop.run(engine_fingerprint(config.judge_model)) if config.judge_model else None
        _claim_run_dir(out, run_record(config, model["identity"]))  # run.json: the settings and the weights' identity
        env_kwargs = dict(config.env_kwargs)
        make_env = make_env or (lambda: make_unwrapped(config.env, **env_kwargs))
        probe = make_env()
        try:
            job = _job(config, out, make_env, probe, progress, progress_label)
            judges, errors = loop.run(_evaluate(config, job))
            counted = [n for n, j in judges.judges.items() if hasattr(j, "stats")]  # model-backed judges keep counters
            calls = call_stats(job.store, job.failures, counted, job.wanted)
            rows = job.rows()
            if not rows and errors:
                raise DependencyFailed(
                    f"all {len(errors)} episodes failed (rerun the command to retry them); "
                    f"first: {type(errors[0]).__name__}: {errors[0]}"
                ) from errors[0]
            if model["identity"] is None:  # servers that were not up yet answered while the run played
                model = loop.run(engine_fingerprint(config.engine))
            facts = CardFacts(
                env=probe,
                tasks=job.tasks,
                judges=judges.judges,
                primary=judges.primary,
                sampling=job.play.sampling,
                judge_model=judge_fp,
                model=model,
                llm_calls=calls,
                tool_costs=tool_cost_totals(rows),
            )
            card = build_card(config, facts)
        finally:
            probe.close()
        summary = _summary(config, card, rows, judges, calls, human)
        (out / SUMMARY).write_text(json.dumps(_finite(summary), indent=2))  # NaN (no valid verdict) -> null
        if report:
            from searchgym.eval.report import write_report

            write_report(out, summary, rows)
        if errors:  # every other episode was finished and stored: a rerun plays only the failed ones
            raise DependencyFailed(
                f"{len(errors)} of {len(job.todo)} episodes failed (rerun the command to retry them); "
                f"first: {type(errors[0]).__name__}: {errors[0]}"
            ) from errors[0]
        _check_judges(calls["judges"], rows)
        return summary


def _settings_and_out(
    config: EvalSettings | str, where: Sequence[str | os.PathLike], settings: dict[str, Any]
) -> tuple[EvalSettings, Path]:
    """`run_eval`'s settings object and run directory, from either of its forms: (settings, out) or the keyword
    form (env_id, engine, out, **EvalSettings' fields)."""
    if isinstance(config, EvalSettings):
        (out,) = where
        return config, Path(out)
    engine, out = where
    if settings.get("env_kwargs") is None:
        settings.pop("env_kwargs", None)
    if settings.get("labels") is not None:
        settings["labels"] = os.fspath(settings["labels"])
    return EvalSettings(env=config, engine=str(engine), **settings), Path(out)


def _claim_run_dir(out: Path, run: dict[str, Any]) -> None:
    """Write `run.json`, or check that the one there records the same run (a rerun resumes it): ValueError naming
    what differs, or that the file is damaged."""
    run_path = out / RUN
    if not run_path.exists():
        run_path.write_text(json.dumps(run, indent=2))
        return
    try:
        previous = json.loads(run_path.read_text())
        if not isinstance(previous, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(
            f"{run_path} is damaged ({e}); it records what {out}'s samples were made with: "
            f"restore it, or evaluate into another --out"
        ) from None
    # a model identity of None is unknown (an older run, a server that was down), not a difference;
    # a run made before context policies existed ended its episodes ("end")
    before = {"context_policy": "end", **previous}
    changed = {
        key: (before.get(key), run[key])
        for key in (*RESUME_KEYS, "model")
        if before.get(key) != run[key] and (key != "model" or None not in (before.get(key), run[key]))
    }
    if changed:
        raise ValueError(f"{out} holds samples of another run (differs in {changed}); use another --out")


def _job(
    config: EvalSettings,
    out: Path,
    make_env: Callable[[], SearchEnv],
    probe: SearchEnv,
    progress: bool,
    progress_label: str,
) -> EvalJob:
    """The run's questions (the probe env's, the first `max_tasks`), its stores in `out`, and what is left."""
    from searchgym.envs.suites import suite_of

    suite = suite_of(config.env)
    tasks = list(probe.tasks)[: config.max_tasks]
    store = SampleStore(out / SAMPLES)
    wanted = {(t.id, s) for t in tasks for s in range(config.k)}
    sampling = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=config.temperature)
    return EvalJob(
        make_env=make_env,
        tasks=tasks,
        store=store,
        failures=JsonlLog(out / FAILURES, check=_sample_key),
        judge=config.judge or (suite.judge if suite else "em,f1"),
        play=WorkflowSettings(
            sampling, max_context=config.max_context, context=make_context_policy(config.context_policy)
        ),
        total=len(tasks) * config.k,
        wanted=wanted,
        todo=[(i, t, s) for i, t in enumerate(tasks) for s in range(config.k) if (t.id, s) not in store],
        rejudge=[row for key, row in store.rows.items() if key in wanted and failed_judges(row)],
        progress=progress,
        progress_label=progress_label,
    )


def _summary(
    config: EvalSettings,
    card: dict[str, Any],
    rows: list[dict[str, Any]],
    judges: CompositeJudge,
    calls: dict[str, Any],
    human: Any,
) -> dict[str, Any]:
    """What `summary.json` holds: the card, the scores, the judges' agreement (and their accuracy against the
    human labels, if any), their call counts and what failed."""
    meta = {"env_id": config.env, "engine": config.engine, "judges": list(judges.judges)}
    summary = {"card": card, **summarize_rows(rows, config.k, **meta)}
    summary["agreement"] = judge_agreement(rows, summary["judges"])
    if human is not None:
        summary["labels"] = {"file": str(config.labels), **label_accuracy(rows, human, summary["judges"])}
    summary["judge_stats"] = calls["judges"]
    summary["failed_calls"] = {
        "agent": calls["agent"],
        "judges": {n: {"pending": st["pending"]} for n, st in calls["judges"].items()},
    }
    return summary


def _check_judges(stats: dict[str, dict[str, int]], rows: Sequence[dict[str, Any]]) -> None:
    """DependencyFailed when a model judge failed on every sample it judged; a warning when on some."""
    import warnings

    for name, st in stats.items():
        if not st["pending"]:
            continue
        judged = [r for r in rows if name in r["verdicts"] and r.get("prediction") is not None]
        first = next(r["verdicts"][name]["error"] for r in rows if r["verdicts"].get(name, {}).get("error"))
        message = (
            f"judge {name!r} failed on {st['pending']} of {len(judged)} samples (left out of its scores; "
            f"rerun the command to judge them again); first: {first}"
        )
        if st["pending"] >= len(judged):
            raise DependencyFailed(message)
        warnings.warn(message, stacklevel=3)


async def _evaluate(config: EvalSettings, job: EvalJob) -> tuple[CompositeJudge, list[BaseException]]:
    """Judge again the stored samples whose judge failed, play and judge the missing ones; returns the judges
    and the episodes' errors (those samples are not stored, and logged in `job.failures`)."""
    device, seed = config.device, config.seed
    judge_handle = await open_engine(config.judge_model, device=device, seed=seed) if config.judge_model else None
    try:
        judge = eval_judge(job.judge, judge_handle.chat if judge_handle else None)
        if job.rejudge:
            tasks = {t.id: t for t in job.tasks}
            await _rejudge(job.rejudge, tasks, judge, job.store, concurrency=config.concurrency)
        errors: list[BaseException] = []
        if job.todo:
            async with opened_engine(config.engine, device=device, seed=seed, tokenizer=config.tokenizer) as handle:
                # a Workflow or an agent program
                player = build_player(handle, workflow=config.workflow, settings=job.play)
                errors = await _play(config, job, judge, player)
        return judge, errors
    finally:
        if judge_handle is not None:
            await judge_handle.aclose()


async def _rejudge(
    rows: Sequence[dict[str, Any]],
    tasks: dict[str, Any],
    judge: CompositeJudge,
    store: SampleStore,
    *,
    concurrency: int,
) -> None:
    """Judge stored samples again with the judges that failed on them; each is stored as a new revision."""
    gate = asyncio.Semaphore(concurrency)

    async def one(row: dict[str, Any]) -> None:
        names = [n for n in failed_judges(row) if n in judge.judges]
        if not names:
            return
        task = tasks.get(row["task_id"])
        again = CompositeJudge({n: judge.judges[n] for n in names}, primary=names[0])
        async with gate:
            verdicts = await judge_all(
                again,
                row.get("prediction"),
                row.get("answers") or (list(task.answers) if task else []),
                row.get("question", ""),
                task.aug_answers if task else (),
            )
        store.revise({**row, "verdicts": {**row["verdicts"], **verdicts}})

    await asyncio.gather(*(one(row) for row in rows))


async def _play(config: EvalSettings, job: EvalJob, judge: CompositeJudge, workflow: Workflow) -> list[BaseException]:
    """Play, judge and store each missing sample; an episode that raised is logged in `failures`, not stored."""
    gate = asyncio.Semaphore(config.concurrency)
    envs = EnvPool(job.make_env)
    seed, failures, store, total = config.seed, job.failures, job.store, job.total
    bar = tqdm(total=total, initial=total - len(job.todo), desc=job.progress_label, disable=not job.progress)

    async def one(index: int, task: Task, sample: int) -> None:
        async with gate:
            try:
                with envs.env() as env:
                    episode_seed = int(np.random.SeedSequence([seed, index, sample]).generate_state(1)[0])
                    traj = await workflow.arun_episode(
                        env, seed=episode_seed, options={"task_id": task.id}, rid=f"eval-{index}-{sample}"
                    )
                    known = env_verdicts(env.judge, judge, traj.verdict)  # the env judged the answer already
            except Exception as e:  # the agent or its endpoint failed: a failure of this sample, never a score
                failures.append(
                    {
                        "task_id": task.id,
                        "sample": sample,
                        "stage": "agent",
                        "time": time.time(),
                        "error": f"{type(e).__name__}: {e}"[:1000],
                    }
                )
                raise
            verdicts = await judge_all(judge, traj.prediction, task.answers, task.question, task.aug_answers, known)
            counts = traj.counts
            store.append(
                {
                    "task_id": task.id,
                    "sample": sample,
                    "question": task.question,
                    "answers": list(task.answers),
                    "prediction": traj.prediction,
                    "reward": traj.reward,
                    "subset": subset_of(task.metadata),
                    "env_correct": bool((traj.verdict or {}).get("correct")),
                    "verdicts": verdicts,
                    "stats": {
                        "turns": len(traj.turns),
                        "searches": counts.get("search", 0),
                        "accesses": counts.get("access", 0),
                        "generated_tokens": traj.generated_tokens,
                        "answered": traj.prediction is not None,
                        "stop_reason": traj.stop_reason,
                        "segments": traj.num_segments,
                        "tool_cost": traj.tool_cost,
                        **evidence_stats(traj.turns, task.metadata),
                    },
                    "trajectory": traj.to_dict(),
                }
            )
            bar.update()

    try:
        results = await asyncio.gather(*[one(i, t, s) for i, t, s in job.todo], return_exceptions=True)
        return [r for r in results if isinstance(r, BaseException)]
    finally:
        bar.close()
        envs.close()


def subset_of(metadata: dict[str, Any]) -> dict[str, Any]:
    """The task metadata scores are broken down by (hops, level, ...): scalar values of BREAKDOWN_KEYS."""
    return {
        key: metadata[key]
        for key in BREAKDOWN_KEYS
        if isinstance(metadata.get(key), (str, int, float)) and not isinstance(metadata.get(key), bool)
    }


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not np.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def tool_cost_totals(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """What every stored sample's tool calls cost, summed per unit (resumed runs included: it reads the store)."""
    totals: dict[str, float] = {}
    for row in rows:
        for unit, amount in (row["stats"].get("tool_cost") or {}).items():
            totals[unit] = totals.get(unit, 0) + amount
    return totals


def cost_metrics(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Each cost unit's mean per sample (`cost/api_calls`, ...); none for backends that cost nothing."""
    return {f"cost/{unit}": total / len(rows) for unit, total in sorted(tool_cost_totals(rows).items())} if rows else {}


def summarize_rows(rows: Sequence[dict[str, Any]], k: int, **meta: Any) -> dict[str, Any]:
    """summarize() of stored rows, per-subset breakdowns (where a key takes 2+ values) and stop reasons."""
    samples = [sample_of(r) for r in rows]
    metrics = {**summarize(samples, k), **evidence_metrics(rows), **cost_metrics(rows)}
    breakdowns = {}
    for key in BREAKDOWN_KEYS:
        groups = [(r.get("subset") or {}).get(key) for r in rows]
        if len({g for g in groups if g is not None}) > 1:
            breakdowns[key] = breakdown(samples, groups, k)
    return {
        **meta,
        "k": k,
        "metrics": metrics,
        "breakdowns": breakdowns,
        "stop_reasons": {
            reason: sum(r["stats"]["stop_reason"] == reason for r in rows)
            for reason in sorted({r["stats"]["stop_reason"] for r in rows})
        },
    }
