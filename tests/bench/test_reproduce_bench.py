"""`searchgym bench reproduce` at toy scale through the real pipeline: arms from one warm start per seed, resumable
per (seed, arm), refused when the configuration differs, pooled per arm with per-step curves."""

import dataclasses
import functools
import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchgym.bench import reproduce
from searchgym.bench.reproduce import (
    CLAIMS,
    WARM,
    UnitRules,
    arm_fingerprint,
    load_reproduce_config,
    run_reproduce,
    select_arms,
)
from searchgym.bench.reproduce_status import Deadline, format_status, hours_left, parse_stop_by, unit_status
from searchgym.cli import main
from searchgym.pipeline.stages import configure_rl, resumable_step
from searchgym.trainers.config import EnvConfig, config_dict, load_config
from searchgym.trainers.run.checkpoint import latest_checkpoint, slim_finished_run
from tests.bench.test_learning_bench import TOY

# two arms of the staleness claim (fast: sync, one step apart in objective) on the toy scale
ARMS = {
    "eta0-decoupled": CLAIMS["staleness"].arms["eta0-decoupled"],
    "eta0-plain": CLAIMS["staleness"].arms["eta0-plain"],
}
SEEDS = [0, 1]


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    root = tmp_path_factory.mktemp("reproduce")
    config = load_reproduce_config("staleness", [f"out_dir={root / 'runs'}", *TOY, "rl.learner.minibatches=2"])
    report = run_reproduce("staleness", config, SEEDS, out=root / "r.json", arms=ARMS, progress=False)
    return root, config, report


def test_the_report_pools_every_arm_against_the_baseline_with_curves(bench):
    root, config, report = bench
    assert json.loads((root / "r.json").read_text()) == report and (root / "r.png").stat().st_size > 0
    assert list(report["pooled"]) == [WARM, *ARMS] and report["seeds"] == SEEDS
    assert report["baseline"] == "eta0-decoupled" and report["commit"] and report["machine"]["cpus"]
    assert report["row_commits"] == [report["commit"]] and all(r["commit"] for r in report["rows"])
    assert {(r["seed"], r["arm"]) for r in report["rows"]} == {(s, a) for s in SEEDS for a in [WARM, *ARMS]}
    plain = report["pooled"]["eta0-plain"]
    assert plain["vs_baseline"]["seeds"] == 2 and plain["vs_warm"]["seeds"] == 2
    assert "vs_baseline" not in report["pooled"]["eta0-decoupled"] and "vs_warm" not in report["pooled"][WARM]
    # per-step curves of each RL arm: one point per learner step, with tool calls per episode
    for arm in ARMS:
        points = report["pooled"][arm]["curve"]
        assert [p["step"] for p in points] == [1.0, 2.0]
        assert all(p["episode/tool_calls"] == p["episode/searches"] + p["episode/accesses"] for p in points)
    assert report["pooled"][WARM]["curve"] == []
    # each row's timings are the seed's setup and its own arm's laps, not those of arms run before it
    for row in report["rows"]:
        laps = {k for k in row["timings"] if k.startswith(("rl ", "evaluate "))}
        assert laps == ({f"rl {row['arm']}"} if row["arm"] != WARM else set()) | {f"evaluate {row['arm']}"}
        assert {"world", "warm start"} <= set(row["timings"])
    # the pooled difference is the mean over (seed, question) of the stored per-question rewards
    rows = [json.loads(line) for line in (Path(config.out_dir) / "arms.jsonl").read_text().splitlines()]
    by = {(r["seed"], r["arm"]): r["per_question"] for r in rows}
    deltas = [by[s, "eta0-plain"][t] - by[s, "eta0-decoupled"][t] for s in SEEDS for t in by[s, "eta0-decoupled"]]
    assert plain["vs_baseline"]["gain"] == pytest.approx(sum(deltas) / len(deltas))
    # tool calls per episode carry a paired interval too (long horizon's claim), from each question's samples
    samples = [json.loads(line) for line in (Path(config.out_dir) / "seed-0/eval-eta0-plain/samples.jsonl").open()]
    calls = {
        t: [s["stats"]["searches"] + s["stats"]["accesses"] for s in samples if s["task_id"] == t] for t in by[0, WARM]
    }
    assert rows[[(r["seed"], r["arm"]) for r in rows].index((0, "eta0-plain"))]["per_question_calls"] == pytest.approx(
        {t: sum(c) / len(c) for t, c in calls.items()}
    )
    by_calls = {(r["seed"], r["arm"]): r["per_question_calls"] for r in rows}
    moved = [by_calls[s, "eta0-plain"][t] - by_calls[s, WARM][t] for s in SEEDS for t in by_calls[s, WARM]]
    assert plain["tool_calls_vs_warm"]["gain"] == pytest.approx(sum(moved) / len(moved))
    assert (
        plain["tool_calls_vs_warm"]["ci95_low"]
        <= plain["tool_calls_vs_warm"]["gain"]
        <= plain["tool_calls_vs_warm"]["ci95_high"]
    )
    assert "tool_calls_vs_warm" not in report["pooled"][WARM]
    # per hop count, the mean over seeds of each row's own per-hop figures
    for arm, pooled in report["pooled"].items():
        mine = [r for r in rows if r["arm"] == arm]
        assert set(pooled["by_hops"]) == set(mine[0]["policy"]) - {"all"} != set()
        for hop, figures in pooled["by_hops"].items():
            want = sum(r["policy"][hop]["avg@2/reward"] for r in mine) / len(mine)
            assert figures["avg@2/reward"] == pytest.approx(want)


def test_a_rerun_skips_finished_seed_arms_and_runs_only_new_ones(bench, tmp_path):
    root, config, report = bench
    arms_file = Path(config.out_dir) / "arms.jsonl"
    before = arms_file.read_text()
    again = run_reproduce("staleness", config, SEEDS, out=tmp_path / "again.json", arms=ARMS, progress=False)
    assert arms_file.read_text() == before and again["rows"] == report["rows"]
    # the copy beside the results (committed with them) holds every finished (seed, arm), here and for a new OUT
    assert (root / "r.arms.jsonl").read_text() == before == (tmp_path / "again.arms.jsonl").read_text()
    # a lost row (an interrupted seed) is run again alone, from the same warm start
    kept = [line for line in before.splitlines() if '"arm": "eta0-plain"' not in line or '"seed": 1' not in line]
    assert len(kept) == len(before.splitlines()) - 1
    arms_file.write_text("\n".join(kept) + "\n")
    stamp = (Path(config.out_dir) / "seed-0" / "rl-eta0-plain").stat().st_mtime_ns
    third = run_reproduce("staleness", config, SEEDS, out=tmp_path / "third.json", arms=ARMS, progress=False)
    assert (Path(config.out_dir) / "seed-0" / "rl-eta0-plain").stat().st_mtime_ns == stamp  # seed 0 untouched
    redone = [r for r in third["rows"] if (r["seed"], r["arm"]) == (1, "eta0-plain")]
    old = [r for r in report["rows"] if (r["seed"], r["arm"]) == (1, "eta0-plain")]
    assert redone[0]["policy"] == old[0]["policy"]  # sync RL from the same warm start repeats exactly


def test_rows_of_another_configuration_or_changed_arm_are_refused(bench):
    root, config, _ = bench
    changed = {**ARMS, "eta0-plain": [*ARMS["eta0-plain"], "rl.learner.eps_clip=0.3"]}
    with pytest.raises(ValueError, match="another configuration"):
        run_reproduce("staleness", config, SEEDS, out=root / "x.json", arms=changed, progress=False)
    other = load_reproduce_config("staleness", [f"out_dir={config.out_dir}", *TOY, "rl.learner.minibatches=3"])
    with pytest.raises(ValueError, match="another configuration"):
        run_reproduce("staleness", other, SEEDS, out=root / "x.json", arms=ARMS, progress=False)


def test_arms_run_apart_pool_together(bench, tmp_path):
    """Two machines (or sessions) each ran the warm start and one arm: their logs, merged, pool as one run did, and
    a run of one arm reuses what the log holds and reports only that arm."""
    root, config, _ = bench
    report = run_reproduce("staleness", config, SEEDS, out=tmp_path / "whole.json", arms=ARMS, progress=False)
    rows = [json.loads(line) for line in (Path(config.out_dir) / "arms.jsonl").read_text().splitlines()]
    first = [r for r in rows if r["arm"] in (WARM, "eta0-decoupled")]
    second = [
        {**r, "timings": {"elsewhere": 1.0}} if r["arm"] == WARM else r for r in rows if r["arm"] != "eta0-decoupled"
    ]
    merged = tmp_path / "merged.arms.jsonl"
    merged.write_text("".join(json.dumps(r) + "\n" for r in [*first, *second]))
    runs = load_reproduce_config("staleness", [f"out_dir={tmp_path / 'runs'}", *TOY, "rl.learner.minibatches=2"])
    pooled = run_reproduce("staleness", runs, SEEDS, out=tmp_path / "merged.json", arms=ARMS, progress=False)
    assert not (tmp_path / "runs" / "seed-0").exists()  # nothing trained: every unit was in the merged log
    assert pooled["pooled"] == report["pooled"]
    # each (seed, arm) counts once, as its first row: the second machine's warm rows are left out of the report
    assert len(pooled["rows"]) == len(report["rows"]) == len(SEEDS) * (1 + len(ARMS))
    assert all(r["timings"] != {"elsewhere": 1.0} for r in pooled["rows"])
    one = {"eta0-decoupled": ARMS["eta0-decoupled"]}  # the baseline: a run of any arms includes it
    alone = run_reproduce("staleness", runs, SEEDS, out=tmp_path / "one.json", arms=one, progress=False)
    assert list(alone["pooled"]) == [WARM, "eta0-decoupled"] and {r["arm"] for r in alone["rows"]} == {
        WARM,
        "eta0-decoupled",
    }
    assert alone["pooled"]["eta0-decoupled"] == report["pooled"]["eta0-decoupled"]
    # a row of an arm the claim does not have is refused, with the file named
    stray = tmp_path / "stray.arms.jsonl"
    stray.write_text(json.dumps({**rows[0], "arm": "eta9-unknown"}) + "\n")
    with pytest.raises(ValueError, match="stray.arms.jsonl holds runs of another configuration"):
        run_reproduce("staleness", runs, SEEDS, out=tmp_path / "stray.json", arms=ARMS, progress=False)


def test_an_rl_arm_cut_after_a_checkpoint_goes_on_from_it(tmp_path, monkeypatch):
    """A session's end cuts a real-model arm mid-RL (25 minutes an arm): the rerun goes on from the arm's last
    checkpoint, keeping the steps trained before the cut, and its row says where it resumed."""
    monkeypatch.setattr(reproduce, "RESUME_EVERY", 1)
    arms = {"eta0-decoupled": ARMS["eta0-decoupled"]}
    config = load_reproduce_config("staleness", [f"out_dir={tmp_path / 'runs'}", *TOY, "rl.learner.minibatches=2"])
    first = run_reproduce(
        "staleness",
        config,
        [0],
        out=tmp_path / "r.json",
        arms=arms,
        progress=False,
        rules=UnitRules(keep_rl_state=True),
    )
    run = tmp_path / "runs" / "seed-0" / "rl-eta0-decoupled"
    # the arm saved at RESUME_EVERY, not only at its last step
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == ["step-00001", "step-00002"]
    before = (run / "metrics.jsonl").read_text().splitlines()
    [row_before] = [r for r in first["rows"] if r["arm"] == "eta0-decoupled"]
    assert "rl_resumed_after_step" not in row_before
    # killed after step 2's metrics, before its checkpoint and its row
    shutil.rmtree(run / "checkpoints" / "step-00002")
    (run / "checkpoints" / "latest").write_text("step-00001\n")
    log = tmp_path / "runs" / "arms.jsonl"
    log.write_text("".join(line + "\n" for line in log.read_text().splitlines() if '"eta0-decoupled"' not in line))
    # --status reads where each unit stands, writing nothing: the warm start done, the arm cut, seed 1 to run
    (tmp_path / "r.arms.jsonl").unlink()  # the results copy still held the arm's row
    keys = {name: arm_fingerprint(config, "staleness", name, o) for name, o in {WARM: [], **arms}.items()}
    units = unit_status(tmp_path / "runs", tmp_path / "r.json", keys, [0, 1], WARM)
    assert [(u["seed"], u["arm"], u["state"]) for u in units] == [
        (0, WARM, "done"),
        (0, "eta0-decoupled", "cut"),
        (1, WARM, "to run"),
        (1, "eta0-decoupled", "to run"),
    ]
    assert units[1]["after_step"] == 1 and not (tmp_path / "r.arms.jsonl").exists()
    text = format_status("staleness", units, running="123 bench reproduce")
    assert "seed 0, eta0-decoupled: cut: resumes after step 1" in text and "1 done, 1 cut, 2 to run" in text
    assert "a bench reproduce is at work in this folder now (pid 123)" in text
    again = run_reproduce("staleness", config, [0], out=tmp_path / "again.json", arms=arms, progress=False)
    [row] = [r for r in again["rows"] if r["arm"] == "eta0-decoupled"]
    assert row["rl_resumed_after_step"] == 1
    after = (run / "metrics.jsonl").read_text().splitlines()
    assert after[0] == before[0] and [json.loads(line)["step"] for line in after] == [1, 2]  # step 1 kept, 2 redone
    assert [p["step"] for p in row["curve"]] == [1.0, 2.0] and row["curve"][0] == row_before["curve"][0]
    assert (run / "checkpoints" / "step-00002" / "model.safetensors").exists()  # step 2 trained and saved again
    # --stop-by: a deadline already past starts nothing of seed 1 (not even its SFT), and the report pools seed 0
    # alone; a deadline that leaves time for the warm start but, at a made-up pace, not for the RL arm runs the warm
    # start and stops before the arm
    stopped = run_reproduce(
        "staleness", config, [0, 1], out=tmp_path / "stop.json", arms=arms, rules=UnitRules(stop_by=datetime.now())
    )
    assert stopped["seeds"] == [0] and not (tmp_path / "runs" / "seed-1").exists()
    monkeypatch.setattr(reproduce, "unit_means", lambda units: {"rl": 1e9, "warm": 1.0, "sft": 1.0})
    later = datetime.now() + timedelta(hours=1)
    partial = run_reproduce(
        "staleness", config, [0, 1], out=tmp_path / "stop.json", arms=arms, rules=UnitRules(stop_by=later)
    )
    assert {(r["seed"], r["arm"]) for r in partial["rows"]} == {(0, WARM), (0, "eta0-decoupled"), (1, WARM)}
    assert not (tmp_path / "runs" / "seed-1" / "rl-eta0-decoupled").exists()


def test_a_deadline_admits_a_unit_only_if_it_ends_in_time():
    """A unit is started only if its kind's mean time (after the seed's SFT, where that is to do) ends by the
    deadline; a kind no finished unit timed is admitted, there being nothing to judge it by."""
    means = {"rl": 3600.0, "warm": 600.0, "sft": 1200.0}
    deadline = Deadline(datetime.now(UTC) + timedelta(minutes=30), means)  # a zone-aware deadline too
    assert deadline.fits(rl=False) and not deadline.fits(rl=False, sft=True) and not deadline.fits(rl=True)
    assert Deadline(datetime.now() + timedelta(minutes=1), {"rl": None, "warm": None, "sft": None}).fits(rl=True)
    assert parse_stop_by("2026-12-08T02:55") == datetime(2026, 12, 8, 2, 55)
    with pytest.raises(ValueError, match="--stop-by takes an ISO date and time"):
        parse_stop_by("in two hours")
    assert main(["bench", "reproduce", "staleness", "--stop-by", "soon"]) == 2


def test_a_finished_arm_keeps_its_last_model_and_drops_its_trainer_state(bench):
    """A real-model arm's RL run holds GBs of optimizer state per checkpoint and a claim has dozens of arms: once its
    row is written the arm keeps its last checkpoint as a model dir, its metrics and its trajectories."""
    _, config, _ = bench
    for seed in SEEDS:
        for arm in ARMS:
            run = Path(config.out_dir) / f"seed-{seed}" / f"rl-{arm}"
            checkpoints = run / "checkpoints"
            assert sorted(p.name for p in checkpoints.glob("step-*")) == ["step-00002"]
            last = checkpoints / "step-00002"
            assert (last / "model.safetensors").exists() and (last / "config.json").exists()
            assert not (last / "trainer.pt").exists() and not (checkpoints / "healthy").exists()
            assert "bench reproduce" in (checkpoints / "SLIMMED").read_text()
            assert (run / "metrics.jsonl").read_text().count("\n") == 2 and any((run / "trajectories").iterdir())
            with pytest.raises(FileNotFoundError, match="cannot be resumed; train from it anew with model.path="):
                latest_checkpoint(run)
            assert slim_finished_run(run, "again") == 0  # a second call finds nothing more to free


def test_only_a_run_of_the_same_config_with_a_whole_checkpoint_is_resumed(tmp_path):
    """Anything else in the arm's folder (another config, no checkpoint, a damaged pointer or config) starts over."""
    rl, out = load_config(None, []), tmp_path / "rl"
    configure_rl(rl, tmp_path / "model", out, EnvConfig(), ["t1"], seed=3)
    assert resumable_step(rl, out) is None  # nothing there
    (out / "checkpoints" / "step-00003").mkdir(parents=True)
    (out / "checkpoints" / "step-00003" / "trainer.pt").write_bytes(b"")
    (out / "config.json").write_text(json.dumps(config_dict(rl)))
    assert resumable_step(rl, out) is None  # no `latest`: cut before its first checkpoint
    (out / "checkpoints" / "latest").write_text("step-00003\n")
    assert resumable_step(rl, out) == 3
    configure_rl(rl, tmp_path / "model", out, EnvConfig(), ["t1"], seed=4)
    assert resumable_step(rl, out) is None  # another seed's run
    configure_rl(rl, tmp_path / "model", out, EnvConfig(), ["t1"], seed=3)
    rl.learner.lr *= 2
    assert resumable_step(rl, out) is None  # another setting
    rl.learner.lr /= 2
    (out / "config.json").write_text("{not json")
    assert resumable_step(rl, out) is None
    (out / "config.json").write_text(json.dumps(config_dict(rl)))
    (out / "checkpoints" / "step-00003" / "trainer.pt").unlink()
    assert resumable_step(rl, out) is None  # `latest` names a checkpoint without its trainer state


def test_bad_input_is_a_clear_error(tmp_path, capsys):
    assert main(["bench", "reproduce", "nope", "--out", str(tmp_path / "r.json")]) == 2
    assert "unknown claim 'nope'" in capsys.readouterr().err
    assert main(["bench", "reproduce", "shaping", "--seeds", "0,x"]) == 2
    assert "--seeds takes comma-separated integers" in capsys.readouterr().err
    config = load_reproduce_config("shaping", [f"out_dir={tmp_path}"])
    with pytest.raises(ValueError, match="rl.\\* settings only"):
        run_reproduce("shaping", config, [0], arms={"success-only": [], "bad": ["sft.lr=1"]}, progress=False)
    with pytest.raises(ValueError, match="rl.learner.proximal"):
        run_reproduce("shaping", config, [0], arms={"success-only": ["rl.learner.proximal=x"]}, progress=False)
    with pytest.raises(ValueError, match="baseline 'success-only'"):
        run_reproduce("shaping", config, [0], arms={"raw": []}, progress=False)


def test_the_claims_arms_are_the_issues_designs():
    staleness = CLAIMS["staleness"].arms
    assert set(staleness) == {f"eta{e}-{o}" for e in (0, 4, 8) for o in ("decoupled", "plain")}
    assert "rl.mode=sync" in staleness["eta0-plain"] and "rl.learner.proximal=behaviour" in staleness["eta8-plain"]
    shaping = CLAIMS["shaping"].arms
    assert "rl.learner.process_reward=none" in shaping["raw"] and "rl.learner.process_reward=delta" in shaping["delta"]
    assert list(select_arms("staleness", "eta4-plain, eta0-decoupled")) == ["eta0-decoupled", "eta4-plain"]
    assert list(select_arms("staleness", "eta4-plain")) == ["eta0-decoupled", "eta4-plain"]  # with its baseline
    assert select_arms("shaping", "") == shaping
    with pytest.raises(ValueError, match="unknown arms \\['nope'\\]"):
        select_arms("shaping", "raw,nope")
    for name in CLAIMS:
        config = load_reproduce_config(name)
        assert config.out_dir == f"runs/reproduce_{name}"


@functools.cache
def shaping_learners():
    """Each shaping arm's learner settings, loaded once."""
    from searchgym.bench.reproduce import arm_config

    base = load_reproduce_config("shaping")
    return {name: arm_config(base, overrides).rl.learner for name, overrides in CLAIMS["shaping"].arms.items()}


@settings(max_examples=20, deadline=None)
@given(repeats=st.integers(1, 6), outcome=st.sampled_from([0.0, 1.0]))
def test_only_the_raw_shaping_arm_pays_for_repeating_a_rewarded_search(repeats, outcome):
    # the return the learner gives an episode that repeats the search that found the answer page `repeats` times,
    # then answers, under each shaping arm's learner settings (the learner's own per-turn return)
    from searchgym.trainers.algorithm.learner import Learner

    found = {"evidence": {"answer_page_rank": 1}}
    traj = SimpleNamespace(turns=[SimpleNamespace(info=found)] * repeats + [SimpleNamespace(info={})], reward=outcome)
    first_turn = {
        name: Learner._turn_returns(SimpleNamespace(config=config), traj)[0]
        for name, config in shaping_learners().items()
    }
    w = 0.5
    assert first_turn["success-only"] == outcome
    assert first_turn["raw"] == pytest.approx(outcome + w * repeats)  # grows with every repeat: hackable
    assert first_turn["delta"] == pytest.approx(outcome + w)  # one search's worth, however many repeats
    assert first_turn["clip"] == pytest.approx(outcome - w / 2)  # the answer turn's -threshold; repeats cost 0


def test_a_claim_on_the_real_model_keeps_its_arms_and_takes_the_real_warm_start(capsys):
    for claim in CLAIMS:
        real = load_reproduce_config(claim, model="smollm2")
        tiny = load_reproduce_config(claim)
        assert real.base == "smollm2-135m-instruct" and tiny.base == "tiny"
        assert real.out_dir == f"runs/reproduce_{claim}_smollm2" != tiny.out_dir  # rows of the two never mix
        assert real.demos.limit and real.demos.limit <= 256 and real.sft.micro_batch_tokens
    deep = load_reproduce_config("long_horizon", model="smollm2")
    assert deep.env.kwargs["max_turns"] >= 16 and max(deep.hops.rl) > max(deep.hops.demos)
    with pytest.raises(ValueError, match="--model: unknown 'gpt5'"):
        load_reproduce_config("shaping", model="gpt5")


@pytest.mark.parametrize("model", [None, "smollm2"])
def test_claims_whose_settings_differ_only_in_rl_share_each_seeds_warm_start(model):
    """A seed's warm start trained for one claim is taken by another whose settings differ only in RL and evaluation
    (bench/learning.py, finished_warm_start): on the tiny model staleness and shaping share it; on the real model
    shaping runs in long horizon's setting and shares its warm start (19 minutes of SFT a seed), staleness has its own.
    The real model's shaping arms train exactly long horizon's RL, bar the process reward."""
    from searchgym.bench.learning import warm_start_fingerprint

    keys = {claim: warm_start_fingerprint(load_reproduce_config(claim, model=model), 0) for claim in CLAIMS}
    if model is None:
        assert keys["staleness"] == keys["shaping"] != keys["long_horizon"]
    else:
        assert keys["long_horizon"] == keys["shaping"] != keys["staleness"]
        shaping, deep = (load_reproduce_config(c, model=model) for c in ("shaping", "long_horizon"))
        assert dataclasses.replace(shaping, preset=deep.preset, out_dir=deep.out_dir) == deep
        assert shaping.rl.learner.process_reward_weight == 0.0  # success-only is long horizon's RL arm
    assert warm_start_fingerprint(load_reproduce_config("staleness", model=model), 1) != keys["staleness"]


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(
        st.one_of(
            st.text(max_size=40),
            st.fixed_dictionaries(
                {"seed": st.integers(0, 3), "arm": st.sampled_from(["warm", "x"]), "fingerprint": st.text(max_size=4)}
            ).map(json.dumps),
            st.sampled_from(
                [
                    '{"seed": [1], "arm": "warm", "fingerprint": "fp"}',
                    '{"seed": 0, "arm": {}}',
                    "[]",
                    "null",
                    "\x00\xff",
                ]
            ),
        ),
        max_size=12,
    )
)
def test_status_reads_any_unit_log_without_failing(tmp_path_factory, lines):
    """A unit log cut by a kill or edited by hand: --status lists what it can place and never raises."""
    root = tmp_path_factory.mktemp("status")
    (root / "arms.jsonl").write_text("\n".join(lines) + "\n", errors="surrogateescape")
    units = unit_status(root, root / "r.json", {"warm": "fp", "x": "fp"}, [0, 1], "warm")
    assert [(u["seed"], u["arm"]) for u in units] == [(0, "warm"), (0, "x"), (1, "warm"), (1, "x")]
    assert all(u["state"] in ("done", "to run") for u in units)
    text = format_status("c", units).splitlines()
    assert len(text) == 5 and text[-1].startswith("c: ")


def test_status_counts_the_warm_starts_a_fresh_checkout_trains_again(tmp_path):
    """The time left counts, besides RL arms, each seed's SFT that is not on disk (a fresh checkout has none) and its
    warm evaluation, each at the finished units' mean; a reused warm start (no SFT lap) times nothing."""
    rows = [
        {"seed": 0, "arm": "warm", "fingerprint": "w", "timings": {"warm start": 1200.0, "evaluate warm": 600.0}},
        {
            "seed": 0,
            "arm": "rl",
            "fingerprint": "r",
            "timings": {"warm start": 0.0, "rl rl": 3000.0, "evaluate rl": 600.0},
        },
        {"seed": 1, "arm": "warm", "fingerprint": "w", "timings": {"warm start": 0.2, "evaluate warm": 600.0}},
    ]
    (tmp_path / "arms.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    keys = {"warm": "w", "rl": "r"}
    fresh = unit_status(tmp_path, tmp_path / "r.json", keys, [0, 1, 2], "warm")
    # seeds 1 and 2 have units left and no SFT model: two SFTs at seed 0's 1,200 s (seed 1's 0.2 s was a reuse),
    # two RL arms at 3,600 s, one warm evaluation at 600 s
    assert hours_left(fresh) == (
        "2.8 h left: 2.0 h of RL arms with their evaluation, 0.2 h of warm-start evaluations, "
        "0.7 h of warm starts (SFT) to train again"
    )
    kept = unit_status(tmp_path, tmp_path / "r.json", keys, [0, 1, 2], "warm", warm_on_disk=[1])
    assert hours_left(kept).endswith("0.3 h of warm starts (SFT) to train again")
    untimed = unit_status(tmp_path, tmp_path / "r.json", {"warm": "w", "new": "n"}, [0], "warm")
    # a kind no finished unit times is counted, never given a made-up time
    assert hours_left(untimed) == (
        "0.3 h left: 0.3 h of warm starts (SFT) to train again (and 1 RL arms with their evaluation, not timed yet)"
    )
    assert hours_left(unit_status(tmp_path, tmp_path / "r.json", keys, [0], "warm")) is None  # nothing left


@pytest.mark.parametrize("model", [None, "smollm2"])
def test_each_claims_setting_text_states_its_own_configs_values(model):
    """The results file's "setting" is the words a reader trusts: its learning rate, turns, hops and minibatches are
    the ones the claim's config (tiny or real model) runs with."""
    import re

    from searchgym.bench.reproduce import REAL_MODEL_SETTINGS

    for claim in CLAIMS:
        config = load_reproduce_config(claim, model=model)
        text = CLAIMS[claim].setting if model is None else REAL_MODEL_SETTINGS[model][claim]
        if lr := re.search(r"\blr ([0-9.e+-]+)", text):
            assert float(lr.group(1)) == config.rl.learner.lr, (claim, text)
        if minibatches := re.search(r"(\d+) minibatches", text):
            assert int(minibatches.group(1)) == config.rl.learner.minibatches, (claim, text)
        if turns := re.search(r"(\d+) turns", text):
            assert int(turns.group(1)) == config.env.kwargs["max_turns"], (claim, text)
        if demos := re.search(r"demonstrations on (\d)-(\d) hops", text):
            assert [int(demos.group(1)), int(demos.group(2))] == [min(config.hops.demos), max(config.hops.demos)]
        if rl := re.search(r"RL[^;]*? on (\d)-(\d) hops", text):
            assert [int(rl.group(1)), int(rl.group(2))] == [min(config.hops.rl), max(config.hops.rl)], (claim, text)
        if context := re.search(r"([0-9,]+) tokens of context", text):
            assert int(context.group(1).replace(",", "")) == config.rl.rollout.max_context, (claim, text)
        if most := re.search(r"at most (\d+)", text):
            assert int(most.group(1)) == config.max_demos == config.demos.limit, (claim, text)
        if "EM reward" in text or "an EM" in text:
            assert config.env.kwargs["judge"] == "em", (claim, text)
        if mode := re.search(r"(?<!is )\b(a?sync) RL", text):  # "eta 0 is sync RL" names an arm
            assert mode.group(1) == config.rl.mode, (claim, text)


def test_a_real_model_report_says_the_real_models_setting(bench):
    """The report's words follow its base model: the same rows pooled under a real model's config say that model's
    setting (SmolLM2's staleness runs at lr 2e-5, not the tiny model's 3e-4) and that base."""
    import dataclasses

    from searchgym.bench.reproduce import REAL_MODEL_SETTINGS, pooled_arms

    root, config, report = bench
    rows = [json.loads(line) for line in (root / "runs" / "arms.jsonl").read_text().splitlines()]
    assert report["setting"] == CLAIMS["staleness"].setting and "copy-pretrained" in report["shared"]
    smollm2 = dataclasses.replace(config, base="smollm2-135m-instruct", preset="reproduce:staleness_smollm2")
    real = pooled_arms("staleness", rows, smollm2, ARMS)
    assert real["setting"] == REAL_MODEL_SETTINGS["smollm2"]["staleness"] and "lr 2e-5" in real["setting"]
    assert "smollm2-135m-instruct" in real["shared"] and "copy-pretrained" not in real["shared"]
    # another base under the tiny model's preset keeps the tiny claim's words: the preset names the setting
    other = pooled_arms("staleness", rows, dataclasses.replace(config, base="smollm2-135m-instruct"), ARMS)
    assert other["setting"] == CLAIMS["staleness"].setting
