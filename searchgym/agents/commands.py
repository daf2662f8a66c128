"""`searchgym demos` and `searchgym model get`: their settings (the commands' flags are these fields) and what
each runs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchgym.settings import setting


@dataclass
class DemosSettings:
    """Demonstrations of the tools' use (a scripted agent's solved episodes of `env`) written as chat JSONL."""

    out: str = setting(help="the chat JSONL to write")
    env: str = setting("searchgym/SyntheticQA-v0", help="a registered env id")
    env_kwargs: dict[str, Any] = field(
        default_factory=lambda: {"split": "train"},
        metadata={"help": 'JSON kwargs for gym.make (default: {"split": "train"})'},
    )
    read_pages: bool = setting(False, help="always open the page (default: answer from results)")
    think: bool = setting(False, help="write a one-line thought before each call")


def write_demos(settings: DemosSettings) -> None:
    import asyncio

    from searchgym.agents.scripted import demonstrations
    from searchgym.envs.factory import make_unwrapped

    env = make_unwrapped(settings.env, **settings.env_kwargs)
    chats = asyncio.run(demonstrations(env, skim=not settings.read_pages, think=settings.think))
    Path(settings.out).parent.mkdir(parents=True, exist_ok=True)
    with open(settings.out, "w") as f:
        for chat in chats:
            f.write(json.dumps({"messages": chat}) + "\n")
    print(f"{len(chats)} demonstrations of {len(env.tasks)} tasks written to {settings.out}")


@dataclass
class ModelGetSettings:
    """A packaged model converted into the cache (or a .gguf file into `out`); prints the model directory."""

    name: str = setting(help="a packaged model's name (smollm2-135m-instruct) or a path to a .gguf file")
    out: Path | None = setting(None, help="where to write a .gguf file's conversion (required for one)")
    cache: Path | None = setting(None, help="cache root (default $SEARCHGYM_CACHE or ~/.cache/searchgym)")
    force: bool = setting(False, help="convert again even when a finished conversion exists")


def get_model_command(settings: ModelGetSettings) -> None:
    from searchgym.agents.packaged_models import MODELS, convert_gguf, get_model

    if settings.name in MODELS:
        if settings.out is not None:
            raise ValueError("--out is for a .gguf file; a packaged model goes to the cache (--cache moves it)")
        print(get_model(settings.name, cache_dir=settings.cache, force=settings.force))
        return
    if not settings.name.endswith(".gguf"):
        known = ", ".join(sorted(MODELS))
        raise ValueError(f"{settings.name!r} is neither a packaged model ({known}) nor a .gguf file")
    if settings.out is None:
        raise ValueError(f"converting {settings.name} needs --out DIR (where the model dir goes)")
    print(convert_gguf(settings.name, settings.out, force=settings.force))
