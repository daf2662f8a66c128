"""An agent program's time budget, enforced by something the agent cannot swallow.

`asyncio.wait_for` waits for the task it cancels, so an agent that catches `CancelledError` in a loop outlives any
timeout (and its late answer used to be judged). Here the agent runs as a task of its own: at the deadline the episode
is closed (`on_deadline`: tools refuse, the answer is ignored), the task is cancelled, and if it has not ended within
a grace period it is abandoned: never awaited again, its result never read, counted in `Abandoned` until it ends.
The whole wait is bounded by `timeout + grace(timeout)`, at most 1.5x the timeout. An agent that blocks the event loop
itself (a busy loop with no `await`) cannot be stopped in-process; that needs a child process.

`SystemExit` (and any other `Exception`) raised by the agent is caught inside its own task, so it ends the episode,
never the run or the event loop; `KeyboardInterrupt` is the user's Ctrl-C and still propagates.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)

CANCEL_GRACE = 10.0  # seconds at most that a cancelled agent has to end before it is abandoned


def grace(timeout: float) -> float:
    """How long a cancelled agent may take to end: half its timeout, at most CANCEL_GRACE seconds."""
    return min(timeout / 2, CANCEL_GRACE)


class Abandoned:
    """Agent tasks that ignored cancellation and were left running; each leaves this set when it finally ends."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def add(self, task: asyncio.Task[Any], why: str, *, ignored: bool = True) -> None:
        """Stop waiting for `task`: keep a reference (so it is not collected mid-run) until it ends, then drop it;
        `ignored`: it ignored its cancellation (logged), else it was only just cancelled."""
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        if ignored:
            log.warning("an agent program ignored cancellation and was abandoned (%s); it is still running", why)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # read, so asyncio does not log "exception was never retrieved" for a dropped result


async def _guarded(start: Callable[[], Awaitable[Any]]) -> tuple[Any, str | None]:
    """The agent's answer, or why it has none; its `SystemExit` is caught here, inside its own task."""
    try:
        return await start(), None
    except (Exception, SystemExit) as e:  # noqa: BLE001 -- the agent is user code: its failure ends the episode
        return None, f"agent error: {type(e).__name__}: {e}"


async def run_within(
    start: Callable[[], Awaitable[Any]], timeout: float | None, abandoned: Abandoned, on_deadline: Callable[[], None]
) -> tuple[Any, str | None]:
    """The agent that `start()` begins, run for at most `timeout` s (None: no limit): (answer, None) or (None, why).

    At the deadline `on_deadline()` runs first (so nothing the agent does afterwards counts), then the agent is
    cancelled; one that is still running `grace(timeout)` later is left to `abandoned`. A late return is dropped."""
    task = asyncio.ensure_future(_guarded(start))
    try:
        await asyncio.wait({task}, timeout=timeout)
    except BaseException:  # the episode itself is cancelled: cancel the agent too, without waiting on it
        task.cancel()
        if not task.done():
            abandoned.add(task, "its episode was cancelled", ignored=False)
        raise
    if task.done():
        return task.result()
    assert timeout is not None
    on_deadline()
    why = f"agent timeout: still running after {timeout:g} s"
    task.cancel()
    try:
        await asyncio.wait({task}, timeout=grace(timeout))
    except BaseException:
        if not task.done():
            abandoned.add(task, "its episode was cancelled", ignored=False)
        raise
    if not task.done():
        abandoned.add(task, why)
        return None, f"{why}; it ignored cancellation and was abandoned"
    if not task.cancelled():
        task.exception()  # a late answer or error is dropped, not judged
    return None, why
