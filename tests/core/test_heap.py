"""release_free_heap gives freed heap memory back to the OS, and a CPU learner step calls it."""

import os

import pytest

from searchgym.core import heap


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(
    heap._libc() is None or "LD_PRELOAD" in os.environ, reason="no glibc malloc_trim here, or another allocator"
)
def test_freed_heap_memory_goes_back_to_the_os():
    """512 MB of 64 KB blocks (below glibc's mmap threshold, so on the heap), 7 in 8 freed: the live eighth pins the
    heap's top, so free() cannot shrink it and glibc keeps the freed pages until malloc_trim returns them."""
    blocks = [bytearray(b"\1" * 64 * 1024) for _ in range(8192)]  # written: every page resident
    live = blocks[::8]
    del blocks
    kept = rss_bytes()
    assert heap.release_free_heap() is True
    after = rss_bytes()
    assert kept - after > 256 * 2**20, (kept, after, len(live))  # most of the 448 MB freed


def test_without_malloc_trim_it_does_nothing(monkeypatch):
    monkeypatch.setattr(heap, "_libc", lambda: None)
    assert heap.release_free_heap() is False
