"""What a moved `python -m` front end does when run: name the command that took its flags and exit 2, as argparse
does for a bad command line, so an old script stops with what to type instead of "No module named"."""

from __future__ import annotations

import sys


def exit_moved(old_module: str, new_command: str, also: str = "") -> None:
    """Print "python -m OLD: error: this is now `NEW`..., with the same flags" to stderr and exit with status 2."""
    print(f"python -m {old_module}: error: this is now `{new_command}`{also}, with the same flags", file=sys.stderr)
    sys.exit(2)
