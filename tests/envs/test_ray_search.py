"""`serve search` as a Ray Serve application, on a local Ray on CPU: byte for byte the replies of `serve search` over
a whole index, over shards the replies of `serve search` on each shard merged by score (ties: lower shard first, then
each shard's order), 4xx for junk, and a shard replica killed while clients query losing no query."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time

import aiohttp
import pytest

from searchgym.envs.tools.base import BackendError
from searchgym.envs.tools.corpus import read_corpus
from searchgym.envs.tools.local_index import LocalIndex
from searchgym.envs.tools.remote_search import RemoteOptions, RemoteSearch
from searchgym.envs.tools.shards import build_shards, shard_dir
from searchgym.serve.retrieval import serving

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from searchgym.serve.ray_search import RayServeLayout, deploy, merge_shards, start_serve  # noqa: E402

# under pytest-xdist, the tests that start a local Ray cluster run on one worker, one cluster at a time
pytestmark = pytest.mark.xdist_group("ray")

SHARDS = 2
TIMEOUT = 30.0
# a call still unanswered after this long is a hang (lost): past every bound the client sets itself (RemoteSearch's
# TIMEOUT per attempt, 3 attempts), so a call slowed by a loaded machine ends as an answer or a clear error first
HANG = 4 * TIMEOUT
BATCH = 2048  # queries per request of the kill tests' 8 big clients: their calls are long, so a kill lands on calls
# in flight  # every client call has one: a hang is a failure, never a stuck test


@pytest.fixture(scope="module")
def sharded_dir(small_bundle, tmp_path_factory):
    return build_shards(small_bundle / "corpus.jsonl", tmp_path_factory.mktemp("ray-shards") / "index", SHARDS)


@pytest.fixture(scope="module")
def ray_serve(small_bundle, sharded_dir):
    """A 2-CPU local Ray with Serve on a free port and two applications: the whole index (1 replica) at /whole, and
    its 2 shards with 2 replicas each at /sharded (replicas reserve no CPU, so all fit). Yields the base URLs."""
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20, log_to_driver=False)
    try:
        base = start_serve()
        small = {"shard_cpus": 0, "ingress_cpus": 0, "threads": 2, "health_check_period_s": 1.0}
        deploy(RayServeLayout(str(small_bundle / "index"), **small), name="whole", route_prefix="/whole")
        deploy(RayServeLayout(str(sharded_dir), replicas=2, **small), name="sharded", route_prefix="/sharded")
        yield {"whole": base + "/whole", "sharded": base + "/sharded"}
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def docs(small_bundle):
    return list(read_corpus(small_bundle / "corpus.jsonl"))


def _bodies(docs) -> list[dict]:
    """/retrieve requests in Search-R1's and our own dialects: titles, words from the text, no hit at all."""
    rng = random.Random(0)
    sample = rng.sample(docs, 12)
    titles = [d.title for d in sample]
    words = [" ".join(d.text.split()[3:9]) for d in sample[:6]]
    return [
        {"queries": titles, "topk": 5, "return_scores": True},
        {"queries": titles[:4], "topk": 3},
        {"queries": words, "topk": 10, "return_scores": True, "snippet": True},
        {"queries": titles[4:8] + ["zzqx nothing matches"], "topk": None, "return_scores": "yes"},
        {"queries": [], "topk": 2},
        {"queries": words[:2], "topk": 0, "return_scores": 1, "snippet": "false", "unknown field": [1]},
    ]


async def _post(session: aiohttp.ClientSession, url: str, body: bytes | dict) -> tuple[int, bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with session.post(url, data=data, headers={"Content-Type": "application/json"}) as resp:
        return resp.status, await resp.read()


def test_a_whole_index_answers_byte_for_byte_as_serve_search(ray_serve, small_index, docs):
    urls = [d.url for d in random.Random(1).sample(docs, 8)]
    access = [{"urls": urls}, {"urls": urls[:2] + ["https://nowhere.test/none", docs[0].id]}, {"urls": []}]

    async def run():
        async with serving(small_index) as plain, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(TIMEOUT)) as s:
            for path, bodies in (("/retrieve", _bodies(docs)), ("/access", access)):
                for body in bodies:
                    want = await _post(s, plain + path, body)
                    assert want[0] == 200
                    assert await _post(s, ray_serve["whole"] + path, body) == want, (path, body)
            async with s.get(ray_serve["whole"] + "/health") as resp:
                assert resp.status == 200 and await resp.json() == {"status": "ok", "docs": len(docs), "access": True}

    asyncio.run(run())


def _shards(sharded_dir) -> list[LocalIndex]:
    return [LocalIndex(shard_dir(sharded_dir, i) / "index") for i in range(SHARDS)]


def _merged(replies: list[list[list[dict]]], k: int, scores: bool) -> list[list[dict]]:
    """The test's own merge of each shard's /retrieve rows (with scores): each query's top k by score, ties to the
    lower shard, then to the shard's own order; the rows without their scores unless asked for."""
    out = []
    for q in range(len(replies[0])):
        ranked = sorted(
            ((-row["score"], i, rank, row) for i, reply in enumerate(replies) for rank, row in enumerate(reply[q])),
            key=lambda item: item[:3],
        )
        out.append([row if scores else row["document"] for *_, row in ranked[:k]])
    return out


def test_shards_answer_as_serve_search_on_each_shard_merged_by_score(ray_serve, sharded_dir, small_index, docs):
    """Every /retrieve over the sharded application equals `serve search` on each shard merged by score (the same
    hits, scores, tie order and documents); every /access equals `serve search` over the whole index, a page from
    the shard its url hashes to, a doc id from whichever shard holds it."""
    urls = [d.url for d in random.Random(2).sample(docs, 8)]
    access = [{"urls": urls}, {"urls": [urls[0], "https://nowhere.test/none", urls[1]]}]
    checks = RayServeLayout(str(sharded_dir)).checker()

    async def run():
        async with contextlib.AsyncExitStack() as stack:
            s = await stack.enter_async_context(aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(TIMEOUT)))
            shards = [await stack.enter_async_context(serving(shard)) for shard in _shards(sharded_dir)]
            whole = await stack.enter_async_context(serving(small_index))
            for body in _bodies(docs):
                _, k, scores, _ = checks._retrieve_args(json.dumps(body).encode())
                replies = [await _post(s, u + "/retrieve", {**body, "return_scores": True}) for u in shards]
                assert all(status == 200 for status, _ in replies)
                want = _merged([json.loads(raw)["result"] for _, raw in replies], k, scores)
                status, raw = await _post(s, ray_serve["sharded"] + "/retrieve", body)
                assert status == 200 and json.loads(raw) == {"result": want}, body
            for body in access + [{"urls": [d.id for d in docs[:6]]}]:  # a doc id hashes to any shard
                assert await _post(s, ray_serve["sharded"] + "/access", body) == await _post(s, whole + "/access", body)
            async with s.get(ray_serve["sharded"] + "/health") as resp:
                assert (await resp.json())["docs"] == len(docs)

    asyncio.run(run())


def test_remote_search_over_the_application_finds_the_shards_top_hits_by_score(ray_serve, sharded_dir, docs):
    queries = [d.title for d in random.Random(3).sample(docs, 20)]
    want = _expected(sharded_dir, queries)

    async def run():
        remote = RemoteSearch(ray_serve["sharded"], RemoteOptions(timeout=TIMEOUT))
        try:
            got = await remote.search_batch(queries, 5)
            for query, hits in zip(queries, got, strict=True):
                assert [(h.doc_id, h.score) for h in hits] == want[query]
            page = await remote.fetch(docs[5].url)
            assert page.title == docs[5].title and page.text == docs[5].text
        finally:
            await remote.close()

    asyncio.run(run())


JUNK = [
    b"",
    b"{",
    b"\xff\xfe\x00",
    b"[]",
    b'"queries"',
    b"[" * 100_000,
    b'{"queries": "one query"}',
    b'{"queries": [1, 2]}',
    b'{"queries": ["\\ud800"]}',
    b'{"queries": ["a"], "topk": -1}',
    b'{"queries": ["a"], "topk": "3"}',
    b'{"queries": ["a"], "topk": 1000}',
    b'{"queries": ["a"], "topk": true}',
    b'{"queries": ["a"], "return_scores": "maybe"}',
    json.dumps({"queries": ["a"] * 5000}).encode(),
    json.dumps({"queries": ["a"] * 4000, "topk": 5}).encode(),
]
ACCESS_JUNK = [b"{", b'{"urls": "u"}', b'{"urls": [null]}', json.dumps({"urls": ["u"] * 65}).encode(), b"null"]


def test_junk_bodies_get_the_400s_serve_search_gives_never_a_5xx(ray_serve, small_index):
    async def run():
        async with serving(small_index) as plain, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(TIMEOUT)) as s:
            for path, bodies in (("/retrieve", JUNK), ("/access", ACCESS_JUNK)):
                for body in bodies:
                    for app in ("whole", "sharded"):
                        status, raw = await _post(s, ray_serve[app] + path, body)
                        assert status == 400, (app, path, body[:40], raw[:200])
                        assert json.loads(raw) == json.loads((await _post(s, plain + path, body))[1])
            big = b'{"queries": ["' + b"a" * (17 * 2**20) + b'"]}'
            assert (await _post(s, ray_serve["whole"] + "/retrieve", big))[0] == 413
            async with s.get(ray_serve["whole"] + "/retrieve") as resp:
                assert resp.status == 405 and "error" in await resp.json()
            status, raw = await _post(s, ray_serve["whole"] + "/nowhere", {})
            assert status == 404 and "error" in json.loads(raw)

    asyncio.run(run())


def test_a_score_that_is_not_finite_fails_the_merge_never_ranks():
    doc = {"id": "d", "contents": "", "title": "", "text": "", "url": "u"}
    assert merge_shards([[[(doc, 1.0)]], [[(doc, 2.0)]]], 1) == [[(doc, 2.0)]]
    assert merge_shards([[[(doc, 1.0), (dict(doc, id="e"), 1.0)]], [[(dict(doc, id="f"), 1.0)]]], 3) == [
        [(doc, 1.0), (dict(doc, id="e"), 1.0), (dict(doc, id="f"), 1.0)]  # ties: lower shard first, then its order
    ]
    for bad in (float("nan"), float("inf"), "1"):
        with pytest.raises(Exception, match="not finite"):
            merge_shards([[[(doc, 1.0)]], [[(doc, bad)]]], 2)


def _replicas(app: str, deployment: str) -> list[str]:
    """The actor names of a deployment's replicas (Ray Serve names them SERVE_REPLICA::app#deployment#id)."""
    prefix = f"SERVE_REPLICA::{app}#{deployment}#"
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix))


def test_a_replica_killed_mid_load_loses_no_query(ray_serve, sharded_dir, docs):
    """16 clients (8 sending 2,048 queries a request, 8 one) query the sharded application over plain HTTP, with no
    retries of their own, while one of shard 0's two replicas is killed (ray.kill, as a crash) with calls in flight:
    every query is answered with the right hits, or with a clear error; none hangs, none is wrong, none is lost. Then
    Ray Serve brings the shard back to two replicas."""
    queries = [d.title for d in random.Random(4).sample(docs, 40)]
    want = _expected(sharded_dir, queries)
    victim = _replicas("sharded", "shard-00")[0]
    url = ray_serve["sharded"] + "/retrieve"

    async def ask(s: aiohttp.ClientSession, batch: list[str]) -> list[list[tuple[str, float]]] | None:
        """The hits, or None for a clear error (a status with {"error": ...}); anything else raises (lost)."""
        status, raw = await _post(s, url, {"queries": batch, "topk": 5, "return_scores": True, "snippet": True})
        if status != 200:
            assert "error" in json.loads(raw), raw[:200]
            return None
        return [[(r["document"]["id"], r["score"]) for r in rows] for rows in json.loads(raw)["result"]]

    retried = []
    for _ in range(4):  # a kill between two shard calls catches none in flight: kill again until one is caught
        before = _ingress_stats()
        tally = asyncio.run(_load_while_killing(ask, want, victim))
        stats = {k: v - before[k] for k, v in _ingress_stats().items()}
        print("shard replica kill:", tally, "ingress:", stats)
        assert tally["after_kill"] > 0 and tally["right"] > 100
        assert tally["lost"] == 0 and tally["wrong"] == 0, tally  # every attempt: nothing lost, nothing wrong
        _wait_for_replicas("sharded", "shard-00", 2, victim)
        retried.append(stats["shard_retries"])
        if stats["shard_retries"]:
            break
        victim = _replicas("sharded", "shard-00")[0]
    assert retried[-1] >= 1, retried  # a kill caught shard calls in flight, and the ingress sent them again


def test_an_ingress_replica_killed_mid_load_loses_no_query(ray_serve, small_bundle, small_index, docs):
    """The whole index behind two ingress replicas; one is killed while 16 RemoteSearch clients query (RemoteSearch
    retries what the proxy could not deliver): every query is answered right or fails with a clear BackendError."""
    queries = [d.title for d in random.Random(5).sample(docs, 40)]
    want = {q: [(h.doc_id, h.score) for h in small_index.search_sync(q, 5)] for q in queries}
    layout = RayServeLayout(str(small_bundle / "index"), ingress_replicas=2, shard_cpus=0, ingress_cpus=0, threads=2)
    deploy(layout, name="two-fronts", route_prefix="/two-fronts")
    try:
        victim = _replicas("two-fronts", "ingress")[0]
        remote = RemoteSearch(
            ray_serve["whole"].replace("/whole", "/two-fronts"), RemoteOptions(timeout=TIMEOUT, max_batch=1)
        )

        async def ask(_: aiohttp.ClientSession, batch: list[str]) -> list[list[tuple[str, float]]] | None:
            try:
                hits = await remote.search_batch(batch, 5)
            except BackendError:
                return None
            return [[(h.doc_id, h.score) for h in row] for row in hits]

        tally = asyncio.run(_load_while_killing(ask, want, victim))
        print("ingress replica kill:", tally, remote.stats())
        assert tally["after_kill"] > 0 and tally["right"] > 100
        assert tally["lost"] == 0 and tally["wrong"] == 0, tally
        _wait_for_replicas("two-fronts", "ingress", 2, victim)
    finally:
        serve.delete("two-fronts")


async def _load_while_killing(ask, want: dict[str, list[tuple[str, float]]], victim: str) -> dict[str, int]:
    """16 clients calling `ask` for 10 s (8 with BATCH queries a call, 8 with one), every call under HANG, while
    the replica actor `victim` is killed after 2 s; each query tallied: right, clear error, wrong or lost."""
    queries = list(want)
    tally = {"right": 0, "clear_error": 0, "wrong": 0, "lost": 0, "after_kill": 0}
    killed: list[bool] = []
    stop = time.monotonic() + 10.0

    async def client(s: aiohttp.ClientSession, i: int) -> None:
        n = i
        while time.monotonic() < stop:
            batch = [queries[(n + j) % len(queries)] for j in range(BATCH if i < 8 else 1)]  # big: long calls
            n += 1
            try:
                got = await asyncio.wait_for(ask(s, batch), HANG)
            except Exception:  # noqa: BLE001 -- a hang, a dropped connection, an unreadable reply: lost
                tally["lost"] += len(batch)
                continue
            if got is None:
                tally["clear_error"] += len(batch)
                continue
            for query, hits in zip(batch, got, strict=True):
                tally["right" if hits == want[query] else "wrong"] += 1
            tally["after_kill"] += len(batch) * bool(killed)

    async def killer() -> None:
        await asyncio.sleep(2.0)
        ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
        killed.append(True)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(TIMEOUT)) as s:
        await asyncio.gather(killer(), *(client(s, i) for i in range(16)))
    return tally


def _wait_for_replicas(app: str, deployment: str, n: int, gone: str) -> None:
    """Ray Serve's health checks notice a death and start a new replica: wait (up to 2 minutes) for n again."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        replicas = _replicas(app, deployment)
        if len(replicas) == n and gone not in replicas:
            return
        time.sleep(1)
    raise AssertionError(f"{app}/{deployment} has replicas {replicas}, not {n} new ones")


def _ingress_stats() -> dict[str, int]:
    return serve.get_app_handle("sharded").stats.remote().result(timeout_s=TIMEOUT)


def _expected(sharded_dir, queries: list[str]) -> dict[str, list[tuple[str, float]]]:
    """Each query's top 5 (doc id, score) over every shard's top 5, by score (ties: lower shard, then its order)."""
    shards = _shards(sharded_dir)
    want = {}
    for q in queries:
        ranked = sorted(
            (-h.score, i, rank, h.doc_id)
            for i, shard in enumerate(shards)
            for rank, h in enumerate(shard.search_sync(q, 5))
        )
        want[q] = [(doc_id, -neg) for neg, _, _, doc_id in ranked[:5]]
    return want


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"replicas": 0}, "replicas must be a whole number of at least 1"),
        ({"shard_retries": -1}, "shard_retries must be a whole number of at least 0"),
        ({"default_topk": 200}, r"default_topk \(200\) must be at most max_topk \(100\)"),
        ({"max_queries": 0}, "max_queries must be an integer of at least 1"),
    ],
)
def test_a_bad_layout_is_refused_before_anything_starts(small_bundle, change, error):
    from searchgym.serve.ray_search import build_app

    with pytest.raises(ValueError, match=error):
        build_app(RayServeLayout(str(small_bundle / "index"), **change))
