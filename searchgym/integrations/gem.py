"""GEM (gem-llm): every searchgym env id as a GEM env, so GEM's wrappers, vector envs and trainers run it.

GEM's `Env` is Gymnasium's text API (`reset(seed) -> (obs, info)`, `step(action) -> (obs, reward, terminated,
truncated, info)`, string actions), so the adapter is thin: `register_gem()` registers `searchgym:ID` for each
searchgym id (`searchgym:SyntheticQA-v0`), and `gem.make("searchgym:SyntheticQA-v0", env_kwargs={...})` builds one.

- `env_kwargs` are the searchgym env's kwargs (checked by name before anything is built); `seed` is what
  `gem.make_vec` hands each copy, and seeds the task draw of `reset()` calls that pass none.
- The reward is the env's: the judge's verdict on the answer at the end, 0 before. A judge that could not score
  the answer raises `JudgeFailed` instead of returning a reward: a 0 would train the agent on a failure of ours.
- `spawn()` gives a fresh copy with the same configuration (GEM's way of forking an env).

Needs `pip install 'searchgym[gem]'`.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

import searchgym
from searchgym.core.extras import needs
from searchgym.envs.env_ids import SYNTHETIC_QA
from searchgym.envs.factory import make_unwrapped
from searchgym.envs.rewards import JudgeFailed, judge_error

with needs("searchgym.integrations.gem"):
    import gem

PREFIX = "searchgym:"


class SearchGymGemEnv(gem.Env):
    """One searchgym env behind GEM's `Env`."""

    def __init__(
        self, searchgym_id: str = SYNTHETIC_QA, env_kwargs: dict[str, Any] | None = None, seed: int | None = None
    ) -> None:
        super().__init__()
        self.searchgym_id, self.env_kwargs = searchgym_id, dict(env_kwargs or {})
        self._env = make_unwrapped(searchgym_id, **self.env_kwargs)
        self._next_seed = seed

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """A new episode on a task drawn by `seed` (else by the constructor's seed, counted up per episode)."""
        if seed is None and self._next_seed is not None:
            seed, self._next_seed = self._next_seed, self._next_seed + 1
        super().reset(seed)
        return self._env.reset(seed=seed)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """The agent's whole turn as text, as the searchgym env takes it."""
        obs, reward, terminated, truncated, info = self._env.step(action)
        if (error := judge_error([info])) is not None:
            raise JudgeFailed(f"the judge could not score the answer: {error}")
        return obs, float(reward), terminated, truncated, info

    def sample_random_action(self) -> str:
        """A random turn (a search for a random word of the question, or a guess), as GEM's random agents use."""
        import random

        words = self._env.task.question.split() if self._env.task is not None else ["a"]
        word = random.choice(words)
        return random.choice([f"<search>{word}</search>", f"<answer>{word}</answer>"])

    def spawn(self, same_state: bool = False, **kwargs: Any) -> SearchGymGemEnv:
        """A fresh copy with this configuration (`kwargs` override it); same_state is not supported."""
        if same_state:
            raise NotImplementedError("a searchgym episode cannot be copied mid-way; spawn(same_state=False)")
        config = {"searchgym_id": self.searchgym_id, "env_kwargs": self.env_kwargs, **kwargs}
        return SearchGymGemEnv(**config)

    def close(self) -> None:
        self._env.close()


def register_gem() -> list[str]:
    """Register `searchgym:NAME` in GEM for every searchgym gym id (idempotent); the ids registered."""
    from gem.envs.registration import ENV_REGISTRY

    ids = []
    for env_id in sorted(i for i in gym.registry if i.startswith("searchgym/")):
        gem_id = PREFIX + env_id.removeprefix("searchgym/")
        if gem_id not in ENV_REGISTRY:
            gem.register(gem_id, entry_point=SearchGymGemEnv, searchgym_id=env_id)
        ids.append(gem_id)
    return ids


assert searchgym  # the ids are registered on import
