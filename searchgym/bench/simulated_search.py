"""`searchgym bench simulated-search`: what a real model writes as ZeroSearch's simulated search engine.

For N one-hop questions of a synthetic world, the simulator (by default the packaged SmolLM2-135M-Instruct) is
asked for k documents per question (the question is the query), a share `noise` of them from the noisy prompt,
under each prompt set in one run, interleaved question by question:
- `blind`: the default prompts, which see only the query (the world is fictional: the model cannot know it);
- `answer_aware`: ZeroSearch's, which tell the useful documents the question and its answer.
A document *holds the answer* when a labelled answer appears in its normalised text (SQuAD normalisation). Per
prompt set: the share of useful and of noisy documents that hold it, with 95% Wilson intervals; searches that
failed (no parseable document after the retries), counted by reason; empty or repeated documents; seconds; and
a few documents.

With `--sft-demos N` the run also makes ZeroSearch's light fine-tune (`bench/simulated_search_sft.py`): N
demonstrations written from the world's pages on other questions than the measured ones, the simulator fine-tuned
on them (cached beside the results file, reused when finished), and both models measured in one run. The arms are
`model/prompt set`: `base/blind`, `base/answer_aware`, `tuned/blind`, `tuned/answer_aware`.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchgym.bench.provenance import git_commit, machine
from searchgym.bench.retrieval_paraphrase import wilson
from searchgym.core.atomic_file import write_atomic
from searchgym.core.settings_flags import settings_argv
from searchgym.envs.answer_text import holds_answer
from searchgym.envs.tasks import Task
from searchgym.envs.tools.base import SEARCHING_FOR, BackendError
from searchgym.envs.tools.simulated_search import PROMPT_SETS, SimulatedSearch, SimulatorOptions
from searchgym.settings import setting

EXAMPLES = 3  # documents kept per prompt set and kind


@dataclass
class SimulatedSearchBenchSettings:
    """`searchgym bench simulated-search`: one simulator model, every packaged prompt set, the same questions."""

    simulator: str = setting(
        "smollm2-135m-instruct", help="a packaged model name (converted on first use) or a model directory"
    )
    questions: int = setting(16, at_least=1, help="one-hop questions of the world asked as queries")
    world_size: int = setting(1000, at_least=100, help="pages of the synthetic world the questions come from")
    seed: int = setting(0, help="seed of the world, its questions and the simulator")
    k: int = setting(4, at_least=1, help="documents per search")
    noise: float = setting(0.5, at_least=0, at_most=1, help="share of the k documents from the noisy prompt")
    prompt_sets: list[str] = setting(
        default_factory=lambda: list(PROMPT_SETS), help="comma list of packaged prompt sets: blind, answer_aware"
    )
    max_tokens: int = setting(192, at_least=16, help="the simulator's reply budget per call")
    concurrency: int = setting(16, at_least=1, help="searches in flight")
    threads: int = setting(1, at_least=1, help="torch threads of the simulator")
    out: str = setting("results/bench_simulated_search_smollm2.json", help="the results file")
    sft_demos: int = setting(
        0,
        at_least=0,
        help="ZeroSearch's fine-tune: demonstrations (chats, a useful and a noisy one per question) written from the "
        "world on other questions; the tuned simulator is measured beside the base one (0: no fine-tune)",
    )
    sft_prompt_sets: list[str] = setting(
        default_factory=lambda: ["answer_aware"], help="comma list of prompt sets the demonstrations are written in"
    )
    sft_epochs: float = setting(3.0, above=0, help="passes over the demonstrations")
    sft_lr: float = setting(1e-4, above=0, help="the fine-tune's learning rate")
    sft_batch_tokens: int = setting(4096, at_least=1, help="tokens (padded) per fine-tune step")
    sft_micro_batch_tokens: int = setting(
        1024,
        at_least=1,
        help="tokens per forward/backward pass of a fine-tune step (the same update in less memory: SmolLM2-135M "
        "peaked at 7.7 GB resident with 2048)",
    )
    device: str = setting("cpu", help="where the fine-tune and the simulators run: cpu or cuda")
    work: str = setting(
        "runs/bench_simulated_search",
        help="where the tuned simulator is kept, by a digest of its recipe, for a rerun to reuse (never in results/: "
        "it is a 0.5 GB model)",
    )

    def check(self) -> Any:
        """Every prompt set is one that ships with searchgym."""
        for key in ("prompt_sets", "sft_prompt_sets"):
            for name in getattr(self, key):
                if name not in PROMPT_SETS:
                    yield key, f"has {name!r}; the packaged sets are {', '.join(PROMPT_SETS)}"


async def _search_all(backend: SimulatedSearch, tasks: list[Task], k: int, concurrency: int) -> list[dict[str, Any]]:
    slots = asyncio.Semaphore(concurrency)

    async def one(task: Task) -> dict[str, Any]:
        async with slots:
            serving = SEARCHING_FOR.set((task.question, tuple(task.answers)))
            try:
                hits = await backend.search(task.question, k)
            except BackendError as e:
                return {"task_id": task.id, "failed": str(e)[:300]}
            finally:
                SEARCHING_FOR.reset(serving)
        docs = []
        for hit in hits:
            page = await backend.fetch(hit.url)
            docs.append(
                {
                    "kind": "noisy" if hit.doc_id.startswith("sim-n-") else "useful",
                    "title": page.title,
                    "text": page.text,
                    "holds_answer": holds_answer(f"{page.title} {page.text}", task.answers),
                }
            )
        return {"task_id": task.id, "question": task.question, "answers": list(task.answers), "docs": docs}

    return list(await asyncio.gather(*(one(t) for t in tasks)))


def summarise(rows: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """Answer rates of useful and noisy documents with intervals, failures, empty and repeated documents."""
    out: dict[str, Any] = {"searches": len(rows), "failed_searches": sum("failed" in r for r in rows)}
    docs = [d for r in rows for d in r.get("docs", [])]
    for kind in ("useful", "noisy"):
        mine = [d for d in docs if d["kind"] == kind]
        hits = sum(d["holds_answer"] for d in mine)
        low, high = wilson(hits, len(mine))
        out[kind] = {
            "documents": len(mine),
            "hold_answer": hits,
            "rate": round(hits / len(mine), 4) if mine else None,
            "rate_95": [round(low, 4), round(high, 4)],
            "empty_text": sum(not d["text"].strip() for d in mine),
            "distinct_texts": len({d["text"] for d in mine}),
        }
    out["seconds"] = round(seconds, 1)
    out["failures"] = sorted({r["failed"] for r in rows if "failed" in r})[:5]
    return out


def _examples(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    picked: list[dict[str, Any]] = []
    for kind in ("useful", "noisy"):
        for r in rows:
            doc = next((d for d in r.get("docs", []) if d["kind"] == kind), None)
            if doc is not None and len([p for p in picked if p["kind"] == kind]) < EXAMPLES:
                picked.append({"question": r["question"], "answers": r["answers"], **doc, "text": doc["text"][:600]})
    return picked


def failure_reasons(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Failed searches counted by reason: the engine's message cut to its first clause ("cut off", "unparseable")."""
    prefix = "the simulated search engine failed: "
    reasons = [r["failed"].removeprefix(prefix).split(":")[0].strip() for r in rows if "failed" in r]
    return dict(sorted(Counter(reasons).items()))


def _simulators(settings: SimulatedSearchBenchSettings, models: dict[str, Path]) -> dict[str, SimulatedSearch]:
    """One engine per model, one backend per (model, prompt set): the arms, named `model/prompt set`."""
    from searchgym.agents.chat import EngineChat
    from searchgym.agents.engines.torch_engine import TorchEngine

    arms = {}
    for model, model_dir in models.items():
        engine = TorchEngine(str(model_dir), device=settings.device, seed=settings.seed)
        chat = EngineChat(engine, engine.tokenizer)
        for name in settings.prompt_sets:
            options = SimulatorOptions(
                noise=settings.noise, seed=settings.seed, prompts=name, max_tokens=settings.max_tokens
            )
            arms[f"{model}/{name}"] = SimulatedSearch(chat, options)
    return arms


async def _run(settings: SimulatedSearchBenchSettings, models: dict[str, Path], tasks: list[Task]) -> dict[str, Any]:
    backends = _simulators(settings, models)
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in backends}
    seconds = dict.fromkeys(backends, 0.0)
    step = max(1, settings.concurrency)
    for start in range(0, len(tasks), step):  # interleaved: each arm meets the same load
        for name, backend in backends.items():
            began = time.perf_counter()
            rows[name] += await _search_all(backend, tasks[start : start + step], settings.k, settings.concurrency)
            seconds[name] += time.perf_counter() - began
    return {
        name: {
            **summarise(rows[name], seconds[name]),
            "failed_by_reason": failure_reasons(rows[name]),
            "examples": _examples(rows[name]),
        }
        for name in backends
    }


def run_simulated_search_bench(settings: SimulatedSearchBenchSettings) -> dict[str, Any]:
    """Ask each simulator (the base model, and the fine-tuned one with `sft_demos`) for documents on the world's
    questions under each prompt set; write `settings.out`."""
    import torch

    from searchgym.bench.simulated_search_sft import tuned_simulator
    from searchgym.pipeline.stages import resolve_model
    from searchgym.world.simulator_demos import one_hop_tasks
    from searchgym.world.world import World

    torch.set_num_threads(settings.threads)
    world = World(settings.world_size, settings.seed)
    tasks = one_hop_tasks(world, settings.questions, settings.seed)
    base = resolve_model(settings.simulator)
    models, sft_info = {"base": base}, None
    if settings.sft_demos:
        models["tuned"], sft_info = tuned_simulator(settings, base, world, tasks)
    load_before = os.getloadavg()
    results = asyncio.run(_run(settings, models, tasks))
    report = {
        "bench": "simulated-search",
        "command": " ".join(["searchgym bench simulated-search", *settings_argv(settings)]),
        "settings": {k: getattr(settings, k) for k in settings.__dataclass_fields__},
        "definition": "a document holds the answer when a labelled answer appears as whole words in its "
        "normalised title and text; arms are simulator/prompt set (tuned: fine-tuned on sft_demos demonstrations "
        "written from the world on other questions)",
        "sft": sft_info,
        "results": results,
        "commit": git_commit(),
        "machine": machine(torch_threads=settings.threads, load_before=load_before, load_after=os.getloadavg()),
    }
    write_atomic(Path(settings.out), json.dumps(report, indent=2) + "\n")
    return report


def format_report(report: dict[str, Any]) -> str:
    """One line per prompt set: useful and noisy answer rates with intervals, failed searches."""
    lines = []
    sft = report.get("sft")
    if sft:
        trained = "reused" if sft["reused"] else f"{sft.get('steps')} steps, {sft.get('sft_seconds')} s"
        lines.append(
            f"fine-tune: {sft['demos']} demonstrations on {sft['demo_questions']} other questions; {trained}; "
            f"loss {sft.get('first_loss')} -> {sft.get('final_loss')}; model {sft['model_dir']}"
        )
    for name, r in report["results"].items():
        u, n = r["useful"], r["noisy"]
        reasons = ", ".join(f"{why} {count}" for why, count in r.get("failed_by_reason", {}).items())
        lines.append(
            f"{name:>19}: useful hold the answer {u['hold_answer']}/{u['documents']} {u['rate_95']}, "
            f"noisy {n['hold_answer']}/{n['documents']} {n['rate_95']}; "
            f"{r['failed_searches']}/{r['searches']} searches failed{f' ({reasons})' if reasons else ''}; "
            f"{r['seconds']:.0f} s"
        )
    return "\n".join(lines)


def simulated_search_command(settings: SimulatedSearchBenchSettings) -> None:
    """`searchgym bench simulated-search`: run it and print one line per prompt set."""
    report = run_simulated_search_bench(settings)
    print(format_report(report))
    print(f"results in {settings.out}")
