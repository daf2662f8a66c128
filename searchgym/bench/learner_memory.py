"""`searchgym bench learner`: the learner's peak memory and step time against trajectory length, chunked loss head
against the whole-logits one it replaced, on a Qwen2 model with Qwen's real vocabulary (151,936) and a tiny hidden
size, so the loss head's [tokens, vocab] term is what grows.

Each (length, head) is one PPO step of `Learner` on one group of two trajectories of that length (one per
micro-batch), measured in a fresh process: peak memory above what was held before the step (CUDA: the allocator's
peak; CPU: the process's peak RSS), and the median time of the timed steps after a warm-up step. The two heads run
interleaved at each length (the order alternating). A head whose step does not fit is recorded as out of memory, or
not run when its estimate exceeds `--max-gib`. The agreement row compares the two heads' log-probs and gradients on
the same step in fp32.

    searchgym bench learner [--lengths 1024,2048,...,32768] [--device cuda] [--out results/bench_learner_memory.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchgym.bench.provenance import peak_rss_bytes
from searchgym.core.settings_flags import add_settings_flags, settings_values
from searchgym.settings import load_settings, setting

if TYPE_CHECKING:  # torch is imported where it runs, so `searchgym --help` needs no torch
    import torch

VOCAB = 151_936  # Qwen2 / Qwen2.5's vocabulary
SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
HEADS = ("chunked", "whole_logits")


def _model(device: str, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB, max_position_embeddings=65_536, tie_word_embeddings=False, initializer_range=0.02, **SHAPE
    )
    return Qwen2ForCausalLM(config).to(device=device, dtype=dtype)


def whole_logits_learner(model: torch.nn.Module, config: Any) -> Any:
    """A Learner whose loss head is the one the chunked head replaced: logits [N, vocab] made whole, then fp32
    log-softmax (the baseline of this bench, and of the test that the two train alike)."""
    from searchgym.trainers.algorithm.learner import Learner, next_token_logits
    from searchgym.trainers.algorithm.ppo import entropy_from_logits, token_logprobs

    class WholeLogitsLearner(Learner):
        def _trained_logprobs(
            self,
            ids: torch.Tensor,
            attention: torch.Tensor | None,
            where: torch.Tensor,
            positions: torch.Tensor | None = None,
        ) -> tuple[torch.Tensor, torch.Tensor]:
            logits = next_token_logits(self.model, ids, attention, where, positions)
            labels = ids[:, 1:][where]
            return (
                token_logprobs(logits, labels, self.config.temperature),
                entropy_from_logits(logits.detach(), self.config.temperature),
            )

    return WholeLogitsLearner(model, config)


def _learner(head: str, model: torch.nn.Module, length: int, chunk_tokens: int) -> Any:
    from searchgym.trainers.algorithm.learner import Learner
    from searchgym.trainers.config import LearnerConfig

    config = LearnerConfig(lr=1e-5, micro_batch_tokens=length, logit_chunk_tokens=chunk_tokens)
    return whole_logits_learner(model, config) if head == "whole_logits" else Learner(model, config)


def _group(length: int, trained_share: float, seed: int) -> list[Any]:
    """Two trajectories of `length` tokens (rewards 0 and 1): a prompt, then turns alternating generated tokens and
    observations, `trained_share` of the tokens generated."""
    import torch

    from searchgym.agents.trajectory import Trajectory, Turn

    gen = torch.Generator().manual_seed(seed)
    group = []
    for reward in (0.0, 1.0):
        traj = Trajectory(task_id="bench", reward=reward)
        turn = 256
        generated = max(1, int(turn * trained_share))
        prompt = length % turn or turn
        prompt = prompt if prompt < length else max(1, length // 4)  # a trajectory of one turn still generates
        traj.extend(torch.randint(3, VOCAB, (prompt,), generator=gen).tolist(), generated=False)
        while len(traj.input_ids) < length:
            n = min(generated, length - len(traj.input_ids))
            traj.extend(
                torch.randint(3, VOCAB, (n,), generator=gen).tolist(),
                generated=True,
                logprobs=(-torch.rand(n, generator=gen) * 3).tolist(),
                versions=[0] * n,
            )
            traj.turns.append(Turn(action="", tool="", observation="", generated_tokens=n))
            rest = min(turn - n, length - len(traj.input_ids))
            if rest > 0:
                traj.extend(torch.randint(3, VOCAB, (rest,), generator=gen).tolist(), generated=False)
        group.append(traj)
    return group


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure_one(
    head: str, length: int, *, device: str, dtype: str, trained_share: float, steps: int, chunk_tokens: int
) -> dict[str, Any]:
    """One (head, length) in this process: peak bytes above the state before the first step, step seconds."""
    import torch

    torch_dtype = getattr(torch, dtype)
    learner = _learner(head, _model(device, torch_dtype), length, chunk_tokens)
    batches = [[_group(length, trained_share, seed)] for seed in range(steps + 1)]
    trained = sum(sum(t.loss_mask) for t in batches[0][0])
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = _rss_bytes()
    seconds = []
    try:
        for i, batch in enumerate(batches):
            t0 = time.perf_counter()
            learner.step(batch)
            if device == "cuda":
                torch.cuda.synchronize()
            if i:  # the first step is a warm-up (and allocates the optimizer state)
                seconds.append(time.perf_counter() - t0)
    except torch.OutOfMemoryError:
        return {"head": head, "length": length, "oom": True, "trained_tokens_per_trajectory": trained // 2}
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = peak_rss_bytes() - before
    return {
        "head": head,
        "length": length,
        "oom": False,
        "peak_bytes": int(peak),
        "peak_gib": round(peak / 2**30, 3),
        "step_s_median": round(statistics.median(seconds), 4),
        "step_s": [round(s, 4) for s in seconds],
        "trained_tokens_per_trajectory": trained // 2,
    }


def agreement(
    *, device: str, length: int = 2048, trained_share: float = 0.25, chunk_tokens: int = 256
) -> dict[str, float]:
    """Both heads' log-probs and LM-head / embedding gradients on the same batch, in fp32 (no optimizer step)."""
    import torch

    results = {}
    for head in HEADS:
        learner = _learner(head, _model(device, torch.float32), length, chunk_tokens)
        samples, _ = learner._samples([_group(length, trained_share, seed=0)])
        logp, _, _ = learner._logprobs(learner._layout(samples[:1]))
        logp.sum().backward()
        results[head] = (logp.detach().cpu(), [p.grad.detach().cpu() for p in learner.model.parameters()])
    (a, ga), (b, gb) = results["chunked"], results["whole_logits"]
    return {
        "length": length,
        "logprob_max_abs_diff": float((a - b).abs().max()),
        "grad_max_abs_diff": max(float((x - y).abs().max()) for x, y in zip(ga, gb, strict=True)),
        "grad_max_abs": max(float(y.abs().max()) for y in gb),
    }


def estimate_gib(head: str, length: int, trained_share: float, chunk_tokens: int, dtype_bytes: int) -> float:
    """A rough upper estimate of the loss head's transient memory, to skip runs that cannot fit `--max-gib`."""
    positions = length * trained_share if head == "whole_logits" else min(chunk_tokens, length)
    return positions * VOCAB * (dtype_bytes + 12) / 2**30 + 0.5


@dataclass
class LearnerBenchSettings:
    """`searchgym bench learner` (and `python -m searchgym.bench.learner_memory`): lengths, device, heads' settings."""

    lengths: str = setting("1024,2048,4096,8192,16384,32768", help="trajectory lengths, comma-separated")
    device: str = setting("cpu", help="cpu or cuda")
    dtype: str | None = setting(None, help="model dtype (default: bfloat16 on cuda, float32 on cpu)")
    trained_share: float = setting(0.25, help="share of a trajectory's tokens generated")
    steps: int = setting(2, at_least=1, help="timed steps after the warm-up step")
    chunk_tokens: int = setting(512, at_least=1, help="learner.logit_chunk_tokens")
    max_gib: float = setting(16.0, help="skip runs whose loss head alone is estimated above it")
    out: Path = setting(Path("results/bench_learner_memory.json"), help="the results JSON")
    agreement_length: int = setting(2048, at_least=2, help="trajectory length of the fp32 agreement row")

    def lengths_list(self) -> tuple[int, ...]:
        """`lengths` as integers (ValueError naming --lengths for anything else)."""
        try:
            lengths = tuple(int(x) for x in str(self.lengths).split(",") if x.strip())
        except ValueError:
            lengths = ()
        if not lengths or min(lengths) < 2:
            raise ValueError(f"--lengths must be integers >= 2, got {self.lengths!r}")
        return lengths


def run_learner_memory_bench(settings: LearnerBenchSettings) -> dict[str, Any]:
    """Every length with both heads (interleaved, each in its own process), plus the fp32 agreement row."""
    import torch

    if not 0 < settings.trained_share <= 1:
        raise ValueError(f"--trained-share must be in (0, 1], got {settings.trained_share}")
    lengths = settings.lengths_list()

    if settings.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda needs a CUDA GPU; none is visible")
    dtype = settings.dtype or ("bfloat16" if settings.device == "cuda" else "float32")
    rows = []
    for i, length in enumerate(lengths):
        for head in HEADS if i % 2 == 0 else HEADS[::-1]:
            if (
                estimate_gib(
                    head,
                    length,
                    settings.trained_share,
                    settings.chunk_tokens,
                    torch.finfo(getattr(torch, dtype)).bits // 8,
                )
                > settings.max_gib
            ):
                rows.append(
                    {"head": head, "length": length, "skipped": f"estimated over --max-gib {settings.max_gib:g}"}
                )
                continue
            rows.append(
                _in_subprocess(
                    head,
                    length,
                    device=settings.device,
                    dtype=dtype,
                    trained_share=settings.trained_share,
                    steps=settings.steps,
                    chunk_tokens=settings.chunk_tokens,
                )
            )
            print(json.dumps(rows[-1]), flush=True)
    result = {
        "device": torch.cuda.get_device_name() if settings.device == "cuda" else f"cpu ({os.cpu_count()} cores)",
        "vocab_size": VOCAB,
        "shape": SHAPE,
        "dtype": dtype,
        "trained_share": settings.trained_share,
        "logit_chunk_tokens": settings.chunk_tokens,
        "timed_steps": settings.steps,
        "rows": rows,
        "ratios": _ratios(rows),
        "agreement_fp32": agreement(device=settings.device, length=settings.agreement_length),
    }
    Path(settings.out).parent.mkdir(parents=True, exist_ok=True)
    Path(settings.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


def _ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per length: whole-logits peak / chunked peak and step time ratio, where both ran."""
    by = {(r["head"], r["length"]): r for r in rows if "peak_bytes" in r}
    out = []
    for length in sorted({r["length"] for r in rows}):
        a, b = by.get(("chunked", length)), by.get(("whole_logits", length))
        if a and b:
            out.append(
                {
                    "length": length,
                    "memory_whole_over_chunked": round(b["peak_bytes"] / max(a["peak_bytes"], 1), 2),
                    "time_whole_over_chunked": round(b["step_s_median"] / a["step_s_median"], 3),
                }
            )
    return out


def _in_subprocess(head: str, length: int, **kwargs: Any) -> dict[str, Any]:
    args = [sys.executable, "-m", "searchgym.bench.learner_memory", "--one", head, str(length)]
    for key, value in kwargs.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        oom = "out of memory" in done.stderr.lower() or done.returncode in (-9, 137)
        return {"head": head, "length": length, "oom": oom, "error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def learner_bench_command(settings: LearnerBenchSettings) -> None:
    print(json.dumps(run_learner_memory_bench(settings)["ratios"], indent=2))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_settings_flags(parser, LearnerBenchSettings)
    parser.add_argument("--one", nargs=2, metavar=("HEAD", "LENGTH"), help="measure one (head, length) and print it")
    args = parser.parse_args(argv)
    settings = load_settings(LearnerBenchSettings, values=settings_values(args, LearnerBenchSettings))
    if args.one:
        print(
            json.dumps(
                measure_one(
                    args.one[0],
                    int(args.one[1]),
                    device=settings.device,
                    dtype=settings.dtype or ("bfloat16" if settings.device == "cuda" else "float32"),
                    trained_share=settings.trained_share,
                    steps=settings.steps,
                    chunk_tokens=settings.chunk_tokens,
                )
            )
        )
    else:
        learner_bench_command(settings)


if __name__ == "__main__":
    main()
