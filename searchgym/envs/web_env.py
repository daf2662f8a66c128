"""WebQA-v0: SearchEnv on the live web (Serper search + guarded page fetching), with a record/replay cache."""

from __future__ import annotations

import os
from typing import Any

from searchgym.envs.env_kwargs import options_from
from searchgym.envs.search_env import SearchEnv
from searchgym.envs.tasks import load_pool
from searchgym.envs.tools.url_safety import UrlPolicy
from searchgym.envs.tools.web_cache import CachedPages, CachedSearch, WebCache
from searchgym.envs.tools.web_fetch import FetchOptions, WebFetcher
from searchgym.envs.tools.web_search import PROVIDERS, WebSearchOptions


class WebSearchEnv(SearchEnv):
    """SearchEnv whose backends hold HTTP sessions and a cache file: `close()` releases them."""

    def __init__(self, *args: Any, web_cache: WebCache | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.web_cache = web_cache

    async def aclose(self) -> None:
        """Close the backends' HTTP sessions (call from the loop that ran the episodes)."""
        for backend in (self.search_backend, self.page_backend):
            close = getattr(backend, "close", None)
            if close is not None:
                await close()

    def close(self) -> None:
        if self._runner is not None:
            self._sync(self.aclose())
        super().close()
        if self.web_cache is not None:
            self.web_cache.close()
            self.web_cache = None


def make_web_qa(
    tasks: str | os.PathLike | Any,
    *,
    search_provider: str = "serper",
    search_api_key: str | None = None,
    search_endpoint: str | None = None,
    search_options: dict[str, Any] | None = None,
    fetch_options: dict[str, Any] | None = None,
    cache: str | os.PathLike | None = None,
    cache_mode: str | None = None,
    allow: list[str] | tuple[str, ...] = (),
    block: list[str] | tuple[str, ...] = (),
    task_split: str | None = None,
    hops: int | list[int] | None = None,
    on_bad_task: str = "raise",
    **env_kwargs: Any,
) -> WebSearchEnv:
    """SearchEnv over the web for any task pool.

    `allow` lifts the SSRF guard for hosts / host:port / networks; `block` keeps domains (benchmark
    answer pages) out of results and fetches. `cache` is a SQLite file; `cache_mode` is "off",
    "read_write" (the default when a cache is given) or "replay_only" (no network, no API key needed).
    """
    if search_provider not in PROVIDERS:
        raise ValueError(f"search_provider must be one of {sorted(PROVIDERS)}, got {search_provider!r}")
    mode = cache_mode or ("read_write" if cache is not None else "off")
    if mode != "off" and cache is None:
        raise ValueError(f"cache_mode={mode!r} needs cache=PATH (a SQLite file)")
    policy = UrlPolicy(allow=allow, block=block)
    sopts = dict(search_options or {})
    if search_endpoint is not None:
        sopts["endpoint"] = search_endpoint
    sopts.setdefault("require_key", mode != "replay_only")
    search_opts = options_from(WebSearchOptions, sopts, "search_options")
    search: Any = PROVIDERS[search_provider](search_api_key, search_opts, policy=policy)
    pages: Any = WebFetcher(options_from(FetchOptions, fetch_options, "fetch_options"), policy=policy)
    web_cache = WebCache(cache, mode) if cache is not None else None
    if web_cache is not None:
        search, pages = CachedSearch(search, web_cache), CachedPages(pages, web_cache)
    pool = load_pool(tasks, on_error=on_bad_task, split=task_split, hops=hops)
    return WebSearchEnv(pool, search, pages, web_cache=web_cache, **env_kwargs)
