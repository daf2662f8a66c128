"""Envs reused across episodes: making one loads its task pool and opens its index, an episode does not.

`gym.make` of a bundle env costs about a second for a 20,000-task pool, while `reset` clears all of an
episode's state; so trainers and the evaluator lend envs from a pool (one per concurrent episode)
instead of making one per episode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from searchgym.envs.search_env import SearchEnv


class EnvPool:
    """Lends idle envs, making a new one only when all are busy; `close` closes every env it made."""

    def __init__(self, make_env: Callable[[], SearchEnv]) -> None:
        self._make_env = make_env
        self._idle: list[SearchEnv] = []
        self.made = 0

    @contextlib.contextmanager
    def env(self) -> Iterator[SearchEnv]:
        """An env for one episode; it goes back to the pool after, unless the episode raised."""
        if self._idle:
            env = self._idle.pop()
        else:
            env = self._make_env()
            self.made += 1
        try:
            yield env
        except BaseException:
            env.close()  # its state is unknown: do not lend it again
            raise
        self._idle.append(env)

    def close(self) -> None:
        """Close the idle envs (all of them, once no episode is running)."""
        while self._idle:
            self._idle.pop().close()
