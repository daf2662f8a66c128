"""`searchgym bench warmstart`: which tool format and instructions give a real model the best held-out accuracy
after the same supervised warm start.

Each arm is a list of overrides of a `bench learning` preset (default `smollm2`): the tool-call syntax the env
teaches and its demonstrations write (`tags`: `<search>q</search>`; `hermes`: `<tool_call>{json}</tool_call>`) and
the instructions the agent reads (`full`: ASearcher's; `brief`: one line). Per (seed, arm): the seed's world, the
oracle's demonstrations in the arm's format, SFT from the preset's base model, and the warm start on the seed's
held-out questions, k samples each. Nothing else differs between arms of a seed: the same tasks are demonstrated
and held out.

Each finished (seed, arm) is one row of OUT_DIR/rows.jsonl, so a stopped run goes on where it stopped. The report
gives each arm's held-out figures pooled over seeds and its difference from the first arm, paired by question, with
a hierarchical bootstrap interval (seeds, then questions).
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchgym.bench.bootstrap import hierarchical_bootstrap, seed_list
from searchgym.bench.learning import (
    fingerprint,
    held_out_samples,
    hop_counts,
    load_learning_config,
    per_question_reward,
    policy_metrics,
    prepare_seed,
    shared_base_model,
    stage_clock,
)
from searchgym.bench.provenance import machine
from searchgym.core.jsonl_log import JsonlLog
from searchgym.pipeline.stages import deterministic_torch, say
from searchgym.settings import setting

ARMS: dict[str, list[str]] = {
    "tags-full": ["env.kwargs.tool_format=tags", "env.kwargs.instructions=full"],
    "hermes-full": ["env.kwargs.tool_format=hermes", "env.kwargs.instructions=full"],
    "tags-brief": ["env.kwargs.tool_format=tags", "env.kwargs.instructions=brief"],
}


def run_warm_start_bench(
    arms: list[str],
    seeds: list[int],
    *,
    preset: str = "smollm2",
    overrides: list[str] | tuple[str, ...] = (),
    out: str | os.PathLike = "results/bench_warmstart.json",
    progress: bool = True,
) -> dict[str, Any]:
    """Every (seed, arm) not yet in OUT_DIR/rows.jsonl, then the pooled report written to `out` (JSON)."""
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms or len(set(arms)) != len(arms):
        raise ValueError(f"arms: expected distinct names of {', '.join(ARMS)}, got {arms}")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct and at least one, got {seeds}")
    configs = {arm: load_learning_config([*ARMS[arm], *overrides], preset=preset) for arm in arms}
    first = configs[arms[0]]
    root = Path(first.out_dir).with_name(Path(first.out_dir).name + "_warmstart")
    root.mkdir(parents=True, exist_ok=True)
    log = JsonlLog(root / "rows.jsonl", check=_check_row)
    keys = {arm: fingerprint(config) for arm, config in configs.items()}
    done = {(r["seed"], r["arm"]) for r in log.rows if r["fingerprint"] == keys.get(r["arm"])}
    with deterministic_torch(first.torch_threads):
        for seed in seeds:
            for arm in arms:
                if (seed, arm) in done:
                    say(progress, f"[bench warmstart] seed {seed} arm {arm}: done before, reused")
                    continue
                log.append(_run_unit(configs[arm], arm, seed, root / f"seed-{seed}" / arm, keys[arm], progress))
    rows = [r for r in log.rows if r["seed"] in seeds and r["arm"] in arms and r["fingerprint"] == keys[r["arm"]]]
    report = pooled_report(rows, arms, seeds, first.torch_threads, preset)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    say(progress, format_report(report))
    return report


def _run_unit(config: Any, arm: str, seed: int, out: Path, key: str, progress: bool) -> dict[str, Any]:
    """One arm of one seed: demos in the arm's format, SFT, the warm start on the held-out questions."""
    timings, lap = stage_clock(progress, f"bench warmstart seed {seed} {arm}")
    base = shared_base_model(config, out.parent, progress=progress)
    setup = prepare_seed(copy.deepcopy(config), seed, base, out, lap, progress=progress)
    samples = held_out_samples(config, setup.warm, out / "eval-warm", seed, progress=progress)
    lap("evaluate")
    hop_of = hop_counts(config, seed)
    formed = [turn for row in samples for turn in row["trajectory"].get("turns", [])]
    return {
        "seed": seed,
        "arm": arm,
        "fingerprint": key,
        "k": config.eval.k,
        "demos": setup.demos,
        "timings": timings,
        "metrics": policy_metrics(samples, hop_of, config.eval.k),
        "well_formed_turns": (sum(t.get("tool") != "invalid" for t in formed) / len(formed)) if formed else None,
        "per_question": per_question_reward(samples),
    }


def pooled_report(
    rows: list[dict[str, Any]], arms: list[str], seeds: list[int], threads: int, preset: str
) -> dict[str, Any]:
    """Each arm's held-out figures over seeds, and its per-question difference from the first arm with an interval."""
    by = {(r["seed"], r["arm"]): r for r in rows}
    report: dict[str, Any] = {
        "benchmark": "searchgym bench warmstart",
        "preset": preset,
        "arms": {arm: ARMS[arm] for arm in arms},
        "machine": machine(torch_threads=threads),
        "units": [{k: v for k, v in r.items() if k != "per_question"} for r in rows],
        "pooled": {},
    }
    reference = arms[0]
    for arm in arms:
        present = [by[(s, arm)] for s in seeds if (s, arm) in by]
        if not present:
            continue
        k = present[0]["k"]
        figures = {
            name: sum(r["metrics"]["all"][name] for r in present) / len(present)
            for name in (f"avg@{k}/reward", f"avg@{k}/correct", f"pass@{k}/correct", "searches", "answered")
        }
        entry: dict[str, Any] = {"seeds": [r["seed"] for r in present], **figures}
        paired = {
            s: [
                by[(s, arm)]["per_question"][t] - by[(s, reference)]["per_question"][t]
                for t in by[(s, arm)]["per_question"]
            ]
            for s in seeds
            if (s, arm) in by and (s, reference) in by
        }
        if arm != reference and paired:
            entry[f"minus_{reference}"] = hierarchical_bootstrap(paired)
        report["pooled"][arm] = entry
    return report


def format_report(report: dict[str, Any]) -> str:
    """One line per arm: held-out F1 and EM, and the paired difference from the first arm."""
    lines = []
    for arm, entry in report["pooled"].items():
        f1 = next(v for name, v in entry.items() if name.endswith("/reward"))
        em = next(v for name, v in entry.items() if name.startswith("avg@") and name.endswith("/correct"))
        line = f"{arm}: held-out F1 {f1:.3f}, EM {em:.3f} over seeds {entry['seeds']}"
        for name, d in entry.items():
            if name.startswith("minus_"):
                line += f"; F1 minus the first arm {d['gain']:+.3f} (95% {d['ci95_low']:+.3f} to {d['ci95_high']:+.3f})"
        lines.append(line)
    return "\n".join(lines)


def _check_row(row: Any) -> None:
    if not isinstance(row, dict) or not {"seed", "arm", "fingerprint", "per_question"} <= set(row):
        raise ValueError("not a bench warmstart row")


@dataclass
class WarmStartBenchCommand:
    """`searchgym bench warmstart`: the arms and seeds, the bench learning preset they override, and the report."""

    arms: str = setting("tags-full,hermes-full,tags-brief", help="comma-separated arms; the first is the reference")
    seeds: str = setting("0,1", help="comma-separated seeds; finished (seed, arm) units are reused")
    preset: str = setting("smollm2", help="the bench learning preset the arms override")
    out: Path = setting(Path("results/bench_warmstart.json"), help="the report JSON")
    overrides: list[str] = setting(default_factory=list, help="config overrides for every arm, e.g. eval.max_tasks=64")


def warm_start_bench_command(command: WarmStartBenchCommand) -> None:
    arms = [a.strip() for a in command.arms.split(",") if a.strip()]
    run_warm_start_bench(
        arms, seed_list(command.seeds), preset=command.preset, overrides=command.overrides, out=command.out
    )
