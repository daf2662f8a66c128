"""The run's rollout engine, opened from its rollout settings: an in-process TorchEngine or clients of SGLang servers.

Both launchers open it here (the local one in its process, the Ray one in each rollout actor), before the rollout
side is built on it (build.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from searchgym.agents.engines.open import EngineHandle, open_engine
from searchgym.trainers.config import RolloutConfig


async def open_rollout_engine(
    rollout: RolloutConfig,
    model_dir: Path | str,
    *,
    device: str,
    seed: int,
    version: int = 0,
    addresses: Sequence[str] = (),
    start_timeout: float = 1800,
    memory_budget_bytes: int | None | Literal["auto"] = "auto",
) -> EngineHandle:
    """The run's rollout engine: an in-process TorchEngine on `model_dir`, or SGLang servers (the caller closes it).

    With SGLang, `model_dir` gives the tokenizer and `start_timeout` bounds the wait for the servers; a TorchEngine
    bounds its batch by `memory_budget_bytes` (the local launcher's: what its plan leaves after the learner).
    """
    if rollout.engine == "sglang":
        if not addresses:
            raise ValueError("rollout.engine=sglang needs SGLang servers (rollout.sglang_addresses, host:port)")
        spec, tokenizer = "sglang:" + ",".join(addresses), str(model_dir)
    else:
        spec, tokenizer = str(model_dir), None
    return await open_engine(
        spec,
        device=device,
        seed=seed,
        version=version,
        tokenizer=tokenizer,
        start_timeout=start_timeout,
        memory_budget_bytes=memory_budget_bytes,
    )
