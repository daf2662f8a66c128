"""Benchmark suites: ASearcher's evaluation sets as gym ids, each with its data source, backend kind and judge.

Local-knowledge suites (NQ, TriviaQA, PopQA, HotpotQA, 2WikiMultihopQA, MuSiQue, Bamboogle) are
LocalQA envs over a local index, a corpus file or retrieval servers (ASearcher: Wikipedia 2018);
web suites (GAIA text-only, xbench-DeepSearch, Frames) are WebQA envs graded by an LLM judge;
SyntheticQA is the embedded world. Questions come from a folder in ASearcher's test-data layout,
`{root}/{folder}/{split}.jsonl` (or `.json`, or a `datasets` directory saved at `{root}/{folder}/{split}`
or `{root}/{folder}`), rows with `question` and `answer` or `gt` (a string or a list); `root` is the
`data_root` kwarg or `$SEARCHGYM_DATA`. `data=` points at one file or saved dataset directly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym

from searchgym.envs.env_ids import SYNTHETIC_QA
from searchgym.envs.factory import make_unwrapped

DATA_ENV = "SEARCHGYM_DATA"


@dataclass(frozen=True)
class Suite:
    """One benchmark: gym id, ASearcher data folder and split, backend kind and the judges that grade it."""

    name: str
    folder: str  # the folder name in ASearcher's test data
    kind: str  # "local" (LocalQA), "web" (WebQA), "embedded" (SyntheticQA) or "browsecomp" (its own layout)
    judge: str  # default judges of `searchgym eval` (comma list; the first is primary)
    split: str = "test"
    note: str = ""

    @property
    def env_id(self) -> str:
        return f"searchgym/{self.name}-v0"


SUITES: dict[str, Suite] = {
    s.name: s
    for s in [
        Suite("NQ", "nq", "local", "em,f1"),
        Suite("TriviaQA", "triviaqa", "local", "em,f1"),
        Suite("PopQA", "popqa", "local", "em,f1"),
        Suite("HotpotQA", "hotpotqa", "local", "em,f1"),
        Suite("2WikiMultihopQA", "2wikimultihopqa", "local", "em,f1"),
        Suite("MuSiQue", "musique", "local", "em,f1"),
        Suite("Bamboogle", "bamboogle", "local", "em,f1"),
        Suite("GAIA", "gaia", "web", "llm,f1", note="text-only questions (no attached files)"),
        Suite("xbench-DeepSearch", "xbench-deepsearch", "web", "llm,f1"),
        Suite("Frames", "frames", "web", "llm,f1"),
        Suite("SyntheticQA", "", "embedded", "em,f1", split="test", note="the embedded synthetic world"),
        Suite(
            "BrowseCompPlus",
            "browsecomp-plus",
            "browsecomp",
            "llm,f1",
            note="830 queries over a fixed ~100K-document corpus, with evidence judgements (envs/browsecomp_plus.py)",
        ),
    ]
}


def suite_of(env_id: str) -> Suite | None:
    """The suite registered under a gym id (`searchgym/HotpotQA-v0`), or None for other envs."""
    return next((s for s in SUITES.values() if s.env_id == env_id), None)


def register_suites() -> None:
    """Register every suite's gym id (idempotent). SyntheticQA is `searchgym/SyntheticQA-v0` itself."""
    for suite in SUITES.values():
        if suite.kind == "embedded" or suite.env_id in gym.registry:
            continue
        if suite.kind == "browsecomp":  # its repository's layout, not ASearcher's: a loader of its own
            gym.register(
                id=suite.env_id,
                entry_point="searchgym.envs.browsecomp_plus:make_browsecomp_plus",
                nondeterministic=False,
                disable_env_checker=False,
            )
            continue
        gym.register(
            id=suite.env_id,
            entry_point="searchgym.envs.suites:make_suite_env",
            kwargs={"suite": suite.name},
            nondeterministic=suite.kind == "web",
            disable_env_checker=False,
        )


def resolve_data(suite: Suite, data_root: str | os.PathLike | None = None, split: str | None = None) -> Path:
    """The task file or saved dataset of a suite, or a FileNotFoundError that says where to put what."""
    split = split or suite.split
    root = data_root if data_root is not None else os.environ.get(DATA_ENV)
    expected = f"{{root}}/{suite.folder}/{split}.jsonl"
    if root is None:
        raise FileNotFoundError(
            f"{suite.env_id}: no data folder. Put ASearcher's test data at {expected} (JSON lines with "
            f"'question' and 'answer' or 'gt', a string or a list) and pass data_root=ROOT (env kwarg) or set "
            f"${DATA_ENV}=ROOT; or pass data=FILE.jsonl or a `datasets` directory."
        )
    folder = Path(root) / suite.folder
    for candidate in (folder / f"{split}.jsonl", folder / f"{split}.json", folder / split):
        if candidate.is_file() or (candidate.is_dir() and _is_dataset(candidate)):
            return candidate
    if folder.is_dir() and _is_dataset(folder):
        return folder
    found = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else None
    raise FileNotFoundError(
        f"{suite.env_id}: no {split} data in {folder}"
        + (f" (it holds {found})" if found is not None else " (the folder does not exist)")
        + f". Put the questions at {folder / (split + '.jsonl')} (or {split}.json, or a `datasets` directory "
        f"saved at {folder / split}): one JSON object per line with 'question' and 'answer' or 'gt' "
        f"(a string or a list), as in ASearcher's test data."
    )


def _is_dataset(path: Path) -> bool:
    return (
        (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists() or (path / "state.json").exists()
    )


def make_suite_env(
    suite: str,
    *,
    data_root: str | os.PathLike | None = None,
    data: Any = None,
    split: str | None = None,
    **env_kwargs: Any,
) -> gym.Env:
    """Build a suite's env: its tasks (from `data` or the data folder) on its backend kind.

    Local suites take LocalQA's backend kwargs (`index=`, `corpus=` or `servers=`); web suites WebQA's
    (`search_provider=`, `cache=`, ...). The env's reward judge defaults to F1 (an LLM judge is applied
    by `searchgym eval`, which needs a chat model)."""
    spec = SUITES[suite]
    if spec.kind == "embedded":
        return make_unwrapped(SYNTHETIC_QA, **env_kwargs)
    tasks = data if data is not None else resolve_data(spec, data_root, split)
    if isinstance(tasks, (str, os.PathLike)) and Path(tasks).is_dir():
        from searchgym.envs.tasks import TaskPool

        tasks = TaskPool.from_dataset(tasks, split=split)
    if spec.kind == "local":
        from searchgym.envs.local_qa import make_local_qa

        if not any(env_kwargs.get(k) is not None for k in ("index", "corpus", "servers")):
            raise ValueError(
                f"{spec.env_id} needs a search backend: index=DIR (`searchgym index build`), "
                "corpus=FILE.jsonl or servers=URL(s) (`searchgym serve search`; ASearcher uses a "
                "Wikipedia 2018 corpus)"
            )
        return make_local_qa(tasks, **env_kwargs)
    from searchgym.envs.web_env import make_web_qa

    return make_web_qa(tasks, **env_kwargs)


# its **env_kwargs reach one of these, by the suite's kind (envs/env_kwargs.py checks them by name); SyntheticQA's
# factory is named by its gym id, as make_suite_env builds it: its module is in world/, a floor above envs
make_suite_env.forwards_kwargs_to = (  # type: ignore[attr-defined]
    "searchgym.envs.local_qa:make_local_qa",
    "searchgym.envs.web_env:make_web_qa",
    SYNTHETIC_QA,
)
