"""Checkpoint writes the disk refuses, and partial directories a failed or killed writer leaves behind."""

import errno
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchgym.core.atomic_file import DISK_ERRORS, DiskWriteError, disk_error
from searchgym.trainers.run.checkpoint import checkpoint_root, latest_checkpoint, load_trainer_state, save_checkpoint
from searchgym.trainers.run.partials import remove_stale
from searchgym.trainers.run.start import start_run

FIRST = {"learner": {"version": 1}, "rollouts": [{}]}  # the first checkpoint's trainer state
needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full (always ENOSPC)")


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)


def _leftovers(root: Path) -> list[str]:
    """Hidden entries a write left in the checkpoint directory (partial dirs, lock files, temporary pointers)."""
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


class _Tokenizer:
    """The real tokenizer, whose save also plants a file in the checkpoint being written (fault injection)."""

    def __init__(self, tokenizer, plant):
        self.tokenizer, self.plant = tokenizer, plant

    def save_pretrained(self, directory):
        self.tokenizer.save_pretrained(directory)
        self.plant(Path(directory))


def _first_checkpoint(tmp_path, model_and_tokenizer) -> Path:
    model, tokenizer = model_and_tokenizer
    return save_checkpoint(tmp_path, 1, model=model, tokenizer=tokenizer, state=FIRST)


def _assert_last_whole_checkpoint_kept(tmp_path, first: Path) -> None:
    root = checkpoint_root(tmp_path)
    assert _leftovers(root) == [], "the failed write left files behind"
    assert sorted(p.name for p in root.glob("step-*")) == ["step-00001"]
    assert latest_checkpoint(tmp_path) == first
    assert load_trainer_state(first) == {**FIRST, "step": 1}


@needs_dev_full
def test_a_full_disk_under_torch_save_is_named_not_unexpected_pos(tmp_path, model_and_tokenizer):
    # trainer.pt goes to /dev/full: the kernel's real ENOSPC, through torch's serializer
    model, tokenizer = model_and_tokenizer
    first = _first_checkpoint(tmp_path, model_and_tokenizer)
    full = _Tokenizer(tokenizer, lambda d: (d / "trainer.pt").symlink_to("/dev/full"))
    with pytest.raises(DiskWriteError) as caught:
        save_checkpoint(tmp_path, 2, model=model, tokenizer=full, state={"x": 2})
    message = str(caught.value)
    assert caught.value.errno == errno.ENOSPC
    assert message.startswith("disk full while writing ") and "unexpected pos" not in message
    assert f".partial-step-00002-{os.getpid()}/trainer.pt" in message
    assert "latest still names step-00001" in message
    _assert_last_whole_checkpoint_kept(tmp_path, first)


def test_a_full_disk_under_safetensors_names_the_weights_file(tmp_path, model_and_tokenizer, monkeypatch):
    from safetensors import SafetensorError

    model, tokenizer = model_and_tokenizer
    first = _first_checkpoint(tmp_path, model_and_tokenizer)

    def cut(directory, **_):  # what safetensors raises when the disk fills mid-file (its own error type and text)
        (Path(directory) / "model.safetensors").write_bytes(b"\0" * 1000)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(model, "save_pretrained", cut)
    named = (
        r"disk full while writing step-00002's model \(config and safetensors weights\) "
        r"to \S+/\.partial-step-00002-\d+: "
    )
    with pytest.raises(DiskWriteError, match=named):
        save_checkpoint(tmp_path, 2, model=model, tokenizer=tokenizer, state={"x": 2})
    _assert_last_whole_checkpoint_kept(tmp_path, first)


def test_a_bare_serializer_error_is_named_by_probing_the_disk(tmp_path, model_and_tokenizer, monkeypatch):
    model, tokenizer = model_and_tokenizer
    first = _first_checkpoint(tmp_path, model_and_tokenizer)
    pos = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 531072 vs 531024")

    def fail(directory, **_):
        raise pos

    monkeypatch.setattr(model, "save_pretrained", fail)
    # on a healthy disk the error is not the disk's: it goes up as it is, and the partial is still removed
    with pytest.raises(RuntimeError, match="unexpected pos") as caught:
        save_checkpoint(tmp_path, 2, model=model, tokenizer=tokenizer, state={"x": 2})
    assert not isinstance(caught.value, DiskWriteError)
    _assert_last_whole_checkpoint_kept(tmp_path, first)
    # with no space left the same error is reported as a full disk
    real = os.statvfs
    full = lambda path: os.statvfs_result((*real(path)[:3], 0, 0, *real(path)[5:]))  # noqa: E731 -- bfree, bavail
    monkeypatch.setattr(os, "statvfs", full)
    with pytest.raises(DiskWriteError, match=r"disk full while writing .*\(0 bytes free under ") as caught:
        save_checkpoint(tmp_path, 2, model=model, tokenizer=tokenizer, state={"x": 2})
    assert caught.value.__cause__ is pos
    _assert_last_whole_checkpoint_kept(tmp_path, first)


def test_a_read_only_file_system_is_named(tmp_path, model_and_tokenizer, monkeypatch):
    model, tokenizer = model_and_tokenizer
    first = _first_checkpoint(tmp_path, model_and_tokenizer)

    def read_only(directory, **_):  # the OSError a read-only mount raises on open
        target = Path(directory) / "config.json"
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(target))

    monkeypatch.setattr(model, "save_pretrained", read_only)
    named = r"read-only file system while writing step-00002's model .* to \S+/config\.json: Read-only"
    with pytest.raises(DiskWriteError, match=named):
        save_checkpoint(tmp_path, 2, model=model, tokenizer=tokenizer, state={"x": 2})
    _assert_last_whole_checkpoint_kept(tmp_path, first)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through directory permissions")
def test_a_directory_without_write_permission_is_named(tmp_path, model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    first = _first_checkpoint(tmp_path, model_and_tokenizer)
    root = checkpoint_root(tmp_path)
    root.chmod(0o555)
    named = f"permission denied while writing step-00002 to {re.escape(str(root))}/"
    try:
        with pytest.raises(DiskWriteError, match=named):
            save_checkpoint(tmp_path, 2, model=model, tokenizer=tokenizer, state={"x": 2})
    finally:
        root.chmod(0o755)
    _assert_last_whole_checkpoint_kept(tmp_path, first)


@needs_dev_full
def test_a_full_disk_while_replacing_latest_keeps_the_old_pointer(tmp_path, model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    first = _first_checkpoint(tmp_path, model_and_tokenizer)
    root = checkpoint_root(tmp_path)
    (root / f".latest.{os.getpid()}.tmp").symlink_to("/dev/full")  # the new pointer's temporary file
    named = r"disk full while writing the new latest to \S+/\.latest\.\d+\.tmp: "
    with pytest.raises(DiskWriteError, match=named):
        save_checkpoint(tmp_path, 2, model=model, tokenizer=tokenizer, state={"x": 2})
    assert latest_checkpoint(tmp_path) == first  # step-00002 is whole on disk, but latest was never half-replaced
    assert _leftovers(root) == []


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_partials_of_dead_processes_are_removed_at_start_and_a_live_ones_kept(tmp_path, model_and_tokenizer):
    first = _first_checkpoint(tmp_path, model_and_tokenizer)
    root = checkpoint_root(tmp_path)
    dead = root / f".partial-step-00002-{_dead_pid()}"  # written before the lock files existed: judged by pid
    (dead / "model.safetensors").parent.mkdir()
    (dead / "model.safetensors").write_bytes(b"\0" * 4096)
    sharded = root / ".sharded-step-00002"  # a sharded learner's staging dir, no lock: its writers are gone
    sharded.mkdir()
    lone_lock = root / ".partial-step-00003-1.lock"  # a writer killed between its rename and removing its lock
    lone_lock.touch()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        alive = root / f".partial-step-00002-{sleeper.pid}"
        alive.mkdir()
        run = start_run(tmp_path, None, seed=0, resume=True)
        assert run.checkpoint == first and run.first_step == 2
        assert _leftovers(root) == [alive.name]
    finally:
        sleeper.kill()
        sleeper.wait()
    assert remove_stale(root) == [alive]


_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from searchgym.trainers.run.partials import partial_dir
    with partial_dir(Path(sys.argv[1]) / "step-00002", "step-00002") as write:
        (write.path / "model.safetensors").write_bytes(b"half")
        print(write.path, flush=True)
        time.sleep(120)
""")


def test_a_partial_being_written_is_kept_until_its_writer_is_killed(tmp_path):
    root = checkpoint_root(tmp_path)
    root.mkdir(parents=True)
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(root)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        partial = Path(writer.stdout.readline().strip())
        assert partial.parent == root and partial.is_dir()
        assert remove_stale(root) == []  # the writer holds its lock: a concurrent run never deletes its work
        assert partial.is_dir()
    finally:
        writer.kill()
        writer.wait()
    assert remove_stale(root) == [partial]  # the kernel dropped the lock with the writer
    assert _leftovers(root) == []


def test_a_fresh_run_refused_in_a_used_directory_changes_nothing(tmp_path, model_and_tokenizer):
    _first_checkpoint(tmp_path, model_and_tokenizer)
    dead = checkpoint_root(tmp_path) / f".partial-step-00002-{_dead_pid()}"
    dead.mkdir()
    with pytest.raises(ValueError, match="Nothing was changed"):
        start_run(tmp_path, None, seed=0, resume=False)
    assert dead.is_dir()


def test_a_training_run_on_a_full_disk_stops_naming_it_and_resumes_after(
    tmp_path, small_bundle, tiny_model_dir, monkeypatch
):
    import torch

    from searchgym.trainers.config import load_config
    from searchgym.trainers.launchers.local import train
    from searchgym.trainers.run import checkpoint
    from tests.conftest import SMALL

    overrides = [
        f"out_dir={tmp_path}",
        f"model.path={tiny_model_dir}",
        "steps=3",
        "save_every=1",
        f"env.kwargs.size={SMALL['size']}",
        f"env.kwargs.n_tasks={SMALL['n_tasks']}",
        "env.kwargs.max_turns=2",
        "rollout.group_size=2",
        "rollout.batch_size=2",
        "rollout.max_new_tokens=12",
        "learner.drop_no_spread=false",
    ]
    real_save = torch.save

    def fills_at_step_2(obj, f, *args, **kwargs):  # the disk fills while step 2's trainer.pt is half written
        if isinstance(obj, dict) and obj.get("step") == 2:
            f.write(b"\0" * 512)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", fills_at_step_2)
    named = r"disk full while writing step-00002 to \S+/trainer\.pt: .*latest still names step-00001"
    with pytest.raises(DiskWriteError, match=named):
        train(load_config(None, overrides), progress=False)
    root = checkpoint_root(tmp_path)
    assert _leftovers(root) == [] and latest_checkpoint(tmp_path).name == "step-00001"

    monkeypatch.setattr(checkpoint.torch, "save", real_save)  # space freed
    history = train(load_config(None, overrides), resume=True, progress=False)
    assert [h["step"] for h in history] == [1, 2, 3]
    assert load_trainer_state(latest_checkpoint(tmp_path))["step"] == 3


@given(st.text(max_size=200))
def test_only_a_disk_errno_in_an_error_message_is_taken_for_a_disk_error(text):
    healthy = os.path.dirname(os.path.abspath(__file__))  # a writable directory with free space
    plain = disk_error(RuntimeError(text), healthy, "x")
    assert plain is None or (plain.errno in DISK_ERRORS and re.search(r"os error \d+|\[Errno \d+\]", text))
    wrapped = disk_error(RuntimeError(f"{text} I/O error: No space left on device (os error 28)"), healthy, "x")
    assert wrapped is not None and wrapped.errno == errno.ENOSPC and str(wrapped).startswith("disk full while writing")


def test_without_file_locks_writes_go_on_and_only_a_dead_writers_partial_is_removed(tmp_path, monkeypatch, caplog):
    """Lustre without -o flock (ENOSYS) or NFS without lockd (ENOLCK): checkpoints are still written; a live
    writer's partial is kept and a dead pid's removed, judged by the pid in the name."""
    from searchgym.trainers.run import partials

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(partials.fcntl, "flock", no_locks)
    live = tmp_path / f".partial-step-00001-{os.getpid()}"
    with partials.writer_lock(live):
        live.mkdir()
        dead = tmp_path / ".partial-step-00002-999999999"
        dead.mkdir()
        partials.lock_path(dead).touch()
        assert partials.remove_stale(tmp_path) == [dead]
        assert live.is_dir() and partials.lock_path(live).exists()
    assert not partials.lock_path(live).exists() and "file locks are not supported" in caplog.text
