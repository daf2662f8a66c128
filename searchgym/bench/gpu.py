"""The GPU check (never part of CI): on one GPU, a 0.5B-parameter Qwen2-shaped model built from a config,

    - learner: one-rank FSDP2 (bf16 compute, fp32 reduction and master weights) PPO steps on synthetic
      trajectories: trained tokens/s, processed tokens/s and model FLOP utilisation against the GPU's bf16 peak;
    - engine: TorchEngine tokens/s at 1, 8 and 64 concurrent requests (`searchgym bench engine`'s measurement);
    - agreement: the engine's bf16 sampling log-probs against the learner's recomputation of the same tokens.

    python -m searchgym.bench.gpu [--out results/bench_gpu.json] [--steps 3]

Results go to `out` with the GPU's name; docs quote them only from a run on a named GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

# Qwen2.5-0.5B's transformer shape (24 layers, hidden 896, 14 heads, 2 KV heads, MLP 4864) with the tiny
# tokenizer's vocabulary; its parameter count is reported with the results.
SHAPE = {
    "hidden_size": 896,
    "num_layers": 24,
    "num_heads": 14,
    "num_kv_heads": 2,
    "intermediate_size": 4864,
    "vocab_size": 32000,
}
PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense bf16 tensor-core peaks


def _peak(name: str) -> float | None:
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)


def _join_one_rank() -> None:
    """A one-rank process group on loopback, as torchrun would describe it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")


def _trajectories(vocab: int, n: int, length: int, generated: int, seed: int) -> list[Any]:
    from searchgym.agents.trajectory import Trajectory, Turn

    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        traj = Trajectory(task_id="bench", reward=float(i % 2))
        traj.extend(torch.randint(3, vocab, (length - generated,), generator=gen).tolist(), generated=False)
        traj.extend(
            torch.randint(3, vocab, (generated,), generator=gen).tolist(),
            generated=True,
            logprobs=(-torch.rand(generated, generator=gen) * 3).tolist(),
            versions=[0] * generated,
        )
        traj.turns.append(Turn(action="", tool="", observation="", generated_tokens=generated))
        out.append(traj)
    return out


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def bench_learner(
    learner: Any,
    *,
    steps: int,
    device: str,
    group_size: int = 8,
    groups: int = 4,
    length: int = 2048,
    generated: int = 512,
) -> dict[str, Any]:
    """Learner tokens/s and MFU of PPO steps on synthetic trajectories (the first step is a warm-up, not timed)."""
    params = sum(p.numel() for p in learner.model.parameters())
    vocab = learner.model.config.vocab_size
    batches = [
        [_trajectories(vocab, group_size, length, generated, seed=s * 100 + g) for g in range(groups)]
        for s in range(steps + 1)
    ]
    learner.step(batches[0])
    _sync(device)
    t0 = time.perf_counter()
    for batch in batches[1:]:
        learner.step(batch)
    _sync(device)
    seconds = time.perf_counter() - t0
    tokens = steps * groups * group_size * length
    # forward + backward (6 N per token) of the update; the proximal forward (2 N) for the minibatches after the
    # first (the first takes its own pass's log-probs) or all of them for a model with dropout; the recomputed
    # forward of activation checkpointing (2 N) where it is on; attention's quadratic term left out
    m = learner.config.minibatches
    proximal = 2.0 if not learner._prox_from_training_pass else 2.0 * (m - 1) / m
    recompute = 2.0 if learner.config.activation_checkpointing else 0.0
    flops = tokens * params * (6 + proximal + recompute)
    peak = _peak(torch.cuda.get_device_name()) if device == "cuda" else None
    return {
        "parameters": params,
        "steps": steps,
        "tokens_per_step": tokens // steps,
        "seconds": round(seconds, 2),
        "tokens_per_s": round(tokens / seconds, 1),
        "trained_tokens_per_s": round(steps * groups * group_size * generated / seconds, 1),
        "mfu": round(flops / seconds / peak, 4) if peak else None,
    }


def bench_engine(engine: Any, concurrency: tuple[int, ...] = (1, 8, 64), new_tokens: int = 64) -> dict[str, float]:
    """TorchEngine generated tokens/s at each concurrency (`searchgym bench engine`'s measurement)."""
    from searchgym.bench.engine import _engine_run, _prompts

    prompts = _prompts(engine.tokenizer, max(concurrency) * 2)
    return {str(c): asyncio.run(_engine_run(engine, prompts[: max(2 * c, 16)], c, new_tokens)) for c in concurrency}


def logprob_agreement(
    engine: Any, learner: Any, *, device: str, requests: int = 8, new_tokens: int = 128
) -> dict[str, float]:
    """The engine's sampling log-probs vs the learner's recomputation of the same tokens (same weights)."""
    from searchgym.agents.engines.types import GenerateRequest, SamplingParams

    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True)
    prompts = [[5 + i, 17, 42, 99, 123] for i in range(requests)]

    async def run() -> list[Any]:
        return await asyncio.gather(
            *(engine.agenerate(GenerateRequest(p, sampling, f"agree-{i}")) for i, p in enumerate(prompts))
        )

    diffs = []
    for prompt, response in zip(prompts, asyncio.run(run()), strict=True):
        ids = torch.tensor([prompt + list(response.output_ids)], device=device)
        where = torch.zeros(1, ids.shape[1] - 1, dtype=torch.bool, device=device)
        where[0, len(prompt) - 1 :] = True
        with torch.no_grad():
            recomputed = learner.root(ids, torch.ones_like(ids), where)[0].float().cpu()
        diffs.append((recomputed - torch.tensor(response.logprobs)).abs())
    diff = torch.cat(diffs)
    return {"mean_abs_diff": float(diff.mean()), "max_abs_diff": float(diff.max()), "tokens": len(diff)}


def run_gpu_bench(
    out: str | os.PathLike = "results/bench_gpu.json",
    *,
    steps: int = 3,
    device: str = "cuda",
    shape: dict[str, Any] = SHAPE,
    learner_batch: dict[str, int] | None = None,
    concurrency: tuple[int, ...] = (1, 8, 64),
) -> dict[str, Any]:
    """All three measurements (agreement first, while engine and learner hold the same weights); written to `out`.

    `device="cpu"` with a small `shape` and `learner_batch` is a smoke run of the code paths, not a benchmark.
    """
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("searchgym's GPU check needs a CUDA GPU; none is visible")
    from searchgym.agents.engines.torch_engine import TorchEngine
    from searchgym.agents.tiny_model import TinyShape, build_tiny_model
    from searchgym.trainers.algorithm.fsdp import load_sharded_learner
    from searchgym.trainers.config import LearnerConfig

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "qwen2-shape", TinyShape(init_std=0.02, **shape))
        _join_one_rank()
        learner = load_sharded_learner(
            model_dir, LearnerConfig(lr=1e-6, micro_batch_tokens=16_384, activation_checkpointing=True)
        )
        engine = TorchEngine(model_dir, device=device, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
        agreement = logprob_agreement(engine, learner, device=device)
        engine_tps = bench_engine(engine, concurrency)
        asyncio.run(engine.close())
        learner_results = bench_learner(learner, steps=steps, device=device, **(learner_batch or {}))
    results = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "shape": shape,
        "learner_fsdp_1_rank": learner_results,
        "engine_tokens_per_s": engine_tps,
        "engine_vs_learner_logprobs": agreement,
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(results, indent=2) + "\n")
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/bench_gpu.json")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    print(json.dumps(run_gpu_bench(args.out, steps=args.steps), indent=2))


if __name__ == "__main__":
    main()
