"""`searchgym bench learning` at toy scale through the real pipeline, and its hierarchical bootstrap on hand-made
data."""

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchgym.bench.bootstrap import hierarchical_bootstrap
from searchgym.bench.learning import load_learning_config, run_learning_bench
from searchgym.cli import main
from tests.conftest import SMALL

# Two seeds of a toy run: tiny model, a few demonstrations, two RL steps per mode, 10 held-out questions (both hop
# counts for seeds 0 and 1).
TOY = [
    "torch_threads=1",
    f"env.kwargs.size={SMALL['size']}",
    f"env.kwargs.n_tasks={SMALL['n_tasks']}",
    "env.kwargs.top_k=1",
    "env.kwargs.doc_chars=120",
    "max_demos=6",
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.vocab_size=2048",
    "model.init_std=0.3",
    "copy.steps=2",
    "copy.batch_size=4",
    "sft.epochs=2",
    "sft.lr=1e-2",
    "sft.warmup_steps=1",
    "rl.steps=2",
    "rl.rollout.group_size=2",
    "rl.rollout.batch_size=2",
    "rl.rollout.max_new_tokens=12",
    "rl.learner.drop_no_spread=false",
    "eval.max_tasks=10",
    "eval.k=2",
    "eval.max_new_tokens=12",
    "bootstrap_resamples=300",
]
SEEDS = [0, 1]


def samples(seed_dir: Path, policy: str) -> list[dict]:
    return [json.loads(line) for line in (seed_dir / f"eval-{policy}" / "samples.jsonl").read_text().splitlines()]


def per_question(rows: list[dict]) -> dict[str, float]:
    by_task: dict[str, list[float]] = {}
    for row in rows:
        by_task.setdefault(row["task_id"], []).append(row["reward"])
    return {t: float(np.mean(v)) for t, v in by_task.items()}


def comparable(rows: list[dict]) -> list[dict]:
    """Samples in (task, sample) order without wall-clock fields and behaviour logprobs (batching moves their last
    bits, never a token: tests/test_determinism.py)."""

    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in ("generate_seconds", "env_seconds", "logprobs")}
        return [strip(v) for v in x] if isinstance(x, list) else x

    return [strip(r) for r in sorted(rows, key=lambda r: (r["task_id"], r["sample"]))]


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    root = tmp_path_factory.mktemp("learning")
    config = load_learning_config([f"out_dir={root / 'runs'}", *TOY])
    report = run_learning_bench(config, SEEDS, out=root / "bench_learning.json", progress=False)
    return root, config, report


def test_the_report_has_per_seed_and_pooled_figures_per_hop(bench):
    root, _, report = bench
    assert json.loads((root / "bench_learning.json").read_text()) == report
    assert (root / "bench_learning.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [row["seed"] for row in report["seeds"]] == SEEDS
    for row in report["seeds"]:
        assert set(row["policies"]) == {"warm", "async", "sync"}
        assert {"all", "1", "2"} <= set(row["gain"])
        assert len(row["rl"]["async"]) == len(row["rl"]["sync"]) == 2
        assert set(row["async_vs_sync"]) == {"equal_steps", "equal_wall_time", "speedup"}
    pooled = report["pooled"]
    assert pooled["ci95_low"] <= pooled["gain"] <= pooled["ci95_high"]
    assert set(pooled["hops"]) == {"1", "2"} and pooled["seeds"] == 2
    for hop in pooled["hops"].values():
        assert hop["ci95_low"] <= hop["gain"] <= hop["ci95_high"]
    assert {"equal_steps", "equal_wall_time", "speedup_mean"} <= set(pooled["async_vs_sync"])


def test_the_figures_are_the_stored_samples(bench):
    root, config, report = bench
    deltas, two_hop = [], []
    hops = {}
    for seed in SEEDS:
        seed_dir = Path(config.out_dir) / f"seed-{seed}"
        warm, rl = per_question(samples(seed_dir, "warm")), per_question(samples(seed_dir, "async"))
        assert set(warm) == set(rl) and warm
        stored = next(
            r for r in (json.loads(line) for line in (Path(config.out_dir) / "seeds.jsonl").open()) if r["seed"] == seed
        )
        hops.update({(seed, t): h for t, h in stored["hops"].items()})
        deltas += [rl[t] - warm[t] for t in warm]
        two_hop += [rl[t] - warm[t] for t in warm if stored["hops"][t] == 2]
        row = next(r for r in report["seeds"] if r["seed"] == seed)
        for policy in ("warm", "async", "sync"):
            rows = samples(seed_dir, policy)
            assert row["policies"][policy]["all"]["avg@2/reward"] == pytest.approx(np.mean([r["reward"] for r in rows]))
            one = [r for r in rows if stored["hops"][r["task_id"]] == 1]
            if one:
                assert row["policies"][policy]["1"]["searches"] == pytest.approx(
                    np.mean([r["stats"]["searches"] for r in one])
                )
    assert set(hops.values()) <= {1, 2}
    assert report["pooled"]["gain"] == pytest.approx(np.mean(deltas))
    assert report["pooled"]["hops"]["2"]["gain"] == pytest.approx(np.mean(two_hop))


def test_a_rerun_reuses_finished_seeds_and_repeats_the_warm_start(bench, tmp_path):
    root, config, report = bench
    seeds_file = Path(config.out_dir) / "seeds.jsonl"
    before = seeds_file.read_text()
    weights = Path(config.out_dir) / "seed-0" / "sft-model" / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    again = run_learning_bench(config, SEEDS, out=tmp_path / "again.json", progress=False)
    assert seeds_file.read_text() == before and weights.stat().st_mtime_ns == stamp  # nothing was rerun
    assert again["seeds"] == report["seeds"]

    # seed 0 from scratch, in a fresh directory: the world, demos, warm start and its evaluation repeat exactly
    fresh = load_learning_config([f"out_dir={tmp_path / 'fresh'}", *TOY, "sync=false"])
    rerun = run_learning_bench(fresh, [0], out=tmp_path / "fresh.json", progress=False)
    assert rerun["seeds"][0]["policies"]["warm"] == report["seeds"][0]["policies"]["warm"]
    assert comparable(samples(tmp_path / "fresh" / "seed-0", "warm")) == comparable(
        samples(Path(config.out_dir) / "seed-0", "warm")
    )
    assert (tmp_path / "fresh" / "seed-0" / "demos.jsonl").read_text() == (
        Path(config.out_dir) / "seed-0" / "demos.jsonl"
    ).read_text()


def test_a_fresh_clone_with_the_committed_seed_log_runs_no_seed_again(bench, tmp_path):
    root, config, report = bench
    kept = root / "bench_learning.seeds.jsonl"  # the copy beside the results, which is committed with them
    assert kept.read_text() == (Path(config.out_dir) / "seeds.jsonl").read_text() != ""
    clone = tmp_path / "clone" / "results"
    clone.mkdir(parents=True)
    (clone / "bench_learning.seeds.jsonl").write_text(kept.read_text())
    fresh = load_learning_config([f"out_dir={tmp_path / 'clone' / 'runs'}", *TOY])
    again = run_learning_bench(fresh, SEEDS, out=clone / "bench_learning.json", progress=False)
    assert again["seeds"] == report["seeds"] and again["pooled"] == report["pooled"]
    assert not list((tmp_path / "clone" / "runs").glob("seed-*"))  # no world, warm start or RL was built again
    assert (tmp_path / "clone" / "runs" / "seeds.jsonl").read_text() == kept.read_text()  # carried into the run
    # a copy holding another configuration's seeds is refused, and the run folder is left as it was
    other = load_learning_config([f"out_dir={tmp_path / 'other'}", *TOY, "rl.steps=3"])
    with pytest.raises(ValueError, match="another configuration"):
        run_learning_bench(other, SEEDS, out=clone / "bench_learning.json", progress=False)
    assert not (tmp_path / "other" / "seeds.jsonl").exists()


def test_demonstrated_and_rl_tasks_split_by_hop_count(small_bundle, tmp_path):
    from searchgym.bench.learning import _demo_tasks
    from searchgym.pipeline.stages import make_env

    config = load_learning_config([f"out_dir={tmp_path}", *TOY, "max_demos=1000", "hops.rl=[2]", "hops.rl_demos=0"])
    env = make_env(config.env.id, {**config.env.kwargs, "seed": 0, "hops": [1, 2]}, "train")
    demos, rl = _demo_tasks(env, config)
    assert demos and rl and {t.metadata["hops"] for t in demos} == {1} and {t.metadata["hops"] for t in rl} == {2}
    assert len(demos) == sum(t.metadata["hops"] == 1 for t in env.tasks)  # every 1-hop train task (fraction 1)
    seeded = load_learning_config([f"out_dir={tmp_path}", *TOY, "max_demos=1000", "hops.rl=[2]", "hops.rl_demos=0.25"])
    more, fewer = _demo_tasks(env, seeded)
    shown = [t for t in more if t.metadata["hops"] == 2]
    assert shown == rl[: round(0.25 * len(rl))] and fewer == rl[len(shown) :]  # disjoint: RL never trains on a demo
    with pytest.raises(ValueError, match="rl_demos"):
        load_learning_config(["hops.rl_demos=1.5"])


def test_rows_of_another_configuration_are_refused(bench):
    _, config, _ = bench
    other = load_learning_config([f"out_dir={config.out_dir}", *TOY, "rl.steps=3"])
    with pytest.raises(ValueError, match="another configuration"):
        run_learning_bench(other, SEEDS, out=Path(config.out_dir) / "x.json", progress=False)


def test_settings_added_later_keep_older_rows_at_their_default_and_part_them_when_used():
    from searchgym.bench.learning import LATER_SETTINGS, fingerprint
    from searchgym.settings import settings_dict

    config = load_learning_config(preset="smollm2")
    older = settings_dict(config)  # what a config written before the settings existed held
    for path in LATER_SETTINGS:
        holder = older
        for key in path[:-1]:
            holder = holder[key]
        del holder[path[-1]]
    assert fingerprint(config) == fingerprint_of(older)
    assert fingerprint(load_learning_config(["rl.learner.autocast=bf16"], preset="smollm2")) != fingerprint(config)
    trained = load_learning_config(["rl.learner.trainable_layers=4"], preset="smollm2")
    assert fingerprint(trained) != fingerprint(config)


def fingerprint_of(data):
    import hashlib

    data = {k: v for k, v in data.items() if k not in ("out_dir", "seed")}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def test_bad_input_is_a_clear_error(tmp_path, capsys):
    assert main(["bench", "learning", "--seeds", "0,x", "--out", str(tmp_path / "r.json")]) == 2
    assert "--seeds takes comma-separated integers" in capsys.readouterr().err
    assert main(["bench", "learning", "--preset", "nope", "--out", str(tmp_path / "r.json")]) == 2
    assert "unknown preset 'nope'" in capsys.readouterr().err
    assert main(["bench", "learning", "--out", str(tmp_path / "r.json"), "rl.stepz=3"]) == 2
    assert "rl.stepz" in capsys.readouterr().err
    with pytest.raises(ValueError, match="distinct"):
        run_learning_bench(load_learning_config([f"out_dir={tmp_path}"]), [1, 1], out=tmp_path / "r.json")


# --- the hierarchical bootstrap ---------------------------------------------------------------------------------------

groups = st.dictionaries(
    st.integers(0, 20), st.lists(st.floats(-1, 1, allow_nan=False), min_size=1, max_size=12), min_size=1, max_size=6
)


@settings(max_examples=60, deadline=None)
@given(groups)
def test_the_interval_contains_the_pooled_mean(data):
    result = hierarchical_bootstrap(data, resamples=400)
    values = [v for vs in data.values() for v in vs]
    assert result["gain"] == pytest.approx(np.mean(values))
    assert result["ci95_low"] - 1e-9 <= result["gain"] <= result["ci95_high"] + 1e-9
    assert result["seeds"] == len(data) and result["questions"] == len(values)


@given(st.floats(-1, 1, allow_nan=False), st.lists(st.integers(1, 10), min_size=1, max_size=5))
@settings(max_examples=30, deadline=None)
def test_zero_variance_gives_a_zero_width_interval(value, sizes):
    result = hierarchical_bootstrap({seed: [value] * n for seed, n in enumerate(sizes)}, resamples=200)
    assert result["ci95_high"] - result["ci95_low"] == pytest.approx(0.0, abs=1e-12)
    assert result["gain"] == pytest.approx(value) and not (result["significant"] and value == 0)


def test_seeds_that_disagree_widen_the_interval_more_than_questions_alone_would():
    # two seeds, each internally consistent, disagreeing with each other: the seed level carries the spread
    data = {0: [0.3] * 50, 1: [-0.1] * 50}
    hierarchical = hierarchical_bootstrap(data)
    assert hierarchical["gain"] == pytest.approx(0.1)
    assert hierarchical["ci95_low"] == pytest.approx(-0.1) and hierarchical["ci95_high"] == pytest.approx(0.3)
    assert not hierarchical["significant"]
    one_seed = hierarchical_bootstrap({0: [0.3] * 25 + [-0.1] * 25})  # same values, as if from one seed
    assert one_seed["ci95_high"] - one_seed["ci95_low"] < 0.5 * (hierarchical["ci95_high"] - hierarchical["ci95_low"])


def test_the_bootstrap_refuses_empty_or_non_finite_data():
    with pytest.raises(ValueError, match="empty"):
        hierarchical_bootstrap({0: []})
    with pytest.raises(ValueError, match="finite"):
        hierarchical_bootstrap({0: [float("nan")]})


def test_the_deep_preset_demonstrates_shallow_questions_and_trains_rl_on_deep_ones(small_bundle, tmp_path):
    """Issue 29 claim 1's setting: its first stages (world, split, oracle demonstrations) run, the warm start sees
    only 1- and 2-hop questions, RL and evaluation reach 3-hop ones, with a 16-turn budget and exact match."""
    from searchgym.bench.learning import _demo_tasks
    from searchgym.pipeline.stages import make_demos, make_env

    # a small world (max_demos scaled down with it, so undemonstrated 2-hop questions are left for RL, as at scale)
    small = [f"env.kwargs.size={SMALL['size']}", f"env.kwargs.n_tasks={SMALL['n_tasks']}", "max_demos=20"]
    config = load_learning_config([f"out_dir={tmp_path}", *small], preset="deep")
    assert config.preset == "deep" and config.env.kwargs["max_turns"] >= 16 and config.env.kwargs["judge"] == "em"
    hops = sorted(set(config.hops.demos) | set(config.hops.rl))
    env = make_env(config.env.id, {**config.env.kwargs, "seed": 0, "hops": hops}, "train")
    demos, rl = _demo_tasks(env, config)
    assert {t.metadata["hops"] for t in demos} == {1, 2} and {t.metadata["hops"] for t in rl} == {2, 3}
    assert len(demos) <= config.max_demos and not {t.id for t in demos} & {t.id for t in rl}
    assert env.unwrapped.max_turns == 16 and env.unwrapped.judge.name == "em"
    chats = make_demos(env, demos[:8], tmp_path / "demos.jsonl")
    assert len(chats) == 8  # the oracle solves the shallow questions it demonstrates
    test = make_env(config.env.id, {**config.env.kwargs, "seed": 0, "hops": config.hops.eval, "split": "test"}, "test")
    assert test.tasks and {t.metadata["hops"] for t in test.tasks} == {2, 3}


def test_each_stage_of_a_seed_names_its_seed_in_its_bar(small_bundle, tmp_path, monkeypatch):
    import searchgym.bench.learning as learning

    labels: dict[str, str] = {}

    def stage(name):
        def record(*args, progress_label=None, **kwargs):
            labels[name] = progress_label or args[-1].label  # sft's keyword, or the stages' StageRun
            if name == "evaluate":
                Path(args[1]).mkdir(parents=True, exist_ok=True)
                (Path(args[1]) / "samples.jsonl").write_text("")
            return []

        return record

    for name, function in (("sft", "sft"), ("rl", "run_rl"), ("evaluate", "evaluate_policy")):
        monkeypatch.setattr(learning, function, stage(name))
    config = load_learning_config([f"out_dir={tmp_path}", *TOY])
    setup = learning.prepare_seed(config, 3, tmp_path / "base", tmp_path / "seed-3", lambda stage: None, progress=True)
    setup.train(config.rl, tmp_path / "seed-3" / "rl-async", config.env.id, seed=3, progress=True)
    learning.held_out_samples(config, tmp_path / "m", tmp_path / "seed-3" / "eval-warm", 3, progress=True)
    assert labels == {"sft": "seed 3: warm start", "rl": "seed 3: RL (async)", "evaluate": "seed 3: evaluate, warm"}


def test_a_finished_warm_start_is_reused_by_a_resumed_seed_and_by_runs_that_differ_only_in_rl(
    small_bundle, tmp_path, monkeypatch
):
    """SFT is the costly part of a real-model seed (7 minutes): a resumed seed, and a sibling run under the same runs
    folder whose settings differ only in RL or evaluation (staleness and shaping's arms), take the finished warm
    start; another SFT setting, another seed or a cut-short mark trains a new one."""
    import searchgym.bench.learning as learning

    trained: list[Path] = []

    def fake_sft(base, chats, out, config, **kwargs):
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "model.safetensors").write_text(f"lr {config.lr} seed {config.seed}")
        trained.append(Path(out))

    monkeypatch.setattr(learning, "sft", fake_sft)
    runs = tmp_path / "runs"

    def prepare(name: str, seed: int, *extra: str) -> Path:
        config = load_learning_config([f"out_dir={runs / name}", *TOY, *extra])
        out = runs / name / f"seed-{seed}"
        return learning.prepare_seed(config, seed, tmp_path / "base", out, lambda stage: None, progress=False).warm

    first = prepare("staleness", 3)
    assert trained == [first] and first == runs / "staleness" / "seed-3" / "sft-model"
    assert prepare("staleness", 3) == first  # resumed
    assert prepare("shaping", 3, "rl.learner.lr=5e-4", "rl.rollout.max_staleness=0", "eval.k=4") == first
    assert len(trained) == 1
    other_sft = prepare("other", 3, "sft.lr=5e-3")
    other_seed = prepare("staleness", 4)
    assert trained == [first, other_sft, other_seed] and len({first, other_sft, other_seed}) == 3
    (other_sft / learning.WARM_MARK).write_text('{"fingerpr')  # a mark cut short
    assert prepare("other", 3, "sft.lr=5e-3") == other_sft and len(trained) == 4
    assert json.loads((other_sft / learning.WARM_MARK).read_text())["seed"] == 3


def test_questions_can_be_chosen_by_their_proven_least_number_of_tool_calls(tmp_path):
    """`hops.by=min_calls`: demonstrations, RL and the held-out questions come from SyntheticQA's min_calls pools by
    proven minimum (a question whose hops can be skipped by a lucky search is not a long-horizon question)."""
    from searchgym.bench.learning import _demo_tasks, count_label, hop_counts
    from searchgym.pipeline.stages import make_env

    by_calls = [
        "hops.by=min_calls",
        "hops.demos=[1]",
        "hops.rl=[2,3]",
        "hops.eval=[2,3]",
        "hops.rl_demos=0",
        "env.kwargs.top_k=5",  # the proof's settings (mincalls.PROOF_ENV)
        "env.kwargs.doc_chars=60",
        "env.kwargs.min_calls_tasks=40",
    ]
    config = load_learning_config([f"out_dir={tmp_path}", *TOY, *by_calls])
    assert config.hops.env_kwargs(config.hops.eval) == {"min_calls": [2, 3]}
    env = make_env(config.env.id, {**config.env.kwargs, "seed": 0, **config.hops.env_kwargs([1, 2, 3])}, "train")
    demos, rl = _demo_tasks(env, config)
    assert demos and {t.metadata["min_calls"] for t in demos} == {1}
    assert rl and {t.metadata["min_calls"] for t in rl} <= {2, 3} and not {t.id for t in rl} & {t.id for t in demos}
    held = hop_counts(config, 0)
    test = make_env(config.env.id, {**config.env.kwargs, "seed": 0, "min_calls": [2, 3]}, "test")
    assert held == {t.id: t.metadata["min_calls"] for t in test.tasks} and set(held.values()) <= {2, 3} and held
    assert not set(held) & {t.id for t in env.tasks}  # held out: none of them is a train question
    # reports name these questions by their calls, not their hops
    assert count_label({"config": {"hops": {"by": "min_calls"}}}, 3) == "3-call"
    assert count_label({"config": {"hops": {"by": "hops"}}}, 3) == count_label({}, "3") == "3-hop"
    # the default stays the hop count, and its fingerprint is the one committed results were written under
    assert load_learning_config([*TOY]).hops.env_kwargs([2, 1]) == {"hops": [1, 2]}
    for bad, message in (
        ("hops.rl=[2,4]", "no gap"),
        ("hops.rl=[13]", "between 1 and 12"),
    ):
        with pytest.raises(ValueError, match=message):
            load_learning_config([*TOY, *by_calls, bad])
    with pytest.raises(ValueError, match="hop counts between 1 and 4"):
        load_learning_config([*TOY, "hops.rl=[5]"])
    with pytest.raises(ValueError, match="hops.by"):
        load_learning_config([*TOY, "hops.by=turns"])


def test_the_new_hops_by_setting_leaves_committed_fingerprints_alone():
    """Rows and warm starts written before `hops.by` existed keep their fingerprints (it is dropped at its default)."""
    from searchgym.bench.learning import fingerprint, warm_start_fingerprint

    config = load_learning_config([], "smollm2")
    rows = json.loads(Path("results/bench_learning_smollm2.json").read_text())["seeds"]
    assert {r["fingerprint"] for r in rows} == {fingerprint(config)}
    moved = load_learning_config(["hops.by=min_calls", "hops.rl=[1]", "hops.eval=[1]"], "smollm2")
    assert fingerprint(moved) != fingerprint(config)
    assert warm_start_fingerprint(moved, 0) != warm_start_fingerprint(config, 0)
