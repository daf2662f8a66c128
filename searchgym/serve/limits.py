"""Socket-level limits of our servers (`serve search`, `serve model`, and `serve env`/`serve mcp` through
asgi_limits.py): the settings, whose fields are every `searchgym serve` command's limit flags (serve/settings.py).

aiohttp closes a connection that connects and sends nothing, or only part of a request head, only after its
3,630 s keep-alive (older releases never), and it accepts connections until the process runs out of file
descriptors. ServerLimits says
how long a client may take to send its first request head (`header_timeout`), how long a keep-alive
connection may sit idle (`idle_timeout`, which also bounds a later head), how long a request body may take
once its head is in (`body_timeout`), and how many connections may be open at once (`max_connections`; past it a new
one is answered 503 with Retry-After). guarded_site.py
enforces them.
"""

from __future__ import annotations

import argparse
import resource
from dataclasses import dataclass

from searchgym.settings import setting

PROMPT_CHARS_PER_TOKEN = 32  # the model server's default --max-prompt-chars per context token (real text: ~4)
DEFAULT_HEADER_TIMEOUT = 15.0
DEFAULT_IDLE_TIMEOUT = 75.0  # above aiohttp's client-side 15 s pool keep-alive, so a pooled request never races a close
DEFAULT_BODY_TIMEOUT = 60.0  # a 64 MiB body at 10 Mbit/s takes ~55 s; over loopback it is milliseconds
DEFAULT_MAX_CONNECTIONS = 4096  # above SGLangEngine's 1,024-connection pool and 1,000 load-bench clients
FINITE = float("inf")  # a number of seconds must be below this
FD_RESERVE = 128  # descriptors kept for files, the listening socket and refused connections' short lives


def raise_open_files_limit() -> tuple[int, int]:
    """Raise this process's soft open-files limit to its hard limit (children inherit it); the limits now.

    A server's connection cap must not sit below its clients' pools because of a shell's default `ulimit -n` 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # some systems cap an unlimited hard limit lower: keep what there is
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def default_max_connections() -> int:
    """DEFAULT_MAX_CONNECTIONS, or fewer when the descriptor limit (ulimit -n, first raised to its hard limit by
    `raise_open_files_limit`) is lower."""
    soft, _ = raise_open_files_limit()
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS
    return max(16, min(DEFAULT_MAX_CONNECTIONS, soft - FD_RESERVE))


@dataclass(frozen=True)
class ServerLimits:
    """How long a client may take to send a request head, stay idle between requests, and how many may connect.

    Every server's settings hold one as `limits`; its fields are the flags `--header-timeout`, `--idle-timeout`,
    `--body-timeout` and `--max-connections` of each `searchgym serve` command (serve/settings.py)."""

    header_timeout: float = setting(
        DEFAULT_HEADER_TIMEOUT,
        above=0,
        below=FINITE,
        metavar="S",
        help="close a connection whose request head is not whole S seconds after it connects",
    )
    idle_timeout: float = setting(
        DEFAULT_IDLE_TIMEOUT,
        above=0,
        below=FINITE,
        metavar="S",
        help="close a keep-alive connection idle for S seconds",
    )
    max_connections: int | None = setting(  # None: DEFAULT_MAX_CONNECTIONS within the descriptor limit
        None,
        at_least=1,
        metavar="N",
        help="open connections past which new ones get a 503 with Retry-After "
        f"(default {DEFAULT_MAX_CONNECTIONS}, fewer under a lower `ulimit -n`)",
    )
    body_timeout: float = setting(  # a request body must arrive whole this long after its head
        DEFAULT_BODY_TIMEOUT,
        above=0,
        below=FINITE,
        metavar="S",
        help="answer 408 to a request whose body is not whole S seconds after its head",
    )

    def __post_init__(self) -> None:
        for key in ("header_timeout", "idle_timeout", "body_timeout"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"{key} must be a positive finite number of seconds, got {value!r}")
        cap = self.max_connections
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ValueError(f"max_connections must be an integer of at least 1, got {cap!r}")

    @property
    def connection_cap(self) -> int:
        """max_connections, or the default for this process."""
        return self.max_connections if self.max_connections is not None else default_max_connections()


def seconds(text: str) -> float:
    """argparse type: a positive finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive finite number of seconds, got {text}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
