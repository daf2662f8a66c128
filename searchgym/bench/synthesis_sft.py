"""The fine-tuned synthesizer of `searchgym bench synthesis --sft-demos N`, and the KB's check of what it accepts.

N demonstration seed pages, the N after the measured ones in the bench's seeded order, are run through the agent
with the KB writing every reply (`synthesis/kb_demos.py`); each recorded call is a chat, its reply closed by the
tokenizer's end token (so the model learns to stop after the JSON). The agent sends no system message, so the chats
are laid out under the system message the model's template writes by itself: the model learns the exact tokens it
reads in the run. The tuned model, its demonstrations and its pool live in `<work>/<digest>/` (`bench/tuned_model`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from searchgym.bench.tuned_model import FineTune, recipe_dir, tuned_model
from searchgym.envs.answer_text import holds_answer
from searchgym.world.world import World

# everything that shapes the tuned model; WRITER names the demonstration writer's version
SFT_KEYS = (
    "model",
    "world_size",
    "seed",
    "seeds",
    "max_turns",
    "sft_demos",
    "sft_epochs",
    "sft_lr",
    "sft_batch_tokens",
)
WRITER = 2  # 2: judge replies set the two answers side by side before the verdict
DEMO_SOLVES = 2


def pool_name(settings: Any) -> str:
    """The pool's file name in its work folder: one per difficulty judge, so a run never resumes another's."""
    return "pool.jsonl" if settings.difficulty_judge == "llm" else f"pool-difficulty-{settings.difficulty_judge}.jsonl"


def sft_dir(settings: Any) -> Path:
    """Where the tuned synthesizer of these settings lives (with its demonstrations and pool)."""
    return recipe_dir(settings.work, {"writer": WRITER, **{key: getattr(settings, key) for key in SFT_KEYS}})


def demo_chats(records: list[dict[str, Any]], end_token: str) -> list[list[dict[str, str]]]:
    """The recorded calls as SFT chats: the agent's user message, then the KB's reply closed by `end_token`."""
    chats = []
    for record in records:
        *asked, reply = record["messages"]
        chats.append([*asked, {"role": "assistant", "content": reply["content"] + end_token}])
    return chats


def tuned_synthesizer(
    settings: Any, base_dir: Path, index: Any, urls: list[str]
) -> tuple[Path, dict[str, Any], set[str]]:
    """The synthesizer fine-tuned on the KB's demonstrations over the `settings.sft_demos` seed pages after the
    measured ones in `urls` (trained now, or reused), what the report says of it, and the demonstrations' questions."""
    from transformers import AutoTokenizer

    from searchgym.agents.formats import template_default_system
    from searchgym.synthesis.kb_demos import demo_seed_pages, synthesis_demos
    from searchgym.synthesis.qa_agent import QAConfig

    demo_urls = demo_seed_pages(urls, settings.seeds, settings.sft_demos)
    if len(demo_urls) < settings.sft_demos:
        raise ValueError(
            f"sft_demos asks for {settings.sft_demos} demonstration pages; a world of {settings.world_size} pages has "
            f"{len(demo_urls)} beside the {settings.seeds} measured seeds"
        )
    world = World(settings.world_size, settings.seed)
    # two solver attempts per seed: the k calls repeat one form, and two give as many graded right as wrong answers
    qa = QAConfig(max_turns=settings.max_turns, k=DEMO_SOLVES)
    demos = synthesis_demos(world, index, index, demo_urls, seed=settings.seed, config=qa)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    tune = FineTune(
        settings.sft_epochs, settings.sft_lr, settings.sft_batch_tokens, settings.sft_micro_batch_tokens, settings.seed
    )
    chats = demo_chats(demos.records, tokenizer.eos_token or "")
    system = template_default_system(tokenizer)
    model_dir, trained = tuned_model(sft_dir(settings), base_dir, chats, system, tune, demos.records)
    info = {
        "demo_pages": len(demo_urls),
        "demos": len(demos.records),
        "demos_by_step": dict(Counter(r["step"] for r in demos.records)),
        "demo_seeds": demos.outcomes,
        "system_message": system,
        "model_dir": str(model_dir),
    }
    return model_dir, {**info, **trained}, demos.questions


def tuned_run(settings: Any, base_dir: Path, index_dir: Path) -> tuple[str, Path, dict[str, Any], set[str]]:
    """(engine, pool, report's "sft", demonstration questions) of a run with the tuned synthesizer."""
    from searchgym.envs.tools.indexes import open_index
    from searchgym.synthesis.run import seed_pages

    index = open_index(index_dir)
    model_dir, info, questions = tuned_synthesizer(settings, base_dir, index, seed_pages(index, settings.seed))
    return str(model_dir), sft_dir(settings) / pool_name(settings), info, questions


def kb_check(tasks: list[Any], world: World, demo_questions: set[str]) -> dict[str, Any]:
    """What the world's KB says of accepted tasks: the answer is stated on the seed page, the question does not give
    it away, and the question is not one of the demonstrations' (copied rather than written)."""
    by_url = {e.url: e for e in world} if tasks else {}  # one pass over the world, not one per task
    rows = []
    for task in tasks:
        seed = by_url.get(task.metadata.get("seed_page", ""))
        page = world.render_text(seed) if seed is not None else ""
        rows.append(
            {
                "answer_on_seed_page": holds_answer(page, task.answers),
                "answer_in_question": holds_answer(task.question, task.answers),
                "a_demonstration_question": task.question in demo_questions,
            }
        )
    return {key: sum(row[key] for row in rows) for key in rows[0]} | {"tasks": len(rows)} if rows else {"tasks": 0}
