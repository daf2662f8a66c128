"""`searchgym/SyntheticQA-v0`: a SearchEnv over the embedded synthetic world, built into a cache on first use."""

from __future__ import annotations

import os
from typing import Any

from searchgym.envs.env_ids import SYNTHETIC_QA
from searchgym.envs.env_kwargs import check_env_kwargs as check_kwargs_of
from searchgym.envs.search_env import SearchEnv
from searchgym.envs.tasks import load_pool
from searchgym.envs.tools.index_files import has_manifest
from searchgym.envs.tools.retrievers import DEFAULT_RETRIEVER, check_retriever, open_retriever
from searchgym.world.bundle import DEFAULT_SIZE, DEFAULT_TASKS, ensure_bundle, note, showing_builds
from searchgym.world.kbwalk import start_gives_link
from searchgym.world.mincalls import DEFAULT_MIN_CALLS_TASKS, check_env_kwargs, ensure_min_calls_pool, parse_min_calls


def make_synthetic_qa(
    size: int = DEFAULT_SIZE,
    seed: int = 0,
    *,
    n_tasks: int = DEFAULT_TASKS,
    split: str | None = None,
    hops: int | list[int] | None = None,
    min_calls: int | tuple[int, int] | range | None = None,
    min_calls_tasks: int = DEFAULT_MIN_CALLS_TASKS,
    retriever: str = DEFAULT_RETRIEVER,
    drop_given_links: bool = False,
    cache_dir: str | os.PathLike | None = None,
    **env_kwargs: Any,
) -> SearchEnv:
    """`searchgym/SyntheticQA-v0`: a SearchEnv over the embedded synthetic world (no server, no network).

    `min_calls=N` (or a `(low, high)` pair, or a `range`) serves instead a pool of `min_calls_tasks` deep
    questions, each with a proof (in its metadata) that no play of fewer than its `min_calls` tool calls
    observes the answer under the prover's action set (`searchgym.world.prover`), proven once per bundle
    and cached beside it. Such a pool is proven for fixed env settings (`mincalls.PROOF_ENV`), which
    are applied here; other values of them are refused.

    `retriever` ranks the searches: `"bm25"` (the bundle's index), `"dense"` (all-MiniLM-L6-v2 over the same pages,
    the `dense` extra) or `"hybrid"` (both fused by reciprocal rank fusion). The dense index is built into the
    bundle (`dense-index/`) on first use and reused after (`envs/tools/retrievers.py`).

    `drop_given_links` leaves out the chain questions whose described start names a later entity of the path
    (`kbwalk.start_gives_link`): there a k-hop question needs only k - 1 lookups.
    """
    # a misspelt or mistyped kwarg fails here, before a world is built (gym.make comes straight here)
    check_kwargs_of(
        SYNTHETIC_QA,
        {
            "size": size,
            "seed": seed,
            "n_tasks": n_tasks,
            "split": split,
            "min_calls_tasks": min_calls_tasks,
            "retriever": retriever,
            "drop_given_links": drop_given_links,
            **env_kwargs,
        },
    )
    check_retriever(SYNTHETIC_QA, retriever)
    if min_calls is not None:
        low_high = parse_min_calls(min_calls)  # bad values fail before anything is built
        env_kwargs = check_env_kwargs(low_high, env_kwargs)
        if retriever != "bm25":
            raise ValueError(f"min_calls questions are proven under BM25 search; got retriever={retriever!r}")
    bundle = ensure_bundle(size=size, seed=seed, n_tasks=n_tasks, cache_dir=cache_dir)
    tasks = bundle / "tasks.jsonl" if min_calls is None else ensure_min_calls_pool(bundle, low_high, min_calls_tasks)
    pool = load_pool(tasks, split=split, hops=hops)
    if drop_given_links:
        pool = pool.filter(predicate=lambda task: not start_gives_link(task))
    progress = showing_builds()
    if retriever != "bm25" and not has_manifest(bundle / "dense-index"):
        note(progress, f"encoding the world's pages once for retriever={retriever!r}; later runs reuse them")
    search, pages = open_retriever(bundle, retriever, progress=progress)
    return SearchEnv(pool, search, pages, **env_kwargs)
