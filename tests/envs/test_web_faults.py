"""Nothing a web page or a damaged cache holds crashes a fetch or an episode; the SSRF guard covers IANA's
non-global ranges, and a recorded cache cannot bypass the current URL policy (issue 15, items 1, 6 and 7)."""

import asyncio
import codecs
import ipaddress
import json
import socket
import sqlite3

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchgym.envs.search_env import SearchEnv
from searchgym.envs.tasks import Task, TaskPool
from searchgym.envs.tools.base import BackendError, Page, PageNotFound
from searchgym.envs.tools.url_safety import NON_PUBLIC_NETWORKS, UnsafeURL, UrlPolicy, is_public, parse_numeric_host
from searchgym.envs.tools.web_cache import CachedPages, CachedSearch, WebCache, normalise_url
from searchgym.envs.tools.web_fetch import FetchOptions, WebFetcher, decode_body
from searchgym.testing.faults import CODEC_NAMES
from searchgym.testing.faults import DAMAGED_CACHE_ROWS as DAMAGED_ROWS

# --- the SSRF guard ------------------------------------------------------------------------------------


@given(st.sampled_from(NON_PUBLIC_NETWORKS), st.integers(min_value=0))
def test_every_address_of_every_non_public_range_is_refused(network, offset):
    ip = network[offset % network.num_addresses]
    assert not is_public(ip), f"{ip} (in {network}) was taken for a public address"
    if ip.version == 4:  # and in its IPv6 embeddings too
        for embedded in (f"::ffff:{ip}", f"64:ff9b::{ip}", f"2002:{int(ip) >> 16:x}:{int(ip) & 0xFFFF:x}::1"):
            assert not is_public(ipaddress.ip_address(embedded)), embedded


@pytest.mark.parametrize(
    "host", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "2001:4860:4860::8888", "::ffff:8.8.8.8", "64:ff9b::8.8.8.8"]
)
def test_public_addresses_stay_public(host):
    assert is_public(parse_numeric_host(host))


@pytest.mark.parametrize("address", ["fec0::1", "fec0:1234::5", "3ffe::1", "3fff::1", "5f00::1", "100::1", "::8.8.8.8"])
async def test_deprecated_and_special_ipv6_ranges_are_refused_as_literals_and_through_dns(address, monkeypatch):
    async def fake_getaddrinfo(self, host, port, *args, **kwargs):
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0))]

    monkeypatch.setattr(asyncio.BaseEventLoop, "getaddrinfo", fake_getaddrinfo)
    policy = UrlPolicy()
    with pytest.raises(UnsafeURL):
        await policy.check(f"http://[{address}]/")
    with pytest.raises(UnsafeURL):
        await policy.check("http://sitelocal.example/")


# --- pages that lie about their encoding ---------------------------------------------------------------


@given(st.binary(max_size=300), st.sampled_from(CODEC_NAMES + [None]), st.sampled_from(CODEC_NAMES + [None]))
def test_any_declared_charset_decodes_or_falls_back(body, header, meta):
    page = (f'<meta charset="{meta}">'.encode() if meta else b"") + body
    text, codec = decode_body(page, header)
    assert isinstance(text, str) and codecs.lookup(codec)


class RandomWeb:
    """A loopback server whose one page answers whatever status, headers and body the test sets."""

    def __init__(self):
        self.response = (200, {}, b"")
        app = web.Application()
        app.router.add_get("/page", self.page)
        self.server = TestServer(app, host="127.0.0.1")

    async def page(self, request: web.Request) -> web.Response:
        status, headers, body = self.response
        return web.Response(status=status, headers=headers, body=body)


HEADER_VALUES = st.one_of(
    st.sampled_from([f"text/html; charset={c}" for c in CODEC_NAMES]),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=60),
)
BODIES = st.one_of(
    st.binary(max_size=2000),
    st.text(max_size=500).map(
        lambda t: f"<html><title>{t}</title><body><p>{t}</p></body>".encode("utf-8", "surrogatepass")
    ),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    status=st.sampled_from([200, 200, 200, 203, 404, 410, 500, 503]),
    content_type=HEADER_VALUES,
    extra=st.dictionaries(
        st.sampled_from(["Content-Encoding", "Content-Language", "Link", "Refresh"]),
        st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40),
        max_size=2,
    ),
    body=BODIES,
)
def test_random_pages_never_raise_from_fetch_or_step(status, content_type, extra, body):
    async def main():
        site = RandomWeb()
        await site.server.start_server()
        site.response = (status, {"Content-Type": content_type, **extra}, body)
        url = f"http://127.0.0.1:{site.server.port}/page"
        fetcher = WebFetcher(FetchOptions(allow=[f"127.0.0.1:{site.server.port}"], total_timeout=5))
        try:
            try:
                page = await fetcher.fetch(url)
                assert isinstance(page.text, str) and isinstance(page.title, str)
            except (BackendError, PageNotFound):
                pass  # a clear, expected failure: the env turns it into an observation
            env = SearchEnv(TaskPool([Task("t", "q?", ["a"])]), _NoSearch(), fetcher)
            await env.areset(options={"index": 0})
            obs, reward, terminated, truncated, info = await env.astep(f"<access>{url}</access>")
            assert env.observation_space.contains(obs) and info["tool"] == "access"
        finally:
            await fetcher.close()
            await site.server.close()

    asyncio.run(main())


class _NoSearch:
    async def search(self, query, k):
        return []


# --- damaged caches ------------------------------------------------------------------------------------


class _Pages:
    """A page backend that records how often it was asked (a stand-in for the network)."""

    def __init__(self):
        self.calls = 0
        self.policy = UrlPolicy()

    async def fetch(self, url):
        self.calls += 1
        return Page(url=url, title="Fresh", text="fresh text")


@pytest.mark.parametrize("row", DAMAGED_ROWS)
async def test_a_damaged_page_row_is_a_counted_miss_or_a_clear_replay_error(tmp_path, row):
    path, url = tmp_path / "c.sqlite", "https://example.com/"
    WebCache(path, "read_write").close()
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO entries VALUES (?, ?, ?, 0)", ("page", normalise_url(url), row))
    backend = _Pages()
    cache = WebCache(path, "read_write")
    page = await CachedPages(backend, cache).fetch(url)
    assert page.title == "Fresh" and backend.calls == 1 and cache.stats()["damaged"] == 1
    assert cache.stats().get("page_hits", 0) == 0 and cache.stats()["page_misses"] == 1
    cache.close()
    with sqlite3.connect(path) as db:  # damage it again, then replay
        db.execute("UPDATE entries SET value=? WHERE kind='page'", (row,))
    replay = WebCache(path, "replay_only")
    with pytest.raises(BackendError, match="replay-only"):
        await CachedPages(backend, replay).fetch(url)
    assert backend.calls == 1


async def test_a_damaged_search_row_is_a_counted_miss(tmp_path):
    path = tmp_path / "c.sqlite"
    WebCache(path, "read_write").close()
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO entries VALUES ('search', ?, ?, 0)", ("5\x00q", json.dumps([{"title": "x"}])))
    cache = WebCache(path, "replay_only")
    with pytest.raises(BackendError, match="replay-only"):
        await CachedSearch(_NoSearch(), cache).search("q", 5)
    assert cache.stats()["damaged"] == 1


def test_a_damaged_cache_file_names_itself(tmp_path):
    path = tmp_path / "c.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(ValueError, match=r"c\.sqlite is damaged"):
        WebCache(path, "read_write")


async def test_replay_does_not_bypass_a_stricter_policy(tmp_path):
    """Pages recorded while loopback was allowlisted are refused when replayed without the allowlist."""
    path = tmp_path / "c.sqlite"
    recorded = WebCache(path, "read_write")
    loose = _Pages()
    loose.policy = UrlPolicy(allow=["127.0.0.1"])
    for url in ("http://127.0.0.1/secret", "http://localhost/admin", "https://example.com/fine"):
        await CachedPages(loose, recorded).fetch(url)
    recorded.close()
    replay = CachedPages(_Pages(), WebCache(path, "replay_only"))
    for url in ("http://127.0.0.1/secret", "http://localhost/admin"):
        with pytest.raises(UnsafeURL):
            await replay.fetch(url)
    assert (await replay.fetch("https://example.com/fine")).title == "Fresh"
