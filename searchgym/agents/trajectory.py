"""Trajectory: one episode as token sequences (one per context segment), plus the per-turn record a human or a
logger reads.

An episode that fits the model's context is one token sequence. A longer one is played in linked *segments*
(see `searchgym.agents.context`): each is exactly what the engine was given and produced before the workflow
rebuilt the context. The trajectory's own `input_ids` / `loss_mask` / `logprobs` / `versions` hold the last
(live) segment, and `segments` the closed ones before it, so code that reads the token arrays of an episode that
never overflowed keeps working unchanged; `token_segments()` lists them all.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Turn:
    """One agent turn: what it wrote, which tool ran, what came back, and what it cost."""

    action: str
    tool: str
    observation: str
    reward: float = 0.0
    generated_tokens: int = 0
    observation_tokens: int = 0
    finish_reason: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    generate_seconds: float = 0.0
    env_seconds: float = 0.0


@dataclass
class Segment:
    """One closed context segment: the token sequence the engine was given and produced, and how it ended.

    `run_turns[k]` is the index (in the episode's `turns`) of the turn whose advantage the k-th run of
    `loss_mask == 1` gets: a turn's own action, or a summary the policy wrote (trained with the advantage of the
    turn it serves).
    """

    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    prompt_length: int = 0
    run_turns: list[int] = field(default_factory=list)
    end: str = ""  # why the workflow closed it: "fold", "summarise", "fold (empty summary)", ...

    @property
    def generated_tokens(self) -> int:
        return sum(self.loss_mask)


def mask_runs(loss_mask: list[int]) -> int:
    """How many contiguous runs of 1 the mask has (one per engine call whose output was kept)."""
    return sum(1 for i, m in enumerate(loss_mask) if m and (i == 0 or not loss_mask[i - 1]))


@dataclass
class Trajectory:
    """Token-level episode for RL: `loss_mask` is 1 exactly on policy-generated tokens.

    `logprobs` are the behaviour policy's (0.0 where the mask is 0) and `versions` the weight version
    of each generated token (-1 elsewhere). Chat-only engines produce empty token arrays and fill
    `messages` alone.
    """

    task_id: str
    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    prompt_length: int = 0
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    stop_reason: str = ""
    verdict: dict[str, Any] | None = None
    prediction: str | None = None  # the answer the env judged (None when the episode ended without one)
    turns: list[Turn] = field(default_factory=list)
    messages: list[dict[str, str]] = field(default_factory=list)
    group: int | None = None  # the data position of the rollout group it was played in (set by trainers)
    segments: list[Segment] = field(default_factory=list)  # closed context segments before the live one
    run_turns: list[int] = field(default_factory=list)  # the live segment's runs -> turn index (empty: one per turn)
    context_events: list[dict[str, Any]] = field(default_factory=list)  # each rebuild: policy, sizes, fallbacks
    proxy_calls: list[dict[str, Any]] = field(default_factory=list)  # an agent program's calls (serve/proxy.py)

    def start_segment(self, prompt_ids: list[int], end: str) -> None:
        """Close the live token sequence as a Segment (ended by `end`) and start a new one from `prompt_ids`."""
        self.segments.append(
            Segment(
                self.input_ids,
                self.loss_mask,
                self.logprobs,
                self.versions,
                self.prompt_length,
                self.live_run_turns(),
                end,
            )
        )
        self.input_ids, self.loss_mask, self.logprobs, self.versions, self.run_turns = [], [], [], [], []
        self.extend(prompt_ids, generated=False)
        self.prompt_length = len(prompt_ids)

    def live_run_turns(self) -> list[int]:
        """The live segment's run -> turn map; an episode recorded without one has one run per generating turn."""
        if self.run_turns or self.segments:
            return list(self.run_turns)
        return [i for i, turn in enumerate(self.turns) if turn.generated_tokens > 0]

    def token_segments(self) -> list[Segment]:
        """Every segment in order, the live one last: what the learner trains, one sample each."""
        live = Segment(
            self.input_ids,
            self.loss_mask,
            self.logprobs,
            self.versions,
            self.prompt_length,
            self.live_run_turns(),
            self.stop_reason,
        )
        return [*self.segments, live]

    def extend(
        self, ids: list[int], *, generated: bool, logprobs: list[float] | None = None, versions: list[int] | None = None
    ) -> None:
        """Append tokens: generated ones with their logprobs and versions, environment ones masked out."""
        if generated and (logprobs is None or versions is None):
            raise ValueError("generated tokens need their logprobs and versions")
        self.input_ids.extend(ids)
        self.loss_mask.extend([1 if generated else 0] * len(ids))
        self.logprobs.extend(logprobs if generated and logprobs is not None else [0.0] * len(ids))
        self.versions.extend(versions if generated and versions is not None else [-1] * len(ids))

    @property
    def generated_tokens(self) -> int:
        """Policy tokens of the whole episode, every segment's."""
        return sum(self.loss_mask) + sum(segment.generated_tokens for segment in self.segments)

    @property
    def num_segments(self) -> int:
        return len(self.segments) + 1

    @property
    def counts(self) -> dict[str, int]:
        """How many times each tool ran in the episode."""
        out: dict[str, int] = {}
        for turn in self.turns:
            out[turn.tool] = out.get(turn.tool, 0) + 1
        return out

    @property
    def tool_cost(self) -> dict[str, float]:
        """What the episode's tool calls cost, summed per unit (the env's `info["cost"]`; envs/tools/costs.py)."""
        out: dict[str, float] = {}
        for turn in self.turns:
            for unit, amount in (turn.info.get("cost") or {}).items():
                out[unit] = out.get(unit, 0) + amount
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Trajectory:
        row = dict(row)
        row["turns"] = [Turn(**t) for t in row.get("turns", [])]
        row["segments"] = [Segment(**s) for s in row.get("segments", [])]
        return cls(**row)
