"""WebFetcher: the page-access tool on the live web, guarded, bounded and turned into plain text.

Every agent-chosen URL passes the `UrlPolicy` (SSRF guard, blocklist) before connecting and after
every redirect (redirects are followed by hand, one checked hop at a time), and aiohttp dials only
addresses the `SafeResolver` checked. Bodies are read in chunks up to a byte cap, decoded by
header / meta / UTF-8 / cp1252 charset, and HTML is extracted with trafilatura (title, main text,
links). Every failure is a `BackendError` (or `PageNotFound`) with a message the agent can act on,
and a counter in `stats()`.
"""

from __future__ import annotations

import asyncio
import codecs
import os
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

import aiohttp

from searchgym.core.cost_meter import charge
from searchgym.core.extras import needs, require
from searchgym.core.http_session import LoopSession
from searchgym.envs.tools.base import BackendError, Page, PageNotFound
from searchgym.envs.tools.url_safety import BlockedURL, SafeResolver, UnsafeURL, UrlPolicy

JINA_ENDPOINT = "https://r.jina.ai/"
TEXT_TYPES = ("text/html", "application/xhtml+xml", "text/plain", "text/markdown", "application/xml", "text/xml")
REDIRECTS = (301, 302, 303, 307, 308)
MAX_LINKS = 500
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_\-:.]+)""", re.I)
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.I | re.S)


def _charset(name: str | None) -> str | None:
    """A Python text codec for a declared charset, or None if unknown or not a text encoding.

    A page controls its declared charset, and Python's codec registry also holds bytes-to-bytes and
    text-to-text codecs (rot13, base64, hex, zlib, ...) that `bytes.decode` refuses with LookupError.
    """
    if not name or not isinstance(name, str):
        return None
    try:
        codec = codecs.lookup(name.strip().strip("\"'"))
    except (LookupError, ValueError, TypeError):
        return None
    return codec.name if getattr(codec, "_is_text_encoding", True) else None


def decode_body(body: bytes, header_charset: str | None) -> tuple[str, str]:
    """Decode a body by header charset, then <meta> charset, then strict UTF-8, then cp1252 with replacement."""
    meta = _META_CHARSET.search(body[:4096])
    for name in (header_charset, meta.group(1).decode("ascii", "replace") if meta else None):
        codec = _charset(name)
        if codec:
            try:  # some text codecs (idna, punycode, ...) still refuse arbitrary bytes or the replace handler
                return body.decode(codec, errors="replace"), codec
            except (LookupError, UnicodeError, ValueError, TypeError):
                continue
    try:
        return body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return body.decode("cp1252", errors="replace"), "cp1252"


def extract_html(html: str, url: str) -> tuple[str, str, tuple[str, ...]]:
    """Title, main text and absolute http(s) links of an HTML page (trafilatura, lxml fallback)."""
    with needs("reading web pages"):
        import lxml.html
        import trafilatura

    title, text = "", ""
    try:
        doc = trafilatura.bare_extraction(
            html, url=url, with_metadata=True, include_tables=True, include_links=False, favor_recall=True
        )
    except Exception:  # noqa: BLE001  (an extractor crash on odd HTML must not end the episode)
        doc = None
    if doc is not None:
        title, text = (getattr(doc, "title", None) or ""), (getattr(doc, "text", None) or "")
    links: list[str] = []
    try:
        tree = lxml.html.fromstring(html)
        if not text.strip():
            text = re.sub(r"\n\s*\n+", "\n\n", tree.text_content()).strip()
        for href in tree.xpath("//a/@href"):
            absolute = urljoin(url, str(href).strip()).split("#", 1)[0]
            if absolute.startswith(("http://", "https://")):
                links.append(absolute)
    except Exception:  # noqa: BLE001  (unparseable markup: keep whatever trafilatura found)
        pass
    if not title:
        m = _TITLE.search(html[:100_000])
        title = re.sub(r"\s+", " ", m.group(1)).strip() if m else ""
    return title, text, tuple(dict.fromkeys(links))[:MAX_LINKS]


@dataclass
class FetchOptions:
    """How `WebFetcher` fetches: WebQA-v0's `fetch_options` env kwarg, by field name."""

    allow: tuple[str, ...] | list[str] = ()  # hosts, host:port or networks the SSRF guard lets through
    block: tuple[str, ...] | list[str] = ()  # domains never fetched (benchmark answer pages)
    connect_timeout: float = 5.0
    read_timeout: float = 10.0
    total_timeout: float = 20.0
    max_bytes: int = 2_000_000
    max_redirects: int = 5
    max_concurrency: int = 16
    user_agent: str = "searchgym-webfetch/0.1 (+https://github.com/searchgym)"
    jina_api_key: str | None = None  # None: the JINA_API_KEY environment variable
    use_jina: bool | None = None  # None: when a Jina key is given
    jina_endpoint: str = JINA_ENDPOINT


class WebFetcher:
    """PageBackend over HTTP(S): guarded, size- and time-bounded, with text extraction (or the Jina reader).

    `policy` (shared with the search tool) replaces the one `options.allow` / `options.block` would make."""

    def __init__(self, options: FetchOptions | None = None, *, policy: UrlPolicy | None = None):
        o = self.options = options or FetchOptions()
        self.policy = policy or UrlPolicy(allow=o.allow, block=o.block)
        self.connect_timeout, self.read_timeout, self.total_timeout = o.connect_timeout, o.read_timeout, o.total_timeout
        self.max_bytes, self.max_redirects = o.max_bytes, o.max_redirects
        self.max_concurrency, self.user_agent = o.max_concurrency, o.user_agent
        self.jina_api_key = o.jina_api_key if o.jina_api_key is not None else os.environ.get("JINA_API_KEY")
        self.use_jina = bool(self.jina_api_key) if o.use_jina is None else o.use_jina
        if self.use_jina and not self.jina_api_key:
            raise ValueError("use_jina=True needs jina_api_key=... or the JINA_API_KEY environment variable")
        if not self.use_jina:  # pages are extracted here: fail now, not at the first page
            require("reading web pages", "trafilatura", "lxml")
        self.jina_endpoint = o.jina_endpoint if o.jina_endpoint.endswith("/") else o.jina_endpoint + "/"
        self.counters: Counter[str] = Counter()
        self._guarded = LoopSession(self._guarded_session)  # agent-chosen URLs: dials only checked addresses
        self._plain = LoopSession(self._plain_session)  # the trusted Jina endpoint
        self._sem: asyncio.Semaphore | None = None

    # --- the PageBackend API -----------------------------------------------------------------

    async def fetch(self, url: str) -> Page:
        """Fetch url and return its text; raise PageNotFound (404/410) or BackendError with the reason."""
        self.counters["requests"] += 1
        url = url.strip()
        if "://" not in url:
            url = "https://" + url
        _, fresh = await self._guarded.get()
        if fresh or self._sem is None:  # a semaphore belongs to one loop, like the session
            self._sem = asyncio.Semaphore(self.max_concurrency)
        try:
            async with self._sem:
                page = await asyncio.wait_for(self._fetch(url), self.total_timeout)
        except PageNotFound:
            self.counters["not_found"] += 1
            raise
        except BlockedURL:
            self.counters["blocked"] += 1
            raise
        except UnsafeURL:
            self.counters["refused_unsafe"] += 1
            raise
        except BackendError:
            raise
        except TimeoutError:
            self.counters["timeout"] += 1
            raise BackendError(f"timed out after {self.total_timeout:g}s") from None
        except aiohttp.ClientConnectorError as e:
            self.counters["connect_error"] += 1
            raise BackendError(
                f"could not connect to {e.host}:{e.port} ({e.os_error.strerror or e.os_error})"
            ) from None
        except (aiohttp.ClientError, OSError, ValueError, UnicodeError, LookupError) as e:
            self.counters["client_error"] += 1
            raise BackendError(f"{type(e).__name__}: {str(e)[:200]}") from None
        self.counters["ok"] += 1
        return page

    def stats(self) -> dict[str, Any]:
        """Cumulative fetch counters (requests, ok, and one per failure kind) for the env's info."""
        return {"fetch": dict(self.counters)}

    async def close(self) -> None:
        """Close this loop's HTTP sessions."""
        await self._guarded.close()
        await self._plain.close()

    def __getstate__(self) -> dict[str, Any]:
        """Pickles without its loop-bound semaphore (a copy makes its own)."""
        return {**self.__dict__, "_sem": None}

    # --- internals --------------------------------------------------------------------------

    def _fail(self, kind: str, message: str) -> BackendError:
        """Count a failure kind and build its error."""
        self.counters[kind] += 1
        return BackendError(message)

    def _guarded_session(self) -> aiohttp.ClientSession:
        """A session whose connector resolves through the SafeResolver (LoopSession makes one per loop)."""
        connector = aiohttp.TCPConnector(
            resolver=SafeResolver(self.policy), limit=self.max_concurrency, use_dns_cache=False
        )
        headers = {
            "User-Agent": self.user_agent,
            "Accept": "text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.1",
        }
        return aiohttp.ClientSession(connector=connector, headers=headers, trust_env=False, auto_decompress=True)

    def _plain_session(self) -> aiohttp.ClientSession:
        """A plain session for the Jina reader, which fetches the page itself."""
        return aiohttp.ClientSession(headers={"User-Agent": self.user_agent}, trust_env=False)

    def _timeout(self) -> aiohttp.ClientTimeout:
        """Connect, read and total time limits of one request."""
        return aiohttp.ClientTimeout(
            total=self.total_timeout, sock_connect=self.connect_timeout, sock_read=self.read_timeout
        )

    async def _fetch(self, url: str) -> Page:
        """Check, request and follow redirects by hand (each hop re-checked), then read the page."""
        if self.use_jina:  # the reader service fetches it, not us: no address of ours is at risk
            return await self._fetch_jina(str(self.policy.check_syntax(url)))
        current = str(await self.policy.check(url))  # refused before any connection is made
        session, _ = await self._guarded.get()
        for _hop in range(self.max_redirects + 1):
            charge(fetches=1)
            async with session.get(current, allow_redirects=False, timeout=self._timeout()) as resp:
                if resp.status in REDIRECTS and "Location" in resp.headers:
                    self.counters["redirects"] += 1
                    target = urljoin(current, resp.headers["Location"])
                    current = str(await self.policy.check(target))  # every hop is checked again
                    continue
                return await self._read(resp, current)
        raise self._fail("too_many_redirects", f"more than {self.max_redirects} redirects; giving up")

    async def _read(self, resp: aiohttp.ClientResponse, url: str) -> Page:
        """Status and content-type checks, capped read, decoding and extraction of a final response."""
        if resp.status in (404, 410):
            raise PageNotFound(url)
        if resp.status >= 500:
            raise self._fail("http_5xx", f"the server answered HTTP {resp.status}")
        if resp.status >= 400:
            raise self._fail("http_4xx", f"the server answered HTTP {resp.status}")
        ctype = resp.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        if ctype and not (ctype in TEXT_TYPES or ctype.startswith("text/")):
            raise self._fail("binary", f"the page is {ctype}, not HTML or text, and cannot be read")
        body, truncated, early = await self._read_capped(resp)
        if b"\x00" in body[:4096]:
            raise self._fail("binary", "the page is binary data, not HTML or text, and cannot be read")
        text, _ = decode_body(body, resp.charset)
        if ctype in ("text/html", "application/xhtml+xml") or (not ctype and "<html" in text[:2000].lower()):
            title, main, links = await asyncio.to_thread(extract_html, text, url)
        else:
            title, main, links = url.rsplit("/", 1)[-1] or url, text, ()
        if truncated:
            main += f"\n\n[... page cut at {self.max_bytes} bytes]"
        if early:
            main += "\n\n[... the connection closed before the page was complete]"
        return Page(url=url, title=title or url, text=main, links=links)

    async def _read_capped(self, resp: aiohttp.ClientResponse) -> tuple[bytes, bool, bool]:
        """Read up to max_bytes; (body, cut at the cap, server closed early). Stops reading at the cap."""
        declared = resp.content_length
        if declared is not None and declared > self.max_bytes:
            self.counters["too_large"] += 1
        parts, size = [], 0
        try:
            async for chunk in resp.content.iter_chunked(65536):
                parts.append(chunk)
                size += len(chunk)
                if size > self.max_bytes:
                    if declared is None or declared <= self.max_bytes:
                        self.counters["too_large"] += 1
                    resp.close()  # drop the connection instead of draining the rest
                    charge(bytes_fetched=size)
                    return b"".join(parts)[: self.max_bytes], True, False
        except aiohttp.ClientPayloadError:
            charge(bytes_fetched=size)
            self.counters["truncated"] += 1
            if not parts:
                raise BackendError("the connection closed before any of the page arrived") from None
            return b"".join(parts), False, True
        charge(bytes_fetched=size)
        return b"".join(parts), False, False

    async def _fetch_jina(self, url: str) -> Page:
        """Fetch through the Jina reader (GET endpoint + url, bearer key); it returns the page as text."""
        session, _ = await self._plain.get()
        headers = {"Authorization": f"Bearer {self.jina_api_key}", "Accept": "text/plain"}
        charge(api_calls=1)  # the reader service bills each page
        async with session.get(self.jina_endpoint + url, headers=headers, timeout=self._timeout()) as resp:
            if resp.status in (404, 410, 422):
                raise PageNotFound(url)
            if resp.status >= 400:
                raise self._fail("jina_error", f"the Jina reader answered HTTP {resp.status}")
            body, truncated, _ = await self._read_capped(resp)
        text, _ = decode_body(body, resp.charset)
        title = url
        m = re.match(r"\s*Title:\s*(.*)", text)
        if m:
            title = m.group(1).strip() or url
        marker = text.find("Markdown Content:")
        main = text[marker + len("Markdown Content:") :].strip() if marker >= 0 else text
        if truncated:
            main += f"\n\n[... page cut at {self.max_bytes} bytes]"
        self.counters["jina"] += 1
        return Page(url=url, title=title, text=main, links=())
