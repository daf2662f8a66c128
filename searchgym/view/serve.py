"""Serving the viewer from the command line: on 127.0.0.1 only, until Ctrl-C.

asyncio.run(serve_viewer([Path("runs/quickstart")], port=8765))
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable
from pathlib import Path

from searchgym.serve.http import serve_app
from searchgym.view.app import PROBLEMS, RUNS, viewer_app

HOST = "127.0.0.1"  # the viewer shows what a run holds to whoever can reach it: this machine only


async def serve_viewer(paths: list[Path], port: int = 8765, ready: Callable[[str], None] | None = None) -> None:
    """Serve the viewer over `paths` until cancelled; `ready(url)` once it answers (default: print where)."""
    app = viewer_app(paths)
    for problem in app[PROBLEMS]:
        print(f"searchgym view: {problem.where}: {problem.why}", file=sys.stderr)
    if not app[RUNS]:
        raise ValueError("no run to show in " + ", ".join(str(p) for p in paths))
    async with contextlib.AsyncExitStack() as stack:
        try:
            url = await stack.enter_async_context(serve_app(app, HOST, port, shutdown_timeout=1.0))
        except OSError as e:  # the port is taken (or not ours to bind)
            raise ValueError(f"cannot serve on {HOST}:{port} ({e.strerror or e}); choose another with --port") from None
        if ready is not None:
            ready(url)
        else:
            print(f"searchgym view: {len(app[RUNS])} runs at {url}/ (Ctrl-C stops)", flush=True)
        await asyncio.Event().wait()
