"""Kill-and-resume drills on the real CLI: run a `searchgym` command in a subprocess, SIGKILL it once its
output file holds N rows (or after a delay), damage what a kill or a bad disk leaves, rerun, and count.

Each drill returns a `DrillResult`: kills survived, items written before each kill and lost after the
rerun (must be 0), items repeated (0), damaged lines injected and the ones the rerun reported by file
and line, and crashes (a rerun that exits non-zero without a clear one-line error: 0). The kill tests
(tests/test_kills.py) and `searchgym bench reliability` run the same drills.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


def searchgym_command(*args: str) -> list[str]:
    """The command line of `searchgym ARGS` run by this interpreter (so the drills test this checkout)."""
    return [sys.executable, "-m", "searchgym.cli", *args]


def complete_lines(path: Path) -> int:
    """How many newline-terminated lines `path` holds (0 when it does not exist yet)."""
    try:
        return Path(path).read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def json_rows(path: Path) -> list[Any]:
    """The rows of `path`'s complete lines that parse as JSON (what a reader could use right now)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    rows = []
    for raw in data.split(b"\n")[:-1]:
        try:
            rows.append(json.loads(raw))
        except ValueError:
            continue
    return rows


@dataclass
class Run:
    """One subprocess run: whether the drill killed it, its exit code and its stderr."""

    killed: bool
    returncode: int | None
    stderr: str
    seconds: float


def run_command(
    cmd: Sequence[str],
    *,
    watch: Path | None = None,
    rows: int | None = None,
    after_s: float | None = None,
    timeout: float = 300,
    env: dict[str, str] | None = None,
) -> Run:
    """Run `cmd`; SIGKILL it once `watch` holds `rows` complete lines (or `after_s` seconds have passed).

    Without `rows`/`after_s` it runs to the end. stderr goes to a file, so a chatty child never blocks.
    """
    start = time.monotonic()
    # one torch thread: the drills' tiny models run fastest on one, and a busy machine stays usable
    child_env = {"OMP_NUM_THREADS": "1", **os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as err:
        proc = subprocess.Popen(list(cmd), stdout=subprocess.DEVNULL, stderr=err, env=child_env)
        killed = False
        try:
            while proc.poll() is None:
                elapsed = time.monotonic() - start
                if elapsed > timeout:
                    raise TimeoutError(f"{' '.join(cmd[2:])} ran past {timeout} s")
                due = (after_s is not None and elapsed >= after_s) or (
                    rows is not None and watch is not None and complete_lines(watch) >= rows
                )
                if due:
                    proc.send_signal(signal.SIGKILL)
                    killed = True
                    break
                time.sleep(0.005)
            proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        err.seek(0)
        return Run(killed, proc.returncode, err.read(), time.monotonic() - start)


def cut_last_line(path: Path) -> int:
    """Cut the last line of `path` in half, as a kill mid-write leaves it; returns its 1-based line number."""
    data = Path(path).read_bytes()
    start = data.rindex(b"\n", 0, len(data) - 1) + 1 if data.count(b"\n") > 1 else 0
    Path(path).write_bytes(data[: start + max(1, (len(data) - start) // 2)])
    return data[:start].count(b"\n") + 1


def append_partial(path: Path, row: Any) -> int:
    """Append the first half of `row` without its newline (a kill while writing a new row); its line number."""
    line = json.dumps(row).encode()
    with open(path, "ab") as f:
        f.write(line[: len(line) // 2])
    return complete_lines(path) + 1


def damage_line(path: Path, number: int, text: str = '{"damaged": ') -> None:
    """Replace line `number` (1-based) of `path` with text that is not a JSON row (a bad sector, a bad edit)."""
    lines = Path(path).read_bytes().split(b"\n")
    lines[number - 1] = text.encode()
    Path(path).write_bytes(b"\n".join(lines))


def reported(stderr: str, path: Path, line: int) -> bool:
    """Whether a rerun's stderr names `path` and its line `line` among the lines it set aside."""
    return any(str(path) in text and f"line {line}:" in text for text in stderr.splitlines())


@dataclass
class DrillResult:
    """What one drill did and found; `ok` when nothing was lost or repeated and every damaged line reported."""

    name: str
    kills: int = 0
    kills_survived: int = 0
    items_before_kills: int = 0
    items_lost: int = 0
    items_repeated: int = 0
    damaged_injected: int = 0
    damaged_reported: int = 0
    files_truncated: int = 0
    files_named: int = 0
    crashes: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.items_lost == 0
            and self.items_repeated == 0
            and self.crashes == 0
            and self.kills_survived == self.kills
            and self.damaged_reported == self.damaged_injected
            and self.files_named == self.files_truncated
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    def check_rerun(self, run: Run, what: str) -> bool:
        """Count a rerun that failed without a clear error as a crash; True when it finished."""
        if run.returncode == 0:
            return True
        self.crashes += 1
        self.notes.append(f"{what} exited {run.returncode}: {run.stderr.strip()[-300:]}")
        return False

    def compare(self, before: list[Any], after: list[Any], key: Any) -> None:
        """Items written before a kill must all be in the rerun's output, unchanged; no key twice."""
        before = list({key(row): row for row in before}.values())  # a row seen at two kills counts once
        keys = [key(row) for row in after]
        self.items_repeated += len(keys) - len(set(keys))
        kept = {key(row): row for row in after}
        lost = [key(row) for row in before if kept.get(key(row)) != row]
        self.items_lost += len(lost)
        self.items_before_kills += len(before)
        if lost:
            self.notes.append(f"lost after a kill: {lost[:5]}")


def _kill_runs(
    result: DrillResult,
    cmd_for: Callable[[int], list[str]],
    watch: Path,
    kill_rows: Sequence[int],
    damage: Callable[[int, list[tuple[Path, int]]], list[Any]],
) -> list[Any]:
    """Run, SIGKILL at each of `kill_rows` rows of `watch` (each run resuming the last), let `damage` spoil
    what the kill left, then run to the end. Returns the rows `damage` says must survive."""
    survivors: list[Any] = []
    pending: list[tuple[Path, int]] = []  # damaged lines the next run must report by file and line
    for i, rows in enumerate([*sorted(set(kill_rows)), None]):
        run = run_command(cmd_for(i), watch=watch, rows=rows)
        result.damaged_reported += sum(reported(run.stderr, path, line) for path, line in pending)
        pending = []
        went_on = run.killed or result.check_rerun(run, "the final run" if rows is None else f"run {i}")
        if i and went_on:  # it resumed after our kill and kept going (until we killed it again, or the end)
            result.kills_survived += 1
        if rows is None:
            break
        if not run.killed:
            result.notes.append(f"run {i} ended before {watch.name} held {rows} rows")
            break
        result.kills += 1
        survivors += damage(i, pending)
    return survivors


def drill_agent_synthesis(
    workdir: Path, index: Path, chat_url: str, *, kill_rows: Sequence[int], n: int, max_seeds: int = 200
) -> DrillResult:
    """`searchgym synthesize` (the LLM agent, chatting with `chat_url`), killed when the pool holds each of
    `kill_rows` rows, each rerun resuming; after the first kill a partial row is appended to the pool (a kill
    mid-write) and a progress line damaged. Pool rows are checked by id and seed page, progress by url."""
    result = DrillResult("synthesize (agent)")
    out = Path(workdir) / "pool.jsonl"
    progress = out.with_name(out.name + ".progress.jsonl")
    cmd = searchgym_command(
        "synthesize",
        "--corpus",
        str(index),
        "--engine",
        f"openai:{chat_url}:stand-in",
        "--n",
        str(n),
        "--out",
        str(out),
        "--max-seeds",
        str(max_seeds),
        "--concurrency",
        "2",
        "--k",
        "2",
    )
    logged: list[Any] = []

    def damage(i: int, pending: list[tuple[Path, int]]) -> list[Any]:
        pooled, log = json_rows(out), json_rows(progress)
        if i == 0 and log:
            pending.append((out, append_partial(out, {"id": "qa-cut", "question": "cut by a kill " * 8})))
            damage_line(progress, 1)
            pending.append((progress, 1))
            log = log[1:]  # set aside: that seed runs again (or counts as done through its pool row)
            result.damaged_injected += 2
        logged.extend(log)
        return pooled

    pooled = _kill_runs(result, lambda i: cmd, out, kill_rows, damage)
    final = json_rows(out)
    result.compare(pooled, final, key=lambda row: row["id"])
    result.compare(logged, json_rows(progress), key=lambda row: row["url"])
    seeds = [row["metadata"]["seed_page"] for row in final]
    result.items_repeated += len(seeds) - len(set(seeds))
    if len(final) != n:
        result.items_lost += max(0, n - len(final))
        result.notes.append(f"the pool holds {len(final)} tasks, not {n}")
    return result


def drill_kbwalk_synthesis(workdir: Path, world: Path, *, kill_after_s: Sequence[float], n: int) -> DrillResult:
    """`searchgym synthesize --method kbwalk`, killed after each delay: the pool is written whole (atomically),
    so a killed run leaves no pool or the whole one; the rerun then finishes it, or refuses to replace it
    with a clear error. Either way the pool equals an uninterrupted run's, byte for byte."""
    result = DrillResult("synthesize (kbwalk)")
    reference = Path(workdir) / "reference.jsonl"
    ran = run_command(
        searchgym_command(
            "synthesize", "--method", "kbwalk", "--corpus", str(world), "--n", str(n), "--out", str(reference)
        )
    )
    result.check_rerun(ran, "the uninterrupted run")
    for i, delay in enumerate(kill_after_s):
        out = Path(workdir) / f"kill-{i}.jsonl"
        cmd = searchgym_command(
            "synthesize", "--method", "kbwalk", "--corpus", str(world), "--n", str(n), "--out", str(out)
        )
        run = run_command(cmd, after_s=delay)
        if not run.killed:
            result.notes.append(f"the run ended within {delay:.2f} s")
            continue
        result.kills += 1
        before = json_rows(out)
        if before and len(before) != n:
            result.notes.append(f"a kill left a partial pool of {len(before)} rows")
        rerun = run_command(cmd)
        if before:  # the pool was whole: the rerun must refuse to replace it, naming --overwrite
            if rerun.returncode == 2 and "--overwrite" in rerun.stderr:
                result.kills_survived += 1
            else:
                result.check_rerun(rerun, "the rerun onto a whole pool")
        elif result.check_rerun(rerun, "the rerun"):
            result.kills_survived += 1
        result.compare(before, json_rows(out), key=lambda row: row["id"])
        if reference.exists() and out.read_bytes() != reference.read_bytes():
            result.items_lost += 1
            result.notes.append(f"kill {i}: the pool differs from the uninterrupted run's")
    return result


def drill_train(
    workdir: Path, overrides: Sequence[str], *, kill_rows: Sequence[int], steps: int, fallback: bool = True
) -> DrillResult:
    """`searchgym train` (local launcher), killed when metrics.jsonl holds each of `kill_rows` rows, each rerun
    resuming; after each kill a partial row is appended (a kill mid-write). Then the latest checkpoint's
    model.safetensors is cut short: the resume must refuse naming it, and (with `fallback`) resumes once
    `latest` points at the previous checkpoint, as the message says."""
    result = DrillResult("train")
    run_dir = Path(workdir) / "run"
    base = ["train", *overrides, f"out_dir={run_dir}", "save_every=1", "keep_checkpoints=2"]
    metrics = run_dir / "metrics.jsonl"
    kept: dict[int, Any] = {}

    def damage(i: int, pending: list[tuple[Path, int]]) -> list[Any]:
        checkpoint = _latest_step(run_dir)
        for row in json_rows(metrics):  # the steps the checkpoint holds: they must survive unchanged
            if row["step"] <= checkpoint:
                kept.setdefault(row["step"], row)
        pending.append((metrics, append_partial(metrics, {"step": checkpoint + 1, "loss": 0.0})))
        result.damaged_injected += 1
        return []

    _kill_runs(
        result,
        lambda i: searchgym_command(*base, f"steps={steps}", *(["--resume"] if i else [])),
        metrics,
        kill_rows,
        damage,
    )
    after = json_rows(metrics)
    result.compare(list(kept.values()), after, key=lambda row: row["step"])
    if [row["step"] for row in after] != list(range(1, steps + 1)):
        result.items_lost += 1
        result.notes.append(f"metrics.jsonl steps after resume: {[row['step'] for row in after]}")
    provenance = [row["step"] for row in json_rows(run_dir / "provenance.jsonl")]
    result.items_repeated += len(provenance) - len(set(provenance))
    leftovers = sorted(
        p.name
        for pattern in ("*/.partial-*", "*/.sharded-step-*")  # a killed write's, after resume
        for p in run_dir.glob(pattern)
        if p.is_dir()
    )
    if leftovers:
        result.crashes += 1
        result.notes.append(f"partial checkpoint directories left after the resumes: {leftovers[:5]}")

    # a checkpoint file cut short: the resume names it and says what to do; pointing `latest` back works
    latest = run_dir / "checkpoints" / "latest"
    target = run_dir / "checkpoints" / latest.read_text().strip() / "model.safetensors"
    data = target.read_bytes()
    target.write_bytes(data[: len(data) // 2])
    result.files_truncated += 1
    more = searchgym_command(*base, f"steps={steps + 1}", "--resume")
    refused = run_command(more)
    if refused.returncode == 2 and str(target) in refused.stderr and "earlier checkpoint" in refused.stderr:
        result.files_named += 1
    else:
        result.crashes += 1
        result.notes.append(f"a cut {target.name}: exit {refused.returncode}: {refused.stderr.strip()[-300:]}")
    if not fallback:
        return result
    earlier = sorted(p.name for p in (run_dir / "checkpoints").glob("step-*"))[-2]
    latest.write_text(earlier + "\n")
    result.check_rerun(run_command(more), "the resume from the earlier checkpoint")
    steps_now = [row["step"] for row in json_rows(metrics)]
    if steps_now != list(range(1, steps + 2)):
        result.items_lost += 1
        result.notes.append(f"metrics.jsonl steps after the fallback: {steps_now}")
    return result


def drill_eval(
    workdir: Path, model: Path, env_kwargs: dict[str, Any], *, kill_rows: Sequence[int], tasks: int, k: int
) -> DrillResult:
    """`searchgym eval`, killed when samples.jsonl holds each of `kill_rows` rows, each rerun resuming; after
    the first kill the last row is cut in half and the first damaged. Samples are checked by (task, sample)."""
    result = DrillResult("eval")
    out = Path(workdir) / "eval"
    samples = out / "samples.jsonl"
    cmd = searchgym_command(
        "eval",
        "--env",
        "searchgym/SyntheticQA-v0",
        "--engine",
        str(model),
        "--out",
        str(out),
        "--k",
        str(k),
        "--max-tasks",
        str(tasks),
        "--env-kwargs",
        json.dumps(env_kwargs),
        "--max-new-tokens",
        "8",
        "--max-context",
        "768",
        "--concurrency",
        "4",
        "--judge",
        "em",
    )

    def damage(i: int, pending: list[tuple[Path, int]]) -> list[Any]:
        rows = json_rows(samples)
        if i == 0 and len(rows) >= 3:
            pending.append((samples, cut_last_line(samples)))
            damage_line(samples, 1)
            pending.append((samples, 1))
            result.damaged_injected += 2
            return rows[1:-1]  # both pairs are played again
        return rows

    survivors = _kill_runs(result, lambda i: cmd, samples, kill_rows, damage)
    after = json_rows(samples)
    result.compare(survivors, after, key=lambda row: (row["task_id"], row["sample"]))
    if len(after) != tasks * k:
        result.items_lost += abs(tasks * k - len(after))
        result.notes.append(f"samples.jsonl holds {len(after)} rows, not {tasks * k}")
    return result


def _latest_step(run_dir: Path) -> int:
    """The step of the run's latest checkpoint (0 when it has none)."""
    pointer = run_dir / "checkpoints" / "latest"
    return int(pointer.read_text().strip().split("-")[1]) if pointer.exists() else 0
