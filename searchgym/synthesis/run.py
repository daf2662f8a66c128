"""`searchgym synthesize --method agent`: open the corpus index and the engines, then drive the pool."""

from __future__ import annotations

import asyncio
import random
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from searchgym.agents.engines.open import open_engine
from searchgym.envs.tools.indexes import open_index
from searchgym.synthesis.pool import asynthesize, raise_on_failures
from searchgym.synthesis.qa_agent import QAConfig, QASynthesisAgent


def seed_pages(index: Any, seed: int, *, limit: int | None = None) -> list[str]:
    """Urls of the corpus's pages in a seeded order (pages with links first is not assumed)."""
    urls = [doc.url for doc in index.iter_docs()]
    random.Random(seed).shuffle(urls)
    return urls[:limit] if limit else urls


async def _synthesize_main(
    corpus: str | Path,
    engine: str,
    judge_engine: str | None,
    n: int,
    out: str | Path,
    *,
    concurrency: int,
    seed: int,
    config: QAConfig,
    max_seeds: int | None,
    progress: bool,
    device: str,
) -> dict[str, Any]:
    index = open_index(corpus)
    urls = seed_pages(index, seed, limit=max_seeds)
    async with AsyncExitStack() as stack:
        models: dict[str, Any] = {}

        async def chat_model(spec: str) -> Any:
            """The chat model of an engine spec, opened once (a local model dir is chatted with in process)."""
            if spec not in models:
                handle = await open_engine(spec, device=device, seed=seed)
                stack.push_async_callback(handle.aclose)
                models[spec] = handle.chat
            return models[spec]

        model = await chat_model(engine)
        judge = await chat_model(judge_engine or engine)
        agent = QASynthesisAgent(index, index, model, judge, config)
        return await asynthesize(
            agent,
            urls,
            out,
            n,
            concurrency=concurrency,
            progress=progress,
            engine_name=engine,
            judge_name=judge_engine or engine,
        )


def synthesize(
    corpus: str | Path,
    engine: str,
    n: int,
    out: str | Path,
    *,
    judge_engine: str | None = None,
    concurrency: int = 4,
    seed: int = 0,
    config: QAConfig | None = None,
    max_seeds: int | None = None,
    progress: bool = False,
    device: str = "cpu",
) -> dict[str, Any]:
    """Blocking entry point of `searchgym synthesize --method agent`; returns the summary (also written).

    Raises DependencyFailed (naming the cause) after writing the summary when seeds failed on LLM calls
    and the target was not reached: the command then exits non-zero, and its rerun tries them again."""
    report = asyncio.run(
        _synthesize_main(
            corpus,
            engine,
            judge_engine,
            n,
            out,
            concurrency=concurrency,
            seed=seed,
            config=config or QAConfig(),
            max_seeds=max_seeds,
            progress=progress,
            device=device,
        )
    )
    raise_on_failures(report)
    return report
