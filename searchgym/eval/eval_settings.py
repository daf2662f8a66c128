"""One eval's settings as one object: what `searchgym eval` loads (flags, `--config FILE`, dotted overrides)
through the one settings loader, what `run_eval` takes, and what a run directory's `run.json` holds."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
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

    env: str = setting(help="a gym id, e.g. searchgym/HotpotQA-v0 or searchgym/SyntheticQA-v0")
    engine: str = setting(
        help="a model directory (TorchEngine), sglang:HOST:PORT[,HOST:PORT] or openai:http://host/v1[:model]"
    )
    k: int = setting(4, at_least=1, help="samples per question")
    judge: str | None = setting(None, help="comma list of em, f1, cover_em, llm (default: the suite's)")
    env_kwargs: dict[str, Any] = setting(default_factory=dict, help="JSON kwargs for gym.make")
    max_tasks: int | None = setting(None, at_least=1, help="the first questions only (default: all)")
    concurrency: int = setting(32, at_least=1, help="episodes in flight")
    temperature: float = setting(1.0, at_least=0)
    max_new_tokens: int = setting(1024, at_least=1, help="tokens per turn")
    max_context: int = setting(32_768, at_least=1, help="tokens per episode")
    seed: int = setting(0, help="the sampling seed")
    device: str = setting("cpu", help="of a local model directory")
    tokenizer: str | None = setting(None, help="tokenizer of sglang servers (default: the served model's)")
    judge_model: str | None = setting(
        None, help="chat model of the llm judge: openai:http://host/v1[:model], a model directory or sglang:..."
    )
    workflow: str | None = setting(
        None, help="a custom Workflow class that plays the episodes: module:Class or path/to/file.py:Class"
    )
    labels: str | None = setting(
        None, help="human verdicts (CSV or JSONL: question id, prediction, verdict) each judge is scored against"
    )
    context_policy: str = setting(
        "end",
        choices=CONTEXT_POLICIES,
        help="past --max-context: end the episode, fold old results, or have the model summarise",
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
