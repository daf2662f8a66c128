"""Questions with a proven minimum number of tool calls: deep walks, served with title-only hits and short parts.

A chain question of up to `MAX_HOPS` relations is kept only when `prover.MinCallsProver` shows that
the fewest search/access calls that observe its answer (over the prover's stated action set) falls in
the requested range, and the oracle, replaying the proof's witness play through a real env, reaches the
answer in exactly that many calls and is judged right. Three things make the count large, all of
them shortcut-proof by construction of the proof: a walk's pages must be found one after another
(names of later pages show only on earlier ones), search hits show little more than titles
(`PROOF_ENV["doc_chars"]`), and pages are served in short parts (`PROOF_ENV["page_chunk_chars"]`), so a
fact in a later part needs one access per part before it.

The proof holds for env settings `PROOF_ENV` only; `make_synthetic_qa` serves these pools with them and
refuses others. The hops-based pools of the bundle (`tasks.jsonl`) are untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from tqdm import tqdm

from searchgym.core.file_lock import file_lock
from searchgym.envs.search_env import SearchEnv
from searchgym.envs.tasks import Task, TaskPool
from searchgym.envs.tools.local_index import LocalIndex
from searchgym.world.bundle import showing_builds
from searchgym.world.kbwalk import KBWalker, to_task
from searchgym.world.oracle import OracleAgent
from searchgym.world.prover import PROOF_VERSION, MinCallsProver
from searchgym.world.validation import TEST_SHARE, run_blocking
from searchgym.world.world import World

MAX_HOPS = 8  # longest walk drawn for these pools
MAX_MIN_CALLS = 12  # the largest minimum asked for; above it worlds rarely hold any question
PROOF_ENV: dict[str, Any] = {
    "top_k": 5,
    "doc_chars": 60,
    "page_chunk_chars": 120,
    "max_page_chars": 250_000,
    "max_page_chunks": 10,
}
CANDIDATES_PER_TASK = 400  # give up (ValueError) after this many candidates per wanted task,
MIN_CANDIDATES = 2_000  # and never before this many
DEFAULT_MIN_CALLS_TASKS = 64


def parse_min_calls(value: Any) -> tuple[int, int]:
    """(low, high) from an int N (exactly N), a (low, high) pair (both included) or a `range`; ValueError otherwise."""
    if isinstance(value, range):
        if value.step != 1 or len(value) == 0:
            raise ValueError(f"min_calls as a range must be non-empty with step 1, got {value!r}")
        low, high = value.start, value.stop - 1
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        low, high = value
    else:
        low = high = value
    if any(isinstance(v, bool) or not isinstance(v, int) for v in (low, high)):
        raise ValueError(f"min_calls must be an int, a (low, high) pair of ints or a range, got {value!r}")
    if not 1 <= low <= high:
        raise ValueError(f"min_calls must be at least 1 (and low <= high), got {value!r}")
    if high > MAX_MIN_CALLS:
        raise ValueError(f"min_calls above {MAX_MIN_CALLS} is more than the synthetic world supports, got {value!r}")
    return low, high


def check_env_kwargs(low_high: tuple[int, int], env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The env kwargs with PROOF_ENV filled in; ValueError (naming min_calls) when they break the proof's settings."""
    for key, value in PROOF_ENV.items():
        if key in env_kwargs and env_kwargs[key] != value:
            raise ValueError(f"min_calls questions are proven for {key}={value}; got {key}={env_kwargs[key]!r}")
    turns = env_kwargs.get("max_turns", 32)
    if turns <= low_high[1]:
        raise ValueError(
            f"min_calls={low_high[1]} needs max_turns above it (the calls plus the answer), got max_turns={turns}"
        )
    return {**env_kwargs, **PROOF_ENV}


def synthesize_min_calls_pool(
    world: World, index: LocalIndex, n_tasks: int, min_calls: Any, *, seed: int = 0, progress: bool = False
) -> tuple[TaskPool, dict[str, Any]]:
    """The first `n_tasks` chain questions whose proven minimum lies in `min_calls`, each replayed by the oracle.

    Blocking; also callable from a running event loop (the work then runs on a loop of its own in a thread).
    """
    low, high = parse_min_calls(min_calls)
    return run_blocking(_synthesize(world, index, n_tasks, low, high, seed, progress))


async def _synthesize(
    world: World, index: LocalIndex, n_tasks: int, low: int, high: int, seed: int, progress: bool
) -> tuple[TaskPool, dict[str, Any]]:
    walker = KBWalker(
        world,
        seed=seed,
        comparison_prob=0.0,
        max_hops=MAX_HOPS,
        hop_weights={h: float(h * h) for h in range(1, MAX_HOPS + 1)},
    )  # long walks first
    prover = MinCallsProver.over(world, index, **PROOF_ENV)
    oracle = OracleAgent()
    budget = max(MIN_CANDIDATES, CANDIDATES_PER_TASK * n_tasks)
    accepted: list[Task] = []
    seen: set[str] = set()
    minima: Counter[str] = Counter()
    rejections: Counter[str] = Counter()
    candidates = walker.candidates()
    with tqdm(total=n_tasks, desc=f"proving min_calls {low}..{high}", disable=not progress, unit="task") as bar:
        drawn = 0
        while len(accepted) < n_tasks:
            if len(seen) >= budget or drawn >= 4 * budget:  # the second: a world with few distinct questions
                raise ValueError(
                    f"min_calls={low if low == high else (low, high)}: only {len(accepted)} of {n_tasks} questions "
                    f"found in {budget:,} candidates of this {world.size:,}-page world (proven minima seen: "
                    f"{_by_calls(minima)}); ask for a smaller min_calls, fewer tasks or a larger world"
                )
            candidate = next(candidates)
            drawn += 1
            if candidate.question in seen:
                continue
            seen.add(candidate.question)
            digest = int(hashlib.sha256(candidate.question.encode()).hexdigest(), 16)
            task = to_task(
                candidate, f"mc{world.seed}-{seed}-{len(seen):07d}", "test" if digest % TEST_SHARE == 0 else "train"
            )
            proof = await prover.prove(task, high)
            minima[str(proof.min_calls) if proof.min_calls is not None else f">{high}"] += 1
            if proof.min_calls is None or proof.min_calls < low:
                rejections["proof: " + ("too many calls" if proof.min_calls is None else "too few calls")] += 1
                continue
            task = Task(
                task.id,
                task.question,
                task.answers,
                {**task.metadata, "min_calls": proof.min_calls, "min_calls_proof": proof.metadata()},
            )
            env = SearchEnv(TaskPool([task]), index, index, judge="em", max_turns=high + 2, **PROOF_ENV)
            result = await oracle.arun(env, task)
            env.close()
            if not result.solved or len(result.turns) != proof.min_calls + 1:
                rejections["oracle: " + (result.failure or "other play length").split(":")[0]] += 1
                continue
            accepted.append(task)
            bar.update(1)
    prover.env.close()
    report = {
        "accepted": len(accepted),
        "candidates": len(seen),
        "min_calls": [low, high],
        "proven_minima": _by_calls(minima),
        "rejections": dict(sorted(rejections.items())),
        "kb_rejections": dict(walker.rejections),
        "env": PROOF_ENV,
        "proof_version": PROOF_VERSION,
    }
    return TaskPool(accepted, name=f"synthetic-{world.size}-{world.seed}-mincalls{low}-{high}"), report


def _by_calls(minima: Counter[str]) -> dict[str, int]:
    """Proven minima in call order ("1", "2", ..., then ">N")."""
    return dict(sorted(minima.items(), key=lambda kv: (kv[0].startswith(">"), int(kv[0].lstrip(">")))))


def pool_key() -> str:
    """What shapes a min_calls pool besides its range and size: the proof's version, env settings and walk depth."""
    spec = json.dumps({"proof": PROOF_VERSION, "env": PROOF_ENV, "max_hops": MAX_HOPS}, sort_keys=True)
    return f"v{PROOF_VERSION}-" + hashlib.sha256(spec.encode()).hexdigest()[:8]


def ensure_min_calls_pool(bundle: Path, min_calls: Any, n_tasks: int, *, progress: bool | None = None) -> Path:
    """The min_calls task file inside a built bundle, proven on first use under a file lock (keyed by range,
    count and proof version, so other pools of the bundle never change); its progress shown as `ensure_bundle`'s."""
    progress = showing_builds(progress)
    low, high = parse_min_calls(min_calls)
    manifest = json.loads((bundle / "bundle.json").read_text())
    path = bundle / f"mincalls-{pool_key()}-{low}-{high}-tasks{n_tasks}.jsonl"
    if path.exists():
        return path
    with file_lock(path.with_name(path.name + ".lock")):
        if not path.exists():
            from searchgym.envs.tools.indexes import open_index

            world = World(manifest["size"], manifest["seed"])
            pool, report = synthesize_min_calls_pool(
                world, open_index(bundle), n_tasks, (low, high), seed=manifest["seed"], progress=progress
            )
            tmp = path.with_name(path.name + f".report-{os.getpid()}")
            tmp.write_text(json.dumps(report, indent=2) + "\n")
            os.replace(tmp, path.with_suffix(".report.json"))
            pool.to_jsonl(path)  # atomic: written last, so a present file is a whole pool
    return path
