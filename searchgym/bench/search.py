"""`searchgym bench search`: LocalIndex against its peers, and what the retrieval server costs.

On one synthetic world (100,000 pages by default), in one run:
- **peers**: LocalIndex (with snippets; ranking only; ranking batched over the cores), tantivy's default
  query path, bm25s (one query a call; batched on one thread and over the cores) and rank-bm25 on the
  same entity-name queries and on the same questions (1-hop KB-walk questions naming the entity),
  interleaved chunk by chunk; queries/s beside recall@5 and MRR of the answer page (the entity's own
  page), and the like-for-like ratios (`like_for_like`: each LocalIndex row over the peer doing the same work);
- **server**: the in-process index, then `searchgym serve search` in its own process queried through
  RemoteSearch at concurrency 1 and 64 (concurrent searches coalesce into shared requests) and batched
  (64 queries per /retrieve request);
- **envs**: 32 SearchEnvs playing oracle episodes concurrently, over the index in process and over the
  server through one shared RemoteSearch, with and without coalescing.
The machine's load average is recorded before and after. Numbers go to a JSON file, never asserted in tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchgym.bench.env import _machine
from searchgym.bench.search_peers import (
    BM25S,
    RANK,
    SNIPPETS,
    batched,
    bm25s_peers,
    local_index_peers,
    race,
    rank_bm25_peer,
    read_corpus_texts,
    tantivy_default_peer,
)
from searchgym.envs.search_env import SearchEnv
from searchgym.envs.tasks import TaskPool
from searchgym.envs.tools.indexes import open_index
from searchgym.envs.tools.local_index import LocalIndex, batch_threads
from searchgym.envs.tools.remote_search import RemoteOptions, RemoteSearch
from searchgym.settings import setting
from searchgym.world.kbwalk import KBWalker
from searchgym.world.oracle import OracleAgent
from searchgym.world.validation import synthesize_pool
from searchgym.world.world import World

K = 5


@dataclass
class SearchBenchSettings:
    """`searchgym bench search`: LocalIndex vs tantivy, bm25s, rank-bm25; the retrieval server and envs over it."""

    size: int = setting(100_000, at_least=100, help="pages in the synthetic world")
    queries: int = setting(2000, at_least=1, help="queries of each kind per measurement")
    out: Path = setting(Path("results/bench_search.json"), help="the results JSON")
    workdir: Path | None = setting(None, help="where to build the world (default: a temp dir)")
    concurrency: list[int] = setting(default_factory=lambda: [1, 64], help="concurrent queries measured")
    batch: int = setting(64, at_least=1, help="queries per /retrieve request")
    rank_bm25_queries: int = setting(200, at_least=1, help="queries rank-bm25 (slow) answers")
    n_envs: int = setting(32, at_least=1, help="envs over the server")
    n_tasks: int = setting(256, at_least=1, help="tasks the envs play")


def run_search_bench(settings: SearchBenchSettings) -> dict[str, Any]:
    """Build (or reuse) a `size`-page world and its index, then race the peers, the server and the envs."""
    size, n_queries, out, concurrency = settings.size, settings.queries, settings.out, tuple(settings.concurrency)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(settings.workdir or tmp)
        world = World(size, seed=0)
        if not (root / "corpus.jsonl").exists():
            world.write(root, progress=True)
        index = open_index(root)  # root/index, built on first use
        results: dict[str, Any] = {"size": size, "k": K, "machine": {**_machine(), "load_before": os.getloadavg()}}
        results["peers"] = _peers(world, index, root, n_queries, settings.rank_bm25_queries)
        queries = _mixed_queries(world, n_queries)
        results["queries"] = len(queries)
        results["in_process"] = _in_process(index, queries, concurrency)
        with _server_process(root / "index") as url:
            results["server"] = asyncio.run(_remote(url, queries, concurrency, settings.batch))
            results["envs"] = asyncio.run(_envs(world, index, url, settings.n_envs, settings.n_tasks))
        c1 = results["in_process"]["concurrency_1"]["qps"]
        results["server_vs_in_process_at_1"] = round(results["server"]["concurrency_1"]["qps"] / c1, 3)
        results["machine"]["load_after"] = os.getloadavg()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(results, indent=2) + "\n")
    return results


def _peers(world: World, index: LocalIndex, root: Path, n: int, rank_bm25_queries: int) -> dict[str, Any]:
    """Every peer on the name queries and on the questions; each LocalIndex row's queries/s over each peer's, and
    the like-for-like ratios apart."""
    names, questions = _name_queries(world, n), _question_queries(world, n)
    threads = batch_threads()
    ids, texts = read_corpus_texts(root / "corpus.jsonl")
    bm25s, built = bm25s_peers(ids, texts, K, threads=threads)
    rank, built_rank = rank_bm25_peer(ids, texts, K, max(1, rank_bm25_queries // 10))
    del texts
    out: dict[str, Any] = {"built": {**built, **built_rank}, "batch_threads": threads}
    for kind, pairs in (("name_queries", names), ("question_queries", questions)):
        locals_ = local_index_peers(index, K, threads)
        peers = [*locals_, tantivy_default_peer(root / "index", K), *bm25s, *rank]
        systems = race(peers, [q for q, _ in pairs], [a for _, a in pairs], chunks=20)
        out[kind] = {
            "queries": len(pairs),
            "example": pairs[0][0],
            "systems": systems,
            "like_for_like": _like_for_like(systems, threads),
            "threads_over_one": _threads_over_one(systems, threads),
            "local_index_speed_over": {
                mine.name: {
                    name: round(systems[mine.name]["qps"] / r["qps"], 2)
                    for name, r in systems.items()
                    if not name.startswith("LocalIndex") and r["qps"]
                }
                for mine in locals_
            },
        }
    return out


def _threads_over_one(systems: dict[str, Any], threads: int) -> dict[str, float]:
    """What the batch's threads buy each library: its batched queries/s on `threads` threads over one thread's."""
    pairs = {"LocalIndex": (batched(RANK, threads), RANK), BM25S: (batched(BM25S, threads), batched(BM25S, 1))}
    return {
        name: round(systems[a]["qps"] / systems[b]["qps"], 2)
        for name, (a, b) in pairs.items()
        if threads > 1 and a in systems and b in systems and systems[a]["qps"] and systems[b]["qps"]
    }


def _like_for_like(systems: dict[str, Any], threads: int) -> dict[str, float]:
    """LocalIndex over the peer doing the same work: ranking one query a call over bm25s one query a call; ranking
    a chunk a call over bm25s a chunk a call on the same threads (and on bm25s's default one); the env's search
    (hits with snippets) over tantivy's default path (hits' stored ids)."""
    pairs = {
        f"{RANK} / {BM25S}": (RANK, BM25S),
        f"{batched(RANK, threads)} / {batched(BM25S, threads)}": (batched(RANK, threads), batched(BM25S, threads)),
        f"{batched(RANK, threads)} / {batched(BM25S, 1)}": (batched(RANK, threads), batched(BM25S, 1)),
        f"{SNIPPETS} / tantivy default": (SNIPPETS, "tantivy default"),
        f"{RANK} / tantivy default": (RANK, "tantivy default"),
    }
    return {
        label: round(systems[a]["qps"] / systems[b]["qps"], 2)
        for label, (a, b) in pairs.items()
        if a in systems and b in systems and systems[a]["qps"] and systems[b]["qps"]
    }


def _name_queries(world: World, n: int) -> list[tuple[str, str]]:
    """(entity name, its page's id) for n entities drawn with a fixed seed."""
    rng = random.Random(0)
    return [(world.name(eid), world.entity(eid).doc_id) for eid in (rng.randrange(world.size) for _ in range(n))]


def _question_queries(world: World, n: int) -> list[tuple[str, str]]:
    """(1-hop question naming an entity, that entity's page id): "Who wrote the book X?" and the like."""
    walker = KBWalker(world, seed=0, fuzz_prob=0.0, comparison_prob=0.0, hop_weights={1: 1.0})
    out = []
    for candidate in walker.candidates():
        out.append((candidate.question, candidate.metadata["path"][0]["id"]))
        if len(out) >= n:
            return out
    return out


def _mixed_queries(world: World, n: int) -> list[str]:
    """Half entity names, half questions, shuffled with a fixed seed (the server measurements)."""
    mixed = [q for q, _ in _name_queries(world, n // 2)] + [q for q, _ in _question_queries(world, n - n // 2)]
    random.Random(0).shuffle(mixed)
    return mixed


def _rate(count: int, seconds: float, latencies: list[float] | None = None) -> dict[str, float]:
    """Queries/s, plus median and p99 latency in ms when per-request latencies were taken."""
    out = {"qps": round(count / seconds, 1), "seconds": round(seconds, 3)}
    if latencies:
        ordered = sorted(latencies)
        out["p50_ms"] = round(1000 * ordered[len(ordered) // 2], 2)
        out["p99_ms"] = round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2)
    return out


def _in_process(index: LocalIndex, queries: list[str], concurrency: tuple[int, ...]) -> dict[str, Any]:
    """search_sync in a loop (concurrency 1), and from a thread pool of that many threads (others)."""
    for q in queries[:50]:  # warm caches
        index.search_sync(q, K)
    results: dict[str, Any] = {}
    for c in concurrency:
        t0 = time.perf_counter()
        if c == 1:
            for q in queries:
                index.search_sync(q, K)
        else:
            with ThreadPoolExecutor(max_workers=c) as pool:
                list(pool.map(lambda q: index.search_sync(q, K), queries))
        results[f"concurrency_{c}"] = _rate(len(queries), time.perf_counter() - t0)
    return results


async def _remote(url: str, queries: list[str], concurrency: tuple[int, ...], batch: int) -> dict[str, Any]:
    """RemoteSearch with c searches in flight (coalescing into shared requests), then `batch` queries a request."""
    client = RemoteSearch(url, RemoteOptions(timeout=60, retries=0))
    try:
        for q in queries[:50]:  # warm the connection pool and the server
            await client.search(q, K)
        results: dict[str, Any] = {}
        for c in concurrency:
            latencies: list[float] = []
            pending = iter(queries)

            async def worker(pending: Iterator[str], latencies: list[float]) -> None:
                for q in pending:
                    t = time.perf_counter()
                    await client.search(q, K)
                    latencies.append(time.perf_counter() - t)

            t0 = time.perf_counter()
            await asyncio.gather(*(worker(pending, latencies) for _ in range(c)))
            results[f"concurrency_{c}"] = _rate(len(queries), time.perf_counter() - t0, latencies)
        t0 = time.perf_counter()
        for lo in range(0, len(queries), batch):
            await client.search_batch(queries[lo : lo + batch], K)
        results[f"batched_{batch}_per_request"] = _rate(len(queries), time.perf_counter() - t0)
        results["client_stats"] = client.stats()
        return results
    finally:
        await client.close()


async def _envs(world: World, index: LocalIndex, url: str, n_envs: int, n_tasks: int) -> dict[str, Any]:
    """Env steps/s of n_envs envs playing oracle episodes at once: over the index in process, and over the server
    through one shared RemoteSearch with coalescing (the default) and without (max_batch=1); two rounds, interleaved."""
    pool, _ = synthesize_pool(world, index, n_tasks, seed=1)
    setups = {
        "in_process": lambda: index,
        "server_coalesced": lambda: RemoteSearch(url, RemoteOptions(timeout=60, retries=0)),
        "server_one_query_per_request": lambda: RemoteSearch(url, RemoteOptions(timeout=60, retries=0, max_batch=1)),
    }
    totals: dict[str, dict[str, float]] = {name: {"steps": 0, "seconds": 0.0, "requests": 0} for name in setups}
    for _ in range(2):
        for name, make in setups.items():
            backend = make()
            steps, seconds = await _play(pool, backend, n_envs)
            totals[name]["steps"] += steps
            totals[name]["seconds"] += seconds
            if isinstance(backend, RemoteSearch):
                totals[name]["requests"] += backend.stats()["remote_requests"]
                await backend.close()
    out: dict[str, Any] = {"envs": n_envs, "episodes_per_round": len(pool)}
    for name, t in totals.items():
        out[name] = {"steps_per_s": round(t["steps"] / t["seconds"], 1), "steps": int(t["steps"])}
        if name != "in_process":
            out[name]["http_requests_per_step"] = round(t["requests"] / t["steps"], 3)
    base = out["in_process"]["steps_per_s"]
    out["server_coalesced_vs_in_process"] = round(out["server_coalesced"]["steps_per_s"] / base, 3)
    out["server_one_query_per_request_vs_in_process"] = round(
        out["server_one_query_per_request"]["steps_per_s"] / base, 3
    )
    return out


async def _play(pool: TaskPool, backend: Any, n_envs: int) -> tuple[int, float]:
    """Every task of the pool played once by the oracle, n_envs envs at a time; (steps, seconds)."""
    envs = [SearchEnv(pool, backend, backend, judge="em") for _ in range(n_envs)]
    tasks, oracle, steps = iter(pool), OracleAgent(), 0

    async def play(env: SearchEnv) -> None:
        nonlocal steps
        for task in tasks:
            turns = len((await oracle.arun(env, task)).turns)  # awaited first: `steps +=` must not span the await
            steps += turns

    t0 = time.perf_counter()
    await asyncio.gather(*(play(env) for env in envs))
    seconds = time.perf_counter() - t0
    for env in envs:
        env.close()
    return steps, seconds


class _server_process:
    """`searchgym serve search` in a child process on a free loopback port, stopped with SIGTERM on exit."""

    def __init__(self, index_dir: Path) -> None:
        self.index_dir = index_dir

    def __enter__(self) -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "searchgym",
                "serve",
                "search",
                "--index",
                str(self.index_dir),
                "--port",
                str(port),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"retrieval server exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return url
            except OSError:
                time.sleep(0.1)
        self.__exit__()
        raise RuntimeError("retrieval server did not start within 60 s")

    def __exit__(self, *exc: Any) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def search_bench_command(settings: SearchBenchSettings) -> None:
    print(json.dumps(run_search_bench(settings), indent=2))
