"""`searchgym bench trainer`: asynchronous against synchronous RL on heavy-tailed agent episodes, at equal reward.

The benchmark trains the same tiny policy with one config at each staleness bound of a sweep (AReaL's
table: eta = 0 is the synchronous baseline, `mode: sync`; eta = 1, 2, 4, 8 are `mode: async` with
`rollout.max_staleness` = eta), on `searchgym-bench/SlowSyntheticQA-v0` (slow_env.py): episodes
whose turn counts and per-turn token counts are drawn from an ASearcher-shaped heavy-tailed
`Workload` (workload.py; the same draws in every run), tools with Pareto latency, and a shaped
reward the policy improves on (the share of its turns that open with a word). The sweep runs in
`rounds`, each playing every eta once, alternately forwards and backwards, so a change in the
machine's load hits every setting alike; ratios are taken within a round and their median reported.

Per run it reports AReaL's metric, trained (generated) tokens per second at steady state (the steps
after `warmup_steps`), the engine's idle fraction over the same window, episode latency percentiles,
the reward at the start and at the end (mean and spread over the last `final_steps` steps' episodes),
and what limits throughput: the learner's share of the wall time, episodes in flight, and the share
of time the staleness rule held admissions below the concurrency limit. All of these come from the
run's own metrics rows (learner/step_s, rollout/episodes_in_flight_mean, rollout/admission_blocked_share,
engine/*: trainers/run/metrics.py), which any `searchgym train` writes too. Numbers go to a JSON file,
never into asserts.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from searchgym.bench.plan_workflow import PLANNED_WORKFLOW
from searchgym.bench.slow_env import (  # noqa: F401
    SLOW_SYNTHETIC_QA,
    TOOL_DELAYS,
    ParetoLatency,
    SlowPages,
    SlowSearch,
    SlowSearchEnv,
    make_slow_synthetic_qa,
)
from searchgym.bench.workload import Workload, quantiles
from searchgym.settings import check_settings, setting

STALENESS_SWEEP = (0, 1, 2, 4, 8)


@dataclass
class TrainerBenchConfig:
    """`searchgym bench trainer`'s settings (its flags, `--config FILE` and dotted overrides, one loader)."""

    steps: int = setting(5, at_least=1, help="learner steps per run")
    warmup_steps: int = setting(1, at_least=0, help="steps left out of the steady-state throughput")
    final_steps: int = setting(2, at_least=1, help="last steps whose episodes give the final reward")
    rounds: int = setting(1, at_least=1, help="passes over the sweep, alternately forwards and backwards")
    staleness: list[int] = setting(
        default_factory=lambda: list(STALENESS_SWEEP),
        help="staleness bounds to sweep, comma-separated (0: the synchronous baseline, required)",
    )
    headline_staleness: int = setting(4, at_least=0, help="the bound the headline speedup quotes")
    # learner.proximal per run, crossed with the sweep (issue 29's objective axis): "recompute" is decoupled PPO,
    # "behaviour" plain PPO without the proximal forward pass; the first one gives `sweep` and the headline
    proximal: list[str] = setting(
        default_factory=lambda: ["recompute"], help="learner.proximal per run, comma-separated: recompute, behaviour"
    )
    size: int = setting(1000, at_least=1, help="pages in the synthetic world")
    n_tasks: int = setting(200, at_least=1, help="tasks in the pool")
    seed: int = setting(0, help="training seed (and the latency and workload seeds)")
    group_size: int = setting(4, at_least=1, help="episodes per task")
    batch_size: int = setting(2, at_least=1, help="groups per learner step")
    max_concurrent: int = setting(64, at_least=1, help="rollout.max_concurrent_rollouts (episodes)")
    lr: float = setting(1e-2, above=0, help="learning rate of the tiny policy")
    turns_median: float = setting(3.0, at_least=1, help="median turns per episode")  # the workload (workload.py)
    turns_p90: float = setting(16.0, help="90th percentile of turns per episode")
    turns_max: int = setting(40, help="most turns an episode plays")
    turn_tokens_median: float = setting(48.0, at_least=1, help="median tokens one turn generates")
    turn_tokens_sigma: float = setting(0.5, at_least=0, help="log-normal sigma of a turn's tokens")
    turn_tokens_max: int = setting(192, help="most tokens one turn generates")
    episode_tokens_min: int = setting(58, at_least=1, help="fewest tokens an episode generates")
    episode_tokens_max: int = setting(1920, help="most tokens an episode generates")
    tail_share: float = setting(
        0.0,
        at_least=0,
        at_most=1,
        help="share of episodes that play exactly --turns-max turns (a long tail on purpose)",
    )
    context_policy: str = setting(
        "end",
        choices=("end", "fold", "summarise"),
        help="what an episode does when its context is full (rollout.context_policy)",
    )
    latency_ms: float = setting(250.0, at_least=0, help="median tool latency")
    latency_alpha: float = setting(1.2, above=0, help="Pareto tail index (smaller: heavier tail)")
    latency_max_s: float = setting(10.0, at_least=0, help="cap on one tool call's latency")
    threads: int = setting(1, at_least=0, help="torch intra-op threads (0: torch's default)")
    out: str = setting("results/bench_trainer.json", help="the report JSON")
    workdir: str | None = setting(None, help="where the runs write (default: a temp dir)")
    world_seed: int = setting(0, help="the synthetic world's seed")
    workload_seed: int | None = setting(None, help="the workload's and the latency's seed (default: --seed)")
    top_k: int = setting(2, at_least=1, help="search results per call (env.kwargs.top_k)")
    doc_chars: int = setting(160, at_least=1, help="characters of each result shown (env.kwargs.doc_chars)")
    train_overrides: list[str] = setting(
        default_factory=list, help="dotted overrides of every run's training config, comma-separated"
    )

    def check(self) -> Iterator[tuple[str, str]]:
        """The checks that span fields: the sweep, the step windows and the workload's shape."""
        if (
            0 not in self.staleness
            or any(eta < 0 for eta in self.staleness)
            or len(set(self.staleness)) != len(self.staleness)
        ):
            yield (
                "staleness",
                f"must be distinct bounds >= 0 including 0 (the synchronous baseline), got {self.staleness}",
            )
        if (
            not self.proximal
            or set(self.proximal) - {"recompute", "behaviour"}
            or len(set(self.proximal)) != len(self.proximal)
        ):
            yield ("proximal", f"must be distinct values of recompute, behaviour; got {self.proximal}")
        if self.warmup_steps >= self.steps:
            yield ("warmup_steps", f"must be less than steps ({self.steps}), got {self.warmup_steps}")
        if self.final_steps > self.steps:
            yield ("final_steps", f"must be at most steps ({self.steps}), got {self.final_steps}")
        if not self.turns_median < self.turns_p90 <= self.turns_max:
            yield (
                "turns_p90",
                f"must be above turns_median ({self.turns_median}) and at most turns_max "
                f"({self.turns_max}), got {self.turns_p90}",
            )
        if self.turn_tokens_max < self.turn_tokens_median:
            yield (
                "turn_tokens_max",
                f"must be at least turn_tokens_median ({self.turn_tokens_median}), got {self.turn_tokens_max}",
            )
        if self.episode_tokens_min > self.turn_tokens_max:
            yield (
                "episode_tokens_min",
                f"must be at most turn_tokens_max ({self.turn_tokens_max}) so one turn can "
                f"meet it, got {self.episode_tokens_min}",
            )
        if self.episode_tokens_max < max(self.episode_tokens_min, self.turns_max):
            yield (
                "episode_tokens_max",
                f"must be at least episode_tokens_min ({self.episode_tokens_min}) and "
                f"turns_max ({self.turns_max}), got {self.episode_tokens_max}",
            )

    def workload(self) -> Workload:
        """The heavy-tailed episode shapes these settings describe."""
        return Workload(
            self.turns_median,
            self.turns_p90,
            self.turns_max,
            self.turn_tokens_median,
            self.turn_tokens_sigma,
            self.turn_tokens_max,
            self.episode_tokens_min,
            self.episode_tokens_max,
            self.seed if self.workload_seed is None else self.workload_seed,
            self.tail_share,
        )

    def latency(self) -> ParetoLatency:
        """The tools' heavy-tailed latency these settings describe."""
        seed = self.seed if self.workload_seed is None else self.workload_seed
        return ParetoLatency(self.latency_ms / 1000, self.latency_alpha, self.latency_max_s, seed)


def run_trainer_bench(config: TrainerBenchConfig, *, progress: bool = True) -> dict[str, Any]:
    """Train once per staleness bound per round, summarise each run and the sweep, write the results to `out`.

    `threads` sets torch's intra-op threads for the runs (0: leave torch's default). One
    thread by default: on a small shared box, intra-op threads that outnumber the free cores make
    every tiny-model op wait on a descheduled thread; with one thread each, the engine and the
    learner's thread still run on two cores at once.
    """
    import torch

    from searchgym.agents.tiny_model import build_tiny_model
    from searchgym.world.bundle import ensure_bundle

    check_settings(config)  # the sweep holds 0, the step windows fit: refused naming the key, before any work
    staleness, proximal = config.staleness, config.proximal
    overrides = [f"rollout.context_policy={config.context_policy}", *config.train_overrides]
    threads_before = torch.get_num_threads()
    if config.threads:  # 0: leave torch's default
        torch.set_num_threads(config.threads)
    # Built here, outside train()'s event loop: a bundle built inside it would call asyncio.run in a running loop.
    ensure_bundle(size=config.size, seed=config.world_seed, n_tasks=config.n_tasks, progress=progress)
    results = _setup(config, overrides, _machine(torch))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(config.workdir or tmp)
            model = build_tiny_model(root / "model", seed=config.seed)  # one policy for every run (and no rebuilds)
            positions = json.loads((model / "config.json").read_text())["max_position_embeddings"]
            base = _overrides(config, model, positions)
            cells = [(eta, p) for eta in staleness for p in proximal]  # each (bound, objective) once per round
            for r in range(config.rounds):
                for eta, p in cells if r % 2 == 0 else list(reversed(cells)):
                    run = root / f"round{r}-eta{eta}" if p == proximal[0] else root / f"round{r}-eta{eta}-{p}"
                    summary = _run_one([*base, *overrides, f"learner.proximal={p}"], eta, run, config, progress)
                    results["runs"].append({"round": r, "staleness": eta, "proximal": p, **summary})
                    results["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        torch.set_num_threads(threads_before)
    by_objective = {p: _sweep([run for run in results["runs"] if run["proximal"] == p], staleness) for p in proximal}
    results["sweep"] = by_objective[proximal[0]]
    if len(proximal) > 1:  # each objective's speedups are over its own sync run of the same round
        results["sweep_by_proximal"] = by_objective
    head = results["sweep"].get(str(config.headline_staleness))
    if head is not None:
        results["headline"] = {
            "staleness": config.headline_staleness,
            **{k: head[k] for k in ("speedup_median", "speedup_pooled", "final_reward", "steady_tokens_per_s")},
            "sync_final_reward": results["sweep"]["0"]["final_reward"],
            "sync_steady_tokens_per_s": results["sweep"]["0"]["steady_tokens_per_s"],
        }
    Path(config.out).parent.mkdir(parents=True, exist_ok=True)
    Path(config.out).write_text(json.dumps(results, indent=2) + "\n")
    return results


def _setup(config: TrainerBenchConfig, overrides: list[str], machine: dict[str, Any]) -> dict[str, Any]:
    """The report's head: the machine, the workload and latency drawn from, the reward and the settings."""
    workload, latency = config.workload(), config.latency()
    return {
        "machine": machine,
        "workload": {
            **asdict(workload),
            "turns_sigma": round(workload.turns_sigma, 4),
            "distribution": "log-normal turns (median, p90, capped) x log-normal tokens per turn, "
            "episode total scaled into [episode_tokens_min, episode_tokens_max]",
        },
        "latency": {
            **{k: v for k, v in asdict(latency).items() if not k.startswith("_")},
            "scale_s": round(latency.scale_s, 5),
            "distribution": "Pareto, capped at max_s",
        },
        "reward": "shaped: share of the episode's turns whose first generated token starts a word (a space and "
        "letters); plan_workflow.word_start_share",
        "settings": {
            "steps": config.steps,
            "warmup_steps": config.warmup_steps,
            "final_steps": config.final_steps,
            "rounds": config.rounds,
            "staleness": list(config.staleness),
            "proximal": list(config.proximal),
            "group_size": config.group_size,
            "batch_size": config.batch_size,
            "max_concurrent_rollouts": config.max_concurrent,
            "lr": config.lr,
            "top_k": config.top_k,
            "doc_chars": config.doc_chars,
            "overrides": overrides,
        },
        "runs": [],
    }


def _machine(torch: Any) -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "note": "a shared box: other engineers' jobs run on the same cores",
    }


def _overrides(config: TrainerBenchConfig, model: Path, positions: int) -> list[str]:
    """The config every run shares (its staleness and mode set per run).

    The context budget is the model's positions: an episode that reaches them ends there ("context
    budget", counted in `episodes_cut_by_context`) instead of playing turns the model cannot extend.
    """
    workload, latency = config.workload(), config.latency()
    fields = [f"env.kwargs.workload.{k}={v}" for k, v in asdict(workload).items()]
    context = min(positions, workload.turns_max * (workload.turn_tokens_max + 256) + 1024)
    return [
        f"steps={config.steps}",
        f"seed={config.seed}",
        f"save_every={config.steps}",
        "keep_checkpoints=1",
        f"model.path={model}",
        f"env.id={SLOW_SYNTHETIC_QA}",
        f"env.kwargs.size={config.size}",
        f"env.kwargs.seed={config.world_seed}",
        f"env.kwargs.n_tasks={config.n_tasks}",
        "env.kwargs.split=train",
        f"env.kwargs.max_turns={workload.turns_max}",
        f"env.kwargs.top_k={config.top_k}",
        f"env.kwargs.doc_chars={config.doc_chars}",
        f"env.kwargs.latency_median_s={latency.median_s}",
        f"env.kwargs.latency_alpha={latency.alpha}",
        f"env.kwargs.latency_max_s={latency.max_s}",
        f"env.kwargs.latency_seed={latency.seed}",
        *fields,
        f"rollout.workflow={PLANNED_WORKFLOW}",
        f"rollout.group_size={config.group_size}",
        f"rollout.batch_size={config.batch_size}",
        f"rollout.max_concurrent_rollouts={config.max_concurrent}",
        f"rollout.max_new_tokens={workload.turn_tokens_max}",
        f"rollout.max_context={context}",
        f"learner.lr={config.lr}",
        "learner.drop_no_spread=false",
        "learner.std_normalize=true",
    ]


def _run_one(overrides: list[str], eta: int, run: Path, bench: TrainerBenchConfig, progress: bool) -> dict[str, Any]:
    """One training run at staleness `eta` (0: mode sync), summarised."""
    from searchgym.trainers.config import load_config
    from searchgym.trainers.launchers.local import train

    mode = "sync" if eta == 0 else "async"
    config = load_config(None, [*overrides, f"mode={mode}", f"rollout.max_staleness={max(eta, 0)}", f"out_dir={run}"])
    TOOL_DELAYS.clear()
    load_before, t0 = os.getloadavg()[0], time.perf_counter()
    history = train(config, progress=progress)
    wall = time.perf_counter() - t0
    load = [round(load_before, 2), round(os.getloadavg()[0], 2)]  # 1-minute load average at start and end
    return {
        "mode": mode,
        "wall_s": round(wall, 2),
        "load_average_1min": load,
        **summarize_run(history, run / "trajectories", bench.warmup_steps, bench.final_steps, list(TOOL_DELAYS)),
    }


def summarize_run(
    history: list[dict[str, float]],
    trajectories: Path,
    warmup_steps: int,
    final_steps: int,
    delays: Sequence[float] = (),
) -> dict[str, Any]:
    """One run in numbers, from its metrics rows: steady-state throughput and idle after the warm-up, reward,
    latencies, and what limits throughput."""
    missing = [key for key in LIMIT_KEYS if any(key not in h for h in history)]
    if missing:
        raise ValueError(f"the run's metrics rows lack {missing}: a trainer that records them is needed")
    times = [h["elapsed_s"] for h in history]
    start = times[warmup_steps - 1] if warmup_steps else 0.0
    end = times[-1]
    steady = history[warmup_steps:]
    tokens = sum(h["trained_tokens"] for h in steady)
    episodes = _episodes(trajectories)
    by_step = [[e for e in episodes if e["step"] == k] for k in range(len(history))]
    final = [e["reward"] for step in by_step[-final_steps:] for e in step]
    return {
        "steps": len(history),
        "steady_window_s": round(end - start, 4),  # precise enough to recompute the rate from it
        "steady_trained_tokens": int(tokens),
        "steady_tokens_per_s": round(tokens / (end - start), 2) if end > start else None,
        "all_tokens_per_s": round(sum(h["trained_tokens"] for h in history) / history[-1]["elapsed_s"], 2),
        "engine_idle_fraction": _idle(history, warmup_steps),
        **window(history, warmup_steps),
        **engine_summary(history[-1]),  # over the whole run, warm-up included
        "staleness_mean": round(statistics.fmean(h["staleness_mean"] for h in steady), 4) if steady else None,
        "staleness_max": max((h["staleness_max"] for h in history), default=None),
        "reward_first_step": round(statistics.fmean(e["reward"] for e in by_step[0]), 4),
        "final_reward": _spread(final),
        "episode_s": quantiles([e["seconds"] for e in episodes]),
        "episode_turns": quantiles([e["turns"] for e in episodes]),
        "episode_tokens": quantiles([e["tokens"] for e in episodes]),
        "episodes_cut_by_context": sum(e["stop_reason"] == "context budget" for e in episodes),
        "tool_delay_s": quantiles(list(delays)) | {"calls": len(delays)},
    }


LIMIT_KEYS = ("elapsed_s", "learner/step_s", "rollout/episodes_in_flight_mean", "rollout/admission_blocked_share")


def window(history: list[dict[str, float]], warmup_steps: int) -> dict[str, float | None]:
    """Over the rows after the warm-up: the learner's share of the time, mean episodes in flight, share below the limit.

    Each row's in-flight mean and blocked share cover the time since the previous row, so the window's are
    their means weighted by each row's span of elapsed_s.
    """
    times = [0.0, *(h["elapsed_s"] for h in history)]
    rows = list(zip(history, times, times[1:], strict=False))[warmup_steps:]
    span = times[-1] - times[warmup_steps]
    if span <= 0:
        return {"learner_share": None, "episodes_in_flight_mean": None, "admission_blocked_share": None}
    weighted = lambda key: sum(h[key] * (b - a) for h, a, b in rows) / span  # noqa: E731
    return {
        "learner_share": round(sum(h["learner/step_s"] for h, _, _ in rows) / span, 4),
        "episodes_in_flight_mean": round(weighted("rollout/episodes_in_flight_mean"), 2),
        "admission_blocked_share": round(weighted("rollout/admission_blocked_share"), 4),
    }


def engine_summary(row: dict[str, float]) -> dict[str, float | None]:
    """From a row's cumulative engine counters: rows per decode step (batching), prompt tokens prefilled and
    reused per generated token, busy seconds (None where the engine does not count them)."""
    generated, steps = row.get("engine/generated_tokens", 0), row.get("engine/decode_steps", 0)
    prefill, reused, busy = row.get("engine/prefill_tokens"), row.get("engine/reused_tokens"), row.get("engine/busy_s")
    return {
        "engine_rows_per_decode_step": round(generated / steps, 2) if steps else None,
        "engine_prefill_per_generated_token": round(prefill / generated, 2)
        if generated and prefill is not None
        else None,
        "engine_reused_per_generated_token": round(reused / generated, 2) if generated and reused is not None else None,
        "engine_busy_s": round(busy, 2) if busy is not None else None,
    }


def _idle(history: list[dict[str, float]], warmup_steps: int) -> float | None:
    """The engine's idle fraction between the warm-up's last step and the last step (from the cumulative figures)."""
    key = "rollout/engine_idle_fraction"
    if key not in history[-1]:
        return None
    busy = [(1.0 - h[key]) * h["elapsed_s"] for h in history]
    t = [h["elapsed_s"] for h in history]
    if warmup_steps == 0:
        return round(history[-1][key], 4)
    span = t[-1] - t[warmup_steps - 1]
    return round(min(1.0, max(0.0, 1.0 - (busy[-1] - busy[warmup_steps - 1]) / span)), 4) if span > 0 else None


def _episodes(directory: Path) -> list[dict[str, Any]]:
    """Every trained episode: its step (0-based), reward, turns, generated tokens, seconds and how it ended."""
    out = []
    for step, path in enumerate(sorted(directory.glob("version-*.jsonl"))):
        for line in path.read_text().splitlines():
            traj = json.loads(line)
            turns = traj.get("turns", [])
            out.append(
                {
                    "step": step,
                    "reward": traj["reward"],
                    "turns": len(turns),
                    "tokens": sum(traj["loss_mask"]) + sum(sum(s["loss_mask"]) for s in traj.get("segments", [])),
                    "stop_reason": traj.get("stop_reason", ""),
                    "seconds": sum(t.get("generate_seconds", 0.0) + t.get("env_seconds", 0.0) for t in turns),
                }
            )
    return out


def _spread(values: Sequence[float]) -> dict[str, float | int | None]:
    """Mean, standard deviation and standard error of `values`."""
    if not values:
        return {"mean": None, "std": None, "sem": None, "n": 0}
    std = statistics.pstdev(values)
    return {
        "mean": round(statistics.fmean(values), 4),
        "std": round(std, 4),
        "sem": round(std / len(values) ** 0.5, 4),
        "n": len(values),
    }


def _sweep(runs: list[dict[str, Any]], staleness: Sequence[int]) -> dict[str, Any]:
    """Per staleness bound: throughput pooled over rounds, the within-round speedups over sync, reward, limits."""
    sweep: dict[str, Any] = {}
    sync = {run["round"]: run for run in runs if run["staleness"] == 0}
    for eta in staleness:
        mine = [run for run in runs if run["staleness"] == eta]
        tokens = sum(run["steady_trained_tokens"] for run in mine)
        seconds = sum(run["steady_window_s"] for run in mine)
        ratios = [
            run["steady_tokens_per_s"] / sync[run["round"]]["steady_tokens_per_s"]
            for run in mine
            if run["steady_tokens_per_s"] and sync[run["round"]]["steady_tokens_per_s"]
        ]
        finals = [run["final_reward"]["mean"] for run in mine if run["final_reward"]["mean"] is not None]
        pooled = round(tokens / seconds, 2) if seconds else None
        sync_tokens = sum(run["steady_trained_tokens"] for run in sync.values())
        sync_seconds = sum(run["steady_window_s"] for run in sync.values())
        sweep[str(eta)] = {
            "mode": "sync" if eta == 0 else "async",
            "steady_tokens_per_s": pooled,
            "speedup_per_round": [round(x, 3) for x in ratios],
            "speedup_median": round(statistics.median(ratios), 3) if ratios else None,
            "speedup_pooled": round(pooled / (sync_tokens / sync_seconds), 3) if pooled and sync_seconds else None,
            "final_reward": {
                "mean": round(statistics.fmean(finals), 4) if finals else None,
                "per_round": finals,
                "episode_std": round(statistics.fmean(run["final_reward"]["std"] for run in mine), 4),
            },
            "reward_first_step": round(statistics.fmean(run["reward_first_step"] for run in mine), 4),
            **{
                key: _mean(run[key] for run in mine)
                for key in (
                    "engine_idle_fraction",
                    "learner_share",
                    "episodes_in_flight_mean",
                    "admission_blocked_share",
                    "staleness_mean",
                    "engine_rows_per_decode_step",
                    "engine_prefill_per_generated_token",
                    "engine_reused_per_generated_token",
                )
            },
            "episode_s_p50": _mean(run["episode_s"]["p50"] for run in mine),
            "episode_s_p90": _mean(run["episode_s"]["p90"] for run in mine),
            "episode_s_p99": _mean(run["episode_s"]["p99"] for run in mine),
        }
    return sweep


def _mean(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.fmean(present), 4) if present else None


def trainer_bench_command(config: TrainerBenchConfig) -> None:
    print(json.dumps(run_trainer_bench(config), indent=2))
