"""The search and page-access contracts every backend satisfies: local index, retrieval server, web."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

# The question, and its labelled answers, that the search being made serves: SearchEnv sets it around each search.
# A retriever never reads it; a simulated engine whose prompts ask for it writes ZeroSearch's answer-aware documents.
SEARCHING_FOR: ContextVar[tuple[str, tuple[str, ...]] | None] = ContextVar("searchgym_searching_for", default=None)


@dataclass(frozen=True)
class SearchHit:
    """One search result as the agent sees it: where it lives and a snippet of what it says."""

    doc_id: str
    title: str
    url: str
    snippet: str
    score: float


@dataclass(frozen=True)
class Page:
    """A whole page's plain text, served to the agent in chunks by the environment."""

    url: str
    title: str
    text: str
    links: tuple[str, ...] = field(default_factory=tuple)
    doc_id: str | None = None


class PageNotFound(LookupError):
    """The backend has no page at this url (the agent asked for an unknown url)."""


class BackendError(RuntimeError):
    """The backend failed (server down, timeout, bad response); the env turns it into an observation."""


@runtime_checkable
class SearchBackend(Protocol):
    """Anything that answers a text query with ranked hits."""

    async def search(self, query: str, k: int) -> list[SearchHit]: ...


@runtime_checkable
class PageBackend(Protocol):
    """Anything that returns a page's text for a url; raises PageNotFound for unknown urls."""

    async def fetch(self, url: str) -> Page: ...


def backend_stats(backend: Any) -> dict[str, Any]:
    """A backend's `stats()` (cache hit rates, error counters) if it has one, else {}; SearchEnv puts them in info."""
    stats = getattr(backend, "stats", None)
    return dict(stats()) if callable(stats) else {}
