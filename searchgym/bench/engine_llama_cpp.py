"""llama.cpp as the CPU reference of `searchgym bench engine --llama-cpp GGUF`: the same multi-turn episodes as
the TorchEngine's, played by llama-cpp-python over the model's GGUF as it ships (quantised: SmolLM2's is Q4_1,
where the engine runs the dequantised fp32 weights).

llama-cpp-python's `Llama` holds one sequence, so its episodes run one after another, each turn continuing the
episode's own KV cache: the binding evaluates only what follows the longest prefix it already holds (the
observation and the last sampled token), which is the prefix reuse the engine does across episodes. Sampling is
plain (temperature 1, no top-k, top-p or min-p), seeded per episode, and eos is ignored, so every system generates
the same number of tokens. The threads are torch's, so both run on the same cores.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from searchgym.core.extras import needs


def gguf_path(spec: str) -> Path:
    """A GGUF file, or a packaged model's name (`smollm2-135m-instruct`: the GGUF inside its wheel)."""
    from searchgym.agents.packaged_models import MODELS, packaged_file

    if spec in MODELS:
        return packaged_file(MODELS[spec])
    path = Path(spec)
    if not path.is_file():
        raise FileNotFoundError(f"llama_cpp: no GGUF file at {path} (or a packaged model's name: {', '.join(MODELS)})")
    return path


def llama_cpp_system(
    gguf: Path, longest: int, vocab: int, threads: int
) -> Callable[[list[list[list[int]]], int, int], dict[str, float]]:
    """A system for `bench engine`'s rotation: `play(conversations, turn_tokens, rep)` runs every conversation on one
    `Llama` loaded now, with room for `longest` tokens; a GGUF whose vocabulary is not the engine's (`vocab`) is
    refused, since both must read the same token ids."""
    with needs("bench engine --llama-cpp"):
        import llama_cpp
        from llama_cpp import Llama
    llm = Llama(model_path=str(gguf), n_ctx=longest + 64, n_threads=threads, verbose=False)
    if llm.n_vocab() != vocab:
        raise ValueError(
            f"llama_cpp: {gguf} has a vocabulary of {llm.n_vocab()} tokens and the engine's model {vocab}: give the "
            "GGUF of the benchmarked model"
        )

    def play(conversations: list[list[list[int]]], turn_tokens: int, rep: int) -> dict[str, float]:
        generated = 0
        llama_cpp.llama_perf_context_reset(llm._ctx.ctx)
        t0 = time.perf_counter()
        for i, parts in enumerate(conversations):
            llm.reset()
            llm.set_seed(1000 * rep + i)
            ids = list(parts[0])
            for turn in range(len(parts)):
                out = _sample(llm, ids, turn_tokens)
                generated += len(out)
                ids += out + (parts[turn + 1] if turn + 1 < len(parts) else [])
        seconds = time.perf_counter() - t0
        # llama.cpp's own counters: every token it decoded, less the sampled ones decoded to sample the next (the
        # last of each turn is decoded with the next prompt), is a prompt token it read
        perf = llama_cpp.llama_perf_context(llm._ctx.ctx)
        turns = sum(len(parts) for parts in conversations)
        prompt = perf.n_p_eval + perf.n_eval - turns * (turn_tokens - 1)
        return {
            "tokens_per_s": round(generated / seconds, 1),
            "seconds": round(seconds, 3),
            "prompt_tokens_per_generated_token": round(prompt / generated, 3),
            "generated_tokens": generated,
        }

    return play


def _sample(llm: Any, ids: list[int], n: int) -> list[int]:
    """`n` tokens sampled after `ids` (eos ignored: the generator is simply read `n` times)."""
    out: list[int] = []
    for token in llm.generate(ids, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, temp=1.0, repeat_penalty=1.0):
        out.append(int(token))
        if len(out) == n:
            break
    return out
