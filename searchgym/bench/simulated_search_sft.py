"""The fine-tuned simulator of `searchgym bench simulated-search --sft-demos N` (ZeroSearch's light SFT).

Demonstrations are written from the world (`world.simulator_demos`) on questions disjoint from the measured ones,
and the simulator is fine-tuned on them with searchgym's own SFT, each reply closed by the tokenizer's end token
(so the model learns to stop after the documents). The tuned model is cached under `<work>/<digest>/` (default
runs/bench_simulated_search, git-ignored), the digest naming everything that shapes it: a rerun reuses a finished
one (the SFT writes it atomically) and a changed setting trains a new one.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from searchgym.envs.tasks import Task
from searchgym.world.simulator_demos import demo_tasks, simulator_demos
from searchgym.world.world import World

SFT_KEYS = (
    "simulator",
    "world_size",
    "seed",
    "k",
    "questions",
    "sft_demos",
    "sft_prompt_sets",
    "sft_epochs",
    "sft_lr",
    "sft_batch_tokens",
)


def sft_dir(settings: Any) -> Path:
    """Where the tuned model of these settings lives: in the work folder, named by a digest of its recipe."""
    recipe = json.dumps({key: getattr(settings, key) for key in SFT_KEYS}, sort_keys=True)
    return Path(settings.work) / hashlib.sha256(recipe.encode()).hexdigest()[:12]


def build_demos(settings: Any, world: World, held_out: list[Task]) -> list[dict[str, Any]]:
    """`settings.sft_demos` chats (a useful and a noisy one per question, over the prompt sets), on questions
    disjoint from `held_out` (asserted)."""
    per_question = 2 * len(settings.sft_prompt_sets)
    try:
        tasks = demo_tasks(world, -(-settings.sft_demos // per_question), held_out, settings.seed)
    except ValueError as e:
        raise ValueError(f"sft_demos asks for {settings.sft_demos} demonstrations: {e}") from None
    asked = {t.question for t in held_out} | {t.metadata["entity_id"] for t in held_out}
    assert not asked & ({t.question for t in tasks} | {t.metadata["entity_id"] for t in tasks}), "demos leak"
    demos = [
        demo
        for name in settings.sft_prompt_sets
        for demo in simulator_demos(world, tasks, prompt_set=name, max_docs=settings.k, seed=settings.seed)
    ]
    if len(demos) < settings.sft_demos:
        raise ValueError(
            f"sft_demos asks for {settings.sft_demos} demonstrations; a world of {settings.world_size} pages gives "
            f"{len(demos)} beside the {len(held_out)} measured questions"
        )
    return demos[: settings.sft_demos]


def sft_chats(demos: list[dict[str, Any]], end_token: str) -> tuple[str, list[list[dict[str, str]]]]:
    """(system prompt, chats) as the SFT lays them out: the system prompt apart (one for all), the reply closed."""
    systems = {d["messages"][0]["content"] for d in demos}
    if len(systems) != 1:
        raise ValueError("the demonstrations' prompt sets have different system prompts; fine-tune on one at a time")
    chats = [
        [d["messages"][1], {"role": "assistant", "content": d["messages"][2]["content"] + end_token}] for d in demos
    ]
    return systems.pop(), chats


def tuned_simulator(settings: Any, base_dir: Path, world: World, held_out: list[Task]) -> tuple[Path, dict[str, Any]]:
    """The fine-tuned simulator's directory (trained now, or reused) and what the report says of it."""
    from transformers import AutoTokenizer

    from searchgym.settings import load_settings
    from searchgym.trainers.warm_start.sft import SFTConfig, sft

    where = sft_dir(settings)
    model_dir = where / "model"
    demos = build_demos(settings, world, held_out)
    info: dict[str, Any] = {
        "demos": len(demos),
        "useful_demos": sum(d["kind"] == "useful" for d in demos),
        "demo_questions": len({d["task_id"] for d in demos}),
        "model_dir": str(model_dir),
    }
    if (model_dir / "config.json").exists():
        record = where / "sft.json"  # absent when a run stopped between saving the model and this record
        return model_dir, {**info, "reused": True, **(json.loads(record.read_text()) if record.exists() else {})}
    where.mkdir(parents=True, exist_ok=True)
    (where / "demos.jsonl").write_text("".join(json.dumps(d) + "\n" for d in demos))
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    system, chats = sft_chats(demos, tokenizer.eos_token or "")
    values = {
        "epochs": settings.sft_epochs,
        "lr": settings.sft_lr,
        "batch_tokens": settings.sft_batch_tokens,
        "micro_batch_tokens": min(settings.sft_batch_tokens, settings.sft_micro_batch_tokens),
        "warmup_steps": 2,
        "system_prompt": system,
        "seed": settings.seed,
    }
    began = time.perf_counter()
    history = sft(base_dir, chats, model_dir, load_settings(SFTConfig, values=values), device=settings.device)
    trained = {
        "steps": len(history),
        "first_loss": round(history[0]["loss"], 4),
        "final_loss": round(history[-1]["loss"], 4),
        "final_token_accuracy": round(history[-1]["token_accuracy"], 4),
        "sft_seconds": round(time.perf_counter() - began, 1),
    }
    (where / "sft.json").write_text(json.dumps(trained) + "\n")
    return model_dir, {**info, "reused": False, **trained}
