"""An inference engine that writes a script's text instead of sampling: the model side of tests and benchmarks that
exercise everything around the model (the recording proxy, agent programs, MCP) deterministically and fast.

`script(request)` returns the text of the reply; its token ids are the tokenizer's encoding of it (plus eos), with
log-prob 0 and the engine's weight version, and `calls` keeps every request and response: the engine's own record
(with `keep_prompts=False` the requests' token ids are dropped, so a benchmark's memory is not the record's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from searchgym.agents.engines.types import FinishReason, GenerateRequest, GenerateResponse


class ScriptedEngine:
    """An InferenceEngine whose replies are `script(request)`'s text, cut at the request's `max_new_tokens`."""

    def __init__(
        self,
        tokenizer: Any,
        script: Callable[[GenerateRequest], str],
        max_context: int = 1 << 20,
        *,
        keep_prompts: bool = True,
    ) -> None:
        self.tokenizer, self.script, self.max_context, self.keep_prompts = tokenizer, script, max_context, keep_prompts
        self.calls: list[tuple[GenerateRequest, GenerateResponse]] = []
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    async def agenerate(self, request: GenerateRequest) -> GenerateResponse:
        """The script's reply to `request`, as token ids (eos appended when it fits; else a length finish)."""
        ids = self.tokenizer.encode(self.script(request), add_special_tokens=False) + [self.tokenizer.eos_token_id]
        limit = request.sampling.max_new_tokens
        finish = FinishReason("stop", ids[-1]) if len(ids) <= limit else FinishReason("length", limit)
        ids = ids[:limit]
        response = GenerateResponse(
            ids, [0.0] * len(ids), [self._version] * len(ids), finish, len(request.input_ids), rid=request.rid
        )
        self.calls.append((request if self.keep_prompts else dataclasses.replace(request, input_ids=[]), response))
        return response

    async def pause(self) -> None:
        return None

    async def resume(self) -> None:
        return None

    async def update_weights(self, source: Any, version: int) -> None:
        self._version = version
