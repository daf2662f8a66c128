"""`searchgym bench scale-out`: one retrieval server against Ray Serve's replicas and shards, side by side in one run.

On one synthetic world (1,000,000 pages by default; `--world DIR` reuses a written one), the corpus is indexed
whole and as `--shards` shards (`index build --shards`). Then the arms, each reached by its clients at one address:

- `single`: the whole index behind one `searchgym serve search` in its own process;
- `ray_1`, `ray_2`: the whole index as a Ray Serve application (`serve ray-search`) with 1 and with 2 replicas;
- `ray_sharded`: the shards as one Ray Serve application, a deployment per shard (scale_out_ray.py).

Measured per arm:

- start-up: seconds from launch to answering (/health for the server, every replica up for an application);
- load: `clients` concurrent clients (1,000 by default), each sending entity-name queries one after another for
  `seconds`, through the client a run uses (`RemoteSearch` on the arm's URL), in rounds that alternate the arms
  (A B C D, D C B A) so all see the same machine; recorded per round: queries/s answered, p50/p99 latency, errors,
  and whether each hit list holds the queried page in its top k;
- memory: the one server's resident set after the load.

Without `searchgym[serve-ray]` only `single` runs and the report says why. (Reports written before the client-side
shard fan-out was removed also hold a `sharded` arm: shard servers searched by `ShardedSearch`.)

Numbers go to results/bench_scale_out.json (with the machine), never asserted in tests.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchgym.bench.load import ServerProcess
from searchgym.bench.scale_out_ray import RAY_REPLICAS, ray_arms
from searchgym.core.atomic_file import write_atomic
from searchgym.envs.tools.corpus import read_corpus
from searchgym.serve.limits import raise_open_files_limit
from searchgym.settings import setting

K = 5


@dataclass
class ScaleOutSettings:
    """`searchgym bench scale-out`: one retrieval server against Ray Serve with 1 and 2 replicas and over `shards`
    shards, side by side."""

    size: int = setting(1_000_000, at_least=100, help="pages in the synthetic world")
    shards: int = setting(4, at_least=1, help="shards of the Ray Serve sharded arm")
    clients: int = setting(1000, at_least=1, help="concurrent clients")
    seconds: float = setting(20.0, above=0, help="per round")
    rounds: int = setting(2, at_least=1, help="each arm's rounds, alternated")
    world: Path | None = setting(None, help="a directory to build the world and indexes in (kept)")
    out: Path | None = setting(Path("results/bench_scale_out.json"), help="the report JSON")
    n_queries: int = setting(5000, at_least=1, help="distinct queries the clients cycle through")


def run_scale_out(settings: ScaleOutSettings) -> dict[str, Any]:
    """Build (or reuse) the world, its index and its shards, then measure the arms side by side; the report (written
    to `out`)."""
    import json

    raise_open_files_limit()  # 1,000 clients hold 1,000 sockets
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(settings.world) if settings.world is not None else Path(tmp) / "world"
        built = _prepare(root, settings.size, settings.shards)
        queries = _queries(root / "corpus.jsonl", settings.n_queries)
        report: dict[str, Any] = {
            "size": settings.size,
            "shards": settings.shards,
            "clients": settings.clients,
            "seconds_per_round": settings.seconds,
            "rounds": settings.rounds,
            "k": K,
            "queries": len(queries),
            "build_s": built,
            "machine": _machine(),
        }
        with ExitStack() as stack:
            starts: dict[str, list[float]] = {}
            single = _start(stack, root / "index", starts)
            layouts = {"single": single.url}
            layouts |= stack.enter_context(ray_arms(root / "index", root / "shards", RAY_REPLICAS, starts, report))
            report["startup_s"] = {
                name: {"servers": [round(s, 2) for s in times], "ready": round(max(times), 2)}
                for name, times in starts.items()
            }
            results: dict[str, list[dict[str, Any]]] = {name: [] for name in layouts}
            for r in range(settings.rounds):  # A B C D, then D C B A: every arm sees the same machine
                for name in list(layouts) if r % 2 == 0 else list(reversed(layouts)):
                    results[name].append(asyncio.run(_load(layouts[name], queries, settings.clients, settings.seconds)))
            report["rounds_by_layout"] = results
            report["rss_mb"] = {"single": [single.stats()["rss_mb"]]}
        report["summary"] = {name: _summary(rows) for name, rows in results.items()}
        qps = {name: s["queries_per_s"] for name, s in report["summary"].items()}
        for name in results:
            if name != "single":
                report["summary"][f"{name}_over_single_qps"] = (
                    round(qps[name] / qps["single"], 3) if qps["single"] else None
                )
    if settings.out is not None:
        write_atomic(Path(settings.out), json.dumps(report, indent=2) + "\n")
    return report


def _prepare(root: Path, size: int, shards: int) -> dict[str, float]:
    """The world's corpus, its whole index and its shards (each built only when missing); seconds each took."""
    from searchgym.envs.tools.local_index import LocalIndex
    from searchgym.envs.tools.shards import build_shards, is_sharded
    from searchgym.world.world import World

    took: dict[str, float] = {}
    t0 = time.perf_counter()
    if not (root / "corpus.jsonl").exists():
        World(size, seed=0).write(root, progress=True)
        took["world"] = round(time.perf_counter() - t0, 1)
    if not (root / "index" / "index.json").exists():
        t0 = time.perf_counter()
        LocalIndex.build(root / "corpus.jsonl", root / "index", progress=True)
        took["index"] = round(time.perf_counter() - t0, 1)
    if not is_sharded(root / "shards"):
        t0 = time.perf_counter()
        build_shards(root / "corpus.jsonl", root / "shards", shards, progress=True)
        took["shards"] = round(time.perf_counter() - t0, 1)
    return took


def _queries(corpus: Path, n: int) -> list[tuple[str, str]]:
    """(title, url) of `n` pages spread over the corpus: a title query should find its page."""
    docs = [(d.title, d.url) for d in read_corpus(corpus)]
    step = max(1, len(docs) // n)
    return docs[::step][:n]


def _start(stack: ExitStack, index: Path, starts: dict[str, list[float]]) -> ServerProcess:
    """`serve search` over `index` in its own process for the block, its start-up seconds in `starts["single"]`."""
    t0 = time.perf_counter()
    server = stack.enter_context(
        ServerProcess(lambda port: ["serve", "search", "--index", str(index), "--port", str(port)], startup_s=1800)
    )
    starts["single"] = [time.perf_counter() - t0]
    return server


async def _load(url: str, queries: list[tuple[str, str]], clients: int, seconds: float) -> dict[str, Any]:
    """`clients` coroutines querying the arm at `url` for `seconds` through RemoteSearch; latencies, errors, top-k
    hits."""
    from searchgym.envs.tools.remote_search import RemoteOptions, RemoteSearch

    backend = RemoteSearch(url, RemoteOptions(max_connections=clients, timeout=60.0))
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    found = 0
    stop = time.perf_counter() + seconds

    async def client(i: int) -> None:
        nonlocal found
        n = i
        while time.perf_counter() < stop:
            title, url = queries[n % len(queries)]
            n += clients
            t0 = time.perf_counter()
            try:
                hits = await backend.search(title, K)
            except Exception as e:  # noqa: BLE001 -- every failure is counted by kind, none stops the run
                errors[type(e).__name__] += 1
                continue
            latencies.append(time.perf_counter() - t0)
            found += url in (h.url for h in hits)

    t0 = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    elapsed = time.perf_counter() - t0
    await backend.close()
    ordered = sorted(latencies)
    return {
        "answered": len(latencies),
        "errors": dict(errors),
        "elapsed_s": round(elapsed, 2),
        "queries_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(1000 * ordered[len(ordered) // 2], 1) if ordered else None,
        "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1) if ordered else None,
        "page_in_top_k": round(found / len(latencies), 4) if latencies else None,
    }


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "queries_per_s": round(statistics.mean(r["queries_per_s"] for r in rows), 1),
        "p99_ms": max((r["p99_ms"] for r in rows if r["p99_ms"] is not None), default=None),
        "errors": sum(sum(r["errors"].values()) for r in rows),
        "page_in_top_k": round(statistics.mean(r["page_in_top_k"] for r in rows if r["page_in_top_k"] is not None), 4)
        if any(r["page_in_top_k"] is not None for r in rows)
        else None,
    }


def _machine() -> dict[str, Any]:
    import platform

    return {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "load_before": os.getloadavg(),
    }


def scale_out_command(settings: ScaleOutSettings) -> None:
    import json

    report = run_scale_out(settings)
    print(json.dumps({"startup_s": report["startup_s"], "summary": report["summary"]}, indent=2))
    print(f"written to {settings.out}")
