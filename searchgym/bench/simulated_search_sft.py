"""The fine-tuned simulator of `searchgym bench simulated-search --sft-demos N` (ZeroSearch's light SFT).

Demonstrations are written from the world (`world.simulator_demos`) on questions disjoint from the measured ones,
and the simulator is fine-tuned on them with searchgym's own SFT, each reply closed by the tokenizer's end token
(so the model learns to stop after the documents). The tuned model is cached under `<work>/<digest>/` (default
runs/bench_simulated_search, git-ignored), the digest naming everything that shapes it: a rerun reuses a finished
one (the SFT writes it atomically) and a changed setting trains a new one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from searchgym.bench.tuned_model import FineTune, recipe_dir, tuned_model
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
    return recipe_dir(settings.work, {key: getattr(settings, key) for key in SFT_KEYS})


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

    demos = build_demos(settings, world, held_out)
    info: dict[str, Any] = {
        "demos": len(demos),
        "useful_demos": sum(d["kind"] == "useful" for d in demos),
        "demo_questions": len({d["task_id"] for d in demos}),
    }
    system, chats = sft_chats(demos, AutoTokenizer.from_pretrained(base_dir).eos_token or "")
    tune = FineTune(
        settings.sft_epochs,
        settings.sft_lr,
        settings.sft_batch_tokens,
        settings.sft_micro_batch_tokens,
        seed=settings.seed,
        device=settings.device,
    )
    where = sft_dir(settings)
    model_dir, trained = tuned_model(where, base_dir, chats, system, tune, demos)
    return model_dir, {**info, "model_dir": str(model_dir), **trained}
