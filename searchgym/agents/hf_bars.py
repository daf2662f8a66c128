"""Hugging Face's own progress bars ("Loading weights", "Writing model shards") kept out of searchgym's output.

Transformers draws a bar for every `from_pretrained` and `save_pretrained`; the quickstart loads and saves a model a
dozen times, and those bars said nothing its own stage bars do not. `no_hf_bars()` turns them off around our loads and
saves only, and only the bars: Transformers' warnings and log messages stay as they are.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_depth = 0
_were_on = True


@contextlib.contextmanager
def no_hf_bars() -> Iterator[None]:
    """Transformers' progress bars off inside the block, as they were after it (nested and threaded blocks: the
    state is restored when the last one ends)."""
    global _depth, _were_on
    from transformers.utils import logging as hf_logging

    with _lock:
        if _depth == 0:
            _were_on = hf_logging.is_progress_bar_enabled()
            if _were_on:
                hf_logging.disable_progress_bar()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _were_on:
                hf_logging.enable_progress_bar()
