"""Provenance helpers: the peak resident memory that bench rows record is in bytes on every platform."""

import json
import os
import subprocess
import sys

from searchgym.bench.provenance import machine, uncommitted_code

# Run in a fresh interpreter: in a shared test worker, other tests' threads free memory while this one allocates,
# so the process's resident size is not this test's to measure.
_MEASURE = """
import json, os
from searchgym.bench.provenance import peak_rss_bytes
with open("/proc/self/statm") as f:
    resident = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
before = peak_rss_bytes()
block = bytearray(256 * 2**20)  # touched: bytearray zero-fills every page
after = peak_rss_bytes()
print(json.dumps({"resident": resident, "before": before, "after": after, "block": len(block)}))
"""


def test_peak_rss_is_bytes_and_follows_an_allocation() -> None:
    done = subprocess.run([sys.executable, "-c", _MEASURE], capture_output=True, text=True, timeout=120, check=True)
    seen = json.loads(done.stdout.splitlines()[-1])
    # the kernel updates its high-water mark lazily, so allow a little; KiB read as bytes would be 1,024 times off
    assert seen["before"] >= 0.9 * seen["resident"]
    assert seen["after"] >= seen["resident"] + seen["block"] * 0.9
    assert seen["after"] < 100 * (seen["resident"] + seen["block"])


def test_machine_keeps_what_the_benchmark_adds() -> None:
    record = machine(torch_threads=1)
    assert record["torch_threads"] == 1 and record["cpus"] == os.cpu_count()


def test_a_run_of_edited_code_says_which_files(tmp_path) -> None:
    """A results file's commit names the code only when the package is as committed: edits are listed beside it."""
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "searchgym").mkdir()
    (tmp_path / "searchgym" / "a.py").write_text("x = 1\n")
    (tmp_path / "results.json").write_text("{}\n")
    subprocess.run([*git, "add", "."], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "c"], cwd=tmp_path, check=True)
    assert uncommitted_code(tmp_path) == []
    (tmp_path / "results.json").write_text("{1}\n")  # a rendered result is not code
    (tmp_path / "searchgym" / "new.py").write_text("")  # nor an untracked file
    assert uncommitted_code(tmp_path) == []
    (tmp_path / "searchgym" / "a.py").write_text("x = 2\n")
    assert uncommitted_code(tmp_path) == ["searchgym/a.py"]
    assert uncommitted_code(tmp_path / "missing") == []
