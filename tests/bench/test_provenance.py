"""Provenance helpers: the peak resident memory that bench rows record is in bytes on every platform."""

import os

from searchgym.bench.provenance import machine, peak_rss_bytes


def test_peak_rss_is_bytes_and_follows_an_allocation() -> None:
    with open("/proc/self/statm") as f:
        resident = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    before = peak_rss_bytes()
    # the kernel updates its high-water mark lazily, so allow a little; KiB read as bytes would be 1,024 times off
    assert before >= 0.9 * resident
    block = bytearray(256 * 2**20)  # touched: bytearray zero-fills every page
    after = peak_rss_bytes()
    assert after >= resident + len(block) * 0.9
    del block


def test_machine_keeps_what_the_benchmark_adds() -> None:
    record = machine(torch_threads=1)
    assert record["torch_threads"] == 1 and record["cpus"] == os.cpu_count()
