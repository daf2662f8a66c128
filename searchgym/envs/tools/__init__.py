"""Search and page backends behind the `SearchBackend` / `PageBackend` protocols."""

from searchgym.envs.tools.base import BackendError, Page, PageBackend, PageNotFound, SearchBackend, SearchHit

__all__ = ["BackendError", "Page", "PageBackend", "PageNotFound", "SearchBackend", "SearchHit"]
