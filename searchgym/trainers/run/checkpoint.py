"""Training checkpoints, written atomically: a usable Hugging Face model dir plus the trainer's state.

    run_dir/checkpoints/step-00012/   config.json, model.safetensors, tokenizer files, trainer.pt
    run_dir/checkpoints/latest        "step-00012"
    run_dir/checkpoints/healthy       "step-00010": the collapse watchdog's restore point, never pruned
    run_dir/checkpoints/SLIMMED       only in a finished run kept as its last model (slim_finished_run)

`trainer.pt` holds what a model directory cannot: optimizer and scheduler state, the weight version,
the rollout controllers' data positions and the groups to replay (one state per controller: one for
the local launcher, one per rollout actor for the Ray launcher), and the step. Each checkpoint is written into a
hidden directory and
renamed into place, and `latest` is replaced only after that, so a run killed at any instant leaves
the previous checkpoint whole and pointed to. A failed write removes its hidden directory; one a killed process
left is removed by the next run in the directory (partials.py). A write the disk refuses (full, read-only, no
permission) raises DiskWriteError naming the file, with `latest` still at the last whole checkpoint.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from searchgym.agents.hf_bars import no_hf_bars
from searchgym.core.atomic_file import DiskWriteError, disk_error, write_atomic
from searchgym.trainers.run.partials import partial_dir, remove_stale

LATEST = "latest"
HEALTHY = "healthy"
SLIMMED = "SLIMMED"  # a finished run whose last checkpoint was kept as a model only (slim_finished_run)


def checkpoint_root(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints"


def checkpoint_dir(run_dir: str | os.PathLike, step: int) -> Path:
    """Where checkpoint `step` lives: run_dir/checkpoints/step-00012."""
    return checkpoint_root(run_dir) / f"step-{step:05d}"


def save_checkpoint(
    run_dir: str | os.PathLike,
    step: int,
    *,
    model: Any,
    tokenizer: Any,
    state: dict[str, Any],
    keep: int = 2,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write checkpoint `step` (model, tokenizer, `state` as trainer.pt, `extra(dir)` files such as the sharded
    learner's), point `latest` at it, prune old ones (never the one `healthy` names)."""
    root = checkpoint_root(run_dir)
    name = checkpoint_dir(run_dir, step).name
    remove_stale(root)  # what killed writers left: on a full disk, the space this write needs

    def add_files(directory: Path) -> None:
        path = directory / "trainer.pt"
        try:
            with open(path, "wb") as f:  # a file object: torch then raises the OSError (ENOSPC...) itself
                torch.save({**state, "step": step}, f)
        except Exception as e:  # noqa: BLE001 -- a failed write() names no file: name it here
            if (disk := disk_error(e, path, name)) is not None:
                raise disk from e
            raise
        if extra is not None:
            extra(directory)

    try:
        final = write_model_dir(root / name, model=model, tokenizer=tokenizer, extra=add_files)
    except DiskWriteError as e:
        last = (root / LATEST).read_text().strip() if (root / LATEST).exists() else None
        kept = f"{root / LATEST} still names {last}" if last else "no earlier checkpoint of this run exists"
        e.message += f"; the partial checkpoint was removed and {kept}"
        raise
    write_pointer(root / LATEST, name)
    healthy = root / HEALTHY
    prune(root, "step-*", keep, protect=(healthy.read_text().strip(),) if healthy.exists() else ())
    return final


def write_model_dir(
    final: str | os.PathLike, *, model: Any, tokenizer: Any, extra: Callable[[Path], None] | None = None
) -> Path:
    """Save a Hugging Face model dir (model, tokenizer, `extra(dir)` files) atomically: a hidden dir, fsync, rename.

    A reader (an inference server loading weights, a resumed run) never sees a half-written directory.
    """
    final = Path(final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        if (disk := disk_error(e, final.parent, f"the directory for {final.name}")) is not None:
            raise disk from e
        raise
    with partial_dir(final, final.name) as write:
        partial = write.path
        write.doing = f"{final.name}'s model (config and safetensors weights)"
        with no_hf_bars():
            model.save_pretrained(partial)
        write.doing = f"{final.name}'s tokenizer files"
        tokenizer.save_pretrained(partial)
        write.doing = final.name
        if extra is not None:
            extra(partial)
        _fsync_tree(partial)
        if final.exists():  # left by a run that was killed after this step and resumed from an earlier one
            shutil.rmtree(final)
        os.replace(partial, final)
    return final


def prune(root: Path, pattern: str, keep: int, protect: tuple[str, ...] = ()) -> None:
    """Delete all but the last `keep` (at least one) directories matching `pattern`, by name order, and those named
    in `protect`."""
    for old in sorted(p for p in root.glob(pattern) if p.is_dir())[: -max(keep, 1)]:
        if old.name not in protect:
            shutil.rmtree(old, ignore_errors=True)


def load_weights(model: Any, model_dir: str | os.PathLike) -> None:
    """Copy a Hugging Face model dir's weights into `model` in place (same architecture; bit for bit, any dtype)."""
    from transformers import AutoModelForCausalLM

    dtype = next(model.parameters()).dtype
    with no_hf_bars():
        saved = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model.load_state_dict(saved.state_dict())


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The checkpoint `latest` points at, or None when the run has none yet."""
    pointer = checkpoint_root(run_dir) / LATEST
    if not pointer.exists():
        return None
    path = checkpoint_root(run_dir) / pointer.read_text().strip()
    if not (path / "trainer.pt").exists():
        if (checkpoint_root(run_dir) / SLIMMED).exists():
            raise FileNotFoundError(
                f"{path} is a finished run's model, its trainer state removed to save space ({SLIMMED} says by "
                f"what): it cannot be resumed; train from it anew with model.path={path}"
            )
        raise FileNotFoundError(f"{pointer} names {path.name}, which has no trainer.pt: the checkpoint is damaged")
    return path


def checkpoint_step(checkpoint: Path) -> int:
    """The step a checkpoint directory holds, from its name (step-00012: 12)."""
    return int(checkpoint.name.removeprefix("step-"))


def slim_finished_run(run_dir: str | os.PathLike, by: str) -> int:
    """Keep a finished run's last checkpoint as a model dir only: remove its trainer state (optimizer, data
    positions, sharded files) and every other checkpoint, and say so in checkpoints/SLIMMED (`by` names who asked).
    Metrics and trajectories stay. Returns the bytes freed. For runs that are done for good: one on a real model
    keeps GBs of optimizer state per checkpoint, and a claim's seeds x arms are dozens of runs."""
    root = checkpoint_root(run_dir)
    if not (root / LATEST).exists():
        return 0
    last = root / (root / LATEST).read_text().strip()  # not latest_checkpoint(): a second call finds it slimmed
    doomed = [p for p in root.glob("step-*") if p.is_dir() and p != last]
    doomed += [p for p in (last / "trainer.pt", last / "sharded") if p.exists()]
    freed = sum(_size(p) for p in doomed)
    write_atomic(root / SLIMMED, f"{last.name} kept as a model dir only, the rest removed by {by}\n")
    for path in doomed:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    (root / HEALTHY).unlink(missing_ok=True)  # it named a checkpoint now gone, or the last one (kept anyway)
    return freed


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def load_trainer_state(checkpoint: str | os.PathLike, *, mmap: bool = False) -> dict[str, Any]:
    """The trainer state saved with a checkpoint (tensors on the CPU; with `mmap`, read lazily from the file).

    `mmap` lets a process that needs only the small parts (step, versions, data positions) skip reading
    a large model's optimizer state.
    """
    check_checkpoint(checkpoint)
    path = Path(checkpoint) / "trainer.pt"
    try:
        state = torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
        if not isinstance(state, dict):
            raise ValueError("not a trainer state (a dict)")
    except Exception as e:  # noqa: BLE001 -- a truncated or foreign file: one error that names it
        raise ValueError(damaged(path, e)) from None
    return state


def check_checkpoint(checkpoint: str | os.PathLike) -> None:
    """Refuse, naming the file, a checkpoint whose model weights are truncated or unreadable (headers only: cheap)."""
    from safetensors import safe_open

    for path in sorted(Path(checkpoint).glob("*.safetensors")):
        try:
            with safe_open(path, "pt") as f:
                names = list(f.keys())
                for name in names[-1:]:  # the last tensor reaches the end of the file: a cut file fails here
                    f.get_slice(name)[:1]
            if path.stat().st_size < 8:
                raise ValueError("empty")
        except Exception as e:  # noqa: BLE001
            raise ValueError(damaged(path, e)) from None


def damaged(path: Path, error: Exception) -> str:
    """The one-line message for a damaged checkpoint file: which file, what failed, what to do."""
    return (
        f"{path} is damaged ({type(error).__name__}: {str(error)[:200]}); resume from an earlier checkpoint "
        f"(write its directory name into {path.parent.parent / LATEST}) or start a new run in another out_dir"
    )


def rollout_states(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The saved rollout controller states, one per controller ("rollouts"; "rollout" in older checkpoints)."""
    return list(state["rollouts"]) if "rollouts" in state else [state["rollout"]]


def write_pointer(path: Path, text: str) -> None:
    """Replace a one-line pointer file (`latest`, `healthy`) atomically: a reader sees the old name or the new one."""
    write_atomic(path, text + "\n")


def _fsync_tree(directory: Path) -> None:
    """Flush a directory's files (sub-directories' too) to disk before it is renamed into place."""
    for path in directory.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
