"""OpenEnv's client half: `SearchGymClient(base_url=...)` talks to `searchgym serve env ID` (serve/env_host.py).

It is an OpenEnv `EnvClient` (`.sync()` for blocking use), usable as it is inside a TRL `environment_factory`
class, as OpenEnv's TRL examples use their clients. Its actions are `SearchAction(tool="search", argument="...")`
or `SearchAction(text="...")` (a whole turn as a model wrote it); see serve/env_host.py for what the server does
with them. Needs `pip install 'searchgym[openenv]'`.
"""

from __future__ import annotations

from typing import Any

from searchgym.core.extras import needs
from searchgym.serve.env_host import SearchAction, SearchObservation, SearchState, TextAction

with needs("searchgym.integrations.openenv"):
    from openenv.core.client_types import StepResult
    from openenv.core.env_client import EnvClient

__all__ = ["SearchAction", "SearchGymClient", "SearchObservation", "SearchState", "TextAction"]


class SearchGymClient(EnvClient[SearchAction, SearchObservation, SearchState]):
    """OpenEnv client for a searchgym env server (async; `.sync()` gives the blocking form)."""

    def _step_payload(self, action: SearchAction) -> dict[str, Any]:
        return action.model_dump(exclude_none=True)

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[SearchObservation]:
        observation = SearchObservation(
            **payload.get("observation", {}), done=payload.get("done", False), reward=payload.get("reward")
        )
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> SearchState:
        return SearchState(**payload)
