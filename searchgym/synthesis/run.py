"""`searchgym synthesize --method agent`: open the corpus index and the engines, then drive the pool."""

from __future__ import annotations

import asyncio
import random
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from searchgym.agents.engines.open import open_engine
from searchgym.envs.tools.indexes import open_index
from searchgym.settings import check_settings, setting
from searchgym.synthesis.pool import PoolOptions, asynthesize, raise_on_failures
from searchgym.synthesis.qa_agent import QAConfig, QASynthesisAgent


def seed_pages(index: Any, seed: int, *, limit: int | None = None) -> list[str]:
    """Urls of the corpus's pages in a seeded order (pages with links first is not assumed)."""
    urls = [doc.url for doc in index.iter_docs()]
    random.Random(seed).shuffle(urls)
    return urls[:limit] if limit else urls


@dataclass
class SynthesisSettings:
    """One `searchgym synthesize --method agent` run: `n` tasks from the corpus index `corpus` into `out`, written by
    the engine `engine` and judged by `judge_engine` (default: the same), `concurrency` seeds in flight."""

    corpus: str = setting(help="a corpus index directory (or a corpus file, indexed on first use)")
    engine: str = setting(help="openai:http://host/v1[:model], sglang:HOST:PORT or a local model directory")
    n: int = setting(help="tasks to have in the pool")
    out: str = setting(help="the task pool (JSONL), resumed when it exists")
    judge_engine: str | None = setting(None, help="the judge's engine (default: --engine)")
    concurrency: int = setting(4, help="seeds in flight")
    seed: int = 0
    max_seeds: int | None = setting(None, help="the first seed pages only (default: all)")
    device: str = setting("cpu", help="of a local model directory")
    stop_after: int | None = setting(
        16, at_least=1, help="seeds failing in a row on an LLM call that stop the run (None: never)"
    )
    qa: QAConfig = field(default_factory=QAConfig)


async def _synthesize_main(settings: SynthesisSettings, progress: bool) -> dict[str, Any]:
    index = open_index(settings.corpus)
    urls = seed_pages(index, settings.seed, limit=settings.max_seeds)
    async with AsyncExitStack() as stack:
        models: dict[str, Any] = {}

        async def chat_model(spec: str) -> Any:
            """The chat model of an engine spec, opened once (a local model dir is chatted with in process)."""
            if spec not in models:
                handle = await open_engine(spec, device=settings.device, seed=settings.seed)
                stack.push_async_callback(handle.aclose)
                models[spec] = handle.chat
            return models[spec]

        judge_engine = settings.judge_engine or settings.engine
        model = await chat_model(settings.engine)
        judge = await chat_model(judge_engine)
        agent = QASynthesisAgent(index, index, model, judge, settings.qa)
        options = PoolOptions(
            settings.concurrency,
            progress,
            engine_name=settings.engine,
            judge_name=judge_engine,
            stop_after=settings.stop_after,
        )
        return await asynthesize(agent, urls, settings.out, settings.n, options)


def synthesize(settings: SynthesisSettings, *, progress: bool = False, raise_failures: bool = True) -> dict[str, Any]:
    """Blocking entry point of `searchgym synthesize --method agent`; returns the summary (also written).

    Settings that fail their checks are refused (ValueError naming the key) before anything starts. Raises
    DependencyFailed (naming the cause) after writing the summary when seeds failed on LLM calls and the target
    was not reached: the command then exits non-zero, and its rerun tries them again. With `raise_failures` False
    (a measurement of a model's yields, where failed calls are a figure) the summary is returned instead."""
    check_settings(settings)
    report = asyncio.run(_synthesize_main(settings, progress))
    if raise_failures:
        raise_on_failures(report)
    return report
