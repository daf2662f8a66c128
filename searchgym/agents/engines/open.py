"""One factory for every engine spec a command takes: a model dir, `sglang:HOST:PORT[,...]` or `openai:URL[:model]`.

`open_engine` returns an `EngineHandle`: the token-level engine and its tokenizer where the backend gives
tokens (TorchEngine in process, SGLang servers), and always a chat model (the OpenAI endpoint, or
`EngineChat` over the token engine, in process: no self-HTTP). Training, evaluation and synthesis open
engines only here; whoever opens one keeps the handle (weight updates, closing) and builds workflows on it
(`agents/workflow.build_workflow`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from searchgym.agents.engines.types import InferenceEngine
from searchgym.core.extras import needs
from searchgym.core.llm_calls import ChatModel

SPEC_HELP = "a model directory, 'sglang:HOST:PORT[,HOST:PORT...]' or 'openai:http://host/v1[:model]'"


@dataclass
class EngineHandle:
    """An opened engine: `engine`/`tokenizer` for token-level use (None for chat endpoints), `chat` always."""

    spec: str
    endpoint: ChatModel | None = None  # a chat-only endpoint (OpenAI-compatible)
    engine: InferenceEngine | None = None
    tokenizer: Any = None
    _adapter: ChatModel | None = field(default=None, repr=False)

    @property
    def chat(self) -> ChatModel:
        """The chat model: the endpoint itself, or in-process chat over the token engine (made on first use)."""
        if self.endpoint is not None:
            return self.endpoint
        if self._adapter is None:
            from searchgym.agents.chat import EngineChat

            assert self.engine is not None  # no endpoint: a token engine
            self._adapter = EngineChat(self.engine, self.tokenizer)
        return self._adapter

    async def aclose(self) -> None:
        """Close what was opened (the chat adapter of a token engine shares the engine: closed once)."""
        for obj in (self.engine, self.endpoint):
            if obj is None:
                continue
            result = obj.close() if hasattr(obj, "close") else None
            if asyncio.iscoroutine(result):
                await result


def engine_kind(spec: str) -> str:
    """ "openai", "sglang" or "local" (a model directory); a clear error for anything else."""
    if spec.startswith("openai:"):
        return "openai"
    if spec.startswith("sglang:"):
        return "sglang"
    if Path(spec).is_dir():
        return "local"
    raise ValueError(f"engine {spec!r}: expected {SPEC_HELP}")


async def open_engine(
    spec: str,
    *,
    device: str = "cpu",
    seed: int = 0,
    version: int = 0,
    tokenizer: str | None = None,
    start_timeout: float = 600,
    memory_budget_bytes: int | None | Literal["auto"] = "auto",
) -> EngineHandle:
    """Open the engine `spec` names (SGLang servers are waited for, up to `start_timeout` seconds); a local model's
    TorchEngine bounds its batch by `memory_budget_bytes` (`EngineLimits`)."""
    kind = engine_kind(spec)
    if kind == "openai":
        from searchgym.agents.engines.openai_engine import OpenAIEngine, parse_openai_spec

        return EngineHandle(spec, endpoint=OpenAIEngine(*parse_openai_spec(spec)))
    if kind == "sglang":
        from searchgym.agents.engines.sglang_engine import SGLangEngine

        addresses = [a for a in spec.removeprefix("sglang:").split(",") if a]
        engine = await SGLangEngine(addresses).start(timeout=start_timeout)
        try:
            tok = load_tokenizer(tokenizer or await served_tokenizer_path(engine))
        except BaseException:
            await engine.close()
            raise
        return EngineHandle(spec, engine=engine, tokenizer=tok)
    from searchgym.agents.engines.torch_engine import EngineLimits, TorchEngine

    limits = EngineLimits(memory_budget_bytes=memory_budget_bytes)
    local = TorchEngine(spec, device=device, seed=seed, version=version, limits=limits)
    tok = load_tokenizer(tokenizer) if tokenizer else local.tokenizer
    return EngineHandle(spec, engine=local, tokenizer=tok)


@contextlib.asynccontextmanager
async def opened_engine(spec: str, **kwargs: Any) -> AsyncIterator[EngineHandle]:
    """`open_engine(spec, **kwargs)` for the body of an `async with`, closed when it ends (also on an error)."""
    handle = await open_engine(spec, **kwargs)
    try:
        yield handle
    finally:
        await handle.aclose()


def load_tokenizer(path: str | Path) -> Any:
    """A Hugging Face tokenizer from a local directory (never a hub download)."""
    with needs("a Hugging Face tokenizer"):
        from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


async def served_tokenizer_path(engine: Any) -> str:
    """The tokenizer path the first SGLang server reports (`/model_info`, or the older `/get_model_info`)."""
    import aiohttp

    async with aiohttp.ClientSession() as http:
        for route in ("/model_info", "/get_model_info"):
            async with http.get(engine.urls[0] + route) as resp:
                if resp.status == 200:
                    info = await resp.json()
                    return info.get("tokenizer_path") or info["model_path"]
    raise RuntimeError(f"{engine.urls[0]} answers neither /model_info nor /get_model_info: is it an SGLang server?")
