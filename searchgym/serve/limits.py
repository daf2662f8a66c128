"""Socket-level limits of our aiohttp servers (`serve search`, `serve model`): the settings and their flags.

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

PROMPT_CHARS_PER_TOKEN = 32  # the model server's default --max-prompt-chars per context token (real text: ~4)
DEFAULT_HEADER_TIMEOUT = 15.0
DEFAULT_IDLE_TIMEOUT = 75.0  # above aiohttp's client-side 15 s pool keep-alive, so a pooled request never races a close
DEFAULT_BODY_TIMEOUT = 60.0  # a 64 MiB body at 10 Mbit/s takes ~55 s; over loopback it is milliseconds
DEFAULT_MAX_CONNECTIONS = 4096  # above SGLangEngine's 1,024-connection pool and 1,000 load-bench clients
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
    """How long a client may take to send a request head, stay idle between requests, and how many may connect."""

    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    max_connections: int | None = None  # None: DEFAULT_MAX_CONNECTIONS within the descriptor limit
    body_timeout: float = DEFAULT_BODY_TIMEOUT  # a request body must arrive whole this long after its head

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


def add_limit_flags(parser: argparse.ArgumentParser) -> None:
    """`--header-timeout`, `--idle-timeout`, `--max-connections`: shared by `serve search` and `serve model`."""
    parser.add_argument(
        "--header-timeout",
        type=seconds,
        default=DEFAULT_HEADER_TIMEOUT,
        metavar="S",
        help="close a connection whose request head is not whole S seconds after it connects "
        f"(default {DEFAULT_HEADER_TIMEOUT:g})",
    )
    parser.add_argument(
        "--idle-timeout",
        type=seconds,
        default=DEFAULT_IDLE_TIMEOUT,
        metavar="S",
        help=f"close a keep-alive connection idle for S seconds (default {DEFAULT_IDLE_TIMEOUT:g})",
    )
    parser.add_argument(
        "--body-timeout",
        type=seconds,
        default=DEFAULT_BODY_TIMEOUT,
        metavar="S",
        help="answer 408 to a request whose body is not whole S seconds after its head "
        f"(default {DEFAULT_BODY_TIMEOUT:g})",
    )
    parser.add_argument(
        "--max-connections",
        type=positive_int,
        default=None,
        metavar="N",
        help="open connections past which new ones get a 503 with Retry-After "
        f"(default {DEFAULT_MAX_CONNECTIONS}, fewer under a lower `ulimit -n`)",
    )


def limits_from_args(args: argparse.Namespace) -> ServerLimits:
    """The ServerLimits that add_limit_flags' flags ask for."""
    return ServerLimits(
        header_timeout=args.header_timeout,
        idle_timeout=args.idle_timeout,
        max_connections=args.max_connections,
        body_timeout=args.body_timeout,
    )


def add_request_limit_flags(parser: argparse.ArgumentParser) -> None:
    """The model server's per-request limit flags (serve/model/core.Limits), for its own parser and `searchgym
    serve model`."""
    parser.add_argument(
        "--max-prompt-chars",
        type=positive_int,
        default=None,
        help="characters of one text prompt (text, prompt, or chat messages), refused with a 400 "
        f"before tokenizing (default: {PROMPT_CHARS_PER_TOKEN} x the context length)",
    )
    parser.add_argument(
        "--max-reply-tokens",
        type=positive_int,
        default=None,
        help="most tokens one reply may ask for (max_new_tokens, max_tokens); default: what the context length leaves",
    )
