"""How well a real chat model judges answers: the LLM judge against exact match and F1 on stored answered samples.

`searchgym bench judge` serves the judge model through the model server's OpenAI route on 127.0.0.1 (a model
directory or a packaged model name; an `openai:` endpoint is used as it is), asks it ASearcher's judge prompt for
every answered sample, and scores its verdicts against EM and F1>0.5 on the same samples: Cohen's kappa, percent
agreement and the confusion table. A reply the judge's parser cannot read is *invalid*: counted apart (with its
reasons and examples), never graded. The samples are answers a real policy gave (the SmolLM2 preset's held-out
evaluations, kept in `results/judge_samples_smollm2.jsonl`); `--from-runs` collects them again from eval runs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchgym.bench.provenance import git_commit, machine
from searchgym.core.atomic_file import write_atomic
from searchgym.core.llm_calls import ReplyRetry
from searchgym.core.settings_flags import settings_argv
from searchgym.envs.judges import make_judge
from searchgym.envs.llm_judge import LLMJudge
from searchgym.eval.agreement import F1_THRESHOLD, judge_agreement
from searchgym.settings import setting

SAMPLES = Path("results/judge_samples_smollm2.jsonl")
EXAMPLES = 12  # replies kept in the results file, valid and invalid


@dataclass
class JudgeBenchSettings:
    """`searchgym bench judge`: one judge model over stored answered samples."""

    judge_model: str = setting(
        "smollm2-135m-instruct",
        help="a packaged model name (converted on first use), a model directory, or openai:http://host/v1[:model]",
    )
    samples: str = setting(str(SAMPLES), help="JSONL of answered samples: question, answers, prediction")
    from_runs: list[str] | None = setting(
        None, help="comma list of eval run directories: collect their answered samples into --samples first"
    )
    max_samples: int | None = setting(None, at_least=1, help="judge the first N samples only (default: all)")
    concurrency: int = setting(16, at_least=1, help="judge calls in flight")
    max_tokens: int = setting(256, at_least=1, help="the judge's reply budget per call")
    attempts: int = setting(
        1, at_least=1, help="tries per sample (the judge decodes greedily: a retry gives the same reply)"
    )
    threads: int = setting(1, at_least=1, help="torch threads of a local judge model")
    out: str = setting("results/bench_judge_smollm2.json", help="the results file")


def collect_samples(run_dirs: Sequence[str | os.PathLike]) -> list[dict[str, Any]]:
    """Distinct (question, prediction) answered samples of eval runs' `samples.jsonl` files, found below each dir."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for root in run_dirs:
        files = sorted(Path(root).rglob("samples.jsonl"))
        if not files:
            raise ValueError(f"--from-runs {root}: no eval run (samples.jsonl) below it")
        for path in files:
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a half-written last line of a run still going
                prediction = row.get("prediction")
                if isinstance(prediction, str) and prediction.strip():
                    seen.setdefault(
                        (row["question"], prediction),
                        {
                            "task_id": row["task_id"],
                            "question": row["question"],
                            "answers": list(row["answers"]),
                            "prediction": prediction,
                            "hops": (row.get("subset") or {}).get("hops"),
                            "source": str(path.parent),
                        },
                    )
    return list(seen.values())


def load_samples(path: str | os.PathLike, limit: int | None) -> list[dict[str, Any]]:
    """The samples file's rows (ValueError naming the line of a row without question, answers and prediction)."""
    rows = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not (isinstance(row["question"], str) and isinstance(row["prediction"], str)):
                raise TypeError
            row["answers"] = [str(a) for a in row["answers"]]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ValueError(f"{path}:{number}: expected a JSON object with question, answers and prediction") from None
        rows.append(row)
    return rows[:limit] if limit else rows


@contextlib.asynccontextmanager
async def served_judge(spec: str, threads: int) -> AsyncIterator[str]:
    """An `openai:` spec of the judge model: served on 127.0.0.1 by the model server unless it is one already."""
    if spec.startswith("openai:"):
        yield spec
        return
    import torch

    from searchgym.agents.engines.torch_engine import TorchEngine
    from searchgym.pipeline.stages import resolve_model
    from searchgym.serve.model.app import serving
    from searchgym.serve.settings import ModelServerSettings

    torch.set_num_threads(threads)
    model_dir = resolve_model(spec)
    engine = TorchEngine(str(model_dir))
    async with serving(engine, ModelServerSettings(model_path=str(model_dir), port=0)) as base:
        yield f"openai:{base}/v1:{model_dir.name}"


async def judge_all(samples: list[dict[str, Any]], settings: JudgeBenchSettings) -> tuple[list[dict[str, Any]], float]:
    """Every sample with em, f1 and llm verdicts (as eval stores them), and the seconds the LLM judge took."""
    from searchgym.agents.engines.open import open_engine

    exact = {name: make_judge(name) for name in ("em", "f1")}
    async with served_judge(settings.judge_model, settings.threads) as spec:
        handle = await open_engine(spec)
        llm = LLMJudge(handle.chat, max_tokens=settings.max_tokens, retry=ReplyRetry(attempts=settings.attempts))
        slots = asyncio.Semaphore(settings.concurrency)

        async def one(i: int, sample: dict[str, Any]) -> dict[str, Any]:
            async with slots:
                verdict = await llm.ajudge(sample["prediction"], sample["answers"], question=sample["question"])
            verdicts = {
                name: (
                    await judge.ajudge(sample["prediction"], sample["answers"], question=sample["question"])
                ).to_dict()
                for name, judge in exact.items()
            }
            return {**sample, "sample": i, "verdicts": {**verdicts, "llm": verdict.to_dict()}}

        start = time.perf_counter()
        try:
            rows = await asyncio.gather(*(one(i, s) for i, s in enumerate(samples)))
        finally:
            await handle.aclose()
        return rows, time.perf_counter() - start


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Kappa and confusion of llm against em and f1>0.5 on the valid verdicts; invalid replies counted apart."""
    valid = [r for r in rows if not r["verdicts"]["llm"].get("error")]
    invalid = [r for r in rows if r["verdicts"]["llm"].get("error")]
    agreement = judge_agreement(rows, ["em", "f1", "llm"], max_listed=0)  # an invalid llm verdict is no call
    f1_rater = f"f1>{F1_THRESHOLD:g}"
    confusion = {}
    for ref in ("em", f1_rater):
        table: collections.Counter[str] = collections.Counter()
        for r in valid:
            truth = r["verdicts"]["em"]["correct"] if ref == "em" else r["verdicts"]["f1"]["score"] > F1_THRESHOLD
            said = "correct" if r["verdicts"]["llm"]["correct"] else "wrong"
            table[f"{ref}={'correct' if truth else 'wrong'}, llm={said}"] += 1
        confusion[f"llm vs {ref}"] = dict(sorted(table.items()))
    reasons = collections.Counter(r["verdicts"]["llm"]["error"].split(":")[0] for r in invalid)
    return {
        "samples": len(rows),
        "valid": len(valid),
        "invalid": len(invalid),
        "invalid_rate": round(len(invalid) / len(rows), 4) if rows else None,
        "invalid_reasons": dict(reasons.most_common()),
        "em_correct_rate": round(sum(r["verdicts"]["em"]["correct"] for r in rows) / len(rows), 4) if rows else None,
        "pairs": [_rounded(pair) for pair in agreement["pairs"]],
        "confusion": confusion,
    }


def _rounded(pair: dict[str, Any]) -> dict[str, Any]:
    """A pair's figures to 4 places, an undefined kappa (NaN: one rater constant) as null: results files are JSON."""
    return {k: (None if v != v else round(v, 4)) if isinstance(v, float) else v for k, v in pair.items()}


def examples(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A few judged samples with the judge's own reply: the first valid ones and the first invalid ones."""

    def brief(r: dict[str, Any]) -> dict[str, Any]:
        llm = r["verdicts"]["llm"]
        return {
            "question": r["question"],
            "answers": r["answers"],
            "prediction": r["prediction"],
            "em": r["verdicts"]["em"]["correct"],
            "llm": None if llm.get("error") else llm["correct"],
            "invalid_because": llm.get("error"),
            "reply": (llm.get("detail") or {}).get("output"),
        }

    valid = [brief(r) for r in rows if not r["verdicts"]["llm"].get("error")][: EXAMPLES // 2]
    invalid = [brief(r) for r in rows if r["verdicts"]["llm"].get("error")][: EXAMPLES - len(valid)]
    return valid + invalid


def run_judge_bench(settings: JudgeBenchSettings) -> dict[str, Any]:
    """Judge the samples, score the judge, write `settings.out`; returns the report."""
    if settings.from_runs:
        collected = collect_samples(settings.from_runs)
        target = Path(settings.samples)
        if target.exists():
            raise ValueError(f"--samples {target} exists: collect into a new file (nothing was overwritten)")
        write_atomic(target, "".join(json.dumps(r) + "\n" for r in collected))
        print(f"[bench judge] {len(collected)} distinct answered samples collected into {target}", flush=True)
    samples = load_samples(settings.samples, settings.max_samples)
    if not samples:
        raise ValueError(f"--samples {settings.samples}: no samples")
    rows, seconds = asyncio.run(judge_all(samples, settings))
    report = {
        "bench": "judge",
        "command": " ".join(["searchgym bench judge", *settings_argv(settings)]),
        "settings": {k: getattr(settings, k) for k in settings.__dataclass_fields__},
        "judge_prompt": "ASearcher's (envs/llm_judge.py JUDGE_PROMPT), temperature 0",
        **summarise(rows),
        "judge_seconds": round(seconds, 1),
        "examples": examples(rows),
        "commit": git_commit(),
        "machine": machine(torch_threads=settings.threads),
    }
    write_atomic(Path(settings.out), json.dumps(report, indent=2) + "\n")
    return report


def format_report(report: dict[str, Any]) -> str:
    """The figures a reader wants first, as lines of text."""
    lines = [
        f"judge {report['settings']['judge_model']}: {report['samples']} samples, {report['valid']} valid verdicts, "
        f"{report['invalid']} invalid ({report['invalid_rate']:.1%}) in {report['judge_seconds']:.0f} s"
    ]
    for pair in report["pairs"]:
        lines.append(
            f"  {pair['a']} vs {pair['b']}: n={pair.get('n')} kappa={pair.get('kappa')} "
            f"agreement={pair.get('agreement')}"
        )
    return "\n".join(lines)


def judge_bench_command(settings: JudgeBenchSettings) -> None:
    """`searchgym bench judge`: run it and print the headline figures."""
    report = run_judge_bench(settings)
    print(format_report(report))
    print(f"results in {settings.out}")
