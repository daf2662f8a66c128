"""Scripted baselines that read only observations, as any agent must."""
from __future__ import annotations

import random
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


class RandomAgent:
    """Seeded random tool use drawn from what it has read: searches words, opens seen urls, answers a word.

    A floor for learning curves, and a fuzzer of env episodes (it also writes malformed turns).
    """

    def __init__(self, seed: int = 0, max_turns: int = 16):
        self.rng = random.Random(seed)
        self.max_turns = max_turns

    async def arun(self, env: SearchEnv, obs: str) -> float:
        for _ in range(self.max_turns):
            obs, reward, terminated, truncated, _ = await env.astep(self.act(obs))
            if terminated or truncated:
                return reward
        return 0.0

    def act(self, obs: str) -> str:
        words = re.findall(r"[A-Z][a-z]+", obs) or ["river"]
        urls = re.findall(r"\]\((https?://[^)\s]+|doc://[^)\s]+)\)", obs)
        roll = self.rng.random()
        if roll < 0.45:
            return f"<search>{' '.join(self.rng.sample(words, min(2, len(words))))}</search>"
        if roll < 0.75 and urls:
            return f"<access>{self.rng.choice(urls)}</access>"
        if roll < 0.9:
            return f"<answer>{self.rng.choice(words)}</answer>"
        return self.rng.choice(["<search>unclosed", "", "<answer></answer>", "<think>only thinking</think>"])
