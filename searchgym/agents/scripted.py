"""Scripted baselines that read only observations, as any agent must."""
from __future__ import annotations

import re

from searchgym.envs.search_env import SearchEnv

_FIRST_HIT = re.compile(r"\[Doc 1\]\((?P<url>[^)]*)\):\n(?P<title>[^\n]*)")


class SearchOnceAgent:
    """Searches the question once and answers with the top hit's title: the floor any learner should beat."""

    async def arun(self, env: SearchEnv, question: str) -> float:
        obs, *_ = await env.astep(f"<search>{question}</search>")
        match = _FIRST_HIT.search(obs)
        guess = match.group("title") if match else "unknown"
        _, reward, *_ = await env.astep(f"<answer>{guess}</answer>")
        return reward
