"""Where a benchmark's numbers came from: the checkout's commit and the machine, as its results file records them."""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

from searchgym.eval.card import edited_package_files

REPO = Path(__file__).resolve().parents[2]


def git_commit() -> str | None:
    """The commit of the checkout searchgym runs from (None outside git)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def uncommitted_code(repo: Path = REPO) -> list[str]:
    """The package's tracked files that differ from the commit (`git_commit` alone would hide a run of edited code);
    [] for a clean checkout or outside git."""
    return edited_package_files(repo) or []


def machine(**extra: Any) -> dict[str, Any]:
    """Platform, Python and CPU count, plus what the benchmark adds (its torch threads, the load average...); the
    package's files edited since the commit, if any (`uncommitted_code`)."""
    edited = {"uncommitted_code": changed} if (changed := uncommitted_code()) else {}
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        **edited,
        **extra,
    }


def accelerator() -> str:
    """The GPU torch trains on here (its name), or "cpu"."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far, in bytes (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
