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
from searchgym.envs.tools.shards import is_sharded


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
    retriever: str | None = None,
    **env_kwargs: Any,
) -> SearchEnv:
    """SearchEnv over any local corpus: an index directory, a corpus JSONL indexed on first use, or retrieval servers
    (`servers=["http://host:port", ...]` or their /retrieve URLs, ours or Search-R1's: replicas of one index, failed
    over) shared by many envs; each server is asked one query at construction, so a wrong URL fails here.

    A sharded index (`index build --shards N`) is searched through one address, `searchgym serve ray-search --index
    DIR` (Ray Serve: a deployment per shard, its replicas placed, routed and replaced by Ray), given as
    `servers=["http://host:port"]`; an env does not fan out to shards itself, so a sharded `index=` or a list of shard
    lists in `servers=` is refused here, saying what to run instead (`check_sharding`).

    `retriever` ranks the searches over a local index or corpus: None (the index as given: BM25 when built here),
    `"bm25"`, `"dense"` (all-MiniLM-L6-v2, the `dense` extra) or `"hybrid"` (both fused by reciprocal rank fusion);
    an index missing is built from the corpus on first use and reused after (`envs/tools/retrievers.py`).
    Servers rank on their own, so with `servers=` it must stay None."""
    if sum(x is not None for x in (index, corpus, servers)) != 1:
        raise ValueError(
            "LocalQA-v0 needs exactly one of index=DIR (from `searchgym index build`), "
            "corpus=FILE.jsonl or servers=URL(s) (from `searchgym serve search`)"
        )
    check_sharding(index, servers)
    if retriever is not None:
        check_retriever(LOCAL_QA, retriever)
        if servers is not None:
            raise ValueError(
                f"{LOCAL_QA}: env kwarg 'retriever' applies to index=DIR or corpus=FILE; retrieval servers rank on "
                "their own (serve a dense index with `searchgym serve search --index DIR`)"
            )
    pool = load_pool(tasks, on_error=on_bad_task, split=task_split, hops=hops)
    if servers is not None:
        from searchgym.envs.tools.remote_search import RemoteOptions, RemoteSearch

        # a wrong URL is an error here, not in every episode
        options = options_from(RemoteOptions, {"check": True, **(server_options or {})}, "server_options")
        urls = [servers] if isinstance(servers, str) else [str(s) for s in servers]
        remote = RemoteSearch(urls, options)
        return SearchEnv(pool, remote, remote, **env_kwargs)
    path = cast("str | os.PathLike", index if index is not None else corpus)  # one is given (above)
    if retriever is not None:
        search, pages = open_retriever(path, retriever)
        return SearchEnv(pool, search, pages, **env_kwargs)
    backend = open_index(path)
    return SearchEnv(pool, backend, backend, **env_kwargs)


def check_sharding(index: str | os.PathLike | None, servers: Any) -> None:
    """Refuse what would need an env to fan a search out to shards itself (a sharded `index=` directory, or
    `servers=` as one list of replicas per shard), naming the key and the command that serves those shards as one
    address instead: Ray Serve routes, replicates and heals them, where a client-side fan-out only added its own
    failure modes and ran at half one server's rate."""
    serve = "`searchgym serve ray-search --index DIR --port 8000` (pip install 'searchgym[serve-ray]')"
    if index is not None and is_sharded(index):
        raise ValueError(
            f"{LOCAL_QA}: env kwarg 'index' is a sharded index ({os.fspath(index)} has shards.json, from `index "
            f"build --shards N`), which an env does not search shard by shard: serve it as one address with "
            f'{serve.replace("DIR", os.fspath(index))} and pass servers=["http://host:8000"]'
        )
    if isinstance(servers, (list, tuple)) and any(isinstance(s, (list, tuple)) for s in servers):
        raise ValueError(
            f"{LOCAL_QA}: env kwarg 'servers' is a list of shard lists ([[shard 0's replicas], ...]), which an env "
            f"no longer fans out to: serve the sharded index as one address with {serve} (a deployment per shard, "
            f'with its replicas) and pass servers=["http://host:8000"]'
        )
