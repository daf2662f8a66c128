"""`searchgym/SimulatedQA-v0`: a task pool searched through an LLM-simulated search engine (ZeroSearch).

The env is a SearchEnv whose search and pages are `envs/tools/simulated_search.SimulatedSearch`: for each query
the chat model named by `engine` writes the documents. It lives here, above envs/, because it opens an engine
from a spec:

- `openai:http://host/v1[:model]` and `sglang:HOST:PORT` (SGLang serves the OpenAI API at /v1): a client per env;
- a model directory: an in-process TorchEngine, shared by the envs of this process (one model in memory),
  to be used from one event loop (the trainer's or the evaluator's);
- or a ChatModel object.

`noise` is the share of unhelpful documents, or `noise_schedule={"start", "end", "steps", "base"}` ZeroSearch's
curriculum over the trained version the trainer reports. `cache=FILE.sqlite` records every written result
(`cache_mode="replay_only"` serves them and never calls the model): the web's record/replay file.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from searchgym.core.llm_calls import ChatModel
from searchgym.envs.search_env import SearchEnv
from searchgym.envs.tasks import load_pool
from searchgym.envs.tools.simulated_search import NoiseSchedule, SimulatedSearch, SimulatorOptions
from searchgym.envs.tools.web_cache import WebCache


def open_chat(spec: str, *, device: str = "cpu", seed: int = 0) -> ChatModel:
    """A chat model for `spec`, opened without an event loop (an env's constructor has none)."""
    from searchgym.agents.engines.open import engine_kind

    kind = engine_kind(spec)
    if kind == "sglang":
        host_port = spec.removeprefix("sglang:").split(",")[0]
        spec = f"openai:http://{host_port}/v1"
        kind = "openai"
    if kind == "openai":
        from searchgym.agents.engines.openai_engine import OpenAIEngine, parse_openai_spec

        return OpenAIEngine(*parse_openai_spec(spec))
    return _local_chat(os.path.abspath(spec), device, seed)


@functools.cache
def _local_chat(model_dir: str, device: str, seed: int) -> ChatModel:
    from searchgym.agents.chat import EngineChat
    from searchgym.agents.engines.torch_engine import TorchEngine

    engine = TorchEngine(model_dir, device=device, seed=seed)
    return EngineChat(engine, engine.tokenizer)


def make_simulated_qa(
    tasks: Any,
    *,
    engine: str | ChatModel,
    noise: float = 0.0,
    noise_schedule: dict[str, Any] | None = None,
    simulator_seed: int = 0,
    cache: str | os.PathLike | None = None,
    cache_mode: str = "read_write",
    prompts: str | os.PathLike | None = None,
    style: str | None = None,
    simulator_max_tokens: int = 768,
    simulator_device: str = "cpu",
    task_split: str | None = None,
    hops: int | list[int] | None = None,
    **env_kwargs: Any,
) -> SearchEnv:
    """SearchEnv over `tasks` (a task file, a `datasets` directory or a TaskPool) with the simulated engine."""
    if noise_schedule is not None and noise:
        raise ValueError("give noise (a fixed share) or noise_schedule, not both")
    schedule: float | NoiseSchedule = NoiseSchedule(**noise_schedule) if noise_schedule is not None else noise
    chat = open_chat(engine, device=simulator_device, seed=simulator_seed) if isinstance(engine, str) else engine
    web_cache = WebCache(cache, cache_mode) if cache is not None else None
    options = SimulatorOptions(
        noise=schedule, seed=simulator_seed, prompts=prompts, style=style, max_tokens=simulator_max_tokens
    )
    backend = SimulatedSearch(chat, options, cache=web_cache)
    pool = load_pool(tasks, split=task_split, hops=hops)
    return SearchEnv(pool, backend, backend, **env_kwargs)
