"""`searchgym bench load` on a tiny configuration: every server answers every small request as it does alone,
with idle sockets held and one oversized request among them, and the bench counts what goes wrong as errors."""

import asyncio
import json
from pathlib import Path

import pytest

from searchgym.bench import load
from searchgym.bench.load_targets import SearchTarget
from searchgym.bench.reliability import generated_block
from searchgym.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
RUN_KEYS = {
    "mode",
    "clients",
    "requests",
    "items_right",
    "seconds",
    "items_per_s",
    "p50_ms",
    "p99_ms",
    "errors",
    "errors_by_kind",
    "idle_sockets",
    "oversized",
    "server_before",
    "server_after_load",
    "server_after_idle_timeout",
    "server_after_release",
}
ITEMS_PER_REQUEST = {
    ("model", "single"): 1,
    ("model", "batched"): 8,
    ("search", "single"): 1,
    ("search", "batched"): 32,
    ("env", "single"): 1,
    ("env", "reused"): 1,
}


@pytest.mark.parametrize("name", ["model", "search", "env"])
def test_a_server_answers_every_small_request_beside_idle_sockets_and_an_oversized_one(
    name, tmp_path, request, small_bundle
):
    if name == "env":
        pytest.importorskip("openenv")
    model = request.getfixturevalue("tiny_model_dir") if name == "model" else None
    out = tmp_path / "load.json"
    report = load.run_load(
        load.LoadBenchSettings(
            out=out,
            clients=[20],
            rounds=1,
            idle=20,
            oversized_mb=0.2,
            timeout=60,
            servers=[name],
            model=model,
            references=8,
            header_timeout=2,
        )
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert set(report["servers"]) == {name}
    runs = report["servers"][name]["runs"]
    assert [r["mode"] for r in runs] == [m for s, m in ITEMS_PER_REQUEST if s == name]
    for run in runs:
        assert set(run) == RUN_KEYS
        per_request = ITEMS_PER_REQUEST[name, run["mode"]]
        requests = 20 * (3 if name == "env" else 1)  # an env episode is reset, search, answer
        # every small request answered, and answered as the same request alone (a wrong one counts 0 items)
        assert run["errors"] == 0 and run["errors_by_kind"] == {}, run
        assert run["requests"] == requests and run["items_right"] == requests * per_request, run
        assert run["p50_ms"] <= run["p99_ms"] and run["items_per_s"] > 0
        assert run["idle_sockets"]["held"] == 20
        assert run["idle_sockets"]["closed_by_server"] == 20, run["idle_sockets"]  # the header timeout closed them
        assert run["server_after_idle_timeout"]["fds"] <= run["server_before"]["fds"] + 3, run  # and their fds
        big = run["oversized"]
        assert big["bytes"] > 200_000 and big["status"] is not None and big["status"] < 500, big  # never a 5xx
        for when in ("server_before", "server_after_load", "server_after_release"):
            assert run[when]["rss_mb"] > 10 and run[when]["fds"] > 2
        assert run["server_after_load"]["fds"] >= run["server_before"]["fds"] + 10  # the held sockets are its
        if name == "model":  # 100,000 tokens against an 8,192-token context: refused, saying why
            assert 400 <= big["status"] < 500 and "error" in big["reply"], big
    assert report["summary"] == {
        "clients": 20,
        "errors": {name: 0, "total": 0},
        "idle_closed": {
            name: runs[0]["idle_sockets"]["closed_by_server"] + runs[1]["idle_sockets"]["closed_by_server"]
        },
        "idle_held": {name: 40},
    }
    table = load.markdown_table(report)
    assert table.count("\n") == 2 + 2 and f"| {name} | {runs[1]['mode']} | 20 |" in table


def test_the_docs_table_is_the_committed_report_rendered():
    report = json.loads((ROOT / "results" / "bench_load.json").read_text())
    docs = (ROOT / "docs" / "reliability.md").read_text()
    assert generated_block(docs, load.DOCS_MARK) == load.markdown_table(report)
    assert report["summary"] == load.summary(report)
    assert set(report["servers"]) == {"model", "search", "env"} and report["config"]["clients"] == [50, 200, 1000]


def test_a_wrong_answer_under_load_is_counted(small_bundle):
    """A server whose answers differ from the reference shows as errors, not as queries answered."""
    target = SearchTarget(small_bundle / "index", ["Footsteps of Kuveth", "Tullil Brewery", "memoir"])

    async def drive(server):
        import aiohttp

        async with aiohttp.ClientSession() as http:
            await target.prepare(http, server.url)
        target.reference = [[*ids, "not-a-hit"] for ids in target.reference]  # as if the server lost a hit
        shape = load.RunShape(rounds=2, idle=4, oversized_bytes=1000, timeout=30)
        return await load.one_run(target, server, "single", 5, shape)

    with load.ServerProcess(target.argv) as server:
        run = asyncio.run(drive(server))
    assert run["errors_by_kind"] == {"wrong answer": 10} and run["items_right"] == 0


@pytest.mark.parametrize("hangs_up", [True, False])
def test_idle_sockets_are_counted_closed_only_when_the_server_closed_them(hangs_up):
    async def main():
        async def serve(reader, writer):
            if hangs_up:
                writer.close()
            else:
                await reader.read()  # holds the connection until the client goes

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        conns = await load.open_idle(port, 6)
        await asyncio.sleep(0.3)
        closed = await load.closed_by_server(conns)
        await load.close_idle(conns)
        server.close()
        return len(conns), closed

    assert asyncio.run(main()) == (6, 6 if hangs_up else 0)


def test_unknown_server_names_are_refused_naming_the_setting(capsys):
    assert cli_main(["bench", "load", "--servers", "model,gpu"]) == 2
    err = capsys.readouterr().err
    assert "servers" in err and "'gpu'" in err
