"""Web search and page access for real, against a local web on 127.0.0.1 only: pages, a Serper test double, faults,
SSRF."""

from __future__ import annotations

import asyncio
import email.utils
import json
import socket
import time
from collections import Counter
from pathlib import Path

import gymnasium as gym
import pytest
from aiohttp import web

import searchgym  # noqa: F401  (registers the ids)
from searchgym.envs.tools.base import BackendError, PageNotFound
from searchgym.envs.tools.url_safety import UnsafeURL, UrlPolicy, is_public, parse_numeric_host
from searchgym.envs.tools.web_cache import CachedPages, CachedSearch, WebCache, normalise_query, normalise_url
from searchgym.envs.tools.web_fetch import FetchOptions, WebFetcher, decode_body
from searchgym.envs.tools.web_search import MissingAPIKey, WebSearch, WebSearchOptions
from searchgym.world.world import WORLD_URL_PREFIX, World
from tests.servers import ThreadServer, free_port

KEY = "test-serper-key"
HUGE = 50 * 1024 * 1024


class LocalWeb:
    """A little web on 127.0.0.1 in a thread of its own: the world's HTML pages, fault pages, and a
    test double of the Serper search API (same wire format: POST {"q", "num"} with X-API-KEY,
    answering {"organic": [{"title", "link", "snippet", "position"}]}) that ranks the world's pages."""

    def __init__(self, world_dir: Path):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.pages: dict[str, str] = {}
        self.docs: list[dict] = []
        for line in open(world_dir / "html.jsonl"):
            row = json.loads(line)
            path = "/wiki/" + row["url"][len(WORLD_URL_PREFIX) :]
            self.pages[path] = row["html"].replace(WORLD_URL_PREFIX, self.base + "/wiki/")
        for line in open(world_dir / "corpus.jsonl"):
            row = json.loads(line)
            self.docs.append(
                {
                    "title": row["title"],
                    "link": self.base + "/wiki/" + row["url"][len(WORLD_URL_PREFIX) :],
                    "text": row["text"],
                }
            )
        self.hits: Counter[str] = Counter()
        self.flaky = 0  # the next this-many searches answer 503
        self.retry_after: str | None = None  # when set, they answer 429 with this Retry-After instead
        self._server = ThreadServer.app(self._app(), self.port)
        self._server.start()

    def _app(self) -> web.Application:
        @web.middleware
        async def count(request, handler):
            self.hits[request.path] += 1
            return await handler(request)

        app = web.Application(middlewares=[count])
        app.router.add_get("/wiki/{name}", self.page)
        app.router.add_post("/search", self.serper)
        app.router.add_get("/fault/{kind}", self.fault)
        app.router.add_get("/redirect", self.redirect)
        app.router.add_get("/jina/{target:.*}", self.jina)
        return app

    def stop(self) -> None:
        """Shut the server down; its port then refuses connections."""
        self._server.stop()

    async def page(self, request: web.Request) -> web.Response:
        html = self.pages.get(request.path)
        if html is None:
            raise web.HTTPNotFound()
        return web.Response(text=html, content_type="text/html", charset="utf-8")

    async def serper(self, request: web.Request) -> web.Response:
        if request.headers.get("X-API-KEY") != KEY:
            return web.json_response({"message": "Unauthorized.", "statusCode": 403}, status=403)
        if self.flaky > 0:
            self.flaky -= 1
            if self.retry_after is not None:
                return web.Response(status=429, text="slow down", headers={"Retry-After": self.retry_after})
            return web.Response(status=503, text="busy")
        body = await request.json()
        terms = set(body["q"].lower().split())
        scored = [
            (sum(3 * (t in d["title"].lower()) + (t in d["text"].lower()) for t in terms), -i, d)
            for i, d in enumerate(self.docs)
        ]
        top = [d for s, _, d in sorted(scored, key=lambda x: x[:2], reverse=True) if s > 0][: int(body.get("num", 10))]
        organic = [
            {"title": d["title"], "link": d["link"], "snippet": d["text"][:160], "position": i}
            for i, d in enumerate(top, 1)
        ]
        return web.json_response(
            {
                "searchParameters": {"q": body["q"], "num": body.get("num", 10), "type": "search"},
                "organic": organic,
                "credits": 1,
            }
        )

    async def jina(self, request: web.Request) -> web.Response:
        """A test double of the Jina reader: GET /{url} with a bearer key answers the page as text."""
        if request.headers.get("Authorization") != f"Bearer {KEY}":
            return web.Response(status=401, text="unauthorized")
        target = request.match_info["target"]
        return web.Response(text=f"Title: Read {target}\n\nURL Source: {target}\n\nMarkdown Content:\nBody of {target}")

    async def redirect(self, request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query["to"])

    async def fault(self, request: web.Request) -> web.StreamResponse:
        kind = request.match_info["kind"]
        if kind == "500":
            return web.Response(status=500, text="internal error")
        if kind == "slow":
            await asyncio.sleep(30)
            return web.Response(text="too late")
        if kind == "loop":
            raise web.HTTPFound("/fault/loop")
        if kind == "binary":
            return web.Response(body=b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8, content_type="image/png")
        if kind == "untyped-binary":
            resp = web.Response(body=b"\x00\x01\x02\x03" * 512)
            resp.headers["Content-Type"] = ""
            return resp
        if kind == "latin1":  # cp1252 bytes, no charset anywhere: not valid UTF-8
            body = (
                "<html><head><title>Caf\u00e9</title></head><body><p>Un caf\u00e9 cr\u00e8me \u00e0 Paris, "
                "servi chaque matin dans le quartier.</p></body></html>"
            )
            resp = web.Response(body=body.encode("cp1252"))
            resp.headers["Content-Type"] = "text/html"
            return resp
        if kind == "badutf8":  # declared UTF-8 but holds invalid bytes
            return web.Response(body=b"plain text \xff\xfe ok", content_type="text/plain", charset="utf-8")
        if kind == "truncated":  # promises 10,000 bytes, sends 200 and hangs up
            resp = web.StreamResponse(headers={"Content-Type": "text/plain", "Content-Length": "10000"})
            await resp.prepare(request)
            await resp.write(b"partial line of text " * 10)
            request.transport.close()
            return resp
        if kind == "huge":  # a 50 MB page, streamed
            resp = web.StreamResponse(headers={"Content-Type": "text/html"})
            resp.content_length = HUGE
            await resp.prepare(request)
            chunk = b"<p>" + b"x" * 65529 + b"</p>"
            try:
                for _ in range(HUGE // len(chunk)):
                    await resp.write(chunk)
            except (ConnectionError, RuntimeError):
                pass
            return resp
        raise web.HTTPNotFound()


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("web-world")
    World(300, 0).write(out, html=True)
    return out


@pytest.fixture(scope="module")
def local_web(world_dir):
    site = LocalWeb(world_dir)
    yield site
    site.stop()


def allowed_fetcher(site: LocalWeb, **kwargs) -> WebFetcher:
    return WebFetcher(FetchOptions(allow=[f"127.0.0.1:{site.port}"], **kwargs))


def a_page(site: LocalWeb) -> tuple[str, dict]:
    doc = next(d for d in site.docs if " " in d["title"])
    return doc["link"], doc


# --- URL safety -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    [
        "2130706433",
        "0x7f.1",
        "0177.0.0.1",
        "127.1",
        "0x7f000001",
        "[::1]",
        "::ffff:127.0.0.1",
        "10.0.0.1",
        "169.254.169.254",
        "0.0.0.0",
        "224.0.0.1",
        "100.64.0.1",
        "192.168.1.1",
        "[fe80::1]",
        "2002:7f00:1::",
    ],
)
def test_non_public_numeric_hosts_are_recognised(host):
    ip = parse_numeric_host(host)
    assert ip is not None and not is_public(ip)


def test_public_and_named_hosts():
    assert is_public(parse_numeric_host("8.8.8.8")) and parse_numeric_host("example.com") is None
    assert parse_numeric_host("999.1.1.1") is None and parse_numeric_host("1.2.3.4.5") is None


async def test_loopback_refused_without_allowlist_in_every_spelling(local_web):
    fetcher = WebFetcher()
    link, _ = a_page(local_web)
    path = link.split(str(local_web.port), 1)[1]
    before = sum(local_web.hits.values())
    for host in [
        "127.0.0.1",
        "localhost",
        "LOCALHOST.",
        "2130706433",
        "0x7f.1",
        "0177.0.0.1",
        "[::1]",
        "[::ffff:127.0.0.1]",
        "foo.localhost",
    ]:
        with pytest.raises(UnsafeURL):
            await fetcher.fetch(f"http://{host}:{local_web.port}{path}")
    assert sum(local_web.hits.values()) == before, "a refused URL must never reach the server"
    assert fetcher.stats()["fetch"]["refused_unsafe"] == 9
    for url in ["file:///etc/passwd", "ftp://127.0.0.1/", "http://user:pw@example.com/", "http://[::1"]:
        with pytest.raises(UnsafeURL):
            await fetcher.fetch(url)
    await fetcher.close()


async def test_allowlist_is_per_host_and_port_and_redirects_are_rechecked(local_web):
    other = free_port()  # a second loopback "host": same address, a port that is not allowlisted
    fetcher = allowed_fetcher(local_web)
    link, doc = a_page(local_web)
    page = await fetcher.fetch(link)
    assert page.title == doc["title"]
    with pytest.raises(UnsafeURL):
        await fetcher.fetch(f"http://127.0.0.1:{other}/")
    before = local_web.hits["/redirect"]
    for target in [
        f"http://127.0.0.1:{other}/wiki/x",
        f"http://localhost:{local_web.port}/wiki/x",
        f"http://0x7f.1:{other}/",
        "http://169.254.169.254/latest/meta-data/",
    ]:
        with pytest.raises(UnsafeURL):
            await fetcher.fetch(f"{local_web.base}/redirect?to={target}")
    assert local_web.hits["/redirect"] == before + 4
    # a redirect to an allowed place is followed
    page = await fetcher.fetch(f"{local_web.base}/redirect?to={link}")
    assert page.url == link and page.title == doc["title"]
    await fetcher.close()


async def test_dns_answers_are_checked_and_the_checked_address_is_dialled(local_web, monkeypatch):
    """A name resolving to loopback is refused; allowlisted, the connection goes to the address checked."""
    lookups = []

    async def fake_getaddrinfo(self, host, port, *args, **kwargs):
        lookups.append(host)
        assert host == "rebind.example", "no lookup of any other name may happen"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(asyncio.BaseEventLoop, "getaddrinfo", fake_getaddrinfo)
    link, doc = a_page(local_web)
    url = link.replace("127.0.0.1", "rebind.example")
    refusing = WebFetcher()
    with pytest.raises(UnsafeURL, match="non-public"):
        await refusing.fetch(url)
    await refusing.close()
    by_net = WebFetcher(FetchOptions(allow=["127.0.0.0/8"]))
    page = await by_net.fetch(url)
    assert page.title == doc["title"] and len(lookups) == 3  # refused once; then pre-check + resolver
    await by_net.close()


async def test_blocklist_filters_results_and_refuses_fetches(local_web):
    link, doc = a_page(local_web)
    fetcher = WebFetcher(FetchOptions(allow=["127.0.0.1"], block=["127.0.0.1"]))
    with pytest.raises(BackendError, match="blocklist"):
        await fetcher.fetch(link)
    assert fetcher.stats()["fetch"]["blocked"] == 1
    assert UrlPolicy(block=["bench.org"]).is_blocked("https://a.b.bench.org/x")
    assert not UrlPolicy(block=["bench.org"]).is_blocked("https://notbench.org/x")
    search = WebSearch(KEY, WebSearchOptions(endpoint=local_web.base + "/search", block=["127.0.0.1"]))
    assert await search.search(doc["title"], 5) == []
    assert search.stats()["search"]["blocked_results"] >= 1
    await search.close()
    await fetcher.close()


# --- search ---------------------------------------------------------------------------------


async def test_serper_wire_format_and_key(local_web, monkeypatch):
    _, doc = a_page(local_web)
    search = WebSearch(KEY, WebSearchOptions(endpoint=local_web.base + "/search"))
    hits = await search.search(doc["title"], 3)
    assert 1 <= len(hits) <= 3 and hits[0].title == doc["title"] and hits[0].url == doc["link"]
    assert hits[0].snippet == doc["text"][:160] and hits[0].score == 1.0
    assert await search.search("   ", 3) == []
    await search.close()
    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    with pytest.raises(MissingAPIKey, match="SERPER_API_KEY"):
        WebSearch()
    monkeypatch.setenv("SERPER_API_KEY", KEY)
    assert WebSearch().api_key == KEY
    wrong = WebSearch("wrong", WebSearchOptions(endpoint=local_web.base + "/search"))
    with pytest.raises(BackendError, match="refused the API key"):
        await wrong.search("x", 3)
    await wrong.close()


async def test_search_retries_5xx_then_gives_up_and_survives_refused_connections(local_web):
    _, doc = a_page(local_web)
    search = WebSearch(KEY, WebSearchOptions(endpoint=local_web.base + "/search", retries=2, backoff=0.01))
    local_web.flaky = 2
    hits = await search.search(doc["title"], 3)
    assert hits and search.stats()["search"]["retries"] == 2
    local_web.flaky = 10
    with pytest.raises(BackendError, match="HTTP 503.*3 attempts"):
        await search.search(doc["title"], 3)
    local_web.flaky = 0
    await search.close()
    dead = WebSearch(
        KEY, WebSearchOptions(endpoint=f"http://127.0.0.1:{free_port()}/search", retries=1, backoff=0.01, timeout=2)
    )
    t = time.monotonic()
    with pytest.raises(BackendError, match="could not reach"):
        await dead.search("anything", 3)
    assert time.monotonic() - t < 3
    await dead.close()


@pytest.mark.parametrize("retry_after", ["seconds", "http-date"])
async def test_search_waits_as_long_as_a_429_retry_after_asks_up_to_the_cap(local_web, retry_after):
    _, doc = a_page(local_web)
    search = WebSearch(
        KEY, WebSearchOptions(endpoint=local_web.base + "/search", retries=1, backoff=0.01, max_backoff=0.6)
    )
    local_web.retry_after = "0.4" if retry_after == "seconds" else email.utils.formatdate(time.time() + 60, usegmt=True)
    local_web.flaky = 1
    try:
        assert await search.search(doc["title"], 3)
    finally:
        local_web.retry_after = None
        await search.close()
    waited = search.stats()["search"]["retry_wait_s"]
    assert waited == pytest.approx(0.4 if retry_after == "seconds" else 0.6, abs=0.05)  # 60 s asked, capped at 0.6


# --- fetching and its faults ----------------------------------------------------------------


async def test_real_extraction_of_world_html(local_web, world_dir):
    link, doc = a_page(local_web)
    fetcher = allowed_fetcher(local_web)
    page = await fetcher.fetch(link)
    assert page.title == doc["title"] and page.url == link
    first_sentence = doc["text"].split(". ")[0]
    assert first_sentence in page.text and "<" not in page.text
    assert page.links and all(u.startswith(local_web.base + "/wiki/") for u in page.links)
    with pytest.raises(PageNotFound):
        await fetcher.fetch(local_web.base + "/wiki/No_Such_Page")
    await fetcher.close()


@pytest.mark.parametrize(
    "kind, message, counter",
    [
        ("500", "HTTP 500", "http_5xx"),
        ("slow", "timed out", "timeout"),
        ("loop", "redirects", "too_many_redirects"),
        ("binary", "image/png", "binary"),
        ("untyped-binary", "binary", "binary"),
    ],
)
async def test_fetch_faults_are_clear_errors(local_web, kind, message, counter):
    fetcher = allowed_fetcher(local_web, read_timeout=1, total_timeout=1.5, max_redirects=3)
    t = time.monotonic()
    with pytest.raises(BackendError, match=message):
        await fetcher.fetch(f"{local_web.base}/fault/{kind}")
    assert time.monotonic() - t < 2.5, "no request may hang past its timeout"
    assert fetcher.stats()["fetch"][counter] == 1
    await fetcher.close()


async def test_refused_connection_truncation_charsets_and_a_50mb_page(local_web):
    fetcher = allowed_fetcher(local_web, max_bytes=1_000_000, total_timeout=10)
    dead = WebFetcher(FetchOptions(allow=["127.0.0.1"]))
    with pytest.raises(BackendError, match="could not connect"):
        await dead.fetch(f"http://127.0.0.1:{free_port()}/")
    assert dead.stats()["fetch"]["connect_error"] == 1
    await dead.close()

    page = await fetcher.fetch(local_web.base + "/fault/truncated")
    assert page.text.startswith("partial line of text") and "closed before the page was complete" in page.text

    page = await fetcher.fetch(local_web.base + "/fault/latin1")
    assert page.title == "Caf\u00e9" and "caf\u00e9 cr\u00e8me" in page.text
    page = await fetcher.fetch(local_web.base + "/fault/badutf8")
    assert page.text == "plain text \ufffd\ufffd ok"
    assert decode_body('<meta charset="iso-8859-1">\xe9'.encode("latin-1"), None) == (
        '<meta charset="iso-8859-1">\xe9',
        "iso8859-1",
    )

    t = time.monotonic()
    page = await fetcher.fetch(local_web.base + "/fault/huge")
    assert time.monotonic() - t < 5, "the 50 MB page must stop at the cap quickly"
    assert "page cut at 1000000 bytes" in page.text and len(page.text) < 1_100_000
    stats = fetcher.stats()["fetch"]
    assert stats["too_large"] == 1 and stats["truncated"] == 1
    await fetcher.close()


async def test_jina_reader_when_a_key_is_set(local_web, monkeypatch):
    monkeypatch.setenv("JINA_API_KEY", KEY)
    fetcher = WebFetcher(FetchOptions(jina_endpoint=local_web.base + "/jina", block=["bench.org"]))
    page = await fetcher.fetch("https://world.searchgym.test/wiki/Somewhere")
    assert page.title == "Read https://world.searchgym.test/wiki/Somewhere"
    assert page.text == "Body of https://world.searchgym.test/wiki/Somewhere"
    with pytest.raises(BackendError, match="blocklist"):
        await fetcher.fetch("https://www.bench.org/answers")
    await fetcher.close()
    monkeypatch.delenv("JINA_API_KEY")
    assert not WebFetcher().use_jina


# --- the cache and the env ------------------------------------------------------------------


def test_cache_keys_and_modes(tmp_path):
    assert normalise_query("  Who  WROTE\tX? ") == normalise_query("who wrote x?")
    assert normalise_url("HTTP://Example.COM:80/a?b=1#frag") == "http://example.com/a?b=1"
    with pytest.raises(FileNotFoundError):
        WebCache(tmp_path / "none.sqlite", "replay_only")
    with pytest.raises(ValueError):
        WebCache(tmp_path / "c.sqlite", "sometimes")


async def test_replay_only_never_calls_the_backend(tmp_path):
    class Exploding:
        async def search(self, query, k):
            raise AssertionError("network call in replay_only")

        async def fetch(self, url):
            raise AssertionError("network call in replay_only")

    WebCache(tmp_path / "c.sqlite", "read_write").close()
    cache = WebCache(tmp_path / "c.sqlite", "replay_only")
    with pytest.raises(BackendError, match="replay-only"):
        await CachedSearch(Exploding(), cache).search("q", 5)
    with pytest.raises(BackendError, match="replay-only"):
        await CachedPages(Exploding(), cache).fetch("https://example.com/")
    assert cache.stats()["search_misses"] == 1 and cache.stats()["page_misses"] == 1


@pytest.fixture
def web_tasks(tmp_path, local_web) -> Path:
    _, doc = a_page(local_web)
    path = tmp_path / "tasks.jsonl"
    path.write_text(
        json.dumps({"id": "web-1", "question": f"What is {doc['title']}?", "answers": [doc["title"]]}) + "\n"
    )
    return path


def play(env, actions):
    """Run a fixed list of turns; return everything the agent saw and was told, backend stats apart."""
    out = [env.reset(options={"index": 0})[0]]
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        info = {k: v for k, v in info.items() if k not in ("backend", "cost", "episode_cost")}  # run-dependent
        out.append((obs, reward, terminated, truncated, info))
    return out


def test_webqa_episode_records_then_replays_exactly_with_the_server_stopped(tmp_path, world_dir, web_tasks):
    site = LocalWeb(world_dir)
    link, doc = a_page(site)
    cache = tmp_path / "web.sqlite"
    common = dict(
        tasks=web_tasks,
        allow=[f"127.0.0.1:{site.port}"],
        search_endpoint=site.base + "/search",
        fetch_options={"total_timeout": 5},
    )
    actions = [
        f"<search>{doc['title']}</search>",
        f"<access>{link}</access>",
        f"<access>{link}</access>",
        f"<access>{site.base}/wiki/No_Such_Page</access>",
        f"<answer>{doc['title']}</answer>",
    ]
    env = gym.make("searchgym/WebQA-v0", search_api_key=KEY, cache=cache, **common)
    assert env.spec.nondeterministic
    recorded = play(env.unwrapped, actions)
    recording_cost = dict(env.unwrapped.episode_cost)
    obs, reward, terminated, _, info = recorded[1]
    assert doc["link"] in obs and info["hits"][0]["url"] == link
    assert doc["text"].split(". ")[0] in recorded[2][0]
    assert reward == 0 and recorded[-1][1] == 1.0 and recorded[-1][2]
    env.reset(options={"index": 0})
    _, _, _, _, info = env.step(f"<search>  {doc['title'].upper()} </search>")
    assert info["backend"]["cache"]["search_hits"] == 1 and info["backend"]["cache"]["search_hit_rate"] == 0.5
    assert info["backend"]["search"]["requests"] == 1
    env.close()
    site.stop()

    replay = gym.make("searchgym/WebQA-v0", cache=cache, cache_mode="replay_only", **common)
    assert play(replay.unwrapped, actions) == recorded
    # recording paid one search request and the page's fetches; the replay, served from the cache, paid nothing
    assert recording_cost["api_calls"] == 1 and recording_cost["fetches"] >= 2 and recording_cost["bytes_fetched"] > 0
    assert sum(replay.unwrapped.episode_cost.values()) == 0
    replay.unwrapped.reset(options={"index": 0})
    _, _, _, _, info = replay.unwrapped.step("<search>something never searched</search>")
    assert "replay-only" in info["error"] and info["counts"]["backend_errors"] == 1
    replay.close()


def test_webqa_faults_become_observations_and_counters(local_web, web_tasks):
    dead = free_port()
    env = gym.make(
        "searchgym/WebQA-v0",
        tasks=web_tasks,
        search_api_key=KEY,
        search_endpoint=local_web.base + "/search",
        allow=[f"127.0.0.1:{local_web.port}", f"127.0.0.1:{dead}"],
        fetch_options={"read_timeout": 1, "total_timeout": 1.5, "max_bytes": 200_000, "max_redirects": 3},
        search_options={"retries": 0},
    ).unwrapped
    env.reset(options={"index": 0})
    urls = [f"{local_web.base}/fault/{k}" for k in ("500", "slow", "loop", "binary")]
    urls += [f"http://127.0.0.1:{dead}/", "http://2130706433/", "http://localhost/", "http://[::1]/"]
    t = time.monotonic()
    for n, url in enumerate(urls, 1):
        obs, reward, terminated, truncated, info = env.step(f"<access>{url}</access>")
        assert obs.startswith("<information>") and "failed" in obs and info["error"].startswith("access failed")
        assert info["counts"]["backend_errors"] == n and not terminated and reward == 0
    assert time.monotonic() - t < 8
    fetch = info["backend"]["fetch"]
    assert fetch["http_5xx"] == fetch["timeout"] == fetch["too_many_redirects"] == fetch["binary"] == 1
    assert fetch["connect_error"] == 1 and fetch["refused_unsafe"] == 3
    obs, *_, info = env.step(f"<access>{local_web.base}/fault/huge</access>")
    assert "page cut at 200000 bytes" in obs or info["page"]["chunks"] >= 1
    local_web.flaky = 1
    obs, *_, info = env.step("<search>anything</search>")
    assert "search failed" in info["error"] and "HTTP 503" in obs
    env.close()


def test_webqa_check_env_and_clear_errors(web_tasks, tmp_path, monkeypatch):
    from gymnasium.utils.env_checker import check_env

    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    with pytest.raises(MissingAPIKey):
        gym.make("searchgym/WebQA-v0", tasks=web_tasks)
    with pytest.raises(ValueError, match="cache=PATH"):
        gym.make("searchgym/WebQA-v0", tasks=web_tasks, search_api_key=KEY, cache_mode="read_write")
    env = gym.make(
        "searchgym/WebQA-v0",
        tasks=web_tasks,
        search_api_key=KEY,
        search_endpoint=f"http://127.0.0.1:{free_port()}/search",
    )
    check_env(env.unwrapped)
    env.close()
