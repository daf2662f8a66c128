"""`sole_run`: two runs never work in one folder. A second `bench reproduce` on a folder once removed the first's RL
arm while the first was writing its stop checkpoint there."""

import os
import subprocess
import sys
import textwrap

import pytest

from searchgym.bench.reproduce import load_reproduce_config, run_reproduce
from searchgym.core.file_lock import FolderInUse, run_holder, sole_run

HOLDER = textwrap.dedent(
    """
    import sys
    from searchgym.core.file_lock import sole_run
    with sole_run(sys.argv[1], "test run"):
        print("held", flush=True)
        sys.stdin.readline()
    """
)


def test_a_second_run_on_a_held_folder_is_refused_naming_the_holder_then_goes_once_it_ends(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert run_holder(tmp_path) == f"{holder.pid} test run"  # what `bench reproduce --status` reports
        with (
            pytest.raises(FolderInUse, match=rf"in use by another test run \(pid {holder.pid}\)"),
            sole_run(tmp_path, "mine"),
        ):
            pytest.fail("entered a folder another process holds")
        # the bench refuses before touching anything: no log, no seed folder
        config = load_reproduce_config("staleness", [f"out_dir={tmp_path}"])
        with pytest.raises(ValueError, match="in use by another test run"):
            run_reproduce("staleness", config, [0], out=tmp_path / "r.json", progress=False)
        assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]
    finally:
        holder.communicate("\n", timeout=30)
    assert run_holder(tmp_path) is None and run_holder(tmp_path / "never-run") is None
    with sole_run(tmp_path, "mine"):  # the holder's lock died with it
        assert (tmp_path / ".lock").read_text().split() == [str(os.getpid()), "mine"]


def test_a_killed_holder_leaves_nothing_to_clean_up(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait(timeout=30)
    with sole_run(tmp_path, "mine"):
        pass


def test_a_file_system_without_locks_runs_unlocked_with_a_warning(tmp_path, monkeypatch, caplog):
    """NFS without lockd, Lustre without -o flock: flock fails with ENOLCK; the run goes on, said, not refused."""
    import errno
    import fcntl

    def no_locks(*_args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    ran = False
    with caplog.at_level("WARNING"), sole_run(tmp_path, "mine"):
        ran = True
    assert ran and "file locks are not supported here" in caplog.text
    assert run_holder(tmp_path) is None
