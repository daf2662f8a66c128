"""SkyRL-gym: searchgym envs as a SkyRL `BaseTextEnv`, so SkyRL's generator and trainers run them.

SkyRL builds one env per dataset row: `skyrl_gym.make("searchgym", env_config=..., extras=row_extras)`, then
`init(prompt)` and `step(llm_output)` until `done`. Here:

- `env_config` names the env (`env_id`) and its kwargs (`env_kwargs`), shared by the run (a dict or an
  OmegaConf DictConfig, as SkyRL passes it); `extras` is the row's: `task_id` (or `index`, or `seed`) picks the
  task, `max_turns` optionally lowers the env's turn budget for the row.
- `init(prompt)` replaces the row's prompt by the env's first observation (instructions and question) as the
  user message, so dataset rows can carry only the task id; `step` returns the env's next observation as a user
  message, `done` when the agent answered or a budget ran out, and the reward at the end (the judge's verdict).
- A judge that could not score the answer raises `JudgeFailed`: a 0 would train on a failure of ours.
- `get_metrics()` gives the episode's turns, searches, accesses and whether it answered.

`register_skyrl()` registers the id "searchgym" (idempotent). Needs `pip install 'searchgym[skyrl]'`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from searchgym.core.extras import needs
from searchgym.envs.env_ids import SYNTHETIC_QA
from searchgym.envs.factory import make_unwrapped
from searchgym.envs.rewards import JudgeFailed, judge_error

with needs("searchgym.integrations.skyrl"):
    import skyrl_gym
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

SKYRL_ID = "searchgym"


class SearchGymTextEnv(BaseTextEnv):
    """One searchgym episode as SkyRL's text env (messages in, the model's text out)."""

    def __init__(self, env_config: Mapping[str, Any] | None = None, extras: Mapping[str, Any] | None = None):
        super().__init__()
        config, extras = dict(env_config or {}), dict(extras or {})
        unknown = set(config) - {"env_id", "env_kwargs"}
        if unknown:
            raise ValueError(f"env_config takes env_id and env_kwargs, not {sorted(unknown)}")
        env_kwargs = dict(config.get("env_kwargs") or {})
        if "max_turns" in extras:
            env_kwargs["max_turns"] = int(extras["max_turns"])
        self._env = make_unwrapped(str(config.get("env_id") or SYNTHETIC_QA), **env_kwargs)
        self.max_turns = self._env.max_turns
        self._options = {k: extras[k] for k in ("task_id", "index") if extras.get(k) is not None}
        self._seed = int(extras["seed"]) if extras.get("seed") is not None else None
        self._infos: list[dict[str, Any]] = []

    def init(self, prompt: list[dict[str, str]]) -> tuple[list[dict[str, str]], dict[str, Any]]:
        """The env's first observation as the conversation's user message (the row's prompt is only a carrier)."""
        obs, info = self._env.reset(seed=self._seed, options=self._options or None)
        self.turns, self._infos = 0, []
        system = [m for m in prompt or () if m.get("role") == "system"]
        return [*system, {"role": "user", "content": obs}], {"task_id": info["task_id"]}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """The model's turn to the env; its answer as the next user message, or the end with the reward."""
        obs, reward, terminated, truncated, info = self._env.step(action)
        self.turns += 1
        self._infos.append(info)
        if (error := judge_error([info])) is not None:
            raise JudgeFailed(f"the judge could not score the answer: {error}")
        done = terminated or truncated
        metadata = {"tool": info.get("tool"), "truncated": truncated, "verdict": info.get("verdict")}
        return BaseTextEnvStepOutput(
            observations=[] if done else [{"role": "user", "content": obs}],
            reward=float(reward),
            done=done,
            metadata=metadata,
            postprocessed_action=None,
        )

    def get_metrics(self) -> dict[str, Any]:
        tools = [i.get("tool") for i in self._infos]
        return {
            "turns": self.turns,
            "searches": tools.count("search"),
            "accesses": tools.count("access"),
            "answered": float(any(i.get("verdict") for i in self._infos)),
        }

    def close(self) -> None:
        self._env.close()


def register_skyrl() -> str:
    """Register SearchGymTextEnv in SkyRL-gym under "searchgym" (idempotent); the id."""
    if SKYRL_ID not in skyrl_gym.registry:
        skyrl_gym.register(id=SKYRL_ID, entry_point="searchgym.integrations.skyrl:SearchGymTextEnv")
    return SKYRL_ID
