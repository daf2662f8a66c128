"""`searchgym/SyntheticQA-v0`: a SearchEnv over the embedded synthetic world, built into a cache on first use."""

from __future__ import annotations

import os
from typing import Any

from searchgym.envs.env_kwargs import check_env_kwargs as check_kwargs_of
from searchgym.envs.registration import SYNTHETIC_QA
from searchgym.envs.search_env import SearchEnv
from searchgym.envs.tasks import load_pool
from searchgym.envs.tools.indexes import open_index
from searchgym.world.bundle import DEFAULT_SIZE, DEFAULT_TASKS, ensure_bundle
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
    cache_dir: str | os.PathLike | None = None,
    **env_kwargs: Any,
) -> SearchEnv:
    """`searchgym/SyntheticQA-v0`: a SearchEnv over the embedded synthetic world (no server, no network).

    `min_calls=N` (or a `(low, high)` pair, or a `range`) serves instead a pool of `min_calls_tasks` deep
    questions, each with a proof (in its metadata) that no play of fewer than its `min_calls` tool calls
    observes the answer under the prover's action set (`searchgym.world.prover`), proven once per bundle
    and cached beside it. Such a pool is proven for fixed env settings (`mincalls.PROOF_ENV`), which
    are applied here; other values of them are refused.
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
            **env_kwargs,
        },
    )
    if min_calls is not None:
        low_high = parse_min_calls(min_calls)  # bad values fail before anything is built
        env_kwargs = check_env_kwargs(low_high, env_kwargs)
    bundle = ensure_bundle(size=size, seed=seed, n_tasks=n_tasks, cache_dir=cache_dir)
    tasks = bundle / "tasks.jsonl" if min_calls is None else ensure_min_calls_pool(bundle, low_high, min_calls_tasks)
    pool = load_pool(tasks, split=split, hops=hops)
    index = open_index(bundle)
    return SearchEnv(pool, index, index, **env_kwargs)
