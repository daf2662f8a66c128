"""What a training run leaves behind, shared by the launchers: config, metrics, TensorBoard, trajectories.

    run_dir/config.json                      the resolved config
    run_dir/metrics.jsonl                    one line per learner step
    run_dir/tensorboard/                     the same scalars, for TensorBoard
    run_dir/trajectories/version-00003.jsonl the trajectories the step from version 3 trained on
    run_dir/provenance.jsonl                 per step, what async RL's outcome depends on besides the seed:
                                             the batch's groups in the order they were trained (their data
                                             positions, in (start version, arrival) order) and, per
                                             trajectory, which weight version sampled its generated tokens
                                             (runs of [version, tokens])

metrics.jsonl and provenance.jsonl go through the project's one append-only JSONL writer (JsonlLog): a
line cut by a kill is dropped and a damaged line is set aside in NAME.damaged.jsonl, both reported by
file and line. A resumed run first cuts everything after its checkpoint: later metric and provenance
rows move to NAME.superseded.jsonl (those steps are trained again, so metrics.jsonl holds each step
once), later TensorBoard events and trajectory files go, and the run directory reads as one run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from searchgym.agents.trajectory import Trajectory
from searchgym.core.atomic_file import atomic_open
from searchgym.core.jsonl_log import JsonlLog

LOGS = ("metrics.jsonl", "provenance.jsonl")


class RunLog:
    """Writes a run's per-step records; `resume_from(step)` first drops what came after `step`."""

    def __init__(self, run_dir: str | os.PathLike, config: dict[str, Any], *, resume_step: int = 0):
        from torch.utils.tensorboard import SummaryWriter  # heavy import: only when training

        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        self._cut_trajectories(resume_step)
        self.logs = {name: _open_cut(self.dir / name, resume_step) for name in LOGS}
        self.writer = SummaryWriter(str(self.dir / "tensorboard"), purge_step=resume_step + 1 if resume_step else None)

    def record(self, step: int, stats: dict[str, float], batch: list[list[Trajectory]], trained_version: int) -> None:
        """One learner step: scalars to TensorBoard and metrics.jsonl, the batch to trajectories/."""
        for key, value in stats.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()
        path = self.dir / "trajectories" / f"version-{trained_version:05d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:
            for group in batch:
                for traj in group:
                    f.write(json.dumps(traj.to_dict()) + "\n")
        self.logs["metrics.jsonl"].append({"step": step, **stats})
        self.logs["provenance.jsonl"].append(provenance(step, batch, trained_version))

    def history(self) -> list[dict[str, float]]:
        """Every step's metrics so far, this run's and (after a resume) the earlier ones', each step once."""
        return list(self.logs["metrics.jsonl"].rows)

    def close(self) -> None:
        self.writer.close()

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _cut_trajectories(self, step: int) -> None:
        """Delete the trajectory files of steps after `step`: those steps are trained again."""
        for path in (self.dir / "trajectories").glob("version-*.jsonl"):
            if int(path.stem.split("-")[1]) >= step:  # version v is trained by step v + 1
                path.unlink()


def provenance(step: int, batch: list[list[Trajectory]], trained_version: int) -> dict[str, Any]:
    """One step's record of what timing decided: its groups in training order and each token's weight version."""
    return {
        "step": step,
        "trained_version": trained_version,
        "groups": [
            {
                "position": group[0].group if group else None,
                "task_id": group[0].task_id if group else None,
                "versions": [version_runs(traj) for traj in group],
            }
            for group in batch
        ],
    }


def version_runs(traj: Trajectory) -> list[list[int]]:
    """The weight versions of a trajectory's generated tokens, in order, as runs of [version, token count]."""
    runs: list[list[int]] = []
    for version, generated in zip(traj.versions, traj.loss_mask, strict=False):  # bookkeeping: never fails a run
        if not generated:
            continue
        if runs and runs[-1][0] == version:
            runs[-1][1] += 1
        else:
            runs.append([version, 1])
    return runs


def _check_step(row: Any) -> None:
    """A per-step row names its step as a positive integer (else JsonlLog sets it aside as damaged)."""
    step = row["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"step {step!r} is not a positive integer")


def _open_cut(path: Path, step: int) -> JsonlLog:
    """Open a per-step log, repaired, keeping rows up to `step` (each step's first copy, in step order).

    Rows of later steps (a run killed between checkpoints trains them again) and repeated steps move to
    NAME.superseded.jsonl, tagged with the step the run resumed from, so the log holds each step once and
    nothing is silently deleted.
    """
    log = JsonlLog(path, check=_check_step)
    kept: dict[int, Any] = {}
    superseded = []
    for row in log.rows:
        if row["step"] <= step and row["step"] not in kept:
            kept[row["step"]] = row
        else:
            superseded.append(row)
    if not superseded:
        return log
    aside = path.with_name(path.name.removesuffix(".jsonl") + ".superseded.jsonl")
    with open(aside, "a", encoding="utf-8") as f:
        for row in superseded:
            f.write(json.dumps({"resumed_after_step": step, "row": row}, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    with atomic_open(path) as f:
        for row in sorted(kept.values(), key=lambda r: r["step"]):
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return JsonlLog(path, check=_check_step)
