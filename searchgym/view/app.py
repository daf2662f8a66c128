"""`searchgym view`: a local web page over runs, served on 127.0.0.1 by aiohttp, its pages made by Jinja2.

    app = viewer_app([Path("runs/quickstart")])     # then `searchgym view runs/quickstart` serves it

Pages: the runs (with their charts), a run's episodes (filtered and sorted from the URL, 50 a page), one episode
turn by turn, its tokens a thousand at a time, a page of the world a search hit points at, and two runs side by
side on the same questions. Everything a run holds is escaped by Jinja2's autoescape; the pages run no script
(a Content-Security-Policy says so). The viewer only reads: it never writes to a run folder.
"""

from __future__ import annotations

import asyncio
import math
import statistics
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

from aiohttp import web

from searchgym.core.extras import needs
from searchgym.view.charts import CHARTS, NoChart, charts_for
from searchgym.view.episode import (
    TOKENS_PER_PAGE,
    EpisodeGone,
    episode_view,
    full_text,
    read_episode,
    token_page,
    tokenizer_for,
)
from searchgym.view.episode_filter import PAGE_SIZE, SORTS, EpisodeFilter
from searchgym.view.pages import page_text
from searchgym.view.runs import OUTCOMES, EpisodeSummary, Index, Problem, Run, field_list, find_runs

RUNS: web.AppKey[list[Run]] = web.AppKey("runs", list)
PROBLEMS: web.AppKey[list[Problem]] = web.AppKey("problems", list)
TEMPLATES: web.AppKey[Any] = web.AppKey("templates", object)
POLICY = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; base-uri 'none'"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
T = TypeVar("T")


class NotHere(Exception):
    """A page for something the runs do not have (HTTP 404 with an explanation)."""


class BadRequest(Exception):
    """A page asked for with a value it cannot use (HTTP 400 with an explanation)."""


def _templates() -> Any:
    with needs("searchgym view"):
        import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("searchgym.view", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def viewer_app(paths: list[Path]) -> web.Application:
    """The viewer over every run in or below `paths` (runs found once; their episodes re-read when they grow)."""
    app = web.Application(middlewares=[_explain_errors])
    app[TEMPLATES] = _templates()
    app[RUNS], app[PROBLEMS] = find_runs(paths)
    app.router.add_get("/", runs_page)
    app.router.add_get("/view.css", stylesheet)
    app.router.add_get("/run/{run}", episodes_page)
    app.router.add_get("/run/{run}/chart/{chart}.svg", chart)
    app.router.add_get("/run/{run}/page", world_page)
    app.router.add_get("/run/{run}/episode/{episode}", episode_page)
    app.router.add_get("/run/{run}/episode/{episode}/tokens", tokens_page)
    app.router.add_get("/run/{run}/episode/{episode}/turn/{turn}/{part}.txt", turn_text)
    app.router.add_get("/compare", compare_page)
    app.router.add_get("/compare/episode", compare_episode_page)
    return app


def render(request: web.Request, template: str, status: int = 200, **values: Any) -> web.Response:
    page = request.app[TEMPLATES].get_template(template).render(runs=request.app[RUNS], **values)
    return web.Response(text=page, content_type="text/html", status=status, headers={"Content-Security-Policy": POLICY})


@web.middleware
async def _explain_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A page the viewer cannot show is a page saying why (404, 400, 409), never a traceback."""
    try:
        return await handler(request)
    except NotHere as e:
        return render(request, "error.html", 404, title="Not found", message=str(e))
    except BadRequest as e:
        return render(request, "error.html", 400, title="Cannot show that", message=str(e))
    except EpisodeGone as e:
        return render(request, "error.html", 409, title="The run changed", message=str(e))
    except web.HTTPNotFound:
        return render(request, "error.html", 404, title="Not found", message=f"nothing at {request.path}")


def _int(request: web.Request, name: str, default: int | None = None, source: str = "query") -> int:
    raw = request.match_info.get(name) if source == "path" else request.query.get(name)
    if raw is None or raw == "":
        if default is None:
            raise BadRequest(f"{name} is missing")
        return default
    try:
        return int(raw)
    except ValueError:
        raise BadRequest(f"{name}: {raw[:40]!r} is not a whole number") from None


def _run(request: web.Request, value: int | None = None) -> tuple[int, Run]:
    runs = request.app[RUNS]
    number = _int(request, "run", source="path") if value is None else value
    if not 0 <= number < len(runs):
        raise NotHere(f"there is no run {number}: the viewer has {len(runs)}")
    return number, runs[number]


async def _index(run: Run) -> Index:
    """The run's episode index, built (or checked for growth) off the event loop."""
    return await asyncio.to_thread(run.index)


def paged(items: list[T], page: int) -> tuple[list[T], int, int]:
    """The PAGE_SIZE items of page `page` (clamped to the pages there are), that page and how many pages there are."""
    pages = max(1, math.ceil(len(items) / PAGE_SIZE))
    page = min(max(page, 1), pages)
    return items[(page - 1) * PAGE_SIZE : page * PAGE_SIZE], page, pages


async def _episode(run: Run, number: int) -> tuple[EpisodeSummary, dict[str, Any]]:
    index = await _index(run)
    if not 0 <= number < len(index.episodes):
        raise NotHere(f"run {run.label!r} has no episode {number} (it has {len(index.episodes)})")
    summary = index.episodes[number]
    return summary, await asyncio.to_thread(read_episode, run, summary)


def headline(run: Run) -> str:
    """The run's scores in one line, Avg@k per judge ("Avg@4: EM 0.312, F1 0.405"), from summary.json."""
    summary = run.summary()
    metrics, k = summary.get("metrics"), summary.get("k")
    if not isinstance(metrics, dict) or not isinstance(k, int):
        return "training run" if run.kind == "train" else "no summary.json yet (unfinished?)"
    judges = field_list(summary, "judges")
    scores = [
        f"{judge.upper() if len(judge) <= 3 else judge} {metrics[f'avg@{k}/{judge}']:.3f}"
        for judge in judges
        if isinstance(judge, str) and isinstance(metrics.get(f"avg@{k}/{judge}"), (int, float))
    ]
    if not scores and isinstance(metrics.get(f"avg@{k}/reward"), (int, float)):
        scores = [f"reward {metrics[f'avg@{k}/reward']:.3f}"]
    return f"Avg@{k}: {', '.join(scores)}" if scores else "no Avg@k in summary.json"


async def runs_page(request: web.Request) -> web.Response:
    runs = request.app[RUNS]
    indexes = await asyncio.gather(*(_index(run) for run in runs))
    rows = [
        {"number": i, "run": run, "index": index, "headline": headline(run), "charts": charts_for(run)}
        for i, (run, index) in enumerate(zip(runs, indexes, strict=True))
    ]
    return render(request, "runs.html", title="searchgym view", rows=rows, problems=request.app[PROBLEMS])


async def episodes_page(request: web.Request) -> web.Response:
    number, run = _run(request)
    index = await _index(run)
    chosen, errors = EpisodeFilter.parse(request.query, index.judges)
    shown = chosen.apply(index.episodes)
    on_page, page, pages = paged(shown, chosen.page)
    stops = sorted({e.stop_reason for e in index.episodes if e.stop_reason})
    hops = sorted({e.hops for e in index.episodes if e.hops is not None})
    return render(
        request,
        "episodes.html",
        title=run.label,
        number=number,
        run=run,
        index=index,
        chosen=chosen,
        errors=errors,
        shown=on_page,
        matched=len(shown),
        page=page,
        pages=pages,
        sorts=SORTS,
        outcomes=OUTCOMES,
        stops=stops,
        hops=hops,
        charts=charts_for(run),
        headline=headline(run),
    )


async def episode_page(request: web.Request) -> web.Response:
    number, run = _run(request)
    summary, row = await _episode(run, _int(request, "episode", source="path"))
    shown = episode_view(row, run.kind)
    all_turns = request.query.get("turn") == "all"
    turn = 0 if all_turns else _int(request, "turn", 0)
    if shown.turns and not 0 <= turn < len(shown.turns):
        raise BadRequest(f"turn {turn}: the episode has turns 0 to {len(shown.turns) - 1}")
    return render(
        request,
        "episode.html",
        title=f"{run.label}: {summary.task_id}",
        number=number,
        run=run,
        summary=summary,
        episode=shown,
        turn=turn,
        all_turns=all_turns,
        back=request.query.get("back", ""),
    )


async def tokens_page(request: web.Request) -> web.Response:
    number, run = _run(request)
    summary, row = await _episode(run, _int(request, "episode", source="path"))
    decode = await asyncio.to_thread(tokenizer_for, run)
    try:
        tokens = token_page(
            row, run.kind, segment=_int(request, "segment", 0), start=_int(request, "start", 0), decode=decode
        )
    except KeyError as e:
        raise NotHere(f"the episode has no {e.args[0]}") from None
    return render(
        request,
        "tokens.html",
        title=f"tokens of {summary.task_id}",
        number=number,
        run=run,
        summary=summary,
        tokens=tokens,
        per_page=TOKENS_PER_PAGE,
        decoded=decode is not None,
    )


async def turn_text(request: web.Request) -> web.Response:
    _, run = _run(request)
    _, row = await _episode(run, _int(request, "episode", source="path"))
    try:
        text = full_text(row, run.kind, _int(request, "turn", source="path"), request.match_info["part"])
    except KeyError as e:
        raise NotHere(f"the episode has no {e.args[0]}") from None
    return web.Response(text=text, content_type="text/plain", headers={"Content-Security-Policy": POLICY})


async def chart(request: web.Request) -> web.Response:
    _, run = _run(request)
    name = request.match_info["chart"]
    if name not in CHARTS:
        raise NotHere(f"there is no chart {name!r}: the charts are {', '.join(CHARTS)}")
    try:
        svg = await asyncio.to_thread(CHARTS[name], run)
    except NoChart as e:
        raise NotHere(f"run {run.label!r} has no {name} chart: {e}") from None
    return web.Response(body=svg, content_type="image/svg+xml", headers={"Content-Security-Policy": POLICY})


async def world_page(request: web.Request) -> web.Response:
    _, run = _run(request)
    url = request.query.get("url", "")
    if not url:
        raise BadRequest("url is missing")
    found = await page_text(run, url)
    return render(request, "page.html", title=found.title or url, run=run, url=url, found=found)


def _compare_pair(request: web.Request) -> tuple[tuple[int, Run], tuple[int, Run]]:
    a, b = _run(request, _int(request, "a")), _run(request, _int(request, "b"))
    if a[0] == b[0]:
        raise BadRequest("choose two different runs to compare")
    return a, b


@dataclass
class QuestionPair:
    """One question's mean reward over its samples in the left run (a) and the right one (b)."""

    task: str
    question: str
    a: float
    b: float

    @property
    def delta(self) -> float:
        return self.b - self.a


def per_question(episodes: list[EpisodeSummary]) -> dict[str, list[EpisodeSummary]]:
    out: dict[str, list[EpisodeSummary]] = {}
    for episode in episodes:
        out.setdefault(episode.task_id, []).append(episode)
    return out


async def compare_page(request: web.Request) -> web.Response:
    (na, a), (nb, b) = _compare_pair(request)
    ia, ib = await asyncio.gather(_index(a), _index(b))
    qa, qb = per_question(ia.episodes), per_question(ib.episodes)
    shared = [task for task in qa if task in qb]
    rows = [
        QuestionPair(
            task,
            qa[task][0].question,
            statistics.fmean(e.reward for e in qa[task]),
            statistics.fmean(e.reward for e in qb[task]),
        )
        for task in shared
    ]
    changed = request.query.get("changed") in ("1", "on")
    order = request.query.get("sort", "delta")
    listed = [r for r in rows if r.delta != 0] if changed else rows
    if order == "delta":
        listed.sort(key=lambda r: -abs(r.delta))
    on_page, page, pages = paged(listed, _int(request, "page", 1))
    counts = {
        "better": sum(r.delta > 0 for r in rows),
        "worse": sum(r.delta < 0 for r in rows),
        "same": sum(r.delta == 0 for r in rows),
    }
    means = {
        "a": statistics.fmean(r.a for r in rows) if rows else None,
        "b": statistics.fmean(r.b for r in rows) if rows else None,
    }
    query = {"a": na, "b": nb, **({"changed": 1} if changed else {}), "sort": order}
    return render(
        request,
        "compare.html",
        title=f"{a.label} against {b.label}",
        a=a,
        b=b,
        na=na,
        nb=nb,
        rows=on_page,
        shared=len(shared),
        only_a=len(qa) - len(shared),
        only_b=len(qb) - len(shared),
        counts=counts,
        means=means,
        changed=changed,
        order=order,
        page=page,
        pages=pages,
        query=urlencode(query),
    )


async def compare_episode_page(request: web.Request) -> web.Response:
    (na, a), (nb, b) = _compare_pair(request)
    task = request.query.get("task", "")
    of_task = []
    for run in (a, b):
        found = [e for e in (await _index(run)).episodes if e.task_id == task]
        if not found:
            raise NotHere(f"run {run.label!r} has no episode of question {task[:80]!r}")
        of_task.append(found)
    samples = min(len(found) for found in of_task)
    differing = [s for s in range(samples) if of_task[0][s].reward != of_task[1][s].reward]
    sample = _int(request, "sample", differing[0] if differing else 0)  # by default the first sample that differs
    if not 0 <= sample < samples:
        raise BadRequest(f"sample {sample}: both runs have samples 0 to {samples - 1} of this question")
    sides = []
    for number, run, found in ((na, a, of_task[0]), (nb, b, of_task[1])):
        row = await asyncio.to_thread(read_episode, run, found[sample])
        sides.append({"number": number, "run": run, "summary": found[sample], "episode": episode_view(row, run.kind)})
    return render(
        request,
        "compare_episode.html",
        title=f"{task}: {a.label} against {b.label}",
        sides=sides,
        task=task,
        sample=sample,
        samples=samples,
        na=na,
        nb=nb,
    )


async def stylesheet(request: web.Request) -> web.Response:
    css = (Path(__file__).parent / "templates" / "view.css").read_text()
    return web.Response(text=css, content_type="text/css")
