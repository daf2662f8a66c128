"""One eval's settings as one object: what `searchgym eval` loads (flags, `--config FILE`, dotted overrides)
through the one settings loader, what `run_eval` takes, and what a run directory's `run.json` holds."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchgym.settings import load_settings, setting, settings_dict

# the settings a run's samples depend on: a rerun into the same directory must agree on them (with the model's
# identity); the rest (concurrency, device, judges, ...) may change between a run and its resumption
RESUME_KEYS = (
    "env",
    "env_kwargs",
    "engine",
    "seed",
    "temperature",
    "max_new_tokens",
    "max_context",
    "workflow",
    "context_policy",
)
CONTEXT_POLICIES = ("end", "fold", "summarise")


@dataclass
class EvalSettings:
    """k judged samples per question of env `env` by engine `engine` (a model directory, sglang:... or openai:...)."""

    env: str  # a gym id, e.g. searchgym/HotpotQA-v0
    engine: str
    k: int = setting(4, at_least=1)  # samples per question
    judge: str | None = None  # comma list of em, f1, cover_em, llm (None: the suite's)
    env_kwargs: dict[str, Any] = field(default_factory=dict)  # for gym.make
    max_tasks: int | None = setting(None, at_least=1)  # the first questions only (None: all)
    concurrency: int = setting(32, at_least=1)  # episodes in flight
    temperature: float = setting(1.0, at_least=0)
    max_new_tokens: int = setting(1024, at_least=1)  # per turn
    max_context: int = setting(32_768, at_least=1)  # tokens per episode
    seed: int = 0
    device: str = "cpu"  # of a local model directory
    tokenizer: str | None = None  # of sglang servers (None: the served model's)
    judge_model: str | None = None  # chat model of the llm judge (an engine spec)
    workflow: str | None = None  # a custom Workflow class, module:Class or path/to/file.py:Class
    labels: str | None = None  # human verdicts (CSV or JSONL) each judge is scored against
    context_policy: str = "end"  # past max_context: end the episode, fold old results, or summarise

    def check(self) -> Iterator[tuple[str, str]]:
        """The context policy is one of the built-in ones (agents/context.py)."""
        if self.context_policy not in CONTEXT_POLICIES:
            yield (
                "context_policy",
                f"must be one of {', '.join(map(repr, CONTEXT_POLICIES))}, got {self.context_policy!r}",
            )


def load_eval_settings(
    path: str | os.PathLike | None = None, overrides: Iterable[str] = (), values: Mapping[str, Any] | None = None
) -> EvalSettings:
    """Defaults, the YAML file, `values` (the command's flags), then dotted overrides; checked, naming the key."""
    return load_settings(EvalSettings, path, overrides, values)


def run_record(settings: EvalSettings, model: str | None) -> dict[str, Any]:
    """What `run.json` holds: the settings, as loaded, and the identity of the model weights they sampled."""
    return {**settings_dict(settings), "model": model}


def read_run(path: str | os.PathLike) -> tuple[EvalSettings, str | None]:
    """A run directory's `run.json` back as its settings and model identity (ValueError naming a bad key)."""
    data = json.loads(Path(path).read_text())
    model = data.pop("model", None)
    return load_settings(EvalSettings, values=data, values_source=os.fspath(path)), model
