"""One way to build a searchgym env by id for code that drives it directly (its async API, its task pool)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from searchgym.envs.env_kwargs import check_env_kwargs


def make_unwrapped(env_id: str, **kwargs: Any) -> Any:
    """`gym.make(env_id, **kwargs).unwrapped`: the env itself (a SearchEnv for searchgym ids), without
    Gymnasium's checker and order-enforcing wrappers, which only guard the sync `step`/`reset` path.
    The kwargs are checked first (`check_env_kwargs`): a misspelt one fails before a world is built."""
    check_env_kwargs(env_id, kwargs)
    return gym.make(env_id, **kwargs).unwrapped
