"""`searchgym view` in a real browser (Chromium driven by Playwright) over a real quickstart run at toy scale: open
the run, filter, open an episode, step to its last turn, compare the two policies; each page is checked for what
it shows and, at 1,280 and 800 px wide, for anything that runs off the page. Screenshots go to the test's folder."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from searchgym.eval.report import outcome
from searchgym.pipeline.stages import load_quickstart_config
from searchgym.quickstart import run_quickstart
from searchgym.view.app import viewer_app
from tests.servers import ThreadServer
from tests.test_quickstart import TOY

CHROMIUM = shutil.which("chromium")
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extra")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium package is not installed")
WIDTHS = (1280, 800)


@pytest.fixture(scope="module")
def quickstart_run(tmp_path_factory, small_bundle):
    """OUT of `searchgym quickstart` at the toy scale of tests/test_quickstart.py: eval-sft, eval-rl and rl."""
    out = tmp_path_factory.mktemp("quickstart")
    run_quickstart(load_quickstart_config([f"out_dir={out}", *TOY]), progress=False)
    return out


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


def fits(page) -> None:
    """Nothing on the page is wider than the window: no sideways scrolling."""
    scroll, window = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert scroll <= window, f"{page.url} is {scroll} px wide in a {window} px window"


@pytest.mark.parametrize("width", WIDTHS)
def test_a_quickstart_run_in_the_browser(quickstart_run, browser, width, tmp_path):
    with ThreadServer.app(viewer_app([quickstart_run])) as url:
        page = browser.new_page(viewport={"width": width, "height": 900})
        shots: list[Path] = []

        def look(name: str) -> None:
            fits(page)
            shots.append(tmp_path / f"{name}-{width}.png")
            page.screenshot(path=str(shots[-1]), full_page=True)

        # the runs: both evaluations and the training run, with their charts drawn
        page.goto(url + "/")
        labels = page.locator("#runs tbody tr td:first-child").all_inner_texts()
        assert labels == [f"{quickstart_run.name}/{name}" for name in ("eval-rl", "eval-sft", "rl")]
        assert page.locator("#runs").inner_text().count("Avg@2: EM") == 2
        charts = page.locator("#charts img")
        assert charts.count() >= 4 and all(
            page.evaluate("(img) => img.complete && img.naturalWidth > 0", charts.nth(i).element_handle())
            for i in range(charts.count())
        )
        look("runs")

        # one run's episodes, then filtered through the form to an outcome (by EM) some of them have
        samples = [json.loads(line) for line in (quickstart_run / "eval-sft" / "samples.jsonl").open()]
        questions = len({row["task_id"] for row in samples})
        page.click("#runs >> text=eval-sft")
        total = page.locator("tr.episode").count()
        assert total == len(samples) == 2 * questions  # every held-out question, k=2
        outcomes = Counter(outcome(row, "em") for row in samples)
        chosen = outcomes.most_common(1)[0][0]
        page.select_option("select[name=outcome]", chosen)
        page.select_option("select[name=judge]", "em")
        page.click("#apply")
        assert f"outcome={chosen}" in page.url
        kept = page.locator("tr.episode")
        assert kept.count() == outcomes[chosen] == page.locator(f"tr.episode.{chosen}").count()
        assert page.locator("#matched").inner_text().startswith(f"{kept.count()} of {total} episodes")
        look("episodes")

        # one episode, stepped through to its last turn
        kept.first.locator("a").click()
        turns = page.locator("#outline tbody tr:not(.boundary)").count()
        assert turns >= 1 and page.locator("article.turn").count() == 1
        assert page.locator("#turn-position").inner_text() == f"turn 0 of {turns - 1}"
        for step in range(1, turns):
            page.click("#next-turn")
            assert page.locator("#turn-position").inner_text() == f"turn {step} of {turns - 1}"
            assert page.locator(f"#turn-{step}").is_visible()
        assert page.locator("#next-turn").count() == 0 and page.locator("#prev-turn").count() == (turns > 1)
        assert page.locator("#prediction").inner_text()
        look("episode")
        page.click("text=tokens")
        assert page.locator("#tokens tr.written").count() > 0  # the policy's own tokens, with their log-probs
        page.go_back()

        # the two policies side by side on the same questions
        page.goto(url + "/")
        page.select_option("select[name=a]", label=f"{quickstart_run.name}/eval-sft")
        page.select_option("select[name=b]", label=f"{quickstart_run.name}/eval-rl")
        page.click("text=Compare on the same questions")
        assert page.locator("#compare-counts").inner_text().startswith(f"{questions} questions in both runs")
        assert page.locator("#pairs tbody tr").count() == questions
        look("compare")
        page.locator("#pairs tbody a").first.click()
        sides = page.locator(".side")
        assert sides.count() == 2
        assert [sides.nth(i).locator("h2").inner_text() for i in range(2)] == [
            f"{quickstart_run.name}/eval-sft",
            f"{quickstart_run.name}/eval-rl",
        ]
        look("side-by-side")
        page.close()
    assert all(shot.stat().st_size > 0 for shot in shots)
