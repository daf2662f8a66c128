"""LocalQA-v0's factory: SearchEnv over a local index, a corpus file or retrieval servers."""
from __future__ import annotations

import os
from typing import Any, cast

from searchgym.envs.search_env import SearchEnv
from searchgym.envs.tasks import load_pool
from searchgym.envs.tools.indexes import open_index


def make_local_qa(
    tasks: str | os.PathLike | Any,
    index: str | os.PathLike | None = None,
    corpus: str | os.PathLike | None = None,
    *,
    task_split: str | None = None,
    hops: int | list[int] | None = None,
    on_bad_task: str = "raise",
    servers: str | list[str] | None = None,
    server_options: dict[str, Any] | None = None,
    **env_kwargs: Any,
) -> SearchEnv:
    """SearchEnv over any local corpus: an index directory, a corpus JSONL indexed on first use, or
    retrieval servers (`servers=["http://host:port", ...]` or their /retrieve URLs, ours or Search-R1's) shared
    by many envs; each server is asked one query at construction, so a wrong URL fails here."""
    if sum(x is not None for x in (index, corpus, servers)) != 1:
        raise ValueError("LocalQA-v0 needs exactly one of index=DIR (from `searchgym index build`), "
                         "corpus=FILE.jsonl or servers=URL(s) (from `searchgym serve search`)")
    pool = load_pool(tasks, on_error=on_bad_task, split=task_split, hops=hops)
    if servers is not None:
        from searchgym.envs.tools.remote_search import RemoteSearch

        options = {"check": True, **(server_options or {})}  # a wrong URL is an error here, not in every episode
        remote = RemoteSearch([servers] if isinstance(servers, str) else list(servers), **options)
        return SearchEnv(pool, remote, remote, **env_kwargs)
    backend = open_index(cast("str | os.PathLike", index if index is not None else corpus))  # one is given (above)
    return SearchEnv(pool, backend, backend, **env_kwargs)
