"""A page in headless Chromium through Playwright, at the widths people read it at: does anything run off it?"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium")
WIDTHS = (1280, 800)

# the elements whose right edge passes the window, named by tag, class and the start of their text
RUNS_OFF = """() => Array.from(document.body.querySelectorAll("*"))
  .filter(e => e.getBoundingClientRect().right > window.innerWidth + 0.5)
  .slice(0, 5)
  .map(e => `${e.tagName.toLowerCase()}.${e.className}: ${(e.textContent || "").trim().slice(0, 60)}`)"""


def sync_playwright() -> Any:
    """Playwright's sync API; the test is skipped where Chromium or Playwright is missing."""
    if CHROMIUM is None:
        pytest.skip("Debian's chromium package is not installed")
    return pytest.importorskip("playwright.sync_api").sync_playwright


def layout(
    page_file: Path, *, prepare: str = "() => null", evaluate: str = "() => null", shots: Path | None = None
) -> dict[int, dict[str, Any]]:
    """Per window width, after `prepare` ran (a JS function of no arguments, e.g. one that opens every <details>):
    the page's scroll width, the window's width, what runs off it and `evaluate`'s result; with `shots`, a
    full-page screenshot per width in that directory."""
    out = {}
    with sync_playwright()() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            for width in WIDTHS:
                page = browser.new_page(viewport={"width": width, "height": 900})
                page.goto(page_file.as_uri())
                page.evaluate(prepare)
                out[width] = {
                    "scroll_width": page.evaluate("document.documentElement.scrollWidth"),
                    "window_width": page.evaluate("window.innerWidth"),
                    "runs_off": page.evaluate(RUNS_OFF),
                    "value": page.evaluate(evaluate),
                }
                if shots is not None:
                    page.screenshot(path=str(shots / f"{page_file.stem}-{width}.png"), full_page=True)
                page.close()
        finally:
            browser.close()
    return out


def assert_nothing_runs_off(found: dict[int, dict[str, Any]]) -> None:
    """At every width the page is no wider than the window (nothing to scroll sideways to)."""
    for width, at in found.items():
        assert at["window_width"] == width
        assert at["scroll_width"] <= width and not at["runs_off"], (width, at)
