"""The workflow `bench trainer` trains with: each turn generates exactly the tokens the episode's plan drew.

A trained search agent writes a few dozen tokens on most turns and hundreds on some; the fresh tiny
policy would stop at a random end-of-turn token instead. `PlannedWorkflow` is the ordinary
token-in/token-out `TokenWorkflow` (exact ids, behaviour logprobs, versions) whose turn `i` asks the
engine for exactly `plan.turn_tokens[i]` tokens (no stop strings, end-of-sequence ignored), where
the plan is the one the env drew at reset (`SlowSearchEnv.plan`). So the generated tokens per
episode follow the workload's distribution in every trainer mode, and the env's turn budget ends
the episode after `plan.turns` turns. Configs name it `searchgym.bench.plan_workflow:PlannedWorkflow`.

Its reward is shaped and depends on the generated tokens only: the share of the episode's turns
whose first token starts a word (a space and letters) rather than a symbol or a byte fragment,
`word_start_share`. The fresh tiny policy earns about 0.4 with a wide spread between episodes, so
group-normalised advantages have a signal at every step, and the choice it rewards is made in one
fixed context (right after the assistant header), which a tiny model can learn within tens of steps.
Rewards tried first, and why not: the share of the prompt's tokens (about 5% by chance) or of the
question's words (about 2%) among the generated ones moved nothing in 12 steps. The env's judge never
runs (the env plays every turn as a search), so every mode plays the same episodes whatever the
policy learns.
"""

from __future__ import annotations

import contextvars
import dataclasses
import re
from typing import Any

from searchgym.agents.engines.types import GenerateResponse, SamplingParams
from searchgym.agents.trajectory import Trajectory
from searchgym.agents.workflow import TokenWorkflow
from searchgym.bench.workload import EpisodePlan
from searchgym.envs.search_env import SearchEnv

PLANNED_WORKFLOW = f"{__name__}:PlannedWorkflow"


_WORD_START = re.compile(r" [^\W\d_]+")

# The plan of the episode this asyncio task is playing (each episode runs in its own task).
_PLAN: contextvars.ContextVar[list[EpisodePlan]] = contextvars.ContextVar("searchgym_bench_plan")


class PlannedWorkflow(TokenWorkflow):
    """TokenWorkflow whose turns follow the env's episode plan (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.word_starts = word_start_ids(self.tokenizer)

    async def arun_episode(
        self, env: SearchEnv, *, seed: int | None = None, options: dict[str, Any] | None = None, rid: str | None = None
    ) -> Trajectory:
        token = _PLAN.set([])
        try:
            traj = await super().arun_episode(env, seed=seed, options=options, rid=rid)
        finally:
            _PLAN.reset(token)
        traj.reward = word_start_share(traj, self.word_starts)
        return traj

    async def start_episode(
        self, env: SearchEnv, seed: int | None, options: dict[str, Any] | None
    ) -> tuple[str, Trajectory]:
        obs, traj = await super().start_episode(env, seed, options)
        plan = getattr(env, "plan", None)
        if not isinstance(plan, EpisodePlan):
            raise TypeError(
                f"{type(self).__name__} needs an env that draws episode plans "
                f"(searchgym-bench/SlowSyntheticQA-v0 with a workload), got {type(env).__name__}"
            )
        _PLAN.get().append(plan)
        return obs, traj

    async def generate(self, traj: Trajectory, sampling: SamplingParams, rid: str) -> GenerateResponse:
        """The next turn: exactly the plan's token count for it (capped by the context budget the caller passes)."""
        [plan] = _PLAN.get()
        turn = min(len(traj.turns), plan.turns - 1)
        planned = dataclasses.replace(
            sampling,
            max_new_tokens=min(sampling.max_new_tokens, plan.turn_tokens[turn]),
            stop=(),
            stop_token_ids=(),
            ignore_eos=True,
        )
        return await super().generate(traj, planned, rid)


def word_start_ids(tokenizer: Any) -> frozenset[int]:
    """The ids of the tokenizer's tokens that are a space and a run of letters (a word's start, " search")."""
    return frozenset(i for i in range(len(tokenizer)) if _WORD_START.fullmatch(tokenizer.decode([i])))


def word_start_share(traj: Trajectory, word_starts: frozenset[int]) -> float:
    """The share of the trajectory's turns whose first generated token starts a word (0.0 if it has none), over
    every context segment (each turn's tokens are generated, and trained, in exactly one)."""
    firsts = [
        token
        for segment in traj.token_segments()
        for token, mask, previous in zip(segment.input_ids, segment.loss_mask, [0, *segment.loss_mask], strict=False)
        if mask and not previous
    ]
    return sum(token in word_starts for token in firsts) / len(firsts) if firsts else 0.0
