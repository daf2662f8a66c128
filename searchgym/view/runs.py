"""The runs the viewer shows, found under the folders it is given, and each run's index of episodes.

    runs, problems = find_runs([Path("runs/quickstart")])   # eval-sft, eval-rl (evaluations) and rl (training)
    index = runs[0].index()        # one EpisodeSummary per readable line; a Problem per line that is not

A run is an evaluation (a folder holding `samples.jsonl`) or a training run (a folder holding `trajectories/`,
one `version-*.jsonl` per policy version, and `metrics.jsonl`). The index keeps each episode's file, byte offset
and the few fields the list filters on, never its tokens or texts, so a run of 10,000 episodes opens in one pass
and a page only ever holds the episodes it shows. A line that is cut short (a run still writing), not JSON, or from
an older version that lacks fields becomes a Problem the page names, never a crash. Nothing here writes.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from searchgym.eval.agreement import calls

RunKind = Literal["eval", "train"]
SEARCH_DEPTH = 4  # folders below a given one searched for runs (a reproduction: OUT/seed-0/eval-arm)
SKIPPED_FOLDERS = {"checkpoints", "tensorboard", "shared", "sft-model", "base-model", "__pycache__"}
VERSION_FILE = re.compile(r"version-(\d+)\.jsonl$")
OUTCOMES = ("correct", "wrong", "unanswered", "failed")
MAX_QUESTION_CHARS = 300  # what the list shows of a question (the episode page shows it whole)


@dataclass(frozen=True)
class Problem:
    """A line, file or folder the viewer could not read, with why, shown on the run's page."""

    where: str
    why: str


@dataclass
class EpisodeSummary:
    """What the episode list shows and filters on; `offset` and `path` find the whole episode again."""

    number: int
    task_id: str
    sample: int
    version: int | None
    question: str
    prediction: str | None
    reward: float
    turns: int
    searches: int
    accesses: int
    stop_reason: str
    hops: int | None
    calls: dict[str, bool | None]  # each judge's call: True / False, None where it failed or did not run
    folded: bool  # the context was rebuilt (folded or summarised) at least once
    path: Path
    offset: int

    @property
    def tool_calls(self) -> int:
        return self.searches + self.accesses

    @property
    def judges_disagree(self) -> bool:
        given = {c for c in self.calls.values() if c is not None}
        return self.prediction is not None and len(given) > 1

    @property
    def judge_failed(self) -> bool:
        return any(c is None for c in self.calls.values())

    def outcome(self, judge: str) -> str:
        """correct, wrong, failed (`judge` gave no verdict) or unanswered."""
        if self.prediction is None:
            return "unanswered"
        call = self.calls.get(judge)
        return "failed" if call is None else ("correct" if call else "wrong")


@dataclass
class Index:
    """A run's episodes in file order, the judges they carry, and what could not be read."""

    episodes: list[EpisodeSummary] = field(default_factory=list)
    judges: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    stamp: tuple[tuple[str, int, int], ...] = ()


@dataclass
class Run:
    """One run folder: its label (the path below the folder the user gave), kind and files."""

    label: str
    kind: RunKind
    path: Path
    _index: Index | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def files(self) -> list[Path]:
        """The JSONL files holding the run's episodes, in order."""
        if self.kind == "eval":
            return [self.path / "samples.jsonl"] if (self.path / "samples.jsonl").is_file() else []
        found = [p for p in (self.path / "trajectories").glob("version-*.jsonl") if p.is_file()]
        return sorted(found, key=lambda p: _version_of(p) or 0)

    def meta(self) -> dict[str, Any]:
        """run.json (an evaluation) or config.json (a training run), or {} where it is missing or unreadable."""
        return read_json(self.path / ("run.json" if self.kind == "eval" else "config.json")) or {}

    def summary(self) -> dict[str, Any]:
        """An evaluation's summary.json ({} while the run is unfinished)."""
        return read_json(self.path / "summary.json") or {}

    def metrics(self) -> list[dict[str, Any]]:
        """A training run's metrics.jsonl rows (lines that are not JSON objects skipped)."""
        return [row for row, _ in _json_lines(self.path / "metrics.jsonl")]

    def index(self) -> Index:
        """The episode index, rebuilt when a file grew or changed since it was last built (a run still writing)."""
        with self._lock:
            stamp = _stamp(self.files())
            if self._index is None or self._index.stamp != stamp:
                self._index = build_index(self, stamp)
            return self._index


def find_runs(paths: list[Path]) -> tuple[list[Run], list[Problem]]:
    """Every run in or below each path (a folder, or a samples.jsonl file), labelled by where it sits."""
    runs: list[Run] = []
    problems: list[Problem] = []
    for given in paths:
        root = given.parent if given.is_file() and given.name == "samples.jsonl" else given
        if not root.exists():
            problems.append(Problem(str(given), "does not exist"))
            continue
        if not root.is_dir():
            problems.append(Problem(str(given), "is a file: give a run folder (or its samples.jsonl)"))
            continue
        found = list(_runs_below(root, root.name or str(root)))
        if not found:
            problems.append(
                Problem(
                    str(given),
                    "holds no run: an evaluation folder has samples.jsonl, a training run trajectories/version-*.jsonl",
                )
            )
        runs.extend(found)
    labels = [r.label for r in runs]
    for run in runs:  # two given folders of the same name: the full path tells them apart
        if labels.count(run.label) > 1:
            run.label = str(run.path)
    return runs, problems


def _runs_below(root: Path, label: str, depth: int = 0) -> list[Run]:
    found: list[Run] = []
    if (root / "samples.jsonl").is_file():
        found.append(Run(label, "eval", root))
    elif (root / "trajectories").is_dir():
        found.append(Run(label, "train", root))
    if depth >= SEARCH_DEPTH:
        return found
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir() and p.name not in SKIPPED_FOLDERS)
    except OSError:
        return found
    for child in children:
        if child.name != "trajectories":
            found.extend(_runs_below(child, f"{label}/{child.name}", depth + 1))
    return found


def field_list(row: Any, name: str) -> list[Any]:
    """row[name] if row is an object and that is a list, else [] (a stored row is read, never trusted)."""
    value = row.get(name) if isinstance(row, dict) else None
    return value if isinstance(value, list) else []


def field_dict(row: Any, name: str) -> dict[str, Any]:
    """row[name] if row is an object and that is an object, else {}."""
    value = row.get(name) if isinstance(row, dict) else None
    return value if isinstance(value, dict) else {}


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from a file, or None where it is missing, unreadable or not an object."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _stamp(files: list[Path]) -> tuple[tuple[str, int, int], ...]:
    out = []
    for path in files:
        try:
            st = path.stat()
        except OSError:
            continue
        out.append((str(path), st.st_size, st.st_mtime_ns))
    return tuple(out)


def _version_of(path: Path) -> int | None:
    match = VERSION_FILE.search(path.name)
    return int(match.group(1)) if match else None


def _json_lines(path: Path) -> list[tuple[dict[str, Any], int]]:
    """(row, offset) of each line of `path` that is a JSON object."""
    out = []
    try:
        with path.open("rb") as f:
            offset = 0
            for raw in f:
                try:
                    row = json.loads(raw)
                except ValueError:
                    row = None
                if isinstance(row, dict):
                    out.append((row, offset))
                offset += len(raw)
    except OSError:
        pass
    return out


def read_line(path: Path, offset: int) -> dict[str, Any]:
    """The JSON object on the line that starts at `offset` (ValueError if it is not one any more)."""
    with path.open("rb") as f:
        f.seek(offset)
        row = json.loads(f.readline())
    if not isinstance(row, dict):
        raise ValueError("not a JSON object")
    return row


def build_index(run: Run, stamp: tuple[tuple[str, int, int], ...] = ()) -> Index:
    """One pass over the run's files: a summary per episode, a Problem per line that cannot be one."""
    index = Index(stamp=stamp)
    judges: dict[str, None] = {}
    for path in run.files():
        version = _version_of(path) if run.kind == "train" else None
        try:
            f = path.open("rb")
        except OSError as e:
            index.problems.append(Problem(str(path), f"cannot be read: {e.strerror or e}"))
            continue
        with f:
            offset, line_no = 0, 0
            for raw in f:
                line_no += 1
                where = f"{path.name} line {line_no}"
                if raw.strip():
                    summary = _summary_or_problem(raw, run.kind, len(index.episodes), version, path, offset, where)
                    if isinstance(summary, Problem):
                        index.problems.append(summary)
                    else:
                        index.episodes.append(summary)
                        judges.update(dict.fromkeys(summary.calls))
                offset += len(raw)
    index.judges = list(judges)
    return index


def _summary_or_problem(
    raw: bytes, kind: RunKind, number: int, version: int | None, path: Path, offset: int, where: str
) -> EpisodeSummary | Problem:
    try:
        row = json.loads(raw)
    except ValueError as e:
        if not raw.endswith(b"\n"):
            return Problem(where, "cut short (the run may still be writing it)")
        return Problem(where, f"not JSON ({e})")
    if not isinstance(row, dict):
        return Problem(where, f"not a JSON object but {type(row).__name__}")
    try:
        return summarise(row, kind, number, version, path, offset)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        return Problem(where, f"not an episode this version reads ({type(e).__name__}: {e}); written by another one?")


def summarise(
    row: dict[str, Any], kind: RunKind, number: int, version: int | None, path: Path, offset: int
) -> EpisodeSummary:
    """The list's fields of one stored row: an evaluation sample (samples.jsonl) or a trained trajectory."""
    traj = field_dict(row, "trajectory") if kind == "eval" else row
    turns = field_list(traj, "turns")
    stats = field_dict(row, "stats")
    tools = [t.get("tool") for t in turns if isinstance(t, dict)]
    if kind == "eval":
        judge_calls = calls(row) if isinstance(row.get("verdicts"), dict) else {}
        question = row.get("question")
        hops = field_dict(row, "subset").get("hops")
    else:
        verdict = field_dict(traj, "verdict")
        judge_calls = {str(verdict.get("judge") or "env"): bool(verdict.get("correct"))} if verdict else {}
        question, hops = question_of(traj.get("messages")), None
    folded = bool(traj.get("segments")) or bool(traj.get("context_events")) or int(stats.get("segments") or 1) > 1
    return EpisodeSummary(
        number=number,
        task_id=str(row["task_id"]),
        sample=int(row.get("sample", 0) if kind == "eval" else (traj.get("group") or 0)),
        version=version,
        question=str(question or "")[:MAX_QUESTION_CHARS],
        prediction=None if row.get("prediction") is None else str(row["prediction"]),
        reward=float(row.get("reward") or 0.0),
        turns=int(stats.get("turns", len(turns))),
        searches=int(stats.get("searches", tools.count("search"))),
        accesses=int(stats.get("accesses", tools.count("access"))),
        stop_reason=str(stats.get("stop_reason", traj.get("stop_reason", "")) or ""),
        hops=hops if isinstance(hops, int) and not isinstance(hops, bool) else None,
        calls=judge_calls,
        folded=folded,
        path=path,
        offset=offset,
    )


def question_of(messages: Any) -> str:
    """The question a trained trajectory's first user message asks (its text after the last "Question:")."""
    if not isinstance(messages, list):
        return ""
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            text = str(message.get("content") or "")
            return text.rsplit("Question:", 1)[-1].strip()
    return ""
