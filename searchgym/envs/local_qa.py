"""LocalQA-v0's factory: SearchEnv over a local index, a corpus file or retrieval servers."""

from __future__ import annotations

import os
from typing import Any, cast

from searchgym.envs.env_ids import LOCAL_QA  # the id these errors name
from searchgym.envs.env_kwargs import options_from
from searchgym.envs.search_env import SearchEnv
from searchgym.envs.tasks import load_pool
from searchgym.envs.tools.indexes import open_index
from searchgym.envs.tools.retrievers import check_retriever, open_retriever
from searchgym.envs.tools.shards import is_sharded, open_sharded


def make_local_qa(
    tasks: str | os.PathLike | Any,
    index: str | os.PathLike | None = None,
    corpus: str | os.PathLike | None = None,
    *,
    task_split: str | None = None,
    hops: int | list[int] | None = None,
    on_bad_task: str = "raise",
    servers: str | list[str] | list[list[str]] | None = None,
    server_options: dict[str, Any] | None = None,
    retriever: str | None = None,
    **env_kwargs: Any,
) -> SearchEnv:
    """SearchEnv over any local corpus: an index directory (a sharded one from `index build --shards` too), a corpus
    JSONL indexed on first use, or retrieval servers (`servers=["http://host:port", ...]` or their /retrieve URLs,
    ours or Search-R1's: replicas of one index, failed over) shared by many envs, or a sharded index's servers
    (`servers=[[shard 0's replicas], [shard 1's], ...]`, tools/shards.py); each server is asked one query at
    construction, so a wrong URL fails here.

    `retriever` ranks the searches over a local index or corpus: None (the index as given: BM25 when built here),
    `"bm25"`, `"dense"` (all-MiniLM-L6-v2, the `dense` extra) or `"hybrid"` (both fused by reciprocal rank fusion);
    an index missing is built from the corpus on first use and reused after (`envs/tools/retrievers.py`).
    Servers rank on their own, so with `servers=` (and a sharded index) it must stay None."""
    if sum(x is not None for x in (index, corpus, servers)) != 1:
        raise ValueError(
            "LocalQA-v0 needs exactly one of index=DIR (from `searchgym index build`), "
            "corpus=FILE.jsonl or servers=URL(s) (from `searchgym serve search`)"
        )
    if retriever is not None:
        check_retriever(LOCAL_QA, retriever)
        if servers is not None or (index is not None and is_sharded(index)):
            raise ValueError(
                f"{LOCAL_QA}: env kwarg 'retriever' applies to index=DIR or corpus=FILE; retrieval servers and "
                "sharded indexes rank on their own (serve a dense index with `searchgym serve search --index DIR`)"
            )
    pool = load_pool(tasks, on_error=on_bad_task, split=task_split, hops=hops)
    if servers is not None:
        from searchgym.envs.tools.remote_search import RemoteOptions, RemoteSearch

        # a wrong URL is an error here, not in every episode
        options = options_from(RemoteOptions, {"check": True, **(server_options or {})}, "server_options")
        if not isinstance(servers, str) and servers and all(isinstance(s, (list, tuple)) for s in servers):
            from searchgym.envs.tools.shards import ShardedSearch

            sharded = ShardedSearch.remote(servers, options)
            return SearchEnv(pool, sharded, sharded, **env_kwargs)
        urls = [servers] if isinstance(servers, str) else [str(s) for s in servers]
        remote = RemoteSearch(urls, options)
        return SearchEnv(pool, remote, remote, **env_kwargs)
    if index is not None and is_sharded(index):
        sharded_index = open_sharded(index)
        return SearchEnv(pool, sharded_index, sharded_index, **env_kwargs)
    path = cast("str | os.PathLike", index if index is not None else corpus)  # one is given (above)
    if retriever is not None:
        search, pages = open_retriever(path, retriever)
        return SearchEnv(pool, search, pages, **env_kwargs)
    backend = open_index(path)
    return SearchEnv(pool, backend, backend, **env_kwargs)
