"""`searchgym view`: its settings (the command's arguments are these fields) and the page it serves."""

from __future__ import annotations

from dataclasses import dataclass

from searchgym.settings import setting


@dataclass
class ViewSettings:
    """Runs to show (run folders, or folders above runs) and the local port of the page."""

    runs: list[str] = setting(default_factory=list, metavar="RUN_DIR", help="a run folder, or a folder above runs")
    port: int = setting(8765, at_least=0, help="port on 127.0.0.1 (default 8765; 0 picks a free one)")


def view_command(settings: ViewSettings) -> None:
    """Serve the viewer until interrupted."""
    import asyncio
    from pathlib import Path

    from searchgym.view.serve import serve_viewer

    try:
        asyncio.run(serve_viewer([Path(run) for run in settings.runs], port=settings.port))
    except KeyboardInterrupt:
        pass
