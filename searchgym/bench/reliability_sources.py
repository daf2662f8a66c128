"""The reliability bench's classes for round 3's surfaces (issue 44): damaged source files and derived indexes, and
budgets and replies that must not be outlived, swallowed or trusted.

- damaged sources: BrowseComp-Plus corpora, queries and qrels with a damaged line (latin-1, UTF-16, cut, junk, a
  duplicate, ...), sharded indexes whose `shards.json` or shard directories were tampered with, and eval sample rows
  whose fields hold junk. Handled: a clear error naming the user's file (and line), or a result equal to a fresh
  read of what the files hold now; never a traceback, never stale data.
- budgets and replies: agents that swallow cancellation or raise SystemExit (stopped within 2x their timeout, never
  judged), `cost_budget`s naming units no backend charges or non-finite limits (refused naming the key), JSON-RPC
  bodies that are not UTF-8 or nested deep (a 4xx from the MCP endpoint, never a 5xx), and shards sending NaN or
  infinite scores (a failed search, never a ranking).

Each function counts into a `Tally` (the bench's `_Tally`): `ok()` for a fault handled as promised, `bad(why)` else.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Protocol

from searchgym.testing import faults


class Tally(Protocol):
    """What the classes count into."""

    def ok(self) -> None: ...

    def bad(self, what: str) -> None: ...


DOCS = [
    ("101", "Orrin Vale Observatory\nThe observatory was founded in 1931 by Mirela Kost.", "https://example.org/orrin"),
    ("102", "Mirela Kost\nMirela Kost, astronomer, was born in Teslin Bay.", "https://example.org/kost"),
    ("103", "Teslin Bay\nTeslin Bay is a harbour town with a green lighthouse.", "https://example.org/teslin"),
]
QUERIES = [
    {"query_id": "1", "query": "Where was the founder of the Orrin Vale Observatory born?", "answer": "Teslin Bay"},
    {"query_id": "2", "query": "What colour is the lighthouse of Teslin Bay?", "answer": "green"},
]


def write_browsecomp_layout(root: Path) -> dict[str, Path]:
    """A small BrowseComp-Plus ROOT (queries, evidence qrels, corpus JSONL); its three files by name."""
    files = {
        "queries": root / "data" / "browsecomp_plus_decrypted.jsonl",
        "qrels": root / "topics-qrels" / "qrel_evidence.txt",
        "corpus": root / "corpus.jsonl",
    }
    for path in files.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    files["queries"].write_text("".join(json.dumps(q) + "\n" for q in QUERIES))
    files["qrels"].write_text("1 Q0 101 1\n1 Q0 102 1\n2 Q0 103 1\n")
    files["corpus"].write_text("".join(json.dumps({"docid": d, "text": t, "url": u}) + "\n" for d, t, u in DOCS))
    return files


def browsecomp_files(tally: Tally, rng: random.Random, work: Path, n: int) -> None:
    """`n` damaged BrowseComp-Plus files: an error naming the file (and line), or a conversion of what it holds."""
    from searchgym.envs.browsecomp_plus import converted_corpus, load_queries
    from searchgym.envs.source_files import SourceFileError
    from searchgym.envs.tools.corpus import read_corpus

    for i in range(n):
        root = work / f"bcp-{i}"
        files = write_browsecomp_layout(root)
        which, how = rng.choice(sorted(files)), rng.choice(faults.LINE_DAMAGES)
        source, cache = files[which], root / ".searchgym"
        try:
            converted_corpus(files["corpus"], cache)  # a good conversion first: it must not be served after
            source.write_bytes(faults.damage_lines(source.read_bytes(), how, rng.randrange(10)))
            try:
                load_queries(root)
                docs = [doc.id for doc in read_corpus(converted_corpus(files["corpus"], cache))]
            except SourceFileError as e:
                if str(e).startswith(str(source)):
                    tally.ok()
                else:
                    tally.bad(f"{which} {how}: the error does not name {source.name}: {e}")
                continue
            fresh = [str(json.loads(line)["docid"]) for line in files["corpus"].read_text().splitlines()]
            if docs == fresh:
                tally.ok()
            else:
                tally.bad(f"{which} {how}: served {docs}, the file holds {fresh}")
        except Exception as e:  # noqa: BLE001 -- counted: a damaged file must be a clear error, not a traceback
            tally.bad(f"{which} {how}: {type(e).__name__}: {e}")
        finally:
            shutil.rmtree(root, ignore_errors=True)


def every_page_found(index_dir: Path, docs: list[dict[str, Any]]) -> bool:
    """Whether every document is reachable through the shards `serve ray-search` would deploy for `index_dir` (its
    layout reads and checks shards.json): in the shard its url hashes to, found there by its title, its page there."""
    from searchgym.envs.tools.local_index import LocalIndex
    from searchgym.envs.tools.shards import shard_of
    from searchgym.serve.ray_search import RayServeLayout

    shards = [LocalIndex(path) for path in RayServeLayout(str(index_dir)).shard_indexes()]
    for doc in docs:
        home = shards[shard_of(doc["url"], len(shards))]
        if doc["url"] not in [h.url for h in home.search_sync(doc["title"], 10)]:
            return False
        if home.get_page(doc["url"]).title != doc["title"]:
            return False
    return True


def shard_manifests(tally: Tally, rng: random.Random, work: Path, n: int) -> None:
    """`n` tampered sharded indexes read as `serve ray-search` reads them: an error naming shards.json, or every page
    still found in its shard."""
    from searchgym.envs.source_files import SourceFileError
    from searchgym.envs.tools.shards import build_shards

    docs = [{"id": d, "title": t.split("\n")[0], "url": u, "text": t} for d, t, u in DOCS]
    (work / "shard-corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    built = build_shards(work / "shard-corpus.jsonl", work / "sharded", 3)

    for i in range(n):
        index = shutil.copytree(built, work / f"sharded-{i}")
        manifest = index / "shards.json"
        how = rng.choice(["bytes", "shards", "shard_docs", "drop shard", "drop index manifest", "value"])
        try:
            if how == "bytes":
                manifest.write_bytes(rng.randbytes(rng.randrange(40)))
            elif how in ("shards", "shard_docs"):
                value: Any = rng.randrange(-2, 6) if how == "shards" else [rng.randrange(9) for _ in range(3)]
                manifest.write_text(json.dumps({**json.loads(manifest.read_text()), how: value}))
            elif how == "drop shard":
                shutil.rmtree(index / f"shard-{rng.randrange(3):02d}")
            elif how == "drop index manifest":
                (index / f"shard-{rng.randrange(3):02d}" / "index" / "index.json").unlink()
            else:
                manifest.write_text(json.dumps(rng.choice([None, [], "3", 3.0, True, {"shards": "3"}])))
            try:
                found = every_page_found(index, docs)
            except SourceFileError as e:
                if str(e).startswith(str(manifest)):
                    tally.ok()
                else:
                    tally.bad(f"{how}: the error does not name shards.json: {e}")
                continue
            if found:
                tally.ok()
            else:
                tally.bad(f"{how}: opened, but pages were lost")
        except Exception as e:  # noqa: BLE001
            tally.bad(f"{how}: {type(e).__name__}: {e}")
        finally:
            shutil.rmtree(index, ignore_errors=True)


SAMPLE_FIELDS = [
    ("reward",),
    ("env_correct",),
    ("verdicts", "em", "score"),
    ("verdicts", "em", "correct"),
    ("stats", "turns"),
    ("stats", "generated_tokens"),
    ("stats", "answered"),
    ("stats", "stop_reason"),
    ("stats", "tool_cost"),
    ("subset",),
    ("sample",),
]


def good_sample_row(i: int) -> dict[str, Any]:
    return {
        "task_id": "t",
        "sample": i,
        "reward": 0.5,
        "env_correct": True,
        "subset": {"hops": 2},
        "verdicts": {"em": {"score": 1.0, "correct": True}},
        "stats": {
            "turns": 3,
            "searches": 1,
            "accesses": 1,
            "generated_tokens": 40,
            "answered": True,
            "stop_reason": "answer",
            "tool_cost": {"api_calls": 1},
        },
    }


def sample_rows(tally: Tally, rng: random.Random, work: Path, n: int) -> None:
    """`n` samples.jsonl files with one row's field replaced by junk: set aside naming the line, or summarised."""
    from searchgym.eval.harness import SampleStore, summarize_rows

    junk: list[Any] = [None, "1.0", "", [], {}, [1], {"a": []}, True, math.nan, math.inf, -(10**30), 10**30]
    for i in range(n):
        row = good_sample_row(1)
        field = rng.choice(SAMPLE_FIELDS)
        target = row
        for key in field[:-1]:
            target = target[key]
        target[field[-1]] = rng.choice(junk)
        path = work / f"samples-{i}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in (good_sample_row(0), row, good_sample_row(2))))
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                store = SampleStore(path)
            summarize_rows(list(store.rows.values()), 3)
            message = str(caught[0].message) if caught else ""
            if len(store.rows) == 3 or ("line 2: damaged" in message and len(store.rows) == 2):
                tally.ok()
            else:
                tally.bad(f"{'.'.join(field)}: {len(store.rows)} rows kept, warning {message[:200]!r}")
        except Exception as e:  # noqa: BLE001
            tally.bad(f"{'.'.join(field)}={target[field[-1]]!r}: {type(e).__name__}: {e}")


def damaged_sources(tally: Tally, rng: random.Random, n: int) -> None:
    """The damaged-sources class: BrowseComp-Plus files, shard manifests and sample rows, `n` forms each."""
    with tempfile.TemporaryDirectory() as tmp:
        browsecomp_files(tally, rng, Path(tmp), n)
        shard_manifests(tally, rng, Path(tmp), n)
        sample_rows(tally, rng, Path(tmp), n)


# --- budgets and replies ------------------------------------------------------------------------------------------


async def agent_deadlines(tally: Tally, rng: random.Random, n: int) -> None:
    """Agents that swallow cancellation, loop forever or exit: stopped within 2x the timeout, their answer dropped."""
    from searchgym.agents.budget import Abandoned, run_within

    stop = asyncio.Event()
    abandoned = Abandoned()

    async def stubborn() -> str:
        while not stop.is_set():
            try:
                await asyncio.sleep(0.005)
            except asyncio.CancelledError:
                pass
        return "late answer"

    async def exits() -> str:
        raise SystemExit(3)

    async def slow_then_answers() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.001)
            return "late answer"
        return "never"

    agents = {"swallows cancellation": stubborn, "raises SystemExit": exits, "answers late": slow_then_answers}
    for _ in range(n):
        name = rng.choice(sorted(agents))
        timeout = rng.choice([0.02, 0.05])
        closed: list[bool] = []

        def close(closed: list[bool] = closed) -> None:
            closed.append(True)

        t0 = time.perf_counter()
        try:
            answer, error = await run_within(agents[name], timeout, abandoned, close)
            took = time.perf_counter() - t0
            if answer is None and error and took < 2 * timeout + 0.05 and (name == "raises SystemExit" or closed):
                tally.ok()
            else:
                tally.bad(f"{name}: answer {answer!r}, error {error!r} after {took:.3f} s (timeout {timeout})")
        except BaseException as e:  # noqa: BLE001 -- an agent's exit must end its episode, not this run
            tally.bad(f"{name}: {type(e).__name__}: {e}")
    stop.set()
    await asyncio.sleep(0.02)


def cost_budgets(tally: Tally, rng: random.Random, n: int) -> None:
    """Budgets naming unknown units or junk limits are refused naming the key; valid ones are kept."""
    from searchgym.envs.tools.costs import COST_UNITS, check_cost_budget

    units = [*sorted(COST_UNITS), "model_call", "", "API_CALLS", "tokens", 1, None]
    limits: list[Any] = [1, 20, 0.5, 0, -1, math.nan, math.inf, True, "3", None]
    for _ in range(n):
        unit, limit = rng.choice(units), rng.choice(limits)
        valid = unit in COST_UNITS and isinstance(limit, (int, float)) and not isinstance(limit, bool)
        valid = valid and math.isfinite(limit) and limit > 0
        try:
            kept = check_cost_budget({unit: limit})
            if valid and kept == {unit: limit}:
                tally.ok()
            else:
                tally.bad(f"cost_budget {{{unit!r}: {limit!r}}} was accepted")
        except ValueError as e:
            if not valid and "cost_budget" in str(e):
                tally.ok()
            else:
                tally.bad(f"cost_budget {{{unit!r}: {limit!r}}}: {e}")
        except Exception as e:  # noqa: BLE001
            tally.bad(f"cost_budget {{{unit!r}: {limit!r}}}: {type(e).__name__}: {e}")


async def mcp_bodies(tally: Tally, rng: random.Random, n: int) -> None:
    """Junk, non-UTF-8 and deeply nested bodies to an agent's MCP episode endpoint: 4xx or 2xx, never a 5xx."""
    from searchgym.serve.mcp_endpoint import EpisodeToolServer, mcp_available

    if not mcp_available():
        return
    import aiohttp

    bodies = faults.junk_bodies(rng, n) + [b"[" * 100_000 + b"]" * 100_000, b'{"a": "\xff"}']

    async def call(name: str, arguments: dict[str, Any]) -> str:
        return "observation"

    head = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    async with EpisodeToolServer() as server, server.episode("ab", call) as url, aiohttp.ClientSession() as http:
        for body in bodies:
            try:
                async with http.post(url, data=body, headers=head) as resp:
                    if resp.status < 500:
                        tally.ok()
                    else:
                        tally.bad(f"{body[:60]!r}: HTTP {resp.status}")
            except Exception as e:  # noqa: BLE001
                tally.bad(f"{body[:60]!r}: {type(e).__name__}: {e}")


async def shard_scores(tally: Tally, rng: random.Random, n: int) -> None:
    """Shards sending NaN or infinite scores fail the Ray Serve ingress's merge (a 503 naming the shard); finite
    ones are merged."""
    from searchgym.serve.ray_search import ShardCallFailed, merge_shards

    choices = [1.0, 0.5, -2.0, 0.0, math.nan, math.inf, -math.inf]
    for _ in range(n):
        shards = [[rng.choice(choices) for _ in range(rng.randrange(1, 4))] for _ in range(rng.randrange(1, 4))]
        finite = all(math.isfinite(s) for scores in shards for s in scores)
        parts = [[[({"id": f"d{i}-{j}"}, s) for j, s in enumerate(scores)]] for i, scores in enumerate(shards)]
        try:
            merged = merge_shards(parts, 5)
            if finite and all(math.isfinite(s) for _, s in merged[0]):
                tally.ok()
            else:
                tally.bad(f"scores {shards} were merged")
        except ShardCallFailed:
            if finite:
                tally.bad(f"finite scores {shards} failed the search")
            else:
                tally.ok()
        except Exception as e:  # noqa: BLE001
            tally.bad(f"scores {shards}: {type(e).__name__}: {e}")


async def budgets_and_replies(tally: Tally, rng: random.Random, n: int) -> None:
    """The budgets-and-replies class: agent deadlines, cost budgets, MCP bodies and shard scores, `n` forms each."""
    await agent_deadlines(tally, rng, n)
    cost_budgets(tally, rng, n)
    await mcp_bodies(tally, rng, n)
    await shard_scores(tally, rng, n)
