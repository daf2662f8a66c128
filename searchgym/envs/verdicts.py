"""What a judge returns (`Verdict`) and the protocol judges fit, below every judge (their chat models fit
`searchgym.core.llm_calls.ChatModel`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Verdict:
    """A judge's call on one answer; `error` marks a judge failure, which is not the same as a wrong answer."""

    score: float
    correct: bool
    judge: str
    detail: dict = field(default_factory=dict)
    error: str | None = None

    def __post_init__(self) -> None:
        """Reject scores outside [0, 1] (NaN included) so a buggy judge cannot emit an invalid reward."""
        if not 0.0 <= self.score <= 1.0:
            raise ValueError(f"Verdict score must be in [0, 1], got {self.score!r} from judge {self.judge!r}")

    def to_dict(self) -> dict:
        """Plain-dict form for logs and JSON."""
        return asdict(self)


@runtime_checkable
class Judge(Protocol):
    """What SearchEnv and the evaluation harness call to score a final answer."""

    name: str

    async def ajudge(
        self, prediction: str, references: Sequence[str], *, question: str = "", format_errors: Sequence[str] = ()
    ) -> Verdict: ...
