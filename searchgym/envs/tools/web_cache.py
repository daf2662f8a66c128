"""Record/replay cache on disk (SQLite) for web search results and pages.

A web-backed evaluation costs money and the web changes under it; the cache pays each query or
URL once and lets a run be replayed exactly. Keys are normalised queries (NFKC, case-folded,
whitespace collapsed, plus k) and normalised URLs (scheme and host lower-cased, default port and
fragment dropped). Modes: ``off`` (pass through), ``read_write`` (serve hits, record misses),
``replay_only`` (serve hits; a miss is a BackendError and never a network call). Not-found pages
are recorded too, so a replay also reproduces the 404s; transient errors are not recorded.

A damaged row (or a damaged database) is a counted miss (`damaged`), never an exception out of `step`;
in replay_only it is the same clear BackendError as any miss. Recorded pages are served only if the
current URL policy allows their URL: a cache recorded under a looser policy does not bypass it.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
import time
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any

from yarl import URL

from searchgym.envs.tools.base import (
    BackendError,
    Page,
    PageBackend,
    PageNotFound,
    SearchBackend,
    SearchHit,
    backend_stats,
)
from searchgym.envs.tools.url_safety import UnsafeURL, UrlPolicy, parse_numeric_host

MODES = ("off", "read_write", "replay_only")


def normalise_query(query: str) -> str:
    """The cache key form of a query: NFKC, case-folded, whitespace collapsed."""
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", query)).strip().casefold()


def normalise_url(url: str) -> str:
    """The cache key form of a URL: lower-case scheme and host, no default port, no fragment."""
    url = url.strip()
    try:
        u = URL(url)
        if not u.scheme or not u.host:
            return url
        return str(u.with_fragment(None).with_host(u.host.lower().rstrip(".")))
    except (ValueError, TypeError):
        return url


class WebCache:
    """One SQLite file of recorded search answers and pages, shared by `CachedSearch` and `CachedPages`."""

    def __init__(self, path: str | os.PathLike, mode: str = "read_write"):
        if mode not in MODES:
            raise ValueError(f"cache mode must be one of {MODES}, got {mode!r}")
        self.path, self.mode = Path(path), mode
        self.counters: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        if mode != "off":
            if mode == "replay_only" and not self.path.exists():
                raise FileNotFoundError(f"replay_only cache {self.path} does not exist; record it first (read_write)")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute(
                    "CREATE TABLE IF NOT EXISTS entries (kind TEXT, key TEXT, value TEXT, "
                    "created REAL, PRIMARY KEY (kind, key))"
                )
            except sqlite3.DatabaseError as e:
                raise ValueError(
                    f"web cache {self.path} is damaged ({e}): move it aside to record a new one, "
                    "or restore it from a copy"
                ) from None

    def get(self, kind: str, key: str) -> Any | None:
        """The recorded value for (kind, key), or None; counts a hit, a miss, or a damaged row (a miss too)."""
        if self._db is None:
            return None
        try:
            with self._lock:
                row = self._db.execute("SELECT value FROM entries WHERE kind=? AND key=?", (kind, key)).fetchone()
            value = json.loads(row[0]) if row else None
            if row and value is None:
                raise ValueError("a null entry")
        except (sqlite3.DatabaseError, ValueError, TypeError):  # a damaged file or row: as good as absent
            return self.damaged(kind)
        self.counters[f"{kind}_{'hits' if row else 'misses'}"] += 1
        return value

    def damaged(self, kind: str, *, counted_as_hit: bool = False) -> None:
        """Count a recorded entry that could not be used; it is treated as a miss."""
        self.counters["damaged"] += 1
        self.counters[f"{kind}_misses"] += 1
        if counted_as_hit:
            self.counters[f"{kind}_hits"] -= 1
        return None

    def put(self, kind: str, key: str, value: Any) -> None:
        """Record value for (kind, key) (read_write mode only); a damaged database is counted, not raised."""
        if self._db is None or self.mode != "read_write":
            return
        try:
            with self._lock:
                self._db.execute(
                    "INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?)",
                    (kind, key, json.dumps(value, ensure_ascii=False), time.time()),
                )
        except sqlite3.DatabaseError:
            self.counters["write_errors"] += 1
            return
        self.counters["writes"] += 1

    def stats(self) -> dict[str, Any]:
        """Hits, misses and hit rates per kind, for the env's info."""
        out: dict[str, Any] = {"mode": self.mode, **self.counters}
        for kind in ("search", "page"):
            hits, misses = self.counters[f"{kind}_hits"], self.counters[f"{kind}_misses"]
            if hits + misses:
                out[f"{kind}_hit_rate"] = hits / (hits + misses)
        return out

    def __len__(self) -> int:
        if self._db is None:
            return 0
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM entries").fetchone()[0]

    def close(self) -> None:
        """Close the database."""
        if self._db is not None:
            with self._lock:
                self._db.close()
            self._db = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickles as its file, mode and counters: a copy (a vector-env worker, a deepcopy) opens the file again."""
        return {"path": self.path, "mode": self.mode, "counters": self.counters}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["mode"])  # type: ignore[misc]
        self.counters.update(state["counters"])


class _CachedBackend:
    """What both cached wrappers share: the wrapped backend's counters plus the cache's, and close()."""

    backend: Any
    cache: WebCache

    def stats(self) -> dict[str, Any]:
        """The wrapped backend's counters plus the cache's."""
        return {**backend_stats(self.backend), "cache": self.cache.stats()}

    async def close(self) -> None:
        """Close the wrapped backend."""
        close = getattr(self.backend, "close", None)
        if close is not None:
            await close()


class CachedSearch(_CachedBackend):
    """A SearchBackend that serves recorded answers and records new ones (or refuses misses in replay_only)."""

    def __init__(self, backend: SearchBackend, cache: WebCache):
        self.backend, self.cache = backend, cache

    async def search(self, query: str, k: int) -> list[SearchHit]:
        """Recorded hits for (query, k) if any; else ask the backend (unless replay_only) and record."""
        if self.cache.mode == "off":
            return await self.backend.search(query, k)
        key = f"{k}\x00{normalise_query(query)}"
        rows = self.cache.get("search", key)
        if rows is not None:
            try:
                return [SearchHit(**row) for row in rows]
            except (TypeError, ValueError):  # not a list of hit records
                self.cache.damaged("search", counted_as_hit=True)
        if self.cache.mode == "replay_only":
            raise BackendError(f"replay-only cache has no recorded search for {query[:200]!r}; no network call made")
        hits = await self.backend.search(query, k)
        self.cache.put("search", key, [h.__dict__ for h in hits])
        return hits


class CachedPages(_CachedBackend):
    """A PageBackend that serves recorded pages (and 404s) and records new ones (or refuses misses in replay_only)."""

    def __init__(self, backend: PageBackend, cache: WebCache, policy: UrlPolicy | None = None):
        self.backend, self.cache = backend, cache
        self.policy = policy if policy is not None else getattr(backend, "policy", None)

    async def fetch(self, url: str) -> Page:
        """The recorded page for url if any; else fetch (unless replay_only) and record it."""
        if self.cache.mode == "off":
            return await self.backend.fetch(url)
        key = normalise_url(url)
        row = self.cache.get("page", key)
        if row is not None:
            page = self._page(url, row)
            if page is not None:
                return page
        if self.cache.mode == "replay_only":
            raise BackendError(f"replay-only cache has no recorded page for {url[:300]}; no network call made")
        try:
            page = await self.backend.fetch(url)
        except PageNotFound:
            self.cache.put("page", key, {"not_found": True})
            raise
        self.cache.put(
            "page",
            key,
            {"url": page.url, "title": page.title, "text": page.text, "links": list(page.links), "doc_id": page.doc_id},
        )
        return page

    def _page(self, url: str, row: Any) -> Page | None:
        """The recorded page (or its 404) after the current URL policy allows it; None for a damaged row."""
        try:
            if row.get("not_found"):
                self._check_policy(url)
                raise PageNotFound(url)
            page = Page(
                url=row["url"],
                title=row["title"],
                text=row["text"],
                links=tuple(row["links"]),
                doc_id=row.get("doc_id"),
            )
            if not all(isinstance(x, str) for x in (page.url, page.title, page.text, *page.links)):
                raise TypeError("non-text fields")
        except (AttributeError, KeyError, TypeError, ValueError):
            return self.cache.damaged("page", counted_as_hit=True)
        for where in dict.fromkeys((url, page.url)):  # the url asked for and where it led when recorded
            self._check_policy(where)
        return page

    def _check_policy(self, url: str) -> None:
        """Refuse, without any network use, a recorded URL the current policy would not let the fetcher open."""
        if self.policy is None:
            return
        parsed = self.policy.check_syntax(url if "://" in url else "https://" + url)
        host = (parsed.raw_host or parsed.host or "").lower().rstrip(".")
        port = parsed.port
        if host in ("localhost", "localhost.localdomain") or host.endswith(".localhost"):
            if not self.policy.name_allowed(host, port):
                raise UnsafeURL(f"{host} is a loopback name; refused (recorded under another policy)")
        ip = parse_numeric_host(host)
        if ip is not None and not self.policy.address_ok(host, ip, port):
            raise UnsafeURL(f"{host} is not a public address; refused (recorded under another policy)")
