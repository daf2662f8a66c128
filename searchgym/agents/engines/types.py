"""Token-in, token-out generation: the contract between episode runners, trainers and engines.

Every engine returns, for each generated token, its id, its log-probability under the distribution
it was sampled from, and the version of the weights that produced it. Log-probabilities follow
SGLang: log softmax(logits / temperature) of the sampled token, before top-k / top-p / min-p
truncation (training samples with those off, so this is then the exact sampling distribution, and
the learner recomputes the same quantity). Temperature below 1e-6 means greedy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

GREEDY_TEMPERATURE = 1e-6


@dataclass(frozen=True)
class SamplingParams:
    """How to sample; every field is sent explicitly to servers (SGLang defaults unset fields)."""

    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: off
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None  # SGLang's sampling_seed: each token drawn from (seed, position), not the engine's stream
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) added to the logits before temperature

    def to_sglang(self) -> dict[str, Any]:
        """SGLang's `sampling_params` object with every field set (seed and logit_bias when used)."""
        out: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "stop": list(self.stop),
            "stop_token_ids": list(self.stop_token_ids),
            "ignore_eos": self.ignore_eos,
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if self.seed is not None:
            out["sampling_seed"] = self.seed
        if self.logit_bias:
            out["logit_bias"] = {str(token): bias for token, bias in self.logit_bias}
        return out


@dataclass(frozen=True)
class GenerateRequest:
    """Continue `input_ids`; `rid` identifies the trajectory (sticky routing, abort, resume)."""

    input_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    rid: str = ""


@dataclass(frozen=True)
class FinishReason:
    """Why generation stopped, in SGLang's shape: stop (eos, a stop id or string), length, or abort."""

    type: str  # "stop" | "length" | "abort"
    matched: int | str | None = None
    message: str | None = None

    def to_sglang(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        if self.type == "stop":
            out["matched"] = self.matched
        elif self.type == "length":
            out["length"] = self.matched
        else:
            out["message"] = self.message or ""
        return out


@dataclass
class GenerateResponse:
    """Generated tokens with their behaviour log-probabilities and weight versions, one each."""

    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason
    prompt_tokens: int = 0
    text: str | None = None
    rid: str = ""

    def __post_init__(self) -> None:
        if not len(self.output_ids) == len(self.logprobs) == len(self.versions):
            raise ValueError("output_ids, logprobs and versions must have one entry per generated token")


@runtime_checkable
class InferenceEngine(Protocol):
    """An engine a runner or trainer can drive: generate, pause around weight updates, report version."""

    @property
    def version(self) -> int: ...

    async def agenerate(self, request: GenerateRequest) -> GenerateResponse: ...

    async def pause(self) -> None: ...

    async def resume(self) -> None: ...

    async def update_weights(self, source: Any, version: int) -> None: ...
