"""The text of a page a search hit points at, from the run's own environment, rebuilt from what the run recorded.

    found = await page_text(run, "https://world.searchgym.test/wiki/Dellathia")
    found.text or found.why     # the page, or why it cannot be shown (unknown env, page gone, ...)

An evaluation records its env id and kwargs in run.json and a training run in config.json; the env is made once
per run (the world's cached bundle makes that quick) and kept for the viewer's life. Only env ids registered with
Gymnasium are made: a run file cannot make the viewer import code.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass
from typing import Any

from searchgym.envs.tools.index_files import PagesByUrl
from searchgym.view.runs import Run, field_dict

MAX_PAGE_CHARS = 200_000
NO_ENV = "the run does not record its environment (no env id and kwargs in run.json or config.json)"
_ENVS: dict[str, Any] = {}  # (run folder, env id, kwargs) -> the env made for it
_LOCK = threading.Lock()


@dataclass
class FoundPage:
    title: str = ""
    text: str = ""
    cut: bool = False
    why: str = ""  # set when there is no text to show


def env_spec(run: Run) -> tuple[str, dict[str, Any]] | None:
    """(env id, kwargs) the run played, from run.json or config.json; None where the run does not say."""
    meta = run.meta()
    if run.kind == "eval":
        env_id, kwargs = meta.get("env"), meta.get("env_kwargs")
    else:
        env_id, kwargs = field_dict(meta, "env").get("id"), field_dict(meta, "env").get("kwargs")
    if not isinstance(env_id, str) or not isinstance(kwargs, dict):
        return None
    return env_id, kwargs


def _make(env_id: str, kwargs: dict[str, Any]) -> Any:
    import gymnasium as gym

    import searchgym.envs  # noqa: F401  (registers the env ids)

    if env_id not in gym.registry:
        raise LookupError(f"{env_id!r} is not a registered environment here (its package is not imported)")
    return gym.make(env_id, **kwargs).unwrapped


def _env_for(run: Run, env_id: str, kwargs: dict[str, Any]) -> Any:
    key = json.dumps([str(run.path), env_id, kwargs], sort_keys=True, default=str)
    with _LOCK:
        if key not in _ENVS:
            _ENVS[key] = _make(env_id, kwargs)
        return _ENVS[key]


async def page_text(run: Run, url: str) -> FoundPage:
    """The page at `url` in the run's environment, or a FoundPage whose `why` explains its absence."""
    spec = env_spec(run)
    if spec is None:
        return FoundPage(why=NO_ENV)
    try:
        env = await asyncio.to_thread(_env_for, run, *spec)
    except Exception as e:  # the env cannot be made here: say why, keep serving
        return FoundPage(why=f"{spec[0]} could not be made here: {type(e).__name__}: {e}")
    backend = getattr(env, "page_backend", None)
    if not isinstance(backend, PagesByUrl):
        return FoundPage(
            why=f"{spec[0]}'s pages are not stored on this machine (the viewer never goes online to fetch one)"
        )
    try:
        page = backend.get_page(url)
    except Exception as e:  # an unknown url: the page says so
        return FoundPage(why=f"{url[:300]} could not be opened: {type(e).__name__}: {e}")
    text = str(getattr(page, "text", "") or "")
    return FoundPage(
        title=str(getattr(page, "title", "") or ""), text=text[:MAX_PAGE_CHARS], cut=len(text) > MAX_PAGE_CHARS
    )
