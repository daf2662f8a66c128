"""Inference engines behind one token-level contract (see types.py)."""

from searchgym.agents.engines.types import (
    FinishReason,
    GenerateRequest,
    GenerateResponse,
    InferenceEngine,
    SamplingParams,
)

__all__ = ["FinishReason", "GenerateRequest", "GenerateResponse", "InferenceEngine", "SamplingParams"]
