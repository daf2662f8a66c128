"""`searchgym bench engine`: TorchEngine's generation speed on a model (default: a fresh tiny one), two kinds of
traffic; `--model smollm2-135m-instruct --episodes 1,8,32` measures the real model at three concurrencies in one run.

- multiturn (default): agent episodes. N concurrent episodes of T turns; each turn generates M tokens
  (seeded sampling, eos ignored, so every system does the same work) and appends an observation of
  60-200 tokens of world page text, and the next turn sends the whole conversation again, as the
  episode runners do. Measured for (a) the engine with prefix reuse, (b) the same engine with reuse off
  and (c) one batched Hugging Face `model.generate` call per turn over the same conversations (the
  prompts (a) sent), in interleaved repetitions (the order rotates) in one process; reported: prompt
  tokens processed per generated token and generated tokens/s, medians and their ratios. With `--llama-cpp GGUF`
  llama.cpp plays the same episodes too, the CPU reference (bench/engine_llama_cpp.py).
- single: 1, 8 and 64 concurrent one-turn requests against a loop of per-request `model.generate`.

Results go to one JSON file; a run of one kind keeps the other kind's figures already there.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from searchgym.agents.engines.torch_engine import EngineLimits, TorchEngine
from searchgym.agents.engines.types import GenerateRequest, SamplingParams
from searchgym.bench.engine_llama_cpp import gguf_path, llama_cpp_system
from searchgym.envs.prompts import instructions_template
from searchgym.settings import setting
from searchgym.world.world import World

TRAFFIC = ("multiturn", "single", "both")


@dataclass
class EngineBenchSettings:
    """`searchgym bench engine`: TorchEngine's tokens/s on one model, multi-turn episodes or one-turn requests."""

    model: str | None = setting(None, help="a model directory or a packaged model's name (default: a fresh tiny model)")
    out: Path = setting(Path("results/bench_engine.json"), help="the results JSON (other traffic's figures are kept)")
    device: str = setting("cpu", help="cpu or cuda")
    traffic: str = setting(
        "multiturn",
        choices=TRAFFIC,
        help="multiturn: concurrent agent episodes; single: 1/8/64 one-turn requests (default multiturn)",
    )
    episodes: list[int] = setting(
        default_factory=lambda: [8], help="multiturn: concurrent episodes, or a comma list measured in turn (1,8,32)"
    )
    turns: int = setting(8, at_least=1, help="multiturn: turns per episode")
    group_size: int = setting(
        1, at_least=1, help="multiturn: episodes per question, as a GRPO group (their first prompts are the same)"
    )
    instructions: str = setting(
        "none",
        choices=("none", "brief", "full"),
        help="multiturn: the env's opening instructions before each question (full: ASearcher's, as the RL presets)",
    )
    turn_tokens: int = setting(32, at_least=1, help="multiturn: tokens generated per turn")
    repeats: int = setting(5, at_least=1, help="multiturn: interleaved repetitions of every system")
    threads: int | None = setting(None, at_least=1, help="torch intra-op threads (default: torch's own)")
    concurrency: list[int] = setting(default_factory=lambda: [1, 8, 64], help="single: concurrent requests")
    new_tokens: int = setting(64, at_least=1, help="single: tokens per request")
    baseline_requests: int = setting(8, at_least=1, help="single: requests of the model.generate loop")
    llama_cpp: str | None = setting(
        None,
        help="multiturn: also play the episodes on llama.cpp over this GGUF, or a packaged model's (its wheel's "
        "GGUF): the CPU reference (llama-cpp-python, which searchgym[models] installs)",
    )


def run_engine_bench(settings: EngineBenchSettings) -> dict[str, Any]:
    """Measure the chosen traffic on one model; merge the results into `out` and return them all.

    `threads` sets torch's intra-op threads (None: torch's default); on a shared machine one thread avoids
    stalls where a step waits for a descheduled worker thread.
    """
    if settings.model is None:
        raise ValueError("run_engine_bench needs settings.model (a model directory)")
    if settings.traffic not in TRAFFIC:
        raise ValueError(f"traffic must be one of {TRAFFIC}, not {settings.traffic!r}")
    counts = (settings.episodes,) if isinstance(settings.episodes, int) else tuple(settings.episodes)
    if not counts or min(*counts, settings.turns, settings.turn_tokens, settings.repeats) < 1:
        raise ValueError("episodes, turns, turn_tokens and repeats must be >= 1")
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    engine = TorchEngine(settings.model, device=settings.device)
    path = Path(settings.out)
    results: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    setup = {
        "model": str(settings.model),
        "device": settings.device,
        "parameters": sum(p.numel() for p in engine.model.parameters()),
        "machine": {
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "platform": platform.platform(),
            "torch_threads": torch.get_num_threads(),
        },
    }
    if settings.traffic in ("single", "both"):  # the single-turn figures and their setup stay at the top level
        results.update(setup)
        results.update(
            _single_turn(engine, tuple(settings.concurrency), settings.new_tokens, settings.baseline_requests)
        )
    if settings.traffic in ("multiturn", "both"):  # each concurrency in turn; `multiturn` keeps the last, the sweep all
        sweep = {str(n): _multi_turn(engine, n, settings) for n in counts}
        results["multiturn"] = {**setup, **sweep[str(counts[-1])]}
        if len(counts) > 1:
            results["multiturn_sweep"] = {
                n: {key: run[key] for key in run if key.startswith(("speedup", "median", "final_context"))}
                for n, run in sweep.items()
            }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    return results


# ---- multi-turn agent traffic ---------------------------------------------------------------------------------------


def _multi_turn(engine: TorchEngine, episodes: int, settings: EngineBenchSettings) -> dict[str, Any]:
    """Interleaved repetitions of (a) reuse with sharing, (b) reuse without sharing, (c) reuse off, (d) batched
    generate; medians and ratios."""
    turns, turn_tokens, repeats = settings.turns, settings.turn_tokens, settings.repeats
    no_reuse = TorchEngine(
        engine.model, engine.tokenizer, device=str(engine.device), limits=EngineLimits(prefix_cache_bytes=0)
    )
    no_share = TorchEngine(
        engine.model, engine.tokenizer, device=str(engine.device), limits=EngineLimits(share_prefixes=False)
    )
    conversations = _conversations(engine.tokenizer, episodes, turns, settings.group_size, settings.instructions)
    systems = {
        "engine_prefix_reuse": lambda rep: asyncio.run(_episodes(engine, conversations, turn_tokens, rep)),
        "engine_reuse_no_sharing": lambda rep: asyncio.run(_episodes(no_share, conversations, turn_tokens, rep)),
        "engine_no_reuse": lambda rep: asyncio.run(_episodes(no_reuse, conversations, turn_tokens, rep)),
        "batched_generate": lambda rep: _batched_generate(engine, conversations, turn_tokens, rep),
    }
    warm, warm_rep = [c[:2] for c in conversations], repeats + 1  # warm-up: each system on two turns, own rids
    if settings.llama_cpp is not None:
        longest = max(sum(map(len, c)) + turns * turn_tokens for c in conversations)
        gguf = gguf_path(settings.llama_cpp)
        llama = llama_cpp_system(gguf, longest, len(engine.tokenizer), torch.get_num_threads())
        systems["llama_cpp"] = lambda rep: llama(conversations, turn_tokens, rep)
        llama(warm, turn_tokens, warm_rep)
    load_before = os.getloadavg()
    asyncio.run(_episodes(engine, warm, turn_tokens, warm_rep))
    asyncio.run(_episodes(no_reuse, warm, turn_tokens, warm_rep))
    asyncio.run(_episodes(no_share, warm, turn_tokens, warm_rep))
    _batched_generate(engine, warm, turn_tokens, warm_rep)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in systems}
    names = list(systems)
    for rep in range(repeats):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:  # rotate who goes first
            runs[name].append(systems[name](rep))
    load_after = os.getloadavg()
    medians = {
        name: {key: round(statistics.median(r[key] for r in rs), 2) for key in rs[0]} for name, rs in runs.items()
    }
    tps = {name: m["tokens_per_s"] for name, m in medians.items()}
    contexts = [len(c[0]) + sum(len(o) for o in c[1:]) + turns * turn_tokens for c in conversations]
    given = sum(len(part) for c in conversations for part in c)  # prompt and observation tokens: read once at least
    return {
        "episodes": episodes,
        "turns": turns,
        "tokens_per_turn": turn_tokens,
        "repeats": repeats,
        "observation_tokens": [
            min(len(o) for c in conversations for o in c[1:]),
            max(len(o) for c in conversations for o in c[1:]),
        ],
        "final_context_tokens": [min(contexts), max(contexts)],
        "given_tokens_per_generated_token": round(given / (episodes * turns * turn_tokens), 3),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "median": medians,
        "runs": runs,
        "group_size": settings.group_size,
        "instructions": settings.instructions,
        "first_prompt_tokens": [min(len(c[0]) for c in conversations), max(len(c[0]) for c in conversations)],
        "speedup_reuse_vs_no_reuse": round(tps["engine_prefix_reuse"] / tps["engine_no_reuse"], 2),
        "speedup_sharing_vs_no_sharing": round(tps["engine_prefix_reuse"] / tps["engine_reuse_no_sharing"], 2),
        "speedup_reuse_vs_batched_generate": round(tps["engine_prefix_reuse"] / tps["batched_generate"], 2),
        "speedup_no_reuse_vs_batched_generate": round(tps["engine_no_reuse"] / tps["batched_generate"], 2),
        **(
            {"speedup_reuse_vs_llama_cpp": round(tps["engine_prefix_reuse"] / tps["llama_cpp"], 2)}
            if "llama_cpp" in tps
            else {}
        ),
    }


def _conversations(
    tokenizer: Any, episodes: int, turns: int, group_size: int = 1, instructions: str = "none"
) -> list[list[list[int]]]:
    """Per episode: the first prompt (a question about a world entity, the same within a group of `group_size`,
    after the env's `instructions` unless "none"), then one observation per later turn."""
    world, rng = World(1000, 0), random.Random(0)
    opening = "{question}" if instructions == "none" else instructions_template("tags", instructions)
    out: list[list[list[int]]] = []
    for i in range(episodes):
        if i % group_size == 0:
            entity = world.entity(rng.randrange(1000))
        question = f"Answer with the help of the search tool: what do you know about {entity.name}?"
        first = tokenizer.apply_chat_template(
            [{"role": "user", "content": opening.format(question=question, max_turns=turns)}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        observations = []
        for _ in range(turns - 1):
            page = tokenizer.encode(world.render_text(world.entity(rng.randrange(1000))))
            size = rng.randint(60, 200)
            observations.append(
                tokenizer.encode("\n<result>\n")
                + (page * (1 + size // max(len(page), 1)))[:size]
                + tokenizer.encode("\n</result>\n")
            )
        out.append([first, *observations])
    return out


async def _episodes(
    engine: TorchEngine, conversations: list[list[list[int]]], turn_tokens: int, rep: int
) -> dict[str, float]:
    """Every episode at once, turn after turn; prompt tokens the engine prefilled and generated tokens/s."""
    before = engine.stats()

    async def episode(i: int, parts: list[list[int]]) -> None:
        ids = list(parts[0])
        sampling = SamplingParams(max_new_tokens=turn_tokens, temperature=1.0, ignore_eos=True, seed=1000 * rep + i)
        for turn in range(len(parts)):
            response = await engine.agenerate(GenerateRequest(list(ids), sampling, rid=f"bench-{rep}-{i}"))
            ids += response.output_ids + (parts[turn + 1] if turn + 1 < len(parts) else [])

    t0 = time.perf_counter()
    await asyncio.gather(*(episode(i, parts) for i, parts in enumerate(conversations)))
    seconds = time.perf_counter() - t0
    after = engine.stats()
    engine.prefix_cache.discard()
    generated = after["generated_tokens"] - before["generated_tokens"]
    return {
        "tokens_per_s": round(generated / seconds, 1),
        "seconds": round(seconds, 3),
        "prompt_tokens_per_generated_token": round((after["prefill_tokens"] - before["prefill_tokens"]) / generated, 3),
        "generated_tokens": generated,
    }


def _batched_generate(
    engine: TorchEngine, conversations: list[list[list[int]]], turn_tokens: int, rep: int
) -> dict[str, float]:
    """Per turn, one left-padded `model.generate` over every episode's conversation so far (sampling, KV cache
    within the call, none between turns)."""
    model, pad = engine.model, engine.tokenizer.pad_token_id
    histories = [list(parts[0]) for parts in conversations]
    torch.manual_seed(rep)
    generated = prompt_tokens = 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        for turn in range(len(conversations[0])):
            width = max(map(len, histories))
            ids = torch.tensor([[pad] * (width - len(h)) + h for h in histories], device=model.device)
            mask = torch.tensor([[0] * (width - len(h)) + [1] * len(h) for h in histories], device=model.device)
            y = model.generate(
                ids,
                attention_mask=mask,
                do_sample=True,
                max_new_tokens=turn_tokens,
                min_new_tokens=turn_tokens,
                pad_token_id=pad,
            )
            prompt_tokens += sum(map(len, histories))
            generated += (y.shape[1] - width) * len(histories)
            for h, row, parts in zip(histories, y[:, width:].tolist(), conversations, strict=True):
                h += row + (parts[turn + 1] if turn + 1 < len(parts) else [])
    seconds = time.perf_counter() - t0
    return {
        "tokens_per_s": round(generated / seconds, 1),
        "seconds": round(seconds, 3),
        "prompt_tokens_per_generated_token": round(prompt_tokens / generated, 3),
        "generated_tokens": generated,
    }


# ---- single-turn requests -------------------------------------------------------------------------------------------


def _single_turn(
    engine: TorchEngine, concurrency: tuple[int, ...], new_tokens: int, baseline_requests: int
) -> dict[str, Any]:
    prompts = _prompts(engine.tokenizer, max(concurrency) * 2)
    results: dict[str, Any] = {"new_tokens": new_tokens}
    results["generate_loop_tokens_per_s"] = _generate_loop(engine, prompts[:baseline_requests], new_tokens)
    results["engine_tokens_per_s"] = {
        str(c): asyncio.run(_engine_run(engine, prompts[: max(2 * c, 16)], c, new_tokens)) for c in concurrency
    }
    results["speedup_vs_generate_loop"] = {
        c: round(tps / results["generate_loop_tokens_per_s"], 2) for c, tps in results["engine_tokens_per_s"].items()
    }
    return results


def _prompts(tokenizer: Any, n: int) -> list[list[int]]:
    """Chat prompts of varied length built from synthetic-world pages."""
    world, rng = World(1000, 0), random.Random(0)
    texts = [world.render_text(world.entity(rng.randrange(1000)))[: rng.randint(100, 600)] for _ in range(n)]
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for t in texts
    ]


async def _engine_run(engine: TorchEngine, prompts: list[list[int]], concurrency: int, new_tokens: int) -> float:
    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True)
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int, ids: list[int]) -> int:
        async with gate:  # rids unique per run: a one-turn request never finds a cached prefix
            request = GenerateRequest(list(ids), sampling, f"single-{concurrency}-{i}")
            return len((await engine.agenerate(request)).output_ids)

    await one(-1, prompts[0])  # warm-up
    t0 = time.perf_counter()
    tokens = sum(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))
    return round(tokens / (time.perf_counter() - t0), 1)


def _generate_loop(engine: TorchEngine, prompts: list[list[int]], new_tokens: int) -> float:
    """Requests one after another through Hugging Face's own `generate` (sampling, KV cache)."""
    model, tokens = engine.model, 0
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids], device=model.device)
            y = model.generate(
                x,
                attention_mask=torch.ones_like(x),
                do_sample=True,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=engine.tokenizer.pad_token_id,
            )
            tokens += y.shape[1] - x.shape[1]
    return round(tokens / (time.perf_counter() - t0), 1)


def engine_bench_command(settings: EngineBenchSettings) -> None:
    """The bench on `settings.model` (a packaged model's name resolved), or on a fresh tiny model."""
    import dataclasses
    import tempfile

    from searchgym.agents.tiny_model import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        if settings.model:
            from searchgym.pipeline.stages import resolve_model

            model = resolve_model(settings.model)
        else:
            model = build_tiny_model(Path(tmp) / "tiny")
        print(json.dumps(run_engine_bench(dataclasses.replace(settings, model=str(model))), indent=2))
