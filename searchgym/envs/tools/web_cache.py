"""Record/replay cache on disk (SQLite) for web search results and pages.

A web-backed evaluation costs money and the web changes under it; the cache pays each query or
URL once and lets a run be replayed exactly. Keys are normalised queries (NFKC, case-folded,
whitespace collapsed, plus k) and normalised URLs (scheme and host lower-cased, default port and
fragment dropped). Modes: ``off`` (pass through), ``read_write`` (serve hits, record misses),
``replay_only`` (serve hits; a miss is a BackendError and never a network call). Not-found pages
are recorded too, so a replay also reproduces the 404s; transient errors are not recorded.
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

from searchgym.envs.tools.base import BackendError, Page, PageBackend, PageNotFound, SearchBackend, SearchHit, backend_stats

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
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS entries (kind TEXT, key TEXT, value TEXT, "
                             "created REAL, PRIMARY KEY (kind, key))")

    def get(self, kind: str, key: str) -> Any | None:
        """The recorded value for (kind, key), or None; counts a hit or a miss."""
        if self._db is None:
            return None
        with self._lock:
            row = self._db.execute("SELECT value FROM entries WHERE kind=? AND key=?", (kind, key)).fetchone()
        self.counters[f"{kind}_{'hits' if row else 'misses'}"] += 1
        return json.loads(row[0]) if row else None

    def put(self, kind: str, key: str, value: Any) -> None:
        """Record value for (kind, key) (read_write mode only)."""
        if self._db is None or self.mode != "read_write":
            return
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?)",
                             (kind, key, json.dumps(value, ensure_ascii=False), time.time()))
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



class _CachedBackend:
    """What both cached wrappers share: the wrapped backend's counters plus the cache's, and close()."""

    backend: Any
    cache: "WebCache"

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
            return [SearchHit(**row) for row in rows]
        if self.cache.mode == "replay_only":
            raise BackendError(f"replay-only cache has no recorded search for {query[:200]!r}; no network call made")
        hits = await self.backend.search(query, k)
        self.cache.put("search", key, [h.__dict__ for h in hits])
        return hits



class CachedPages(_CachedBackend):
    """A PageBackend that serves recorded pages (and 404s) and records new ones (or refuses misses in replay_only)."""

    def __init__(self, backend: PageBackend, cache: WebCache):
        self.backend, self.cache = backend, cache

    async def fetch(self, url: str) -> Page:
        """The recorded page for url if any; else fetch (unless replay_only) and record it."""
        if self.cache.mode == "off":
            return await self.backend.fetch(url)
        key = normalise_url(url)
        row = self.cache.get("page", key)
        if row is not None:
            if row.get("not_found"):
                raise PageNotFound(url)
            return Page(url=row["url"], title=row["title"], text=row["text"], links=tuple(row["links"]),
                        doc_id=row.get("doc_id"))
        if self.cache.mode == "replay_only":
            raise BackendError(f"replay-only cache has no recorded page for {url[:300]}; no network call made")
        try:
            page = await self.backend.fetch(url)
        except PageNotFound:
            self.cache.put("page", key, {"not_found": True})
            raise
        self.cache.put("page", key, {"url": page.url, "title": page.title, "text": page.text,
                                     "links": list(page.links), "doc_id": page.doc_id})
        return page

