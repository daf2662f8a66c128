"""`searchgym bench reliability`: every fault class of issue 15 with fixed seeds, counted into one table.

    ssrf          URL spellings of addresses in every non-global range (literal, integer, hex, octal, short,
                  IPv6-embedded, behind a DNS name): each must be refused by the SSRF guard
    actions       agent turns (tag soup, nested/wrongly typed/surrogate JSON calls, huge text, non-strings)
                  through env.step, tag and Hermes formats: each must be an observation in the space
    web pages     lying responses from a loopback web server (codecs that are not text encodings, junk
                  headers, random bytes): fetch gives a page or a clear BackendError; env.step an observation
    server bodies junk bodies to every POST route of the retrieval server and the model server: 200 or 4xx
    caches        damaged web-cache rows (a counted miss; in replay an error observation) and a damaged
                  cache file (one error naming it)
    kills         SIGKILL of eval, synthesize (agent, kbwalk) and train at seeded points, with cut and
                  damaged lines and a cut checkpoint file (searchgym.testing.kills)

Each class counts forms tried, faults injected, faults handled as promised, kills survived, crashes (an
exception out of a call that promises none, a 5xx, a rerun that fails unclearly) and items lost. The
json goes to results/reliability.json; `markdown_table` renders the README's table from it.
"""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchgym.settings import setting
from searchgym.testing import faults
from searchgym.testing.kills import DrillResult, drill_agent_synthesis, drill_eval, drill_kbwalk_synthesis, drill_train

SEED = 15
COLUMNS = ("forms_tried", "faults_injected", "handled", "kills_survived", "crashes", "items_lost")


@dataclass
class _Row:
    """One class's counts, as a row of the report's table."""

    name: str
    forms: int
    injected: int
    handled: int
    crashes: int
    kills: int = 0
    lost: int = 0
    notes: list[str] | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "class": self.name,
            "forms_tried": self.forms,
            "faults_injected": self.injected,
            "handled": self.handled,
            "kills_survived": self.kills,
            "crashes": self.crashes,
            "items_lost": self.lost,
            "notes": (self.notes or [])[:10],
            "seconds": round(self.seconds, 1),
        }


class _Tally:
    """Counts one class: each fault handled as promised, or a crash with a note of what happened."""

    def __init__(self, name: str) -> None:
        self.name, self.forms, self.handled, self.crashes = name, 0, 0, 0
        self.notes: list[str] = []
        self.t0 = time.perf_counter()

    def ok(self) -> None:
        self.forms += 1
        self.handled += 1

    def bad(self, what: str) -> None:
        self.forms += 1
        self.crashes += 1
        self.notes.append(what[:300])

    def row(self) -> dict[str, Any]:
        return _Row(
            self.name,
            self.forms,
            self.forms,
            self.handled,
            self.crashes,
            notes=self.notes,
            seconds=time.perf_counter() - self.t0,
        ).as_dict()


# --- classes that run in this process ---------------------------------------------------------------------


async def ssrf(rng: random.Random) -> dict[str, Any]:
    """Every URL spelling of addresses in every non-global range, literal and behind a DNS name: refused."""
    from searchgym.envs.tools.url_safety import UnsafeURL, UrlPolicy

    tally = _Tally("ssrf url forms")
    loop = asyncio.get_running_loop()
    resolved: dict[str, str] = {}

    async def fake_getaddrinfo(host: str, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        import socket

        ip = resolved[host]
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 6, "", (ip, port or 0, 0, 0) if ":" in ip else (ip, port or 0))]

    loop.getaddrinfo = fake_getaddrinfo  # type: ignore[method-assign,assignment]  # this loop only: a name resolves to the form
    try:
        policy = UrlPolicy()
        for i, ip in enumerate(faults.ssrf_addresses(rng)):
            name = f"host-{i}.reliability.test"
            resolved[name] = str(ip)
            for url in [*faults.ssrf_urls(ip), f"http://{name}/", f"https://{name}:8443/a?b=c"]:
                try:
                    await policy.check(url)
                except UnsafeURL:
                    tally.ok()
                except Exception as e:  # noqa: BLE001 -- counted: the guard must refuse, not fail otherwise
                    tally.bad(f"{url}: {type(e).__name__}: {e}")
                else:
                    tally.bad(f"{url} ({ip}) was let through")
    finally:
        del loop.getaddrinfo
    return tally.row()


def actions(rng: random.Random, n: int) -> dict[str, Any]:
    """Fuzzed agent turns through env.step in both tool formats: always an observation in the space."""
    import gymnasium as gym

    import searchgym  # noqa: F401  (registers the env ids)

    tally = _Tally("agent turns (env.step)")
    forms = faults.action_forms(rng, n)
    for tool_format in ("tags", "hermes"):
        env = gym.make(
            "searchgym/SyntheticQA-v0", size=1000, n_tasks=200, max_turns=10_000, tool_format=tool_format
        ).unwrapped
        env.reset(seed=SEED)
        for form in forms:
            try:
                obs, reward, terminated, truncated, info = env.step(form)
                if not env.observation_space.contains(obs):
                    tally.bad(f"{tool_format}: an observation outside the space for {str(form)[:80]!r}")
                    continue
                tally.ok()
                if terminated or truncated:
                    env.reset()
            except Exception as e:  # noqa: BLE001
                tally.bad(f"{tool_format}: {type(e).__name__}: {e} for {str(form)[:80]!r}")
                env.reset()
        env.close()
    return tally.row()


async def web_pages(rng: random.Random, n: int) -> dict[str, Any]:
    """Lying pages from a loopback server: fetch gives a page or a clear error, env.step an observation."""
    from aiohttp import web

    from searchgym.envs.search_env import SearchEnv
    from searchgym.envs.tasks import Task, TaskPool
    from searchgym.envs.tools.base import BackendError, PageNotFound
    from searchgym.envs.tools.web_fetch import FetchOptions, WebFetcher
    from searchgym.serve.http import serve_app

    tally = _Tally("web pages (fetch, env.step)")
    current: list[Any] = [(200, {}, b"")]

    async def page(request: web.Request) -> web.Response:
        status, headers, body = current[0]
        return web.Response(status=status, headers=headers, body=body)

    class NoSearch:
        async def search(self, query: str, k: int) -> list[Any]:
            return []

    app = web.Application()
    app.router.add_get("/page", page)
    async with serve_app(app, "127.0.0.1", 0, shutdown_timeout=0.1) as base:
        port = int(base.rsplit(":", 1)[1].rstrip("/"))
        fetcher = WebFetcher(FetchOptions(allow=[f"127.0.0.1:{port}"], total_timeout=5))
        env = SearchEnv(TaskPool([Task("t", "q?", ("a",))]), NoSearch(), fetcher, max_turns=10_000)
        await env.areset(options={"index": 0})
        try:
            for response in faults.web_responses(rng, n):
                current[0] = response
                what = f"status {response[0]}, {response[1]}, {len(response[2])} bytes"
                try:
                    fetched = await fetcher.fetch(base + "/page")
                    if not isinstance(fetched.text, str) or not isinstance(fetched.title, str):
                        tally.bad(f"fetch gave a page without text: {what}")
                        continue
                except (BackendError, PageNotFound):
                    pass  # a clear, expected failure: the env turns it into an observation
                except Exception as e:  # noqa: BLE001
                    tally.bad(f"fetch: {type(e).__name__}: {e}: {what}")
                    continue
                try:
                    obs, *_ = await env.astep(f"<access>{base}/page</access>")
                    if env.observation_space.contains(obs):
                        tally.ok()
                    else:
                        tally.bad(f"step: an observation outside the space: {what}")
                except Exception as e:  # noqa: BLE001
                    tally.bad(f"step: {type(e).__name__}: {e}: {what}")
        finally:
            await fetcher.close()
    return tally.row()


async def server_bodies(
    rng: random.Random, n: int, index: Any, model_dir: Path, *, model_server: bool = True
) -> dict[str, Any]:
    """Junk bodies to every POST route of the retrieval server and the model server: 200 or 4xx, never 5xx."""
    import aiohttp

    from searchgym.agents.engines.torch_engine import TorchEngine
    from searchgym.serve.model.app import serving as serve_model
    from searchgym.serve.retrieval import serving as serve_search
    from searchgym.serve.settings import ModelServerSettings

    tally = _Tally("server request bodies")
    search_routes = {
        "/retrieve": {"queries": ["Sadesh Whispers"], "topk": 3, "return_scores": True},
        "/access": {"urls": ["https://world.searchgym.test/wiki/X"]},
    }
    model_routes = {
        "/generate": {"text": "hi", "sampling_params": {"max_new_tokens": 4}},
        "/v1/chat/completions": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        "/v1/completions": {"model": "m", "prompt": "hi", "max_tokens": 4},
        "/update_weight_version": {"new_version": "v1"},
        "/update_weights_from_disk": {"model_path": "/nonexistent/model"},
        "/abort_request": {"rid": "none"},
    }

    async def send(http: aiohttp.ClientSession, base: str, routes: dict[str, Any]) -> None:
        for path, valid in routes.items():
            for body in faults.junk_bodies(rng, n, valid):
                try:
                    async with http.post(base + path, data=body, timeout=aiohttp.ClientTimeout(total=60)) as resp:
                        await resp.read()
                        if resp.status < 500:
                            tally.ok()
                        else:
                            tally.bad(f"{path}: {resp.status} for {body[:80]!r}")
                except Exception as e:  # noqa: BLE001
                    tally.bad(f"{path}: {type(e).__name__}: {e}")
            async with http.get(base + "/health") as resp:  # and the server still answers
                if resp.status == 200:
                    tally.ok()
                else:
                    tally.bad(f"/health answered {resp.status}")

    async with aiohttp.ClientSession() as http:
        async with serve_search(index) as base:
            await send(http, base, search_routes)
    if not model_server:
        return tally.row()
    engine = TorchEngine(model_dir, seed=SEED)
    try:
        async with aiohttp.ClientSession() as http:
            # a short context: a junk body that drops max_tokens (null: up to the context) stays a short request
            settings = ModelServerSettings(model_path=str(model_dir), port=0, context_length=64)
            async with serve_model(engine, settings) as base:
                await send(http, base, model_routes)
    finally:
        await engine.close()
    return tally.row()


async def caches(rng: random.Random, workdir: Path) -> dict[str, Any]:
    """Damaged web-cache rows (page and search) and a damaged cache file."""
    from searchgym.envs.tools.base import BackendError, Page
    from searchgym.envs.tools.web_cache import CachedPages, CachedSearch, WebCache, normalise_url

    tally = _Tally("damaged caches")

    class Fresh:
        calls = 0

        async def fetch(self, url: str) -> Page:
            Fresh.calls += 1
            return Page(url=url, title="Fresh", text="fresh text")

        async def search(self, query: str, k: int) -> list[Any]:
            return []

    for i, row in enumerate(faults.DAMAGED_CACHE_ROWS):
        path, url = workdir / f"cache-{i}.sqlite", "https://example.com/"
        WebCache(path, "read_write").close()
        with sqlite3.connect(path) as db:
            db.execute("INSERT INTO entries VALUES (?, ?, ?, 0)", ("page", normalise_url(url), row))
            db.execute("INSERT INTO entries VALUES ('search', ?, ?, 0)", ("5\x00q", row))
        try:
            cache = WebCache(path, "read_write")
            page = await CachedPages(Fresh(), cache).fetch(url)
            await CachedSearch(Fresh(), cache).search("q", 5)
            damaged = cache.stats().get("damaged", 0)
            cache.close()
            if page.title == "Fresh" and damaged >= 1:
                tally.ok()
            else:
                tally.bad(f"row {row!r}: page {page.title!r}, damaged counted {damaged}")
            with sqlite3.connect(path) as db:
                db.execute("UPDATE entries SET value=? WHERE kind='page'", (row,))
            try:
                await CachedPages(Fresh(), WebCache(path, "replay_only")).fetch(url)
                tally.bad(f"replay of a damaged row {row!r} gave a page")
            except BackendError:
                tally.ok()
        except Exception as e:  # noqa: BLE001
            tally.bad(f"row {row!r}: {type(e).__name__}: {e}")
    bad_file = workdir / "damaged.sqlite"
    bad_file.write_bytes(rng.randbytes(4096))
    try:
        WebCache(bad_file, "read_write")
        tally.bad("a damaged cache file opened")
    except ValueError as e:
        if str(bad_file) in str(e):
            tally.ok()
        else:
            tally.bad(f"the error does not name the file: {e}")
    except Exception as e:  # noqa: BLE001
        tally.bad(f"a damaged cache file: {type(e).__name__}: {e}")
    return tally.row()


def round_three(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """Round 3's surfaces (issue 44; bench/reliability_sources.py), `n` forms of each kind: damaged sources
    (BrowseComp-Plus files, shard manifests, sample rows), and budgets and replies (agent deadlines, cost budgets,
    MCP bodies, shard scores)."""
    from searchgym.bench import reliability_sources as sources

    sourced = _Tally("damaged sources (BrowseComp-Plus, shards, samples)")
    sources.damaged_sources(sourced, rng, n)
    budgets = _Tally("budgets and replies (agents, cost, MCP, scores)")
    asyncio.run(sources.budgets_and_replies(budgets, rng, n))
    return [sourced.row(), budgets.row()]


# --- kills (subprocesses of the real CLI) -----------------------------------------------------------------


def _kill_row(result: DrillResult, seconds: float) -> dict[str, Any]:
    injected = result.kills + result.damaged_injected + result.files_truncated
    handled = result.kills_survived + result.damaged_reported + result.files_named
    return _Row(
        f"kill: {result.name}",
        result.kills + result.damaged_injected + result.files_truncated,
        injected,
        handled,
        result.crashes,
        kills=result.kills_survived,
        lost=result.items_lost + result.items_repeated,
        notes=result.notes,
        seconds=seconds,
    ).as_dict()


def _timed(drill: Callable[[], DrillResult]) -> dict[str, Any]:
    t0 = time.perf_counter()
    result = drill()
    return _kill_row(result, time.perf_counter() - t0)


@dataclass
class ReliabilitySettings:
    """`searchgym bench reliability`: every fault class with fixed seeds, or (`markdown`) a table of the report."""

    seed: int = setting(SEED, help="the seed of every fuzzed class")
    n: int = setting(200, at_least=1, help="forms per fuzzed class")
    kills: bool = setting(True, help="the kill-and-resume drills (subprocesses, minutes); --no-kills skips them")
    workdir: Path | None = setting(None, help="where the drills write (default: a temp dir)")
    out: Path = setting(Path("results/reliability.json"), help="the report JSON")
    markdown: str | None = setting(
        None,
        choices=(None, "readme", "docs"),
        help="only print README's (short) or docs/reliability.md's table of the existing --out report",
    )
    load: Path = setting(
        Path("results/bench_load.json"), help="the `bench load` report README's table also renders (when it exists)"
    )


def run_reliability(settings: ReliabilitySettings, model: Path | None = None) -> dict[str, Any]:
    """Run every fault class (kills too unless `settings.kills` is off); write the report to `settings.out` (unless
    None) and return it.

    `model` is the tiny model the model server and the eval/train drills use (default: one built in workdir).
    """
    from searchgym.agents.tiny_model import build_tiny_model
    from searchgym.envs.tools.local_index import LocalIndex
    from searchgym.world.bundle import ensure_bundle

    t0 = time.perf_counter()
    rng, n = random.Random(settings.seed), settings.n
    with ExitStack() as stack:
        work = Path(settings.workdir) if settings.workdir else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        work.mkdir(parents=True, exist_ok=True)
        bundle = ensure_bundle(size=1000, seed=0, n_tasks=200)
        if model is None:
            model = work / "tiny-model"
            if not (model / "config.json").exists():
                build_tiny_model(model, seed=settings.seed)
        rows = [
            asyncio.run(ssrf(rng)),
            actions(rng, n),
            asyncio.run(web_pages(rng, n)),
            asyncio.run(server_bodies(rng, max(n // 10, 5), LocalIndex(bundle / "index"), model)),
            asyncio.run(caches(rng, _fresh(work / "caches"))),
            *round_three(rng, max(n // 10, 5)),
        ]
        if settings.kills:
            rows += _kill_drills(random.Random(settings.seed), work, bundle, model)
    report = {
        "seed": settings.seed,
        "forms_per_class": n,
        "seconds": round(time.perf_counter() - t0, 1),
        "classes": rows,
        "total": {c: sum(r[c] for r in rows) for c in COLUMNS},
    }
    if settings.out is not None:
        Path(settings.out).parent.mkdir(parents=True, exist_ok=True)
        Path(settings.out).write_text(json.dumps(report, indent=2) + "\n")
    return report


def _kill_drills(kill_rng: random.Random, work: Path, bundle: Path, model: Path) -> list[dict[str, Any]]:
    """SIGKILL of eval, synthesize (agent, kbwalk) and train at seeded points, each resumed: one row each."""
    from searchgym.testing.stand_in_llm import StandInLLM, stand_in_server

    rows = []
    env = {
        "size": 1000,
        "seed": 0,
        "n_tasks": 200,
        "hops": 1,
        "instructions": "{question}",
        "top_k": 1,
        "doc_chars": 120,
        "max_turns": 4,
    }
    rows.append(
        _timed(
            lambda: drill_eval(
                _fresh(work / "eval"),
                model,
                env,
                kill_rows=sorted(kill_rng.sample(range(3, 14), 2)),
                tasks=8,
                k=2,
            )
        )
    )
    with stand_in_server(StandInLLM()) as url:
        rows.append(
            _timed(
                lambda: drill_agent_synthesis(
                    _fresh(work / "agent"),
                    bundle / "index",
                    url,
                    kill_rows=sorted(kill_rng.sample(range(2, 20), 3)),
                    n=24,
                )
            )
        )
    rows.append(
        _timed(
            lambda: drill_kbwalk_synthesis(
                _fresh(work / "kbwalk"),
                bundle,
                kill_after_s=[round(kill_rng.uniform(0.3, 3.0), 2) for _ in range(4)],
                n=400,
            )
        )
    )
    overrides = [
        f"model.path={model}",
        "env.kwargs.size=1000",
        "env.kwargs.n_tasks=200",
        "env.kwargs.max_turns=2",
        "rollout.group_size=2",
        "rollout.batch_size=2",
        "rollout.max_new_tokens=8",
        "rollout.max_staleness=1",
        "learner.drop_no_spread=false",
    ]
    rows.append(
        _timed(
            lambda: drill_train(
                _fresh(work / "train"), overrides, kill_rows=sorted(kill_rng.sample(range(1, 5), 2)), steps=5
            )
        )
    )
    return rows


def _fresh(path: Path) -> Path:
    """An empty directory at `path` (a rerun of the bench starts its drills over)."""
    import shutil

    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


HEADERS = (
    "fault class",
    "forms tried",
    "faults injected",
    "handled as promised",
    "kills survived",
    "crashes",
    "items lost",
)


def markdown_table(report: dict[str, Any]) -> str:
    """docs/reliability.md's table, one row per fault class, rendered from a results/reliability.json report."""
    lines = ["| " + " | ".join(HEADERS) + " |", "|---" + "|---:" * (len(HEADERS) - 1) + "|"]
    for row in [*report["classes"], {"class": "**total**", **report["total"]}]:
        lines.append("| " + " | ".join([row["class"], *(f"{row[c]:,}" for c in COLUMNS)]) + " |")
    return "\n".join(lines) + "\n"


SHORT_HEADERS = ("[faults](docs/reliability.md) injected", "kills survived", "crashes", "items lost")
SHORT_COLUMNS = ("faults_injected", "kills_survived", "crashes", "items_lost")


def readme_table(report: dict[str, Any], load: dict[str, Any] | None = None) -> str:
    """README's short table: the report's totals over every class (the classes are docs/reliability.md's table),
    and with a results/bench_load.json report, the errors of every server at its most clients."""
    headers, cells = list(SHORT_HEADERS), [f"{report['total'][c]:,}" for c in SHORT_COLUMNS]
    if load is not None:
        top = load["summary"]
        headers.append(f"[load](docs/reliability.md#load) errors at {top['clients']:,} clients")
        cells.append(f"[{top['errors']['total']:,}](results/bench_load.json)")
    lines = ["| " + " | ".join(headers) + " |", "|---:" * len(headers) + "|", "| " + " | ".join(cells) + " |"]
    return "\n".join(lines) + "\n"


README_MARK = "<!-- bench reliability --markdown readme -->"
DOCS_MARK = "<!-- generated by `searchgym bench reliability --markdown docs` from results/reliability.json -->"


def generated_block(text: str, mark: str) -> str:
    """The table that follows `mark` in a page (up to the first line that is not a table row)."""
    rest = text[text.index(mark) + len(mark) :].lstrip("\n")
    rows = []
    for line in rest.splitlines():
        if not line.startswith("|"):
            break
        rows.append(line)
    return "\n".join(rows) + "\n"


def reliability_command(settings: ReliabilitySettings) -> None:
    """Run every fault class and print the table, or (`markdown`) render a table of the existing report."""
    if settings.markdown:  # README's and docs/reliability.md's tables are this output
        report = json.loads(Path(settings.out).read_text())
        load = json.loads(settings.load.read_text()) if settings.load.exists() else None  # README's row renders both
        print(readme_table(report, load) if settings.markdown == "readme" else markdown_table(report), end="")
        return
    report = run_reliability(settings)
    print(markdown_table(report), end="")
    print(f"written to {settings.out}")
