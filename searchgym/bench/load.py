"""`searchgym bench load`: each server in its own process under 50, 200 and 1,000 concurrent clients.

For every server (`serve model` on the tiny model, `serve search` on a small index, `serve env` over OpenEnv)
and every request mode of `load_targets`, one run per client count: idle sockets are opened first (half that
connect and send nothing, half that send part of a request's headers and stop) and held through the run, one
oversized request (10 MB by default) is sent as the clients start, and every client sends `rounds` requests,
each answer checked against the same request's answer alone. Recorded per run: items/s answered right, p50/p99
request latency, errors by kind, how the oversized request ended, how many idle sockets the server closed, and
the server's RSS and open file descriptors (from /proc/<pid>) before, after the load (idle sockets still held)
and after they are released. Numbers go to results/bench_load.json, never asserted in tests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from searchgym.bench.load_targets import EnvTarget, ModelTarget, SearchTarget, error_kind
from searchgym.serve.limits import raise_open_files_limit
from searchgym.settings import setting

CLIENTS = (50, 200, 1000)
ENV_ID = "searchgym/SyntheticQA-v0"
ENV_KWARGS = {
    "size": 1000,
    "seed": 0,
    "n_tasks": 200,
    "hops": 1,
    "instructions": "brief",
    "top_k": 1,
    "doc_chars": 120,
    "max_turns": 3,
}
HALF_OPEN = b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"  # no blank line


def proc_stats(pid: int) -> dict[str, Any]:
    """The process's resident memory (MB) and open file descriptors, read from /proc."""
    rss_kb = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    return {"rss_mb": round(rss_kb / 1024, 1), "fds": len(os.listdir(f"/proc/{pid}/fd"))}


class ServerProcess:
    """`searchgym <argv>` in a child process on a free loopback port, up once /health answers; SIGTERM on exit."""

    def __init__(self, argv_for_port: Any, startup_s: float = 180) -> None:
        self.argv_for_port, self.startup_s = argv_for_port, startup_s

    def __enter__(self) -> ServerProcess:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()  # a file, not a pipe: a pipe nobody reads stalls a chatty server
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "searchgym.cli", *self.argv_for_port(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )
        deadline = time.monotonic() + self.startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.stderr_tail()!r}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                    if s.recv(64).startswith(b"HTTP/1.1 200"):
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"server did not answer /health within {self.startup_s} s")

    def stderr_tail(self, n: int = 2000) -> str:
        """The last `n` characters the server wrote to stderr."""
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")[-n:]

    def stats(self) -> dict[str, Any]:
        return proc_stats(self.proc.pid)

    def __exit__(self, *exc: Any) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


async def open_idle(port: int, n: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """n connections to the server: the even ones say nothing, the odd ones send half a request's headers."""

    async def one(i: int) -> Any:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 30)
        except (TimeoutError, OSError):
            return None
        if i % 2:
            writer.write(HALF_OPEN)
        return reader, writer

    conns = []
    for lo in range(0, n, 100):  # in waves: a listen backlog of 128 must not turn opening into the test
        conns += await asyncio.gather(*(one(i) for i in range(lo, min(n, lo + 100))))
    return [c for c in conns if c is not None]


async def closed_by_server(conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> int:
    """How many held connections the server has closed: end of stream (after any reply it sent, e.g. a 408) or a
    reset, seen within a moment; an open one just times out its read."""

    async def ended(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        if writer.transport.is_closing() or reader.exception() is not None:
            return True
        try:
            await asyncio.wait_for(reader.read(), 0.05)  # returns only at end of stream
            return True
        except TimeoutError:
            return False
        except OSError:
            return True

    return sum(await asyncio.gather(*(ended(r, w) for r, w in conns)))


async def close_idle(conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> None:
    for _, writer in conns:
        writer.close()
    await asyncio.gather(*(w.wait_closed() for _, w in conns), return_exceptions=True)


async def send_oversized(http: aiohttp.ClientSession, url: str, path: str, body: Any, timeout: float) -> dict[str, Any]:
    """The one oversized request: how it ended (status, or the error it raised) and after how long."""
    nbytes = len(json.dumps(body))
    t0 = time.perf_counter()
    try:
        async with http.post(url + path, json=body, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            text = (await resp.read())[:200].decode("utf-8", "replace")
            out = {"status": resp.status, "reply": text}
    except Exception as e:  # noqa: BLE001 -- recorded: a reset or timeout is this request's result
        out = {"status": None, "error": f"{error_kind(e)}: {e}"[:200]}
    return {"path": path, "bytes": nbytes, **out, "seconds": round(time.perf_counter() - t0, 2)}


def _percentile(ordered: list[float], q: float) -> float:
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1) if ordered else 0.0


@dataclass(frozen=True)
class RunShape:
    """What one run does besides its clients: rounds per client, idle sockets held beside them, the oversized
    request's size, a client's reply timeout, and the server's header timeout (None: idle sockets are counted at
    once after the load)."""

    rounds: int
    idle: int
    oversized_bytes: int
    timeout: float
    header_timeout: float | None = None


async def one_run(target: Any, server: ServerProcess, mode: str, clients: int, shape: RunShape) -> dict[str, Any]:
    """`clients` clients at once beside `shape.idle` held sockets and one oversized request; the run's row.

    With a header timeout (the server's), idle sockets are counted closed once it has passed since they were
    opened (and a 10 s grace); without, at once after the load."""
    rounds, idle, timeout, header_timeout = shape.rounds, shape.idle, shape.timeout, shape.header_timeout
    before = server.stats()
    opened = time.perf_counter()
    conns = await open_idle(server.port, idle)
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    items = [0]

    def record(seconds: float | None, n: int, kind: str | None) -> None:
        if seconds is not None:
            latencies.append(seconds)
        items[0] += n
        if kind:
            errors[kind] += 1

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        path, body = target.oversized(shape.oversized_bytes)
        big = asyncio.create_task(send_oversized(http, server.url, path, body, max(timeout, 120)))
        t0 = time.perf_counter()
        await asyncio.gather(
            *(target.client(http, server.url, mode, i, rounds, record, timeout) for i in range(clients))
        )
        seconds = time.perf_counter() - t0
        oversized = await big
    held_after = server.stats()
    deadline = opened + (-1e9 if header_timeout is None else header_timeout + 10)
    while await closed_by_server(conns) < len(conns) and time.perf_counter() < deadline:
        await asyncio.sleep(0.25)
    closed = await closed_by_server(conns)
    after_idle = server.stats()
    await close_idle(conns)
    await asyncio.sleep(0.5)
    ordered = sorted(latencies)
    return {
        "mode": mode,
        "clients": clients,
        "requests": len(latencies),
        "items_right": items[0],
        "seconds": round(seconds, 2),
        "items_per_s": round(items[0] / seconds, 1),
        "p50_ms": _percentile(ordered, 0.5),
        "p99_ms": _percentile(ordered, 0.99),
        "errors": sum(errors.values()),
        "errors_by_kind": dict(errors.most_common()),
        "idle_sockets": {"held": len(conns), "asked": idle, "closed_by_server": closed},
        "oversized": oversized,
        "server_before": before,
        "server_after_load": held_after,
        "server_after_idle_timeout": after_idle,
        "server_after_release": server.stats(),
    }


async def _drive(target: Any, server: ServerProcess, clients: list[int], shape: RunShape) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        await target.prepare(http, server.url)
    return {"runs": [await one_run(target, server, mode, c, shape) for c in clients for mode in target.modes]}


@dataclass
class LoadBenchSettings:
    """`searchgym bench load`: the servers driven at many clients, or (`markdown`) the table of a report."""

    servers: list[str] = setting(
        default_factory=lambda: ["model", "search", "env"], help="comma-separated: model, search, env"
    )
    quick: bool = setting(False, help="a smoke test: 20 and 50 clients, 50 idle sockets, 1 MB")
    out: Path | None = setting(None, help="default results/bench_load.json (--quick: results/bench_load_quick.json)")
    markdown: bool = setting(False, help="only print docs/reliability.md's table of --out")
    clients: list[int] = setting(default_factory=lambda: list(CLIENTS), help="client counts, comma-separated")
    rounds: int = setting(2, at_least=1, help="rounds per client count")
    idle: int = setting(1000, at_least=0, help="idle sockets held open beside the clients")
    oversized_mb: float = setting(10.0, above=0, help="size of the one oversized request")
    timeout: float = setting(60.0, above=0, help="seconds a client waits for a reply")
    model: Path | None = setting(None, help="the model server's model directory (default: a tiny model)")
    workdir: Path | None = setting(None, help="where the tiny model is built (default: a temp dir)")
    references: int = setting(32, at_least=1, help="distinct prompts, queries and tasks, each asked alone first")
    header_timeout: float = setting(10.0, above=0, help="every server's --header-timeout (idle sockets closed)")


def run_load(settings: LoadBenchSettings) -> dict[str, Any]:
    """Drive each server at each client count; write the report to `out` (unless None) and return it.

    Every server runs with `--header-timeout header_timeout`: idle sockets are counted closed after it.
    `references` distinct prompts, queries and tasks are asked alone first; the clients cycle through them."""
    import searchgym  # noqa: F401  (registers the env ids)
    from searchgym.agents.tiny_model import build_tiny_model
    from searchgym.bench.env import _machine
    from searchgym.envs.factory import make_unwrapped
    from searchgym.world.bundle import ensure_bundle

    unknown = [s for s in settings.servers if s not in ("model", "search", "env")]
    if unknown:
        raise ValueError(f"servers: unknown {unknown}; choose from model, search, env")
    limits = raise_open_files_limit()
    t_start = time.perf_counter()
    env = make_unwrapped(ENV_ID, **ENV_KWARGS)
    tasks = [(t.id, t.metadata["start_query"], t.answers[0]) for t in list(env.tasks)[: settings.references]]
    env.close()
    shape = RunShape(
        settings.rounds,
        settings.idle,
        int(settings.oversized_mb * 1_000_000),
        settings.timeout,
        settings.header_timeout,
    )
    report = _report_head(settings, limits, _machine())
    with ExitStack() as stack:
        work = Path(settings.workdir) if settings.workdir else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        targets: dict[str, Callable[[], Any]] = {
            "search": lambda: SearchTarget(
                ensure_bundle(size=1000, seed=0, n_tasks=200) / "index", [q for _, q, _ in tasks]
            ),
            "env": lambda: EnvTarget(ENV_ID, ENV_KWARGS, tasks, max_sessions=max(settings.clients) + 64),
        }
        model = settings.model
        if "model" in settings.servers:
            if model is None:
                model = work / "tiny-model"
                if not (model / "config.json").exists():
                    build_tiny_model(model, seed=0)
            elif not (Path(model) / "config.json").exists():
                raise ValueError(f"model: {model} is not a model directory (no config.json)")
            targets["model"] = lambda: ModelTarget(Path(model), n_prompts=settings.references)
        for name in settings.servers:
            target = targets[name]()
            with ServerProcess(
                lambda port, target=target: [*target.argv(port), "--header-timeout", str(settings.header_timeout)]
            ) as server:
                row = asyncio.run(_drive(target, server, settings.clients, shape))
                report["servers"][name] = {"argv": target.argv(0)[:2], "pid_open_files_limit": _limit(server), **row}
    report["machine"]["load_after"] = os.getloadavg()
    report["summary"] = summary(report)
    report["seconds"] = round(time.perf_counter() - t_start, 1)
    if settings.out is not None:
        Path(settings.out).parent.mkdir(parents=True, exist_ok=True)
        Path(settings.out).write_text(json.dumps(report, indent=2) + "\n")
    return report


def _report_head(settings: LoadBenchSettings, limits: tuple[int, int], machine: dict[str, Any]) -> dict[str, Any]:
    """The report before any server ran: the machine and the settings."""
    return {
        "machine": {**machine, "load_before": os.getloadavg()},
        "config": {
            "clients": list(settings.clients),
            "rounds_per_client": settings.rounds,
            "idle_sockets": settings.idle,
            "oversized_mb": settings.oversized_mb,
            "timeout_s": settings.timeout,
            "references": settings.references,
            "header_timeout_s": settings.header_timeout,
            "open_files_limit": list(limits),
        },
        "servers": {},
    }


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """At the most clients: errors per server (all modes) and in all, and idle sockets the servers closed."""
    top = max(report["config"]["clients"])
    runs = {name: [r for r in s["runs"] if r["clients"] == top] for name, s in report["servers"].items()}
    errors = {name: sum(r["errors"] for r in rs) for name, rs in runs.items()}
    return {
        "clients": top,
        "errors": {**errors, "total": sum(errors.values())},
        "idle_closed": {name: sum(r["idle_sockets"]["closed_by_server"] for r in rs) for name, rs in runs.items()},
        "idle_held": {name: sum(r["idle_sockets"]["held"] for r in rs) for name, rs in runs.items()},
    }


def _limit(server: ServerProcess) -> str:
    """The server's own open-files limit line from /proc (it inherits the raised one)."""
    return next(
        (
            " ".join(line.split()[3:5])
            for line in Path(f"/proc/{server.proc.pid}/limits").read_text().splitlines()
            if line.startswith("Max open files")
        ),
        "?",
    )


DOCS_MARK = "<!-- generated by `searchgym bench load --markdown` from results/bench_load.json -->"


def markdown_table(report: dict[str, Any]) -> str:
    """docs/reliability.md's load table, one row per server, mode and client count."""
    lines = [
        "| server | mode | clients | items/s | p50 ms | p99 ms | errors | idle closed | oversized | "
        "RSS MB before → after | fds before → after load → released |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for name, server in report["servers"].items():
        for r in server["runs"]:
            big = r["oversized"]
            ended = f"{big['status']} in {big['seconds']} s" if big["status"] else big.get("error", "?")[:40]
            kinds = ", ".join(f"{k}: {v}" for k, v in r["errors_by_kind"].items())
            before, after, released = r["server_before"], r["server_after_load"], r["server_after_release"]
            lines.append(
                f"| {name} | {r['mode']} | {r['clients']:,} | {r['items_per_s']:,.0f} | {r['p50_ms']:,.0f} | "
                f"{r['p99_ms']:,.0f} | {r['errors']:,}{f' ({kinds})' if kinds else ''} | "
                f"{r['idle_sockets']['closed_by_server']:,} of {r['idle_sockets']['held']:,} | {ended} | "
                f"{before['rss_mb']:,.0f} → {after['rss_mb']:,.0f} | {before['fds']:,} → {after['fds']:,} → "
                f"{released['fds']:,} |"
            )
    return "\n".join(lines) + "\n"


def load_bench_command(settings: LoadBenchSettings) -> None:
    # a --quick smoke test never replaces the committed report that README and docs render
    quick_out = settings.quick and not settings.markdown
    out = settings.out or Path("results/bench_load_quick.json" if quick_out else "results/bench_load.json")
    if settings.markdown:  # docs/reliability.md's load table is this output
        print(markdown_table(json.loads(out.read_text())), end="")
        return
    quick: dict[str, Any] = (
        {"clients": [20, 50], "rounds": 1, "idle": 50, "oversized_mb": 1.0, "header_timeout": 3.0}
        if settings.quick
        else {}
    )
    report = run_load(dataclasses.replace(settings, out=out, **quick))
    print(markdown_table(report), end="")
    print(f"written to {out}")
