"""Evaluate a policy on an environment's tasks: k sampled episodes per task, Avg@k and Pass@k.

`evaluate_model` plays every task of an env `k` times through a TorchEngine (concurrently; the engine
batches the requests) and reduces the episodes to the paper's numbers: Avg@k is the mean score over
all samples, Pass@k the unbiased estimator 1 - C(n - c, k) / C(n, k) from n samples with c correct.
"""
from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from searchgym.agents.engines.types import InferenceEngine, SamplingParams
from searchgym.agents.runner import run_episode
from searchgym.agents.trajectory import Trajectory
from searchgym.envs.search_env import SearchEnv


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k from n samples of which c are correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class Sample:
    """One evaluated episode: its score, whether the judge called it correct, and what it did."""

    task_id: str
    sample: int
    reward: float
    correct: bool
    turns: int
    searches: int
    accesses: int
    generated_tokens: int
    answered: bool
    verdicts: dict[str, dict[str, Any]] = field(default_factory=dict)  # judge name -> Verdict.to_dict()

    @classmethod
    def of(cls, traj: Trajectory, sample: int, verdicts: dict[str, dict[str, Any]] | None = None) -> "Sample":
        counts = traj.counts
        return cls(traj.task_id, sample, traj.reward, bool((traj.verdict or {}).get("correct")), len(traj.turns),
                   counts.get("search", 0), counts.get("access", 0), traj.generated_tokens, traj.terminated,
                   dict(verdicts or {}))


def summarize(samples: Sequence[Sample], k: int) -> dict[str, float]:
    """Avg@k of the reward and of correctness, Pass@k, and behaviour means over all samples."""
    if not samples:
        raise ValueError("no samples to summarize")
    by_task: dict[str, list[Sample]] = {}
    for s in samples:
        by_task.setdefault(s.task_id, []).append(s)
    n = len(samples)
    return {
        "tasks": float(len(by_task)),
        "samples": float(n),
        f"avg@{k}/reward": sum(s.reward for s in samples) / n,
        f"avg@{k}/correct": sum(s.correct for s in samples) / n,
        f"pass@{k}/correct": float(np.mean([pass_at_k(len(g), sum(s.correct for s in g), min(k, len(g)))
                                            for g in by_task.values()])),
        "answered": sum(s.answered for s in samples) / n,
        "turns": sum(s.turns for s in samples) / n,
        "searches": sum(s.searches for s in samples) / n,
        "accesses": sum(s.accesses for s in samples) / n,
        "generated_tokens": sum(s.generated_tokens for s in samples) / n,
        **judge_metrics(by_task, k),
    }


def judge_metrics(by_task: dict[str, list[Sample]], k: int) -> dict[str, float]:
    """Per judge: Avg@k of the score, Avg@k and Pass@k of correctness, and the number of judge failures.

    A failed verdict (`error` set: the LLM judge gave no parsable answer or its call failed) is left out
    of that judge's averages and counted in `failures/{judge}`, never scored as a wrong answer.
    Pass@k per question uses its n valid samples (k capped at n)."""
    names = list(dict.fromkeys(name for group in by_task.values() for s in group for name in s.verdicts))
    out: dict[str, float] = {}
    for name in names:
        valid = {t: [s.verdicts[name] for s in g if name in s.verdicts and not s.verdicts[name].get("error")]
                 for t, g in by_task.items()}
        scores = [v["score"] for vs in valid.values() for v in vs]
        failures = sum(1 for g in by_task.values() for s in g if s.verdicts.get(name, {}).get("error"))
        passes = [pass_at_k(len(vs), sum(bool(v["correct"]) for v in vs), min(k, len(vs)))
                  for vs in valid.values() if vs]
        out[f"avg@{k}/{name}"] = float(np.mean(scores)) if scores else float("nan")
        out[f"avg@{k}/{name}_correct"] = float(np.mean([bool(v["correct"]) for vs in valid.values() for v in vs])) if scores else float("nan")
        out[f"pass@{k}/{name}"] = float(np.mean(passes)) if passes else float("nan")
        out[f"failures/{name}"] = float(failures)
    return out


async def evaluate_engine(engine: InferenceEngine, tokenizer: Any, make_env: Callable[[], SearchEnv],
                          task_ids: Sequence[str], *, k: int = 1, sampling: SamplingParams = SamplingParams(),
                          max_context: int = 4096, tool_format: str = "tags", concurrency: int = 64, seed: int = 0,
                          progress: bool = False) -> list[Sample]:
    """Play each task k times (seeded per (task, sample)), at most `concurrency` episodes at once."""
    gate = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(task_ids) * k, desc="evaluating", disable=not progress)

    async def play(index: int, task_id: str, sample: int) -> Sample:
        async with gate:
            env = make_env()
            try:
                traj = await run_episode(env, engine, tokenizer, tool_format=tool_format, sampling=sampling,
                                         max_context=max_context, options={"task_id": task_id},
                                         seed=int(np.random.SeedSequence([seed, index, sample]).generate_state(1)[0]),
                                         rid=f"eval-{index}-{sample}")
            finally:
                env.close()
            bar.update()
            return Sample.of(traj, sample)

    try:
        return list(await asyncio.gather(*[play(i, t, s) for i, t in enumerate(task_ids) for s in range(k)]))
    finally:
        bar.close()


def evaluate_model(model_dir: str | os.PathLike, env_id: str, env_kwargs: dict[str, Any], *, k: int = 1,
                   temperature: float = 1.0, max_new_tokens: int = 64, max_tasks: int | None = None,
                   device: str = "cpu", seed: int = 0, progress: bool = False) -> tuple[dict[str, float], list[Sample]]:
    """Evaluate a Hugging Face model directory on an env's tasks; returns (summary, samples)."""
    import gymnasium as gym

    import searchgym  # noqa: F401  (registers the env ids)
    from searchgym.agents.engines.torch_engine import TorchEngine

    def make_env() -> SearchEnv:
        return gym.make(env_id, **env_kwargs).unwrapped

    probe = make_env()
    task_ids = [t.id for t in probe.tasks][:max_tasks]
    probe.close()

    async def run() -> list[Sample]:
        engine = TorchEngine(model_dir, device=device, seed=seed)
        try:
            return await evaluate_engine(engine, engine.tokenizer, make_env, task_ids, k=k, seed=seed,
                                         sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature),
                                         progress=progress)
        finally:
            await engine.close()

    samples = asyncio.run(run())
    return summarize(samples, k), samples
