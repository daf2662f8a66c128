"""`searchgym bench learning`: does RL make the tiny agent better, over several seeds, with intervals that say so?

Per seed, the quickstart's stages (searchgym/quickstart.py) with that seed: a world and its task pool, the
oracle's demonstrations, a warm start (SFT), async RL (staleness eta=4) and, at equal learner steps, sync
RL from the same warm start; then all three policies on the same held-out questions, k samples each. The
copy-pretrained base model (tokenizer and induction heads, no knowledge of any task) is built once, from
the world of `base_seed`, and shared by every seed: it is the "pretrained LM" each seed starts from.

The default preset, `headroom`, gives RL something the demonstrations barely show: the oracle demonstrates
1-hop questions (search the question, copy the name) and only a tenth of the 1- and 2-hop questions RL may train
on (so the warm start has seen a second search, rarely); RL trains on the rest, and the held-out questions are
1- and 2-hop, reported separately. Each run uses one torch thread, so seeds can run side by side.
Preset `quickstart` is the quickstart's own setting (1-hop everywhere, half the train questions demonstrated, at
most `max_demos`) at the benchmark's scale.

Each finished seed is one row of OUT_DIR/seeds.jsonl and of its copy beside the results
(`results/NAME.seeds.jsonl`, bench/unit_log.py): a rerun, in this session or on a fresh clone that has the copy,
skips it. The pooled gain is the mean over (seed, question) of the RL policy's held-out reward minus the warm
start's, with a hierarchical bootstrap interval (seeds, then questions within seed: bench/bootstrap.py).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from omegaconf import OmegaConf

from searchgym.bench.bootstrap import hierarchical_bootstrap, seed_list
from searchgym.bench.provenance import machine, peak_rss_bytes
from searchgym.bench.unit_log import UnitLog
from searchgym.core.file_lock import sole_run
from searchgym.eval.compare import paired_delta
from searchgym.eval.harness import sample_of
from searchgym.eval.metrics import summarize
from searchgym.pipeline.stages import (
    REAL_MODEL_PRESETS,
    QuickstartConfig,
    StageRun,
    build_base_model,
    configure_rl,
    deterministic_torch,
    evaluate_policy,
    make_demos,
    make_env,
    resolve_model,
    resumable_step,
    run_rl,
    say,
)
from searchgym.settings import load_settings, setting
from searchgym.trainers.config import EnvConfig, TrainConfig
from searchgym.trainers.warm_start.sft import sft
from searchgym.world.mincalls import MAX_MIN_CALLS

POLICIES = ("warm", "async", "sync")
# Each preset is a list of overrides applied before the command line's.
# a real model's settings in bench learning and bench reproduce: the quickstart preset's (its warm start, RL and
# evaluation scale), with the quickstart's 48 tokens a turn where bench learning gives the tiny model 40
REAL_MODEL_LEARNING: dict[str, list[str]] = {
    model: [*overrides, "rl.rollout.max_new_tokens=48", "eval.max_new_tokens=48"]
    for model, overrides in REAL_MODEL_PRESETS.items()
}

PRESETS: dict[str, list[str]] = {
    "headroom": [],  # LearningConfig's defaults
    "quickstart": ["hops.demos=[1]", "hops.rl=[1]", "hops.eval=[1]", "demos.fraction=0.5", "hops.rl_demos=0"],
    # issue 29 claim 1 (ASearcher's longer search from RL): shallow (1-2 hop) demonstrations only, RL and held-out
    # questions reaching 3 hops (undemonstrated 2-hop ones too), a 16-turn budget and exact match (no partial pay
    # for a wrong name). Trial E of docs/reproductions.md: bench learning's 20,000-page world and about 2,600
    # demonstrations, so the warm start solves some 2-hop questions (held-out EM 0.047) and RL sees successes; the
    # 4,000-page, 800-demonstration design of trials A-D solved almost none
    "deep": [
        "env.kwargs.max_turns=16",
        "env.kwargs.judge=em",
        "hops.demos=[1,2]",
        "hops.rl=[2,3]",
        "hops.eval=[2,3]",
        "hops.rl_demos=0",
        "max_demos=2600",
        "sft.epochs=3",
        "sync=false",
        "rl.steps=30",
        "rl.save_every=30",
        "eval.max_tasks=64",
    ],
    # issue 40: the real-model quickstart (SmolLM2-135M-Instruct) over seeds, 1-hop as its quickstart, async only
    "smollm2": [
        *REAL_MODEL_LEARNING["smollm2"],
        "hops.demos=[1]",
        "hops.rl=[1]",
        "hops.eval=[1]",
        "hops.rl_demos=0",
        "demos.fraction=0.5",
        "max_demos=128",
        "sync=false",
    ],
}

BEHAVIOUR = ("turns", "searches", "accesses", "answered")


@dataclass
class HopsConfig:
    """Which questions the oracle demonstrates, RL trains on and the evaluation holds out (reported one by one), by
    their hop count (`by: hops`) or by their proven least number of tool calls (`by: min_calls`: SyntheticQA's
    min_calls pools, one per split's range min..max of the list, with the proof's env settings)."""

    demos: list[int] = field(default_factory=lambda: [1])
    rl: list[int] = field(default_factory=lambda: [1, 2])
    eval: list[int] = field(default_factory=lambda: [1, 2])
    # share of the RL hop counts' train tasks also demonstrated (seeds the behaviour; not RL'd)
    rl_demos: float = setting(0.1, at_least=0, below=1)
    by: str = setting("hops", choices=("hops", "min_calls"))

    def check(self) -> Iterator[tuple[str, str]]:
        """Each list names hop counts the synthetic world makes (1 to 4), or proven minima it can prove (1 to 12)."""
        top = 4 if self.by == "hops" else MAX_MIN_CALLS
        for name in ("demos", "rl", "eval"):
            counts = getattr(self, name)
            if not counts or not set(counts) <= set(range(1, top + 1)):
                yield (name, f"must list {COUNTED[self.by]} between 1 and {top}, got {counts}")
            elif self.by == "min_calls" and set(counts) != set(range(min(counts), max(counts) + 1)):
                yield (name, f"must be a run of minima with no gap (one min_calls pool serves it), got {counts}")

    def env_kwargs(self, counts: list[int]) -> dict[str, Any]:
        """The SyntheticQA kwargs that serve questions of `counts`: a hops filter, or the min_calls pool of their
        range (`count` then tells a task's minimum)."""
        if self.by == "hops":
            return {"hops": sorted(set(counts))}
        return {"min_calls": [min(counts), max(counts)]}

    def count(self, task: Any) -> int | None:
        """The task's hop count or proven minimum (what the lists select on)."""
        value = task.metadata.get(self.by)
        return int(value) if value is not None else None


COUNTED = {"hops": "hop counts", "min_calls": "proven minima of tool calls"}


def count_label(report: dict[str, Any], count: object) -> str:
    """How a report names its questions of `count`: "3-hop", or "3-call" under `hops.by=min_calls` (the least
    number of tool calls that can find the answer)."""
    by = report.get("config", {}).get("hops", {}).get("by", "hops")
    return f"{count}-call" if by == "min_calls" else f"{count}-hop"


def _learning_env() -> dict[str, Any]:
    return {
        "size": 20000,
        "n_tasks": 20000,
        "top_k": 2,
        "doc_chars": 200,
        "max_turns": 4,
        "judge": "f1",
        "instructions": "brief",
    }


@dataclass
class LearningConfig(QuickstartConfig):
    """The quickstart's stages per seed, plus which hops go where and the shared base model's world."""

    out_dir: str = "runs/bench_learning"
    preset: str = "headroom"
    hops: HopsConfig = field(default_factory=HopsConfig)
    max_demos: int = setting(
        1500, at_least=1
    )  # at most this many demonstrated tasks of `hops.demos` per seed (bounds the warm start)
    base_seed: int = 0  # the world whose pages (and demos) train the shared base model's tokenizer
    sync: bool = True  # also train the sync baseline (same steps, staleness 0)
    bootstrap_resamples: int = 2000
    env: EnvConfig = field(default_factory=lambda: EnvConfig(kwargs=_learning_env()))


def load_learning_config(overrides: list[str] | tuple[str, ...] = (), preset: str = "headroom") -> LearningConfig:
    """The preset's settings, then `key=value` overrides, validated against the dataclasses."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    defaults = LearningConfig(preset=preset)
    defaults.sft.epochs, defaults.rl.steps, defaults.rl.save_every = 3.0, 40, 40
    defaults.torch_threads = 1  # one core per run: seeds can run side by side, and the floats do not depend on it
    defaults.rl.rollout.max_staleness = 4  # AReaL's eta=4
    defaults.rl.rollout.max_new_tokens = defaults.eval.max_new_tokens = 40
    defaults.rl.learner.process_reward_weight = 0.0
    defaults.demos.fraction = 1.0
    config = load_settings(LearningConfig, overrides=[*PRESETS[preset], *overrides], base=defaults)
    config.preset = preset
    return config


# Settings added after rows were first written, with the value that means "as before they existed": at that value
# they are left out of the fingerprint, so seeds run before the setting existed and seeds run after still pool.
LATER_SETTINGS: dict[tuple[str, ...], Any] = {
    ("rl", "learner", "autocast"): "off",
    ("rl", "learner", "trainable_layers"): None,
    ("hops", "by"): "hops",
}


def fingerprint(config: LearningConfig) -> str:
    """What a seed's row depends on (everything but the output directory): rows of another config are not mixed."""
    data = cast(dict[str, Any], OmegaConf.to_container(OmegaConf.structured(config)))
    data.pop("out_dir", None)
    data.pop("seed", None)
    for path, unchanged in LATER_SETTINGS.items():
        *parents, name = path
        holder = data
        for key in parents:
            holder = holder.get(key, {})
        if name in holder and holder[name] == unchanged:
            del holder[name]
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def base_fingerprint(config: LearningConfig) -> str:
    """What the shared base model depends on (its world, demonstrations, shape, copy pretraining, threads): a change
    of RL or evaluation settings reuses it."""
    data = {
        "env": OmegaConf.to_container(OmegaConf.structured(config.env)),
        "demos": OmegaConf.to_container(OmegaConf.structured(config.demos)),
        "hops": list(config.hops.demos),
        "model": OmegaConf.to_container(OmegaConf.structured(config.model)),
        "copy": OmegaConf.to_container(OmegaConf.structured(config.copy)),
        "max_demos": config.max_demos,
        "base_seed": config.base_seed,
        "torch_threads": config.torch_threads,
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_learning_bench(
    config: LearningConfig,
    seeds: list[int],
    *,
    out: str | os.PathLike = "results/bench_learning.json",
    progress: bool = True,
) -> dict[str, Any]:
    """Every seed not yet finished (OUT_DIR/seeds.jsonl, or its copy OUT.seeds.jsonl that is committed with the
    results, so a fresh clone goes on), then the pooled report written to `out` (JSON) and a PNG beside it."""
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct and at least one, got {seeds}")
    root = Path(config.out_dir)
    root.mkdir(parents=True, exist_ok=True)
    key = fingerprint(config)
    with sole_run(root, "bench learning"), deterministic_torch(config.torch_threads):
        log = UnitLog(root / "seeds.jsonl", Path(out).with_suffix(".seeds.jsonl"), fingerprint=key, check=_check_row)
        done = {row["seed"] for row in log.rows}
        base = None
        for seed in seeds:
            if seed in done:
                say(progress, f"[bench learning] seed {seed}: done before, reused")
                continue
            base = base or shared_base_model(config, root, progress=progress)
            log.append(run_seed(config, seed, base, root / f"seed-{seed}", key, progress=progress))
    rows = sorted((r for r in log.rows if r["seed"] in seeds), key=lambda r: seeds.index(r["seed"]))
    report = json.loads(json.dumps(pooled_report(rows, config)))  # as the file holds it (lists, not tuples)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    plot_learning(report, path.with_suffix(".png"))
    say(progress, format_report(report))
    return report


def shared_base_model(config: LearningConfig, root: Path, *, progress: bool) -> Path:
    """The copy-pretrained base model, built once per configuration from world `base_seed` and reused (a real model
    named by `base` is used as it is)."""
    if config.base != "tiny":
        return resolve_model(config.base)
    where = root / "shared"
    done = where / "base.json"
    if done.exists() and json.loads(done.read_text()).get("fingerprint") == base_fingerprint(config):
        return where / "base-model"
    kwargs = {**config.env.kwargs, "seed": config.base_seed, **config.hops.env_kwargs(config.hops.demos)}
    env = make_env(config.env.id, kwargs, "train")
    chats = make_demos(
        env, _demo_tasks(env, config)[0], where / "demos.jsonl", question_query=config.demos.question_query
    )
    run = StageRun(seed=config.base_seed, progress=progress, label="shared base model")
    base, history = build_base_model(env, chats, where, config.model, config.copy, run)
    done.write_text(
        json.dumps(
            {
                "fingerprint": base_fingerprint(config),
                "base_seed": config.base_seed,
                "copy_accuracy": history[-1]["copy_accuracy"] if history else None,
            }
        )
        + "\n"
    )
    return base


def _demo_tasks(env: Any, config: LearningConfig) -> tuple[list[Any], list[Any]]:
    """(demonstrated tasks, RL tasks) of the train split: demos from the `hops.demos` tasks (the first
    `demos.fraction`, at most `max_demos`), RL on the `hops.rl` tasks that were not demonstrated."""
    tasks = list(env.tasks)
    demo_pool = [t for t in tasks if config.hops.count(t) in config.hops.demos]
    demos = demo_pool[: min(round(config.demos.fraction * len(demo_pool)), config.max_demos)]
    shown = {t.id for t in demos}
    rl = [t for t in tasks if config.hops.count(t) in config.hops.rl and t.id not in shown]
    if config.hops.rl_demos > 0:  # demonstrate the first share of them too, and train RL on the rest
        cut = round(config.hops.rl_demos * len(rl))
        demos, rl = demos + rl[:cut], rl[cut:]
    return demos, rl


@dataclass
class SeedSetup:
    """One seed's world and warm start, shared by every RL run of the seed: env kwargs, task split, the SFT model."""

    env_kwargs: dict[str, Any]
    demo_tasks: list[Any]
    rl_tasks: list[Any]
    demos: int
    warm: Path

    def train(
        self, rl: TrainConfig, out: Path, env_id: str, *, seed: int, progress: bool, resume: bool = False
    ) -> list[dict[str, float]]:
        """RL from the warm start on the seed's RL tasks into `out` (`run_rl`, which with `resume` goes on from a
        cut run of the same config there): every arm and mode of a seed."""
        run = StageRun(seed=seed, progress=progress, label=f"seed {seed}: RL ({out.name.removeprefix('rl-')})")
        return run_rl(rl, self.warm, out, self.rl_env(env_id), self.rl_task_ids, run, resume=resume)

    def resumable_step(self, rl: TrainConfig, out: Path, env_id: str, *, seed: int) -> int | None:
        """The checkpoint step `train(..., resume=True)` would go on from in `out` (None: it would start over)."""
        configure_rl(rl, self.warm, out, self.rl_env(env_id), self.rl_task_ids, seed)
        return resumable_step(rl, out)

    def rl_env(self, env_id: str) -> EnvConfig:
        """The env RL plays: `env_id` with the seed's world."""
        return EnvConfig(id=env_id, kwargs=self.env_kwargs)

    @property
    def rl_task_ids(self) -> list[str]:
        """The ids of the seed's RL tasks."""
        return [t.id for t in self.rl_tasks]


def prepare_seed(
    config: LearningConfig, seed: int, base: Path, out: Path, lap: Any, *, progress: bool = True
) -> SeedSetup:
    """The seed's world, the oracle's demonstrations and the warm start (SFT from `base`) into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    env_kwargs = {**config.env.kwargs, "seed": seed, **config.hops.env_kwargs([*config.hops.demos, *config.hops.rl])}
    env = make_env(config.env.id, env_kwargs, "train")
    demo_tasks, rl_tasks = _demo_tasks(env, config)
    if not rl_tasks:
        raise ValueError(f"seed {seed}: no train task with hops {config.hops.rl} is left for RL")
    lap("world")
    chats = make_demos(
        env, demo_tasks, out / "demos.jsonl", question_query=config.demos.question_query, limit=config.demos.limit
    )
    if not chats:
        raise ValueError(f"seed {seed}: the oracle solved none of the {len(demo_tasks)} demonstration tasks")
    lap("demos")
    key = warm_start_fingerprint(config, seed)
    warm = finished_warm_start(config, key, out)
    if warm is not None:
        say(progress, f"[bench] seed {seed}: warm start reused from {warm}")
    else:
        warm = out / "sft-model"
        (warm / WARM_MARK).unlink(missing_ok=True)  # an older warm start's mark must not outlive its overwriting
        sft_config = copy.deepcopy(config.sft)
        sft_config.seed = seed
        sft(
            base,
            chats,
            warm,
            sft_config,
            progress=progress,
            device=config.rl.model.device,
            progress_label=f"seed {seed}: warm start",
        )
        warm.mkdir(parents=True, exist_ok=True)
        (warm / WARM_MARK).write_text(json.dumps({"fingerprint": key, "seed": seed}) + "\n")  # last: only when whole
    lap("warm start")
    return SeedSetup(env_kwargs, demo_tasks, rl_tasks, len(chats), warm)


WARM_MARK = "warm_start.json"  # written beside a finished warm start: what it was trained from


def warm_start_fingerprint(config: LearningConfig, seed: int) -> str:
    """What a seed's warm start depends on: every setting but RL's (bar the device SFT runs on), the evaluation's,
    the held-out hops and where runs go. Claims whose settings differ only in RL (on the tiny model staleness and
    shaping, on SmolLM2 long horizon and shaping) share it."""
    data = cast(dict[str, Any], OmegaConf.to_container(OmegaConf.structured(config)))
    device = data.pop("rl")["model"]["device"]
    for name in ("out_dir", "preset", "seed", "eval", "sync", "bootstrap_resamples"):
        data.pop(name, None)
    data["hops"].pop("eval", None)
    if data["hops"].get("by") == "hops":  # the setting came later: warm starts made before it keep their key
        del data["hops"]["by"]
    data.update(seed=seed, sft_device=device, base_model=base_fingerprint(config))
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def finished_warm_start(config: LearningConfig, key: str, out: Path) -> Path | None:
    """A finished warm start with fingerprint `key`: this seed's own (a resumed run) or a sibling run's seed folder
    under the same runs folder (another claim at the same settings), so SFT is not redone; None if there is none."""
    own = [out / "sft-model" / WARM_MARK]
    siblings = sorted(Path(config.out_dir).parent.glob(f"*/{out.name}/sft-model/{WARM_MARK}"))
    for mark in [*own, *siblings]:
        try:
            if json.loads(mark.read_text()).get("fingerprint") == key:
                return mark.parent
        except (OSError, ValueError):
            continue  # absent, or a mark cut short: not a finished warm start
    return None


def held_out_kwargs(config: LearningConfig, seed: int) -> dict[str, Any]:
    """The held-out split's env kwargs for `seed` (the `hops.eval` questions)."""
    return {**config.env.kwargs, "seed": seed, **config.hops.env_kwargs(config.hops.eval), "split": "test"}


def held_out_samples(
    config: LearningConfig, model: Path, out: Path, seed: int, *, progress: bool
) -> list[dict[str, Any]]:
    """`model` evaluated on the seed's held-out questions (k samples each), as the samples' rows."""
    env = EnvConfig(id=config.env.id, kwargs=held_out_kwargs(config, seed))
    label = f"seed {seed}: evaluate, {out.name.removeprefix('eval-')}"
    evaluate_policy(model, out, config.eval, env, StageRun(seed, config.rl.model.device, progress, label))
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]


def hop_counts(config: LearningConfig, seed: int) -> dict[str, int]:
    """Each held-out question's hop count (or proven minimum of tool calls, `hops.by`)."""
    test_env = make_env(config.env.id, held_out_kwargs(config, seed), "test")
    return {t.id: count for t in test_env.tasks if (count := config.hops.count(t)) in config.hops.eval}


def stage_clock(progress: bool, label: str) -> tuple[dict[str, float], Any]:
    """A dict of stage timings and the `lap(stage)` that records (and says) the time since the previous lap, and the
    process's peak resident memory so far (`peak_rss_gb`: what decides whether two runs fit side by side)."""
    timings: dict[str, float] = {}
    clock = [time.perf_counter()]

    def lap(stage: str) -> None:
        timings[stage] = round(time.perf_counter() - clock[0], 1)
        clock[0] = time.perf_counter()
        timings["peak_rss_gb"] = peak_rss_gb()
        say(progress, f"[{label}] {stage}: {timings[stage]} s (peak RSS so far {timings['peak_rss_gb']} GB)")

    return timings, lap


def peak_rss_gb() -> float:
    """This process's peak resident set size in GB (10^9 bytes), as the stage laps print it."""
    return round(peak_rss_bytes() / 1e9, 2)


def run_seed(
    config: LearningConfig, seed: int, base: Path, out: Path, key: str, *, progress: bool = True
) -> dict[str, Any]:
    """One seed's pipeline (world, demos, warm start, async RL, sync RL, three evaluations) into one row."""
    timings, lap = stage_clock(progress, f"bench learning seed {seed}")
    setup = prepare_seed(config, seed, base, out, lap, progress=progress)
    histories: dict[str, list[dict[str, float]]] = {}
    for mode in ("async", "sync") if config.sync else ("async",):
        rl = copy.deepcopy(config.rl)
        rl.mode = mode
        histories[mode] = setup.train(rl, out / f"rl-{mode}", config.env.id, seed=seed, progress=progress)
        lap(f"rl {mode}")

    models = {
        "warm": setup.warm,
        **{mode: out / f"rl-{mode}" / "checkpoints" / f"step-{config.rl.steps:05d}" for mode in histories},
    }
    rows = {
        policy: held_out_samples(config, model, out / f"eval-{policy}", seed, progress=progress)
        for policy, model in models.items()
    }
    lap("evaluate")
    return seed_row(
        seed,
        key,
        rows,
        hop_counts(config, seed),
        histories,
        config.eval.k,
        demos=setup.demos,
        demo_tasks=len(setup.demo_tasks),
        rl_tasks=len(setup.rl_tasks),
        timings=timings,
    )


def seed_row(
    seed: int,
    key: str,
    rows: dict[str, list[dict[str, Any]]],
    hop_of: dict[str, int],
    histories: dict[str, list[dict[str, float]]],
    k: int,
    **extra: Any,
) -> dict[str, Any]:
    """One seed's figures from its evaluation samples and RL histories (all of them recomputable from those)."""
    policies = {policy: policy_metrics(samples, hop_of, k) for policy, samples in rows.items()}
    per_question = {policy: per_question_reward(samples) for policy, samples in rows.items()}
    gains = gains_by_hop(per_question["warm"], per_question["async"], hop_of, seed=seed)
    row = {
        "seed": seed,
        "fingerprint": key,
        "k": k,
        **extra,
        "policies": policies,
        "gain": gains,
        "per_question": per_question,
        "hops": {t: hop_of[t] for t in per_question["warm"]},
        "rl": {mode: curve(history) for mode, history in histories.items()},
    }
    if "sync" in rows:
        row["async_vs_sync"] = async_vs_sync(per_question, hop_of, histories, seed=seed)
    return row


def policy_metrics(rows: list[dict[str, Any]], hop_of: dict[str, int], k: int) -> dict[str, dict[str, float]]:
    """Avg@k, Pass@k and behaviour per episode, over all questions and per hop count ("all", "1", "2", ...)."""

    def reduce(subset: list[dict[str, Any]]) -> dict[str, float]:
        m = summarize([sample_of(r) for r in subset], k)
        keep = (f"avg@{k}/reward", f"avg@{k}/correct", f"pass@{k}/correct", "tasks", *BEHAVIOUR)
        return {name: float(m[name]) for name in keep}

    out = {"all": reduce(rows)}
    for hop in sorted({hop_of[r["task_id"]] for r in rows}):
        out[str(hop)] = reduce([r for r in rows if hop_of[r["task_id"]] == hop])
    return out


def _per_question_mean(rows: list[dict[str, Any]], value: Callable[[dict[str, Any]], float]) -> dict[str, float]:
    """Mean `value` of each question's k samples, by task id."""
    by_task: dict[str, list[float]] = {}
    for row in rows:
        by_task.setdefault(row["task_id"], []).append(float(value(row)))
    return {task: sum(v) / len(v) for task, v in sorted(by_task.items())}


def per_question_reward(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Mean reward of each question's k samples."""
    return _per_question_mean(rows, lambda row: row["reward"])


def per_question_calls(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Mean tool calls (searches + page accesses) of each question's k samples: the long-horizon claim's behaviour,
    paired by question like the reward so its change gets an interval."""
    return _per_question_mean(rows, lambda row: row["stats"]["searches"] + row["stats"]["accesses"])


def gains_by_hop(
    before: dict[str, float], after: dict[str, float], hop_of: dict[str, int], *, seed: int
) -> dict[str, dict[str, Any]]:
    """after - before paired by question (eval compare's bootstrap over questions), overall and per hop count."""
    out = {"all": paired_delta(before, after, seed=seed)}
    for hop in sorted(set(hop_of[t] for t in before)):
        keep = [t for t in before if hop_of[t] == hop]
        out[str(hop)] = paired_delta({t: before[t] for t in keep}, {t: after[t] for t in keep}, seed=seed)
    return out


def curve(history: list[dict[str, float]]) -> list[dict[str, float]]:
    """The RL run's per-step training figures (reward, searches, turns, wall clock since rollouts began)."""
    keys = ("step", "elapsed_s", "episode/reward", "episode/searches", "episode/turns", "episode/accesses")
    return [{k: float(h[k]) for k in keys if k in h} for h in history]


def async_vs_sync(
    per_question: dict[str, dict[str, float]],
    hop_of: dict[str, int],
    histories: dict[str, list[dict[str, float]]],
    *,
    seed: int,
    window: int = 10,
) -> dict[str, Any]:
    """Async against sync: held-out reward at equal learner steps (paired by question), and training reward and
    steps reached at equal wall time (the shorter run's duration; no held-out evaluation at that point)."""
    equal_steps = gains_by_hop(per_question["sync"], per_question["async"], hop_of, seed=seed)
    span = min(histories["async"][-1]["elapsed_s"], histories["sync"][-1]["elapsed_s"])
    at_time = {}
    for mode, history in histories.items():
        reached = [h for h in history if h["elapsed_s"] <= span + 1e-9]
        last = reached[-window:]
        at_time[mode] = {
            "steps": len(reached),
            "train_reward": sum(h["episode/reward"] for h in last) / len(last) if last else None,
            "total_s": history[-1]["elapsed_s"],
        }
    return {
        "equal_steps": equal_steps,
        "equal_wall_time": {"seconds": span, **at_time},
        "speedup": histories["sync"][-1]["elapsed_s"] / histories["async"][-1]["elapsed_s"],
    }


def pooled_report(rows: list[dict[str, Any]], config: LearningConfig) -> dict[str, Any]:
    """Per-seed rows (without the per-question data) and the pooled figures over seeds."""
    if not rows:
        raise ValueError("no finished seed to report")
    k = rows[0]["k"]
    hop_keys = sorted({h for r in rows for h in r["gain"] if h != "all"}, key=int)

    def deltas(before: str, after: str, hop: str) -> dict[int, list[float]]:
        return {
            r["seed"]: [
                r["per_question"][after][t] - r["per_question"][before][t]
                for t in r["per_question"][before]
                if hop == "all" or str(r["hops"][t]) == hop
            ]
            for r in rows
        }

    def pooled(before: str, after: str) -> dict[str, Any]:
        out = hierarchical_bootstrap(deltas(before, after, "all"), resamples=config.bootstrap_resamples)
        out["hops"] = {
            h: hierarchical_bootstrap(deltas(before, after, h), resamples=config.bootstrap_resamples) for h in hop_keys
        }
        return out

    def mean_over_seeds(policy: str, hop: str) -> dict[str, float]:
        present = [r["policies"][policy][hop] for r in rows if hop in r["policies"].get(policy, {})]
        return {name: sum(p[name] for p in present) / len(present) for name in present[0]} if present else {}

    policies = sorted({p for r in rows for p in r["policies"]}, key=POLICIES.index)
    gain = pooled("warm", "async")
    report: dict[str, Any] = {
        "benchmark": "searchgym bench learning",
        "preset": config.preset,
        "k": k,
        "machine": machine(torch_threads=config.torch_threads),
        "config": OmegaConf.to_container(OmegaConf.structured(config)),
        "shared": "the copy-pretrained base model (tokenizer + induction heads) is built once from world "
        f"base_seed={config.base_seed} and shared; world, demos, warm start, RL and evaluation vary by seed",
        "seeds": [{key: value for key, value in r.items() if key not in ("per_question", "hops")} for r in rows],
        "pooled": {**gain, "policies": {p: {h: mean_over_seeds(p, h) for h in ["all", *hop_keys]} for p in policies}},
    }
    if all("sync" in r["per_question"] for r in rows):
        report["pooled"]["async_vs_sync"] = {
            "equal_steps": pooled("sync", "async"),
            "speedup_mean": sum(r["async_vs_sync"]["speedup"] for r in rows) / len(rows),
            "equal_wall_time": {
                mode: {
                    "steps_mean": sum(r["async_vs_sync"]["equal_wall_time"][mode]["steps"] for r in rows) / len(rows),
                    "train_reward_mean": _mean(
                        [r["async_vs_sync"]["equal_wall_time"][mode]["train_reward"] for r in rows]
                    ),
                }
                for mode in ("async", "sync")
            },
        }
    return report


def _mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def _check_row(row: Any) -> None:
    for name in ("seed", "fingerprint", "per_question", "hops", "policies", "gain", "k"):
        row[name]


def format_report(report: dict[str, Any]) -> str:
    """The pooled gain per hop, and each seed's, in a few lines."""
    k, pooled = report["k"], report["pooled"]

    def line(label: str, g: dict[str, Any]) -> str:
        verdict = "interval excludes zero" if g["significant"] else "interval includes zero"
        return f"{label}: {g['gain']:+.3f} (95% {g['ci95_low']:+.3f} to {g['ci95_high']:+.3f}, {verdict})"

    lines = [
        f"RL gain in held-out reward (avg@{k}), pooled over {pooled['seeds']} seeds x questions, "
        f"hierarchical bootstrap:",
        "  " + line("all", pooled),
    ]
    lines += ["  " + line(count_label(report, hop), g) for hop, g in pooled["hops"].items()]
    for row in report["seeds"]:
        lines.append(
            f"  seed {row['seed']}: "
            + ", ".join(f"{hop}: {g['before']:.3f} -> {g['after']:.3f}" for hop, g in row["gain"].items())
        )
    if "async_vs_sync" in pooled:
        a = pooled["async_vs_sync"]
        lines.append(
            "  "
            + line("async minus sync at equal steps", a["equal_steps"])
            + f"; sync/async wall time {a['speedup_mean']:.2f}x"
        )
    return "\n".join(lines)


def plot_learning(report: dict[str, Any], path: Path) -> None:
    """Held-out reward before/after RL per seed and hop count, with the pooled gain and its interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = report["k"]
    hops = ["all", *report["pooled"]["hops"]]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.0), dpi=120)
    ax = axes[0]
    for i, hop in enumerate(hops):
        for j, row in enumerate(report["seeds"]):
            g = row["gain"].get(hop)
            if g is None:
                continue
            x = i + (j - (len(report["seeds"]) - 1) / 2) * 0.08
            ax.plot([x, x], [g["before"], g["after"]], color="tab:green" if g["after"] >= g["before"] else "tab:red")
            ax.plot([x], [g["after"]], marker="o", markersize=3, color="black")
    ax.set_xticks(range(len(hops)), [h if h == "all" else count_label(report, h) for h in hops])
    ax.set_ylabel(f"held-out reward (avg@{k})")
    ax.set_title("per seed: warm start -> async RL")
    ax = axes[1]
    pooled = [report["pooled"], *report["pooled"]["hops"].values()]
    labels = [f"RL - warm\n{h}" for h in hops]
    if "async_vs_sync" in report["pooled"]:
        pooled.append(report["pooled"]["async_vs_sync"]["equal_steps"])
        labels.append("async - sync\nequal steps")
    for i, g in enumerate(pooled):
        ax.errorbar(
            [i], [g["gain"]], yerr=[[g["gain"] - g["ci95_low"]], [g["ci95_high"] - g["gain"]]], fmt="o", capsize=4
        )
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_title(f"pooled over {report['pooled']['seeds']} seeds, 95% hierarchical bootstrap")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


@dataclass
class LearningBenchCommand:
    """`searchgym bench learning`: the seeds, the preset and overrides of its `LearningConfig`, and the report."""

    seeds: str = setting("0,1,2,3,4", help="comma-separated seeds; finished ones are reused")
    preset: str = setting(
        "headroom",
        help="headroom (demos on 1-hop and a tenth of the rest, RL on 1- and 2-hop), quickstart, deep "
        "(issue 29 claim 1: demos on 1-2 hops, RL on 2-3 hops with 16 turns and exact match), or smollm2 (the "
        "real-model quickstart, SmolLM2-135M-Instruct, over seeds)",
    )
    out: Path = setting(Path("results/bench_learning.json"), help="the report JSON")
    overrides: list[str] = setting(
        default_factory=list, help="config overrides, e.g. rl.steps=20 out_dir=runs/bench_learning"
    )


def learning_bench_command(command: LearningBenchCommand) -> None:
    config = load_learning_config(command.overrides, preset=command.preset)
    run_learning_bench(config, seed_list(command.seeds), out=command.out)
