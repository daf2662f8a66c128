"""`searchgym bench reproduce CLAIM`: the papers' claims as arms trained from one warm start per seed (issue 29).

Bench learning's per-seed pipeline (world, demonstrations, warm start) generalised to ARMS: each arm is a named
set of `rl.*` overrides trained from the seed's warm start and evaluated on the seed's held-out questions, as is the
warm start itself (pseudo-arm "warm"). Each finished (seed, arm) is a row of OUT_DIR/arms.jsonl and of its copy
beside the results (`results/NAME.arms.jsonl`), so a rerun skips it, on a fresh clone too; rows of another
configuration (claim, arms or settings) are refused. The report pools each arm over seeds and gives
each arm's paired difference from the claim's baseline arm (and from the warm start) with the hierarchical
bootstrap over (seed, question), plus each arm's per-step training curve (reward, searches, tool calls).

Claims (`CLAIMS`): `staleness` (AReaL: eta x {decoupled, plain PPO}), `shaping` (arXiv 2410.15115: success-only
against a raw, a Clip-refined and a Delta-refined process reward) and `long_horizon` (ASearcher: RL on deep
questions; its preset is bench learning's `deep` when one exists).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, cast

from omegaconf import OmegaConf

from searchgym.bench.bootstrap import hierarchical_bootstrap, seed_list
from searchgym.bench.learning import (
    PRESETS,
    REAL_MODEL_LEARNING,
    LearningConfig,
    count_label,
    curve,
    fingerprint,
    finished_warm_start,
    held_out_samples,
    hop_counts,
    load_learning_config,
    per_question_calls,
    per_question_reward,
    policy_metrics,
    prepare_seed,
    shared_base_model,
    stage_clock,
    warm_start_fingerprint,
)
from searchgym.bench.provenance import git_commit, machine
from searchgym.bench.reproduce_status import Deadline, format_status, parse_stop_by, unit_means, unit_status
from searchgym.bench.unit_log import UnitLog
from searchgym.core.file_lock import sole_run
from searchgym.pipeline.stages import deterministic_torch, say
from searchgym.settings import load_settings, setting
from searchgym.trainers.run.checkpoint import slim_finished_run

WARM = "warm"

# RL arms save a checkpoint at least this often, so an arm cut by a session's end goes on from its last one (with
# the same config) instead of step 1. Bookkeeping, not learning: it is set on the arm's run, outside its fingerprint.
RESUME_EVERY = 5

# A reduced scale every claim shares: bench learning's `headroom` world and warm start (20,000 pages, up to 1,500
# 1-hop demonstrations, 3 epochs: held-out F1 0.078 before RL over 5 seeds, off the floor), then a shorter RL run
# per arm (20 steps of 4 groups x 8 episodes) and 64 held-out questions x 4 samples, so a seed with all its arms fits
# about a quarter of an hour of one core. Two earlier trials with a 4,000-page world and 300 demonstrations had a warm
# start at the floor (held-out reward 0.000 to 0.005, results/reproduce_staleness_trial*.json): no arm could differ.
REDUCED = [
    "rl.steps=20",
    "rl.save_every=20",
    "rl.rollout.group_size=8",
    "rl.rollout.batch_size=4",
    "eval.max_tasks=64",
    "eval.k=4",
]


@dataclass(frozen=True)
class Claim:
    """A claim's setting (overrides of bench learning's config), its arms (rl.* overrides each) and baseline arm."""

    paper: str
    preset: list[str]
    arms: dict[str, list[str]]
    baseline: str
    summary: str  # the paper's claim in a few words: README's row
    setting: str = ""
    notes: list[str] = field(default_factory=list)


def _staleness_setting(lr: str) -> str:
    """The staleness claim's setting in words, at learning rate `lr` (the tiny and the real model differ in it)."""
    return (
        "eta in {0, 4, 8} x {decoupled PPO, plain PPO (proximal = behaviour policy)}; eta 0 is sync RL; "
        f"lr {lr} and 4 minibatches per step so the policy moves within the staleness window"
    )


def _staleness_arms() -> dict[str, list[str]]:
    arms = {}
    for eta in (0, 4, 8):
        for objective, proximal in (("decoupled", "recompute"), ("plain", "behaviour")):
            mode = "sync" if eta == 0 else "async"
            arms[f"eta{eta}-{objective}"] = [
                f"rl.mode={mode}",
                f"rl.rollout.max_staleness={eta}",
                f"rl.learner.proximal={proximal}",
            ]
    return arms


SHAPING_WEIGHT = 0.5  # per search that retrieves the answer page: half the outcome, so repeating two pays more


def _shaping_arms() -> dict[str, list[str]]:
    w = SHAPING_WEIGHT
    dense = [f"rl.learner.process_reward_weight={w}"]
    return {
        "success-only": ["rl.learner.process_reward_weight=0.0"],
        "raw": [*dense, "rl.learner.process_reward=none"],
        "clip": [*dense, "rl.learner.process_reward=clip", f"rl.learner.process_reward_threshold={w / 2}"],
        "delta": [*dense, "rl.learner.process_reward=delta"],
    }


CLAIMS: dict[str, Claim] = {  # in the order: README shows them so
    "long_horizon": Claim(
        paper="ASearcher (arXiv 2508.07976)",
        preset=PRESETS["deep"],  # its design trials: docs/reproductions.md, claim 1
        arms={"rl": []},
        summary="ASearcher: RL makes the agent search longer",
        baseline=WARM,
        setting="bench learning's `deep` preset: demonstrations on 1-2 hops, async RL on 2-3 hops with 16 turns and "
        "an EM reward, against its warm start",
    ),
    "staleness": Claim(
        paper="AReaL (arXiv 2505.24298)",
        # the policy must move within the staleness window for staleness to matter: four minibatches (four optimizer
        # steps) per learner step at bench learning's lr; at lr 1e-3 the sync baseline itself collapsed (it stopped
        # searching: results/reproduce_staleness_trial3.json)
        preset=[*REDUCED, "rl.learner.lr=3e-4", "rl.learner.minibatches=4"],
        arms=_staleness_arms(),
        summary="AReaL: decoupled PPO on stale data matches sync, plain PPO collapses",
        baseline="eta0-decoupled",
        setting=_staleness_setting("3e-4"),
    ),
    "shaping": Claim(
        paper="Reward design for process rewards (arXiv 2410.15115)",
        preset=[*REDUCED, "rl.mode=sync", "rl.rollout.max_staleness=0"],
        arms=_shaping_arms(),
        summary="raw process rewards are hacked, Clip and Delta are not",
        baseline="success-only",
        setting=f"sync RL; success-only vs + {SHAPING_WEIGHT} per search that retrieves the answer page, raw, "
        f"Clip (threshold {SHAPING_WEIGHT / 2}) or Delta",
    ),
}


# issue 40: each claim on a real model, after the claim's own preset: the real-model quickstart's warm start and RL
# scale (pipeline/stages.py), then what the claim needs (docs/reproductions.md says which trials decided them): long
# horizon warms up on 1-2 hop demonstrations (the 2-hop ones search twice) and trains on 2-4 hops with 16 turns;
# staleness moves the policy within the window with 4 minibatches at 2e-5; shaping runs in long horizon's setting,
# async as long horizon is: staleness's warm start, from one-hop demonstrations, searches once and no episode
# repeated a rewarded search (the seed-0 trial on it: Delta gave raw's run bit for bit).
def _real_model_claims(overrides: list[str]) -> dict[str, list[str]]:
    """Each claim's overrides on a real model whose learning preset is `overrides`."""
    long_horizon = [
        *overrides,
        "env.kwargs.max_turns=16",
        "env.kwargs.judge=em",
        "hops.demos=[1,2]",
        "hops.rl=[2,3,4]",
        "hops.eval=[2,3,4]",
        "hops.rl_demos=0",
        "max_demos=256",
        "demos.limit=256",
        "sync=false",
        "rl.rollout.max_context=4096",
    ]
    return {
        "long_horizon": long_horizon,
        "staleness": [*overrides, "rl.learner.lr=2e-5", "rl.learner.minibatches=4"],
        "shaping": [*long_horizon, "rl.mode=async", "rl.rollout.max_staleness=4"],  # the same warm start and RL
    }


REAL_MODEL_CLAIMS: dict[str, dict[str, list[str]]] = {
    model: _real_model_claims(overrides) for model, overrides in REAL_MODEL_LEARNING.items()
}

_LONG_HORIZON_REAL = (
    "the real-model quickstart's warm start from demonstrations on 1-2 hops (at most 256; the 2-hop ones search "
    "twice), then async RL and held-out questions on 2-4 hops with 16 turns, an EM reward and 4,096 tokens of context"
)

# what each claim's setting is on each real model (the results file's "setting"; its config has every value)
REAL_MODEL_SETTINGS: dict[str, dict[str, str]] = {
    model: {
        "long_horizon": f"{_LONG_HORIZON_REAL}, against its warm start",
        "staleness": _staleness_setting("2e-5"),
        "shaping": f"long horizon's setting, {_LONG_HORIZON_REAL}, where a policy can repeat a rewarded search; "
        f"success-only vs + {SHAPING_WEIGHT} per search that retrieves the answer page, raw, Clip (threshold "
        f"{SHAPING_WEIGHT / 2}) or Delta",
    }
    for model in REAL_MODEL_CLAIMS
}


def claim_words(claim: str, config: LearningConfig) -> tuple[str, str]:
    """The results file's "setting" and "shared" words for `claim` run under `config`: the real model's (its preset,
    `reproduce:CLAIM_MODEL`, names it) or the tiny model's."""
    model = config.preset.removeprefix(f"reproduce:{claim}_")
    setting = REAL_MODEL_SETTINGS[model][claim] if model in REAL_MODEL_SETTINGS else CLAIMS[claim].setting
    base = (
        "the copy-pretrained base model is built once from world base_seed and shared"
        if config.base == "tiny"
        else f"the base model is {config.base}, as it is"
    )
    varies = (
        "world, demos, warm start, RL and evaluation vary by seed; every arm of a seed starts from the same warm start"
    )
    return setting, f"{base}; {varies}"


def load_reproduce_config(
    claim: str, overrides: list[str] | tuple[str, ...] = (), model: str | None = None
) -> LearningConfig:
    """The claim's settings: bench learning's defaults, the claim's preset, the real model's (`model`: a key of
    REAL_MODEL_CLAIMS; None: the tiny model), then `key=value` overrides."""
    if claim not in CLAIMS:
        raise ValueError(f"unknown claim {claim!r}; known: {', '.join(CLAIMS)}")
    if model is not None and model not in REAL_MODEL_CLAIMS:
        raise ValueError(f"--model: unknown {model!r}; known: {', '.join(REAL_MODEL_CLAIMS)}")
    real = REAL_MODEL_CLAIMS[model][claim] if model is not None else []
    name = f"{claim}_{model}" if model is not None else claim
    config = load_learning_config([f"out_dir=runs/reproduce_{name}", *CLAIMS[claim].preset, *real, *overrides])
    config.preset = f"reproduce:{name}"
    return config


def select_arms(claim: str, names: str) -> dict[str, list[str]]:
    """The claim's arms named in `names` (comma-separated; empty: all of them) and its baseline arm (every arm is
    reported against it; a finished one is reused), in the claim's order."""
    arms = CLAIMS[claim].arms
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    if wanted and CLAIMS[claim].baseline in arms and CLAIMS[claim].baseline not in wanted:
        wanted.append(CLAIMS[claim].baseline)
    unknown = [n for n in wanted if n not in arms]
    if unknown:
        raise ValueError(f"unknown arms {unknown} of claim {claim!r}; known: {', '.join(arms)}")
    return {n: o for n, o in arms.items() if not wanted or n in wanted}


def arm_config(config: LearningConfig, arm: list[str]) -> LearningConfig:
    """`config` with an arm's overrides; an arm may only change RL settings (the warm start is shared)."""
    for item in arm:
        if not item.startswith("rl."):
            raise ValueError(f"an arm changes rl.* settings only (the warm start is shared), got {item!r}")
    return load_settings(LearningConfig, overrides=list(arm), base=config)


def arm_fingerprint(config: LearningConfig, claim: str, arm: str, overrides: list[str]) -> str:
    """What one arm's rows depend on: the settings, the claim, the arm's name and its overrides. Each arm has its
    own, so arms run apart (`--arms`, another session or machine) pool together, an arm added later leaves the
    finished ones valid, and an arm whose overrides changed is refused."""
    data = json.dumps(
        {"config": fingerprint(config), "claim": claim, "arm": arm, "overrides": list(overrides)}, sort_keys=True
    )
    return hashlib.sha256(data.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class UnitRules:
    """How a run treats its units: keep a finished arm's optimizer state and earlier checkpoints (GBs an arm on a
    real model), and start none that would end after `stop_by`."""

    keep_rl_state: bool = False
    stop_by: datetime | None = None


def run_reproduce(
    claim: str,
    config: LearningConfig,
    seeds: list[int],
    *,
    out: str | os.PathLike | None = None,
    arms: Mapping[str, list[str]] | None = None,
    command: str = "",
    progress: bool = True,
    rules: UnitRules = UnitRules(),
) -> dict[str, Any]:
    """Every (seed, arm) not yet finished (OUT_DIR/arms.jsonl, or its copy OUT.arms.jsonl that is committed with the
    results, so a fresh clone goes on), then the pooled report to `out` (JSON) and a PNG beside it. Once an arm's row
    is written its RL run keeps its last checkpoint as a model only (`slim_finished_run`), unless
    `rules.keep_rl_state`. With `rules.stop_by`, a unit (and a seed's SFT) starts only if it ends by then at the
    finished units' pace."""
    spec = CLAIMS[claim]
    arms = dict(spec.arms if arms is None else arms)
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct and at least one, got {seeds}")
    if spec.baseline != WARM and spec.baseline not in arms:
        raise ValueError(f"the arms must include the baseline {spec.baseline!r}")
    configs = {name: arm_config(config, overrides) for name, overrides in arms.items()}  # bad overrides fail now
    root = Path(config.out_dir)
    root.mkdir(parents=True, exist_ok=True)
    known = {WARM: [], **spec.arms, **arms}  # rows of the claim's other arms may sit in the log: they are kept
    keys = {name: arm_fingerprint(config, claim, name, overrides) for name, overrides in known.items()}
    path = Path(out or f"results/reproduce_{claim}.json")
    with sole_run(root, "bench reproduce"), deterministic_torch(config.torch_threads):
        log = UnitLog(
            root / "arms.jsonl",
            path.with_suffix(".arms.jsonl"),
            fingerprint=lambda row: keys.get(row["arm"]),
            check=_check_row,
        )
        done = {(row["seed"], row["arm"]) for row in log.rows}
        deadline = (
            None
            if rules.stop_by is None
            else Deadline(rules.stop_by, unit_means(unit_status(root, path, keys, seeds, WARM)))
        )
        base = None
        for seed in seeds:
            todo = [a for a in [WARM, *arms] if (seed, a) not in done]
            if not todo:
                say(progress, f"[bench reproduce {claim}] seed {seed}: done before, reused")
                continue
            if deadline and not deadline.fits(rl=todo[0] != WARM, sft=not _warm_on_disk(config, seed)):
                say(progress, f"[bench reproduce {claim}] seed {seed}: not started, it would end after {deadline.at}")
                break
            base = base or shared_base_model(config, root, progress=progress)
            for row in run_seed_arms(config, configs, todo, seed, base, keys, progress=progress, deadline=deadline):
                log.append(row)
                if row["arm"] != WARM and not rules.keep_rl_state:  # the row is durable: the arm is done for good
                    run = root / f"seed-{seed}" / f"rl-{row['arm']}"
                    freed = slim_finished_run(run, "bench reproduce (--keep-rl-state keeps it)")
                    say(progress, f"[bench reproduce {claim}] {run}: kept its last model, freed {freed / 1e9:.1f} GB")
    rows = first_rows([r for r in log.rows if r["seed"] in seeds and r["arm"] in (WARM, *arms)])
    report = json.loads(json.dumps(pooled_arms(claim, rows, config, arms, command=command)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    plot_arms(report, path.with_suffix(".png"))
    say(progress, format_arms(report))
    return report


def _warm_on_disk(config: LearningConfig, seed: int) -> bool:
    """Whether the seed's warm start is on disk and whole (else a run trains it first)."""
    key = warm_start_fingerprint(config, seed)
    return finished_warm_start(config, key, Path(config.out_dir) / f"seed-{seed}") is not None


def run_seed_arms(
    config: LearningConfig,
    configs: Mapping[str, LearningConfig],
    todo: list[str],
    seed: int,
    base: Path,
    keys: Mapping[str, str],
    *,
    progress: bool = True,
    deadline: Deadline | None = None,
) -> Any:
    """The seed's warm start (once), then each arm of `todo` trained from it and evaluated: one row per arm, yielded
    as each finishes so an interrupted seed keeps its finished arms. An arm that would end after `deadline` is not
    started, nor any after it. The seed's runs go to OUT_DIR/seed-SEED."""
    out = Path(config.out_dir) / f"seed-{seed}"
    timings, lap = stage_clock(progress, f"bench reproduce seed {seed}")
    commit = git_commit()  # the code these rows ran at (the report's commit is the code that pooled them)
    setup = prepare_seed(config, seed, base, out, lap, progress=progress)
    hop_of = hop_counts(config, seed)
    shared = dict(timings)  # the seed's setup laps: in every row, each row adding only its own arm's laps
    for arm in todo:
        if deadline and not deadline.fits(rl=arm != WARM):
            say(progress, f"[bench reproduce seed {seed}] {arm}: not started, it would end after {deadline.at}")
            return
        timings.clear()
        timings.update(shared)
        resumed = None
        if arm == WARM:
            model, history = setup.warm, None
        else:
            rl = configs[arm].rl
            rl.save_every = min(rl.save_every, RESUME_EVERY)  # bookkeeping, outside the fingerprint: see RESUME_EVERY
            resumed = setup.resumable_step(rl, out / f"rl-{arm}", config.env.id, seed=seed)
            history = setup.train(rl, out / f"rl-{arm}", config.env.id, seed=seed, progress=progress, resume=True)
            model = out / f"rl-{arm}" / "checkpoints" / f"step-{rl.steps:05d}"
            lap(f"rl {arm}")
        samples = held_out_samples(config, model, out / f"eval-{arm}", seed, progress=progress)
        lap(f"evaluate {arm}")
        yield {
            "seed": seed,
            "arm": arm,
            "fingerprint": keys[arm],
            "k": config.eval.k,
            "policy": policy_metrics(samples, hop_of, config.eval.k),
            "per_question": per_question_reward(samples),
            "per_question_calls": per_question_calls(samples),
            "curve": arm_curve(history) if history is not None else [],
            "demos": setup.demos,
            "rl_tasks": len(setup.rl_tasks),
            "timings": dict(timings),
            "commit": commit,
            **({"rl_resumed_after_step": resumed} if resumed is not None else {}),
        }


def first_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first row of each (seed, arm): logs merged from two machines may both hold one, and a unit counts once."""
    seen: dict[tuple[int, str], dict[str, Any]] = {}
    for row in rows:
        seen.setdefault((row["seed"], row["arm"]), row)
    return list(seen.values())


def arm_curve(history: list[dict[str, float]]) -> list[dict[str, float]]:
    """Bench learning's per-step curve plus tool calls per episode (searches + page accesses) and staleness."""
    points = curve(history)
    for point, h in zip(points, history, strict=True):
        if "episode/searches" in point and "episode/accesses" in point:
            point["episode/tool_calls"] = point["episode/searches"] + point["episode/accesses"]
        for name in ("staleness_mean", "staleness_max"):
            if name in h:
                point[name] = float(h[name])
    return points


def _check_row(row: Any) -> None:
    for name in ("seed", "arm", "fingerprint", "per_question", "policy", "curve", "k"):
        row[name]


POOLED_METRICS = ("avg@{k}/reward", "avg@{k}/correct", "searches", "accesses", "turns")


def pooled_arms(
    claim: str, rows: list[dict[str, Any]], config: LearningConfig, arms: Mapping[str, list[str]], *, command: str = ""
) -> dict[str, Any]:
    """Per arm: means over seeds of the held-out figures, the paired difference from the baseline and from the warm
    start (hierarchical bootstrap over seed and question), and the mean training curve per step."""
    if not rows:
        raise ValueError("no finished (seed, arm) to report")
    spec = CLAIMS[claim]
    k = rows[0]["k"]
    names = [a for a in [WARM, *arms] if any(r["arm"] == a for r in rows)]
    by = {(r["seed"], r["arm"]): r for r in rows}
    seeds = sorted({r["seed"] for r in rows})

    def diff(arm: str, against: str, field: str = "per_question") -> dict[str, Any] | None:
        """arm minus `against`, paired by seed and question on the rows' `field`; None when no seed has both (rows
        written before a field was recorded lack it)."""
        pairs = {
            s: (by[s, arm][field], by[s, against][field])
            for s in seeds
            if (s, arm) in by and (s, against) in by and field in by[s, arm] and field in by[s, against]
        }
        if not pairs:
            return None
        groups = {s: [a[t] - b[t] for t in b if t in a] for s, (a, b) in pairs.items()}
        return hierarchical_bootstrap(groups, resamples=config.bootstrap_resamples)

    pooled: dict[str, Any] = {}
    for arm in names:
        mine = [by[s, arm] for s in seeds if (s, arm) in by]
        figures = {m.format(k=k): [r["policy"]["all"][m.format(k=k)] for r in mine] for m in POOLED_METRICS}
        entry: dict[str, Any] = {"seeds": [r["seed"] for r in mine]}
        entry.update({name: sum(v) / len(v) for name, v in figures.items()})
        entry["tool_calls"] = entry["searches"] + entry["accesses"]
        entry["by_hops"] = pooled_by_hops(mine, k)
        if arm != spec.baseline:
            entry["vs_baseline"] = diff(arm, spec.baseline)
        if arm != WARM:
            entry["vs_warm"] = diff(arm, WARM)
            entry["tool_calls_vs_warm"] = diff(arm, WARM, "per_question_calls")
        entry["curve"] = mean_curve([r["curve"] for r in mine])
        pooled[arm] = entry
    setting, shared = claim_words(claim, config)
    return {
        "benchmark": f"searchgym bench reproduce {claim}",
        "claim": claim,
        "paper": spec.paper,
        "setting": setting,
        "command": command,
        "commit": git_commit(),
        "row_commits": sorted({r.get("commit") or "not recorded" for r in rows}),
        "machine": machine(torch_threads=config.torch_threads),
        "k": k,
        "baseline": spec.baseline,
        "arms": {WARM: [], **dict(arms)},
        "seeds": seeds,
        "config": cast(dict[str, Any], OmegaConf.to_container(OmegaConf.structured(config))),
        "shared": shared,
        "rows": [{k_: v for k_, v in r.items() if k_ not in ("per_question", "per_question_calls")} for r in rows],
        "pooled": pooled,
    }


def pooled_by_hops(rows: list[dict[str, Any]], k: int) -> dict[str, dict[str, float]]:
    """Per hop count every row evaluated, the mean over seeds of held-out reward and of tool calls per episode."""
    hops = set.intersection(*(set(r["policy"]) - {"all"} for r in rows)) if rows else set()
    reward = f"avg@{k}/reward"

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    return {
        hop: {
            reward: mean([r["policy"][hop][reward] for r in rows]),
            "tool_calls": mean([r["policy"][hop]["searches"] + r["policy"][hop]["accesses"] for r in rows]),
        }
        for hop in sorted(hops, key=int)
    }


def mean_curve(curves: list[list[dict[str, float]]]) -> list[dict[str, float]]:
    """Per step, the mean over seeds of each curve figure (steps every seed reached)."""
    curves = [c for c in curves if c]
    if not curves:
        return []
    steps = min(len(c) for c in curves)
    out = []
    for i in range(steps):
        keys = set.intersection(*(set(c[i]) for c in curves))
        out.append({key: sum(c[i][key] for c in curves) / len(curves) for key in sorted(keys)})
    return out


def format_arms(report: dict[str, Any]) -> str:
    """Per arm, the held-out reward, tool calls per episode and the difference from the baseline, in a few lines."""
    k = report["k"]
    lines = [f"{report['benchmark']}: {len(report['seeds'])} seeds, baseline {report['baseline']}"]
    for arm, p in report["pooled"].items():
        d = p.get("vs_baseline")
        vs = f", vs baseline {d['gain']:+.3f} (95% {d['ci95_low']:+.3f} to {d['ci95_high']:+.3f})" if d else ""
        lines.append(f"  {arm}: reward {p[f'avg@{k}/reward']:.3f}, tool calls {p['tool_calls']:.2f}{vs}")
    return "\n".join(lines)


def plot_arms(report: dict[str, Any], path: Path) -> None:
    """Held-out reward per arm (difference from the baseline with its interval), and the training curves of reward
    and tool calls per episode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pooled = report["pooled"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.0), dpi=110)
    ax = axes[0]
    for i, p in enumerate(pooled.values()):
        d = p.get("vs_baseline")
        if d is None:
            ax.plot([i], [0.0], marker="s", color="black")
            continue
        ax.errorbar([i], [d["gain"]], yerr=[[d["gain"] - d["ci95_low"]], [d["ci95_high"] - d["gain"]]], fmt="o")
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(pooled)), list(pooled), fontsize=7, rotation=30)
    ax.set_title(f"held-out reward minus {report['baseline']} (95%)", fontsize=9)
    for ax, key, title in (
        (axes[1], "episode/reward", "training reward per episode"),
        (axes[2], "episode/tool_calls", "tool calls per episode (training)"),
    ):
        for arm, p in pooled.items():
            points = [c for c in p["curve"] if key in c]
            if points:
                ax.plot([c["step"] for c in points], [c[key] for c in points], label=arm)
        ax.set_xlabel("learner step")
        ax.set_title(title, fontsize=9)
    axes[2].legend(fontsize=7)
    fig.suptitle(f"{report['benchmark']} ({len(report['seeds'])} seeds)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------------------
# docs/reproductions.md: tables and verdicts rendered from the results files (tests compare the page with them)
# ---------------------------------------------------------------------------------------------------------------

FLOOR = 0.01  # held-out reward below which every arm counts as at the floor: no claim can show there
FULL_SEEDS = 5  # the bar for a verdict without "preliminary"
INFLATION = 1.2  # tool calls per episode this many times the baseline's count as inflated (the hacking signature)


def docs_mark(claim: str, stem: str | None = None) -> str:
    """The comment after which docs/reproductions.md holds the table of results/STEM.json (default: the claim's)."""
    stem = stem or f"reproduce_{claim}"
    out = "" if stem == f"reproduce_{claim}" else f" --out results/{stem}.json"
    return f"<!-- generated by `searchgym bench reproduce {claim} --markdown{out}` from results/{stem}.json -->"


def _interval(d: dict[str, Any] | None) -> str:
    if d is None:
        return "(baseline)"
    return f"{d['gain']:+.3f} ({d['ci95_low']:+.3f} to {d['ci95_high']:+.3f})"


def _training_calls(p: dict[str, Any], last: int = 5) -> tuple[float, float] | None:
    """Training tool calls per episode: the mean of the first `last` steps and of the last `last`; None without a
    curve. The table shows it and the long-horizon verdict reads it."""
    points = [c["episode/tool_calls"] for c in p["curve"] if "episode/tool_calls" in c]
    if not points:
        return None
    early, late = points[:last], points[-last:]
    return sum(early) / len(early), sum(late) / len(late)


def _late_calls(p: dict[str, Any]) -> str:
    calls = _training_calls(p)
    return "-" if calls is None else f"{calls[0]:.2f} -> {calls[1]:.2f}"


def markdown_table(report: dict[str, Any]) -> str:
    """The claim's table: per arm held-out reward and accuracy, tool calls per episode, the paired differences from
    the baseline and the warm start (95% hierarchical bootstrap), for long horizon the paired change in held-out tool
    calls, and the training curve's calls per episode."""
    k = report["k"]
    headers = [
        "arm",
        "seeds",
        f"held-out reward (avg@{k})",
        "correct",
        "tool calls / episode",
        f"minus {report['baseline']} (95%)",
        "minus warm start (95%)",
        "training calls / episode (first 5 -> last 5 steps)",
    ]
    calls = report["claim"] == "long_horizon"  # the claim is that the agent searches longer: its change, paired
    if calls:
        headers.insert(-1, "tool calls minus warm start (95%)")
    lines = ["| " + " | ".join(headers) + " |", "|---" + "|---:" * (len(headers) - 1) + "|"]
    for arm, p in report["pooled"].items():
        cells = [
            arm,
            str(len(p["seeds"])),
            f"{p[f'avg@{k}/reward']:.3f}",
            f"{p[f'avg@{k}/correct']:.3f}",
            f"{p['tool_calls']:.2f}",
            _interval(p.get("vs_baseline")) if arm != report["baseline"] else "(baseline)",
            _interval(p.get("vs_warm")) if arm != WARM else "(warm start)",
            _late_calls(p),
        ]
        if calls:
            change = p.get("tool_calls_vs_warm")
            cells.insert(-1, "(warm start)" if arm == WARM else _interval(change) if change else "not recorded")
        lines.append("| " + " | ".join(cells) + " |")
    if report["claim"] == "long_horizon":  # the claim is about the deep questions: each hop count on its own
        for arm, p in report["pooled"].items():
            for hop, h in p.get("by_hops", {}).items():
                cells = [f"{arm}, {count_label(report, hop)}", str(len(p["seeds"])), f"{h[f'avg@{k}/reward']:.3f}", "-"]
                cells += [f"{h['tool_calls']:.2f}", "-", "-", "-"] + ["-"] * calls
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _calls_rise(rl: dict[str, Any], warm: dict[str, Any]) -> bool:
    """Held-out tool calls per episode rise: the paired interval above zero, as accuracy's is read; rows written
    before per-question calls were recorded have no interval, and their means decide."""
    change = rl.get("tool_calls_vs_warm")
    if change is not None:
        return bool(change["ci95_low"] > 0)
    return bool(rl["tool_calls"] > warm["tool_calls"])


def _rises(p: dict[str, Any], last: int = 5) -> bool:
    """Training tool calls rise: the last `last` steps' mean above the first's, over at least 2 x `last` steps."""
    calls = _training_calls(p, last)
    return calls is not None and len(p["curve"]) >= 2 * last and calls[1] > calls[0]


def _below(d: dict[str, Any] | None) -> bool:
    return d is not None and d["ci95_high"] < 0


def verdict(report: dict[str, Any]) -> str:
    """The verdict the numbers support, by a fixed rule per claim; "preliminary" below FULL_SEEDS seeds. A trial's
    file (its "trial" key says why it was set aside) gets no verdict on the claim: its design was abandoned."""
    if report.get("trial"):
        return f"none: a trial, set aside ({report['trial']})"
    pooled, claim = report["pooled"], report["claim"]
    k = report["k"]
    if all(p[f"avg@{k}/reward"] < FLOOR for p in pooled.values()):
        return f"inconclusive: every arm, the warm start included, scores below {FLOOR} held-out (a floor)"
    if claim == "staleness":
        need: tuple[str, ...] = ("eta4-decoupled", "eta4-plain")
        if not all(a in pooled for a in need):
            return "not yet run"
        if _below(pooled[report["baseline"]].get("vs_warm")):  # matching a sync run that diverged shows nothing
            return "inconclusive: the synchronous baseline itself falls below its warm start (RL diverged)"
        matches = not _below(pooled["eta4-decoupled"]["vs_baseline"])  # decoupled at eta 4 not below sync
        collapses = _below(pooled["eta4-plain"]["vs_baseline"])  # plain PPO at eta 4 below sync
        word = (
            "reproduced"
            if matches and collapses
            else "partly reproduced (decoupled eta 4 matches sync; plain PPO does not collapse)"
            if matches
            else "not reproduced"
        )
    elif claim == "shaping":
        need = ("success-only", "raw", "clip", "delta")
        if not all(a in pooled for a in need):
            return "not yet run"
        base = pooled["success-only"]["tool_calls"]

        def inflated(arm: str) -> bool:
            return pooled[arm]["tool_calls"] > INFLATION * base

        hacked = inflated("raw") and not (pooled["raw"]["vs_baseline"]["ci95_low"] > 0)
        guarded = all(not inflated(a) and not _below(pooled[a]["vs_baseline"]) for a in ("clip", "delta"))
        word = (
            "reproduced"
            if hacked and guarded
            else "partly reproduced (Clip and Delta do not hurt; the raw reward shows no hacking)"
            if guarded
            else "partly reproduced (the raw reward is hacked; a refinement hurts or inflates)"
            if hacked
            else "not reproduced"
        )
    else:
        rl, warm = pooled.get("rl"), pooled.get(WARM)
        if rl is None or warm is None:
            return "not yet run"
        hops = sorted(rl.get("by_hops", {}), key=int)
        deep = f"avg@{k}/reward"
        parts = {  # ASearcher's claim: accuracy on deep questions rises and the agent searches longer
            "held-out accuracy rises": rl["vs_warm"]["ci95_low"] > 0,
            "held-out tool calls rise": _calls_rise(rl, warm),
            "training tool calls rise": _rises(rl),
            "the deepest questions are solved more": bool(hops)  # by at least FLOOR: one sample in 44 is not
            and rl["by_hops"][hops[-1]][deep] >= warm["by_hops"][hops[-1]][deep] + FLOOR,
        }
        held = [what for what, ok in parts.items() if ok]
        failed = [what for what, ok in parts.items() if not ok]
        word = (
            "reproduced"
            if not failed
            else f"partly reproduced ({', '.join(held)}; not: {', '.join(failed)})"
            if parts["held-out accuracy rises"]
            else f"not reproduced (held-out accuracy does not rise; held: {', '.join(held)})"
            if held
            else "not reproduced"
        )
    n = len(report["seeds"])
    return word if n >= FULL_SEEDS else f"preliminary ({n} of {FULL_SEEDS} seeds): {word} so far"


README_MARK = "<!-- generated by `searchgym bench reproduce --readme` from results/reproduce_*.json -->"


def _figure(value: float, file: str, decimals: int = 3, signed: bool = True) -> str:
    """A figure as README's results table shows it: the number alone links to its file, the sign stays outside."""
    sign = ("-" if value < 0 else "+") if signed else ""
    return f"{sign}[{abs(value):.{decimals}f}]({file})"


def _readme_gain(d: dict[str, Any] | None, file: str) -> str:
    """A paired difference as its 95% interval (the verdicts read the interval; its middle adds little)."""
    if d is None:
        return "no paired seeds"
    return f"{_figure(d['ci95_low'], file)} to {_figure(d['ci95_high'], file)}"


def readme_row(claim: str, report: dict[str, Any] | None) -> str:
    """README's row for one claim: the paper's claim, the verdict and the figures behind it, each linked to the file."""
    first = CLAIMS[claim].summary
    said = verdict(report) if report is not None else "not yet run"
    if report is None or said == "not yet run":
        return f"| {first} | not yet run |"
    file = f"results/reproduce_{claim}.json"
    p, n = report["pooled"], len(report["seeds"])
    if claim == "staleness":
        gains = ", ".join(
            f"{name} {_readme_gain(p[arm].get('vs_baseline'), file)}"
            for name, arm in (("decoupled", "eta4-decoupled"), ("plain", "eta4-plain"))
            if arm in p
        )
        figures = f"held-out reward at η four minus sync: {gains}"
    elif claim == "shaping":
        calls = ", ".join(f"{arm} {_figure(p[arm]['tool_calls'], file, 2, signed=False)}" for arm in p if arm != WARM)
        raw = _readme_gain(p["raw"].get("vs_baseline"), file)
        figures = f"tool calls {calls}; held-out reward, raw minus success-only {raw}"
    else:
        calls = " -> ".join(_figure(p[arm]["tool_calls"], file, 2, signed=False) for arm in (WARM, "rl"))
        gain = _readme_gain(p["rl"].get("vs_warm"), file)
        change = p["rl"].get("tool_calls_vs_warm")
        spread = f"change {_readme_gain(change, file)}" if change is not None else "no interval"
        figures = f"held-out reward, RL minus warm start {gain}; tool calls {calls} ({spread})"
    return f"| {first} | {short_verdict(said)}, [{n}]({file}) seeds; {figures} |"


def short_verdict(said: str) -> str:
    """The verdict without its explanation (README's table shows no number that does not link to its file)."""
    prefix = ""
    if said.startswith("preliminary"):  # "preliminary (3 of 5 seeds): WORD so far"
        prefix, said = "preliminary: ", said.split("): ", 1)[-1]
    if said.startswith("inconclusive"):
        cause = "every arm at the floor" if "floor" in said else "the sync baseline diverged"
        return f"{prefix}inconclusive ({cause})"
    return prefix + re.sub(r" \([^)]*\)", "", said)


def readme_table(reports: Mapping[str, dict[str, Any] | None]) -> str:
    """README's table of the papers' claims, one row per claim in CLAIMS order (None: no results file)."""
    lines = ["| the paper's claim | ours (paired bootstrap intervals) |", "|---|---|"]
    lines += [readme_row(claim, reports.get(claim)) for claim in CLAIMS]
    return "\n".join(lines) + "\n"


def render_pages(root: Path = Path(".")) -> list[Path]:
    """Rewrite README's claims table and every table of docs/reproductions.md from the results files under `root`
    (the pages the tests compare with them); the pages that changed."""
    readme, doc = root / "README.md", root / "docs" / "reproductions.md"
    pages = {readme: readme.read_text(), doc: doc.read_text()}
    new = {readme: update_doc(pages[readme], README_MARK, readme_table(committed_reports(root / "results")))}
    text = pages[doc]
    for path in sorted((root / "results").glob("reproduce_*.json")):
        report = json.loads(path.read_text())
        mark = docs_mark(report["claim"], path.stem)
        if mark in text:  # a new file's place in the prose is the author's to choose: its mark goes in by hand
            text = update_doc(text, mark, markdown_table(report) + f"\n**Verdict: {verdict(report)}**")
    new[doc] = text
    changed = [page for page in new if new[page] != pages[page]]
    for page in changed:
        page.write_text(new[page])
    return changed


def committed_reports(results: Path = Path("results")) -> dict[str, dict[str, Any] | None]:
    """Each claim's results/reproduce_CLAIM.json, or None where the claim has no results file."""
    out: dict[str, dict[str, Any] | None] = {}
    for claim in CLAIMS:
        path = results / f"reproduce_{claim}.json"
        out[claim] = json.loads(path.read_text()) if path.exists() else None
    return out


AREAL_TOKENS_PER_S = {0: 128.7, 1: 269.3, 2: 356.6, 4: 356.6, 8: 371.7}  # k tokens/s, AReaL's staleness table
THROUGHPUT_FILE = "results/bench_trainer_objective.json"  # bench trainer's sweep crossed with the objective
THROUGHPUT_MARK = f"<!-- generated by `reproduce.throughput_table` from {THROUGHPUT_FILE} -->"


OBJECTIVES = {"recompute": "decoupled", "behaviour": "plain PPO"}  # learner.proximal -> the paper's name


def throughput_table(trainer: dict[str, Any]) -> str:
    """Trained tokens/s against eta from a `searchgym bench trainer` report, as ratios to eta 0, beside AReaL's; one
    pair of columns per objective when the report crossed its sweep with `learner.proximal`."""
    by_objective = trainer.get("sweep_by_proximal") or {"recompute": trainer["sweep"]}
    crossed = len(by_objective) > 1
    head = ["eta"]
    for proximal in by_objective:
        who = f"ours, {OBJECTIVES[proximal]}" if crossed else "ours"
        head += [f"{who}: trained tokens/s", f"{who}: / eta 0"]
    head += ["AReaL: k tokens/s", "AReaL: / eta 0"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    first = next(iter(by_objective.values()))
    for eta in sorted(first, key=int):
        cells = [eta]
        for sweep in by_objective.values():
            ours, sync = sweep[eta]["steady_tokens_per_s"], sweep["0"]["steady_tokens_per_s"]
            cells += [f"{ours:.1f}", f"{ours / sync:.2f}x"]
        theirs = AREAL_TOKENS_PER_S.get(int(eta))
        cells += ["-", "-"] if theirs is None else [f"{theirs}", f"{theirs / AREAL_TOKENS_PER_S[0]:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def update_doc(text: str, mark: str, block: str) -> str:
    """`text` with the table after `mark` (and a verdict line right after it, if any) replaced by `block`."""
    head, rest = text.split(mark, 1)
    lines = rest.lstrip("\n").splitlines()
    i = 0
    while i < len(lines) and lines[i].startswith("|"):
        i += 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i < len(lines) and lines[i].startswith("**Verdict:"):
        i += 1
    tail = "\n".join(lines[i:]).lstrip("\n")
    return f"{head}{mark}\n{block.rstrip()}\n\n{tail}".rstrip() + "\n"


@dataclass
class ReproduceCommand:
    """`searchgym bench reproduce`: a claim's arms over seeds, or (`markdown`, `readme`, `render`) its tables."""

    claim: str = setting("", help="long_horizon, staleness or shaping")
    seeds: str = setting("0,1,2,3,4", help="comma-separated seeds; finished (seed, arm) pairs are reused")
    out: Path | None = setting(None, help="default results/reproduce_CLAIM.json")
    markdown: bool = setting(False, help="only print docs/reproductions.md's table of --out")
    readme: bool = setting(False, help="only print README's table of every claim's results file")
    render: bool = setting(False, help="rewrite README's and docs/reproductions.md's tables")
    arms: str = setting("", help="comma-separated subset of the claim's arms, its baseline added (default: all)")
    model: str | None = setting(
        None,
        choices=(None, "smollm2"),
        help="the claim on a real model (SmolLM2-135M-Instruct); default out results/reproduce_CLAIM_MODEL.json",
    )
    status: bool = setting(
        False, help="only list where each (seed, arm) stands: done, cut (resumes from its checkpoint) or to run"
    )
    stop_by: str = setting(
        "",
        help="an ISO date and time (e.g. 2026-12-08T02:55): start a unit only if it ends by then at the finished "
        "units' pace, so a session's end cuts none (default: no limit)",
    )
    keep_rl_state: bool = setting(
        False,
        help="keep each finished arm's optimizer state and earlier checkpoints (GBs an arm on a real model); by "
        "default a finished arm keeps its last model, metrics and trajectories",
    )
    overrides: list[str] = setting(
        default_factory=list, help="config overrides, anywhere after CLAIM: e.g. rl.steps=20 out_dir=runs/r"
    )


def reproduce_command(command: ReproduceCommand) -> None:
    """Run the claim, or print (`markdown`, `readme`) or rewrite (`render`) the pages' tables."""
    if command.render:  # README's and docs/reproductions.md's tables rewritten from the results files
        changed = render_pages()
        print("\n".join(f"rewrote {page}" for page in changed) or "README.md and docs/reproductions.md are up to date")
        return
    if command.readme:  # README's table of the papers' claims is this output
        print(readme_table(committed_reports()), end="")
        return
    seeds = seed_list(command.seeds)
    stop_by = parse_stop_by(command.stop_by) if command.stop_by else None
    out = command.out or (Path(f"results/reproduce_{command.claim}_{command.model}.json") if command.model else None)
    if command.markdown:  # docs/reproductions.md's table and verdict are this output
        report = json.loads(Path(out or f"results/reproduce_{command.claim}.json").read_text())
        print(markdown_table(report) + f"\n**Verdict: {verdict(report)}**")
        return
    config = load_reproduce_config(command.claim, command.overrides, command.model)
    arms = select_arms(command.claim, command.arms)
    if command.status:  # read only: the unit logs and the RL folders' checkpoints
        from searchgym.core.file_lock import run_holder

        keys = {name: arm_fingerprint(config, command.claim, name, o) for name, o in {WARM: [], **arms}.items()}
        results = out or Path(f"results/reproduce_{command.claim}.json")
        ready = [seed for seed in seeds if _warm_on_disk(config, seed)]
        units = unit_status(Path(config.out_dir), results, keys, seeds, WARM, warm_on_disk=ready)
        print(format_status(command.claim, units, run_holder(config.out_dir)))
        return
    picked = ["--arms", command.arms] if command.arms else []
    picked += ["--model", command.model] if command.model else []
    words = ["searchgym", "bench", "reproduce", command.claim, *command.overrides, "--seeds", command.seeds, *picked]
    run_reproduce(
        command.claim,
        config,
        seeds,
        out=out,
        arms=arms,
        command=" ".join(words),
        rules=UnitRules(keep_rl_state=command.keep_rl_state, stop_by=stop_by),
    )
