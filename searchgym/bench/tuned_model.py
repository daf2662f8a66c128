"""A model a benchmark fine-tunes on demonstrations, kept by a digest of its recipe so a rerun reuses it.

The simulated-search and synthesis benches fine-tune the packaged SmolLM2 on demonstrations written from the world
(each with searchgym's own SFT). The tuned model is a 0.5 GB directory, so it lives in the bench's `--work` folder
(git-ignored), never beside the results file: `<work>/<digest>/model`, the digest naming everything that shapes it.
The SFT saves the model atomically; a rerun that finds it reuses it, and a changed recipe trains a new one.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class FineTune:
    """How a bench fine-tunes: passes, learning rate, tokens per step and per forward/backward pass."""

    epochs: float
    lr: float
    batch_tokens: int
    micro_batch_tokens: int
    seed: int = 0
    device: str = "cpu"


def recipe_dir(work: str | Path, recipe: dict[str, Any]) -> Path:
    """Where the model of this recipe lives: `<work>/<first 12 hex of the recipe's sha256>`."""
    text = json.dumps(recipe, sort_keys=True)
    return Path(work) / hashlib.sha256(text.encode()).hexdigest()[:12]


def tuned_model(
    where: Path,
    base_dir: Path,
    chats: list[list[dict[str, str]]],
    system: str | None,
    tune: FineTune,
    demos: list[dict[str, Any]],
) -> tuple[Path, dict[str, Any]]:
    """`where/model`, fine-tuned now on `chats` under the system message `system` (or reused when it exists), and
    what a report says of it: reused or not, steps, losses, seconds. `demos` are kept beside it as demos.jsonl."""
    from searchgym.settings import load_settings
    from searchgym.trainers.warm_start.sft import SFTConfig, sft

    model_dir = where / "model"
    if (model_dir / "config.json").exists():
        record = where / "sft.json"  # absent when a run stopped between saving the model and this record
        return model_dir, {"reused": True, **(json.loads(record.read_text()) if record.exists() else {})}
    where.mkdir(parents=True, exist_ok=True)
    (where / "demos.jsonl").write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in demos))
    values = {
        "epochs": tune.epochs,
        "lr": tune.lr,
        "batch_tokens": tune.batch_tokens,
        "micro_batch_tokens": min(tune.batch_tokens, tune.micro_batch_tokens),
        "warmup_steps": 2,
        "system_prompt": system,
        "seed": tune.seed,
    }
    began = time.perf_counter()
    history = sft(base_dir, chats, model_dir, load_settings(SFTConfig, values=values), device=tune.device)
    trained = {
        "steps": len(history),
        "first_loss": round(history[0]["loss"], 4),
        "final_loss": round(history[-1]["loss"], 4),
        "final_token_accuracy": round(history[-1]["token_accuracy"], 4),
        "sft_seconds": round(time.perf_counter() - began, 1),
    }
    (where / "sft.json").write_text(json.dumps(trained) + "\n")
    return model_dir, {"reused": False, **trained}
