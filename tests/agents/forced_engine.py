"""An engine wrapper that makes a real TorchEngine write scripted text, and records everything the engine returned.

A random tiny model does not call tools for 64 turns on its own. `ForcedEngine` asks a script what the turn
should say, then has the wrapped engine generate it one token at a time with a large logit bias on the wanted
token: every id, log-prob and version still comes from the engine's own sampling step. `calls` keeps each
inner request and response, the record the tests hold trajectories against, token for token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from searchgym.agents.engines.types import FinishReason, GenerateRequest, GenerateResponse, InferenceEngine

FORCE_BIAS = 100.0


@dataclass
class Call:
    """One request the inner engine answered, and its answer."""

    rid: str
    input_ids: list[int]
    response: GenerateResponse


class ForcedEngine:
    """Delegates to `inner`, writing `script(rid, input_ids)`'s text (plus eos when it asks for one)."""

    def __init__(self, inner: InferenceEngine, tokenizer, script: Callable[[str, list[int]], tuple[str, bool]]):
        self.inner, self.tokenizer, self.script = inner, tokenizer, script
        self.calls: list[Call] = []
        self.max_context = getattr(inner, "max_context", None)

    @property
    def version(self) -> int:
        return self.inner.version

    async def agenerate(self, request: GenerateRequest) -> GenerateResponse:
        text, eos = self.script(request.rid, request.input_ids)
        wanted = self.tokenizer.encode(text, add_special_tokens=False) + ([self.tokenizer.eos_token_id] if eos else [])
        wanted = wanted[: request.sampling.max_new_tokens]
        ids, logprobs, versions = [], [], []
        for token in wanted:
            sampling = dataclasses.replace(
                request.sampling, max_new_tokens=1, stop=(), logit_bias=((token, FORCE_BIAS),)
            )
            inner_request = GenerateRequest(list(request.input_ids) + ids, sampling, request.rid)
            response = await self.inner.agenerate(inner_request)
            self.calls.append(Call(request.rid, inner_request.input_ids, response))
            assert response.output_ids == [token], (response.output_ids, token)
            ids += response.output_ids
            logprobs += response.logprobs
            versions += response.versions
        if len(wanted) == request.sampling.max_new_tokens and not eos:
            finish = FinishReason("length", len(wanted))
        else:
            finish = FinishReason("stop", wanted[-1] if wanted else None)
        return GenerateResponse(ids, logprobs, versions, finish, prompt_tokens=len(request.input_ids), rid=request.rid)

    async def pause(self) -> None:
        await self.inner.pause()

    async def resume(self) -> None:
        await self.inner.resume()

    async def update_weights(self, source, version: int) -> None:
        await self.inner.update_weights(source, version)
