"""Task and TaskPool: the questions an environment poses, loaded from JSONL or a `datasets` dataset."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import numpy as np

from searchgym.core.atomic_file import atomic_open
from searchgym.core.extras import needs


@dataclass(frozen=True)
class Task:
    """One question with its accepted answers; only `question` is ever shown to the agent."""

    id: str
    question: str
    answers: tuple[str, ...]
    metadata: dict[str, Any] = field(default_factory=dict, hash=False, compare=True)

    @classmethod
    def from_row(cls, row: Mapping[str, Any], *, fallback_id: str) -> Task:
        """A Task from our row form or ASearcher's (`question`, `answer`/`gt` str or list, `aug_answer`, `qid`/`idx`).

        `aug_answer` (ASearcher's augmented answers) is kept apart in `metadata["aug_answer"]`, not among the
        answers: ASearcher's reward gives them at most 0.3 (see `aug_answers`), so they are not full aliases."""
        if not isinstance(row, Mapping):
            raise ValueError(f"a task row must be a JSON object, got {type(row).__name__}")
        question = row.get("question")
        if not isinstance(question, str) or not question.strip():
            raise ValueError("missing or empty 'question'")
        answers = _answers_of(row)
        if not answers:
            raise ValueError("no answer: give 'answers' (list), or 'answer' / 'gt' (string or list)")
        task_id = next((row[k] for k in _ID_KEYS if row.get(k) not in (None, "")), fallback_id)
        metadata = row.get("metadata") or {}
        if isinstance(metadata, str):  # datasets round-trip: metadata stored as a JSON string
            metadata = json.loads(metadata)
        if not isinstance(metadata, dict):
            raise ValueError("'metadata' must be an object")
        extra = {k: v for k, v in row.items() if k not in _KNOWN_KEYS}
        metadata = {**extra, **metadata}
        aug = _strings_of(metadata.get(AUG_KEY))
        if aug:
            metadata[AUG_KEY] = aug
        else:
            metadata.pop(AUG_KEY, None)
        return cls(str(task_id), question.strip(), tuple(answers), metadata)

    @property
    def aug_answers(self) -> tuple[str, ...]:
        """ASearcher's augmented answers of this task (`metadata["aug_answer"]`), which judges such as
        `asearcher_f1` blend in at weight 0.3; empty for most tasks."""
        return tuple(_strings_of(self.metadata.get(AUG_KEY)))

    def to_row(self) -> dict[str, Any]:
        return {"id": self.id, "question": self.question, "answers": list(self.answers), "metadata": self.metadata}


_ID_KEYS = ("id", "qid", "idx", "question_id")
_ANSWER_KEYS = ("answers", "answer", "gt", "golden_answers")
AUG_KEY = "aug_answer"  # ASearcher's row field for augmented answers; kept in metadata under the same name
_KNOWN_KEYS = frozenset({*_ID_KEYS, *_ANSWER_KEYS, "question", "metadata"})


def _answers_of(row: Mapping[str, Any]) -> list[str]:
    """All reference answers of a row, aliases included, de-duplicated in order."""
    return list(dict.fromkeys(s for key in _ANSWER_KEYS for s in _strings_of(row.get(key))))


def _strings_of(value: Any) -> list[str]:
    """A string, number or list of them as stripped non-empty strings, de-duplicated in order; anything else: []."""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)):
        return []
    found = (str(v).strip() for v in value if isinstance(v, (str, int, float)))
    return list(dict.fromkeys(s for s in found if s))


class TaskFileError(ValueError):
    """A task file has a row that cannot become a Task; the message names the file and line."""


class TaskPool(Sequence[Task]):
    """An indexed, filterable view over tasks; draws are seeded by the caller's generator."""

    def __init__(self, tasks: Iterable[Task], *, name: str = "tasks", rejected: Sequence[tuple[str, str]] = ()):
        self.tasks: list[Task] = list(tasks)
        self.name = name
        self.rejected: list[tuple[str, str]] = list(rejected)  # (where, why) of rows skipped on load
        self._by_id: dict[str, int] = {}
        for i, task in enumerate(self.tasks):
            if task.id in self._by_id:
                raise TaskFileError(f"{name}: duplicate task id {task.id!r} (tasks {self._by_id[task.id]} and {i})")
            self._by_id[task.id] = i

    def __len__(self) -> int:
        return len(self.tasks)

    @overload
    def __getitem__(self, index: int) -> Task: ...

    @overload
    def __getitem__(self, index: slice) -> TaskPool: ...

    def __getitem__(self, index: int | slice) -> Task | TaskPool:
        if isinstance(index, slice):
            return TaskPool(self.tasks[index], name=self.name)
        return self.tasks[index]

    def __repr__(self) -> str:
        return f"TaskPool({self.name!r}, {len(self)} tasks)"

    def by_id(self, task_id: str) -> Task:
        try:
            return self.tasks[self._by_id[str(task_id)]]
        except KeyError:
            raise KeyError(f"no task with id {task_id!r} in {self.name}") from None

    def sample(self, rng: np.random.Generator) -> Task:
        if not self.tasks:
            raise ValueError(f"task pool {self.name} is empty (check the filters and the task file)")
        return self.tasks[int(rng.integers(len(self.tasks)))]

    def shuffled(self, seed: int) -> TaskPool:
        """The same tasks in a seeded order: a trainer's reproducible data order."""
        order = np.random.default_rng(seed).permutation(len(self.tasks))
        return TaskPool([self.tasks[i] for i in order], name=self.name)

    def filter(
        self,
        *,
        hops: int | Iterable[int] | None = None,
        split: str | None = None,
        predicate: Callable[[Task], bool] | None = None,
    ) -> TaskPool:
        """Tasks whose metadata matches: `hops` (one or several), `split` ("train"/"test"), any predicate."""
        wanted_hops = {hops} if isinstance(hops, int) else (set(hops) if hops is not None else None)
        kept = [
            t
            for t in self.tasks
            if (wanted_hops is None or t.metadata.get("hops") in wanted_hops)
            and (split is None or t.metadata.get("split", "train") == split)
            and (predicate is None or predicate(t))
        ]
        return TaskPool(kept, name=self.name)

    # --- loading and saving -------------------------------------------------------------

    @classmethod
    def load(
        cls, source: str | os.PathLike | TaskPool | Iterable[Task], *, on_error: str = "raise", split: str | None = None
    ) -> TaskPool:
        """A pool from a JSONL/JSON file, a `datasets` directory saved on disk, or tasks already in memory."""
        if isinstance(source, TaskPool):
            return source
        if not isinstance(source, (str, os.PathLike)):
            return cls(source)
        path = Path(source)
        if path.is_dir():
            return cls.from_dataset(path, split=split)
        return cls.from_jsonl(path, on_error=on_error)

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike, *, on_error: str = "raise") -> TaskPool:
        """Read a JSONL (or JSON array) task file. on_error="skip" keeps going and records rejects."""
        if on_error not in ("raise", "skip"):
            raise ValueError("on_error must be 'raise' or 'skip'")
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"task file {path} does not exist")
        tasks: list[Task] = []
        rejected: list[tuple[str, str]] = []
        for where, row in _rows_of(path):
            try:
                if isinstance(row, Exception):
                    raise row
                tasks.append(Task.from_row(row, fallback_id=f"{path.stem}-{len(tasks) + len(rejected)}"))
            except (ValueError, TypeError) as e:
                if on_error == "raise":
                    raise TaskFileError(
                        f"{where}: {e}. Fix or delete this row, or load with on_error='skip'."
                    ) from None
                rejected.append((where, str(e)))
        if rejected:
            warnings.warn(
                f"{path}: skipped {len(rejected)} bad rows (see TaskPool.rejected); first: {rejected[0]}", stacklevel=2
            )
        return cls(tasks, name=path.name, rejected=rejected)

    @classmethod
    def from_dataset(cls, source: str | os.PathLike | Any, *, split: str | None = None) -> TaskPool:
        """Tasks from a Hugging Face `datasets` Dataset, or one saved with `save_to_disk`."""
        with needs("reading a `datasets` folder"):  # heavy import: only when a dataset is really used
            import datasets

        data = datasets.load_from_disk(str(source)) if isinstance(source, (str, os.PathLike)) else source
        if isinstance(data, datasets.DatasetDict):
            if split is None:
                if len(data) != 1:
                    raise ValueError(f"{source} has splits {list(data)}: pass split=...")
                split = next(iter(data))
            data = data[split]
        name = str(source) if isinstance(source, (str, os.PathLike)) else "dataset"
        return cls((Task.from_row(row, fallback_id=f"row-{i}") for i, row in enumerate(data)), name=name)

    def to_jsonl(self, path: str | os.PathLike) -> None:
        """Write the pool atomically as JSONL (one `Task.to_row` per line)."""
        with atomic_open(path) as f:
            for task in self.tasks:
                f.write(json.dumps(task.to_row(), ensure_ascii=False) + "\n")

    def to_dataset(self, path: str | os.PathLike | None = None) -> Any:
        """A `datasets.Dataset` of the pool (metadata as JSON text, since its keys vary); saved if `path`."""
        with needs("writing a `datasets` folder"):
            import datasets

        data = datasets.Dataset.from_dict(
            {
                "id": [t.id for t in self.tasks],
                "question": [t.question for t in self.tasks],
                "answers": [list(t.answers) for t in self.tasks],
                "metadata": [json.dumps(t.metadata, ensure_ascii=False) for t in self.tasks],
            }
        )
        if path is not None:
            data.save_to_disk(str(path))
        return data


def _rows_of(path: Path) -> Iterator[tuple[str, Any]]:
    """(location, parsed row or the parse error) for each row of a JSONL file or a JSON array file. Text must be
    UTF-8 (a BOM allowed): a line in another encoding is that row's error, never a row with its characters replaced;
    a UTF-16 file is refused by name."""
    raw = path.read_bytes()
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")) or (len(raw) > 1 and b"\x00" in raw[:2]):
        raise TaskFileError(f"{path}: the file is UTF-16; save it as UTF-8")
    raw = raw.removeprefix(b"\xef\xbb\xbf")
    if raw.lstrip()[:1] == b"[":
        try:
            rows = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise TaskFileError(f"{path}: not valid UTF-8 ({e.reason} at byte {e.start}); save it as UTF-8") from None
        except (ValueError, RecursionError) as e:
            raise TaskFileError(f"{path}: not valid JSON ({e})") from None
        for i, row in enumerate(rows):
            yield f"{path}[{i}]", row
        return
    for lineno, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            yield f"{path}:{lineno}", ValueError(f"not valid UTF-8 ({e.reason} at byte {e.start}); save it as UTF-8")
            continue
        try:
            yield f"{path}:{lineno}", json.loads(text)
        except (ValueError, RecursionError) as e:
            yield f"{path}:{lineno}", ValueError(f"not valid JSON ({e})")


_POOL_CACHE: dict[tuple, TaskPool] = {}
_POOL_CACHE_SIZE = 8


def load_pool(
    source: str | os.PathLike | TaskPool | Iterable[Task],
    *,
    on_error: str = "raise",
    split: str | None = None,
    hops: int | Iterable[int] | None = None,
) -> TaskPool:
    """`TaskPool.load(source)` filtered by metadata `split` and `hops`; pools read from a file are cached.

    A trainer or an evaluation makes dozens of envs over one task file, and parsing 20,000 tasks takes
    about a second, so a file's pool is parsed once per process (keyed by its path, size and mtime:
    an edited file is read again). Pools are shared read-only; filtering makes a new one.
    """
    if not isinstance(source, (str, os.PathLike)) or not os.path.exists(
        source
    ):  # not cached (a missing file: its error)
        pool = TaskPool.load(source, on_error=on_error)
        return pool.filter(split=split, hops=hops) if split is not None or hops is not None else pool
    path = Path(source).resolve()
    stat = path.stat()
    key = (
        str(path),
        stat.st_size,
        stat.st_mtime_ns,
        on_error,
        split,
        tuple(sorted({hops} if isinstance(hops, int) else set(hops))) if hops is not None else None,
    )
    if key not in _POOL_CACHE:
        pool = TaskPool.load(path, on_error=on_error)
        if split is not None or hops is not None:
            pool = pool.filter(split=split, hops=hops)
        if len(_POOL_CACHE) >= _POOL_CACHE_SIZE:
            _POOL_CACHE.pop(next(iter(_POOL_CACHE)))
        _POOL_CACHE[key] = pool
    return _POOL_CACHE[key]
