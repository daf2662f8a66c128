"""The synthesis pool driver: many seed pages through the QA agent into an append-only, resumable task pool.

Finished seeds are recorded in a progress file and skipped on a rerun; near-duplicate questions are
dropped; a summary counts acceptances and rejection reasons. A seed whose LLM call failed (`CallFailure`:
endpoint down, rate limited, replies cut off or unparseable after retries) is logged as a failure, not
finished: a rerun tries it again, and the summary counts failures apart, across resumed processes. After
`stop_after` seeds in a row fail so, the run stops taking seeds (an endpoint that is down is not asked
for every seed) and says why; `raise_on_failures` turns that into the command's error.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from searchgym.core.jsonl_log import JsonlLog
from searchgym.core.llm_calls import DependencyFailed
from searchgym.envs.judges import normalize_answer
from searchgym.envs.tasks import Task
from searchgym.synthesis.qa_agent import STAGES, CallFailure, Candidate, QASynthesisAgent, Rejected

TEST_SHARE = 10


def _tokens(question: str) -> frozenset[str]:
    return frozenset(normalize_answer(question).split())


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


class NearDuplicates:
    """Token-set Jaccard against every kept question, with an inverted index so checks stay cheap."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.sets: list[frozenset[str]] = []
        self.by_token: dict[str, list[int]] = {}

    def is_duplicate(self, question: str) -> bool:
        tokens = _tokens(question)
        seen: set[int] = set()
        for tok in tokens:
            for i in self.by_token.get(tok, ()):
                if i not in seen:
                    seen.add(i)
                    if jaccard(tokens, self.sets[i]) >= self.threshold:
                        return True
        return False

    def add(self, question: str) -> None:
        tokens = _tokens(question)
        for tok in tokens:
            self.by_token.setdefault(tok, []).append(len(self.sets))
        self.sets.append(tokens)


def candidate_to_task(cand: Candidate, seed_url: str, *, engine: str = "", judge: str = "") -> Task:
    digest = hashlib.sha256(seed_url.encode()).hexdigest()
    return Task(
        f"qa-{digest[:12]}",
        cand.question,
        (cand.answer,),
        {
            "source": "qa_agent",
            "seed_page": seed_url,
            "pages": cand.pages,
            "statements": cand.statements,
            "summary": cand.summary,
            "points": cand.points,
            "history": cand.history,
            "solver": cand.solver,
            "solve_rate": cand.solve_rate,
            "hops": len(cand.pages),
            "split": "test" if int(digest, 16) % TEST_SHARE == 0 else "train",
            "engine": engine,
            "judge": judge,
        },
    )


def progress_path(out: Path) -> Path:
    """OUT.progress.jsonl: a row per finished seed of the pool at `out`."""
    return out.with_name(out.name + ".progress.jsonl")


def summary_path(out: Path) -> Path:
    return out.with_name(out.name.removesuffix(".jsonl") + ".summary.json")


@dataclass
class PoolOptions:
    """How `asynthesize` drives the agent: seeds in flight, a progress bar, the engines' names each task records,
    and how many seeds failing in a row on an LLM call stop the run (None: never)."""

    concurrency: int = 4
    progress: bool = False
    engine_name: str = ""
    judge_name: str = ""
    stop_after: int | None = 16


async def asynthesize(
    agent: QASynthesisAgent, seed_urls: Sequence[str], out: str | Path, n: int, options: PoolOptions | None = None
) -> dict[str, Any]:
    """Run `agent` over seed pages (in the given order) until `n` tasks are in `out`; resumable.

    `out` gets one task row per accepted candidate; OUT.progress.jsonl one row per finished seed (accepted
    or with its rejection reason) and one per failed try of a seed ({"url", "failed", "detail"}), so a rerun
    skips finished seeds, tries failed ones again and carries the counts on. `options.stop_after` consecutive
    failed seeds stop the run (None: never).
    """
    options = options or PoolOptions()
    stop_after = options.stop_after
    if stop_after is not None and (not isinstance(stop_after, int) or stop_after < 1):
        raise ValueError(f"stop_after must be an integer >= 1 or None, got {stop_after!r}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    run = _PoolRun(agent, out, n, options)
    queue = iter([u for u in seed_urls if u not in run.done])
    t0 = time.perf_counter()
    await asyncio.gather(*(run.worker(queue) for _ in range(max(1, options.concurrency))))
    if run.stopped is not None:
        run.stopped += f"; {sum(1 for _ in queue)} seeds not tried"
    run.bar.close()
    report = run.report(time.perf_counter() - t0)
    summary_path(out).write_text(json.dumps(report, indent=2) + "\n")
    return report


class _PoolRun:
    """One `asynthesize` call's state: the pool and progress files (repaired and read back on open), the seeds
    finished, the counts carried over from earlier runs and those of this one."""

    def __init__(self, agent: QASynthesisAgent, out: Path, n: int, options: PoolOptions) -> None:
        self.agent, self.out, self.n, self.options = agent, out, n, options
        # Both files are repaired on open: a line cut by a kill is dropped (that seed runs again), a damaged
        # line is set aside in NAME.damaged.jsonl and reported by line, never counted.
        self.pool = JsonlLog(out, check=lambda row: Task.from_row(row, fallback_id="-"))
        self.log = JsonlLog(progress_path(out), check=lambda row: str(row["url"]))
        pooled = {str(row.get("metadata", {}).get("seed_page", "")) for row in self.pool}
        self.done: set[str] = set(pooled)  # a task row written just before a kill counts even if its log row was not
        self.rejections: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()  # every failed try of a seed, in every process
        for row in self.log:
            if "failed" in row:
                self.failures[str(row["failed"])] += 1
                continue
            if row.get("reason") is None and row["url"] not in pooled:
                continue  # logged as accepted, but its task row was set aside as damaged: that seed runs again
            self.done.add(row["url"])
            if row.get("reason"):
                self.rejections[row["reason"]] += 1
        self.dups = NearDuplicates(agent.config.near_duplicate)
        for row in self.pool:
            self.dups.add(row["question"])
        self.accepted = len(self.pool)
        self.resumed = {
            "accepted": self.accepted,
            "seeds_done": len(self.done),
            "damaged_lines": [f"{d.line}: {d.reason}" for d in self.pool.damaged + self.log.damaged],
        }
        self.attempted, self.in_a_row = 0, 0
        self.failed_now: list[CallFailure] = []
        self.stopped: str | None = None
        self.bar = tqdm(
            total=n, initial=min(n, self.accepted), desc="synthesizing", unit="task", disable=not options.progress
        )

    def record(self, url: str, reason: str | None, task: Task | None, outcome: dict[str, Any] | None = None) -> None:
        """A finished seed: accepted (`task`) or rejected for `reason`; `outcome` (see `_outcome`) goes in its row."""
        self.in_a_row = 0
        self.done.add(url)
        if task is not None:
            self.pool.append(task.to_row())
            self.accepted += 1
            self.bar.update(1)
        else:
            self.rejections[reason or "unknown"] += 1
        self.log.append({"url": url, "reason": reason, **(outcome or {})})

    def record_failure(self, url: str, failure: CallFailure) -> None:
        self.failures[failure.reason] += 1
        self.failed_now.append(failure)
        self.log.append({"url": url, "failed": failure.reason, "detail": failure.detail[:500], **_outcome(failure)})
        self.in_a_row += 1
        stop_after = self.options.stop_after
        if stop_after is not None and self.in_a_row >= stop_after and self.stopped is None:
            self.stopped = f"{self.in_a_row} seeds in a row failed on an LLM call"

    async def worker(self, queue: Iterator[str]) -> None:
        while self.accepted < self.n and self.stopped is None:
            url = next(queue, None)
            if url is None:
                return
            self.attempted += 1
            try:
                cand = await self.agent.run(url)
            except Rejected as r:
                self.record(url, r.reason, None, {"detail": r.detail[:500], **_outcome(r)})
                continue
            except CallFailure as f:  # not finished: logged as a failure, tried again by a rerun
                self.record_failure(url, f)
                continue
            except Exception as e:  # a bug in a backend must not end the whole run either
                self.record(url, f"error: {type(e).__name__}", None, {"detail": str(e)[:500]})
                continue
            if self.accepted >= self.n:
                return  # another worker filled the pool meanwhile; this seed stays unfinished
            if self.dups.is_duplicate(cand.question):
                self.record(url, "near-duplicate question", None, _outcome(cand))
                continue
            self.dups.add(cand.question)
            names = {"engine": self.options.engine_name, "judge": self.options.judge_name}
            self.record(url, None, candidate_to_task(cand, url, **names), {**_outcome(cand), "stage": "accepted"})

    def report(self, elapsed: float) -> dict[str, Any]:
        """The summary: acceptances, rejection reasons, failed calls (across resumed runs) and this run's counts."""
        accepted, failed_now = self.accepted, self.failed_now
        total = accepted + sum(self.rejections.values())
        pending = {row["url"] for row in self.log if "failed" in row} - self.done
        return {
            "out": str(self.out),
            "target": self.n,
            "accepted": accepted,
            "seeds_finished": total,
            "acceptance_rate": round(accepted / total, 4) if total else 0.0,
            "rejections": dict(sorted(self.rejections.items())),
            "failed_calls": {
                "seeds_pending": len(pending),
                "tries_failed": sum(self.failures.values()),
                "by_reason": dict(sorted(self.failures.items())),
            },
            "stopped": self.stopped,
            "stages": stage_yields(self.log, self.done),
            "this_run": {
                "seeds_tried": self.attempted,
                "seeds_failed": len(failed_now),
                "first_failure": str(failed_now[0]) if failed_now else None,
                "seconds": round(elapsed, 2),
                "seeds_per_s": round(self.attempted / elapsed, 3) if elapsed > 0 else None,
                "llm_calls": dict(sorted(self.agent.calls.items())),
                "judge_stats": dict(getattr(self.agent.judge, "stats", {})),  # a rule judge keeps none
            },
            "resumed_from": self.resumed,
            "config": asdict(self.agent.config),
            "exhausted_seeds": accepted < self.n,
        }


def _outcome(source: Candidate | BaseException) -> dict[str, Any]:
    """What a progress row keeps of a seed's end: the last stage passed and, once proposed, the candidate's
    question, answer and actions (so rejections can be read back with their questions), and once the solver tried
    it, its answers with the judge's grades (so "too easy" can be read back as the solver's or the judge's doing)."""
    cand = source if isinstance(source, Candidate) else getattr(source, "candidate", None)
    if not isinstance(cand, Candidate):
        return {"stage": STAGES[0]}
    actions = [h["action"] for h in cand.history if h.get("action") != "PROPOSE"]
    row = {"stage": cand.stage, "question": cand.question, "answer": cand.answer, "actions": actions}
    return {**row, "solver": cand.solver} if cand.solver else row


def stage_yields(log: Iterable[dict[str, Any]], done: set[str]) -> list[dict[str, Any]]:
    """Seeds reaching each of STAGES, from the progress rows (every process's): a finished seed by its finishing row,
    a pending one by its latest failed try. Each stage after the first also counts the seeds lost on the way to it:
    `rejected` (a judged outcome, near-duplicates included) and `failed_call` (pending after an LLM call failed).
    Rows of older runs without a stage, and seeds pooled without a row, are `unknown_stage` on the first stage."""
    last: dict[str, dict[str, Any]] = {}
    for row in log:
        if "failed" in last.get(row["url"], {"failed": True}):  # a finished seed keeps its finishing row
            last[row["url"]] = row
    for url in done - last.keys():
        last[url] = {"url": url, "stage": "accepted"}  # pooled just before a kill cut its progress row
    reached = {stage: 0 for stage in STAGES}
    lost = {stage: Counter[str]() for stage in STAGES}
    unknown = 0
    for row in last.values():
        if row.get("stage") not in reached:
            unknown += 1
            continue
        at = STAGES.index(row["stage"])
        for stage in STAGES[: at + 1]:
            reached[stage] += 1
        if at + 1 < len(STAGES):
            lost[STAGES[at + 1]]["failed_call" if "failed" in row else "rejected"] += 1
    table: list[dict[str, Any]] = [{"stage": STAGES[0], "seeds": reached[STAGES[0]] + unknown}]
    if unknown:
        table[0]["unknown_stage"] = unknown
    for stage in STAGES[1:]:
        losses = {k: lost[stage][k] for k in ("rejected", "failed_call")}
        table.append({"stage": stage, "seeds": reached[stage], **losses})
    return table


def raise_on_failures(report: dict[str, Any]) -> None:
    """DependencyFailed naming the cause when this run's seeds failed on LLM calls and its target was not reached."""
    run = report["this_run"]
    if not run["seeds_failed"] or (report["accepted"] >= report["target"] and not report["stopped"]):
        return
    if run["seeds_failed"] == run["seeds_tried"]:
        head = f"all {run['seeds_tried']} seeds tried failed"
    else:
        head = f"{run['seeds_failed']} of {run['seeds_tried']} seeds failed"
    stop = f" (stopped early: {report['stopped']})" if report["stopped"] else ""
    raise DependencyFailed(
        f"{head} on an LLM call and stay unfinished{stop}; rerun to retry them. First: {run['first_failure']}"
    )
