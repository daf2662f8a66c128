"""The collapse watchdog: each rule on hand-made statistics, and a real run that collapses on purpose and recovers."""

import json
import math

import gymnasium as gym
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from searchgym.cli import main
from searchgym.envs.search_env import SearchEnv
from searchgym.trainers.algorithm.learner import Learner
from searchgym.trainers.config import LearnerConfig, WatchdogConfig, load_config
from searchgym.trainers.launchers.local import train
from searchgym.trainers.run.checkpoint import (
    HEALTHY,
    checkpoint_dir,
    latest_checkpoint,
    load_trainer_state,
    save_checkpoint,
)
from searchgym.trainers.run.restore import initial_state, restore_learner
from searchgym.trainers.run.watchdog import Watchdog, check_rules
from searchgym.world.synthetic_env import make_synthetic_qa
from tests.conftest import SMALL

CONFIG = WatchdogConfig()


def healthy(step: int, **overrides: float) -> dict[str, float]:
    """A step's metrics as a healthy run has them."""
    return {
        "step": step,
        "loss": 0.01,
        "grad_norm": 1.0 + 0.1 * (step % 3),
        "entropy": 2.0,
        "importance_weight_max": 1.5,
        "clip_fraction": 0.05,
        "behav_capped_fraction": 0.0,
        "episode/reward": 0.5,
        **overrides,
    }


def rule(metrics: dict[str, float], history: list[dict[str, float]], config: WatchdogConfig = CONFIG) -> str | None:
    alarm = check_rules(config, int(metrics["step"]), metrics, history)
    return alarm.rule if alarm else None


HISTORY = [healthy(s) for s in range(1, 11)]


# ---- each rule -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["loss", "grad_norm", "entropy"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_loss_gradient_or_entropy_triggers_at_once(key, value):
    assert rule(healthy(1, **{key: value}), []) == "non_finite"


def test_grad_norm_spike_is_relative_to_the_median_and_waits_for_history():
    assert rule(healthy(11, grad_norm=19.0), HISTORY) is None  # below 20 x median 1.1
    assert rule(healthy(11, grad_norm=30.0), HISTORY) == "grad_norm_spike"
    assert rule(healthy(3, grad_norm=1e6), HISTORY[:2]) is None  # min_history 3: no median to compare with yet
    no_gradient = [healthy(s, grad_norm=0.0) for s in range(1, 11)]  # steps without signal do not count
    assert rule(healthy(11, grad_norm=5.0), no_gradient) is None
    assert rule(healthy(11, grad_norm=30.0), HISTORY, WatchdogConfig(grad_norm_factor=None)) is None


def test_entropy_collapse_needs_a_fall_below_the_floor_not_a_low_level():
    assert rule(healthy(11, entropy=1e-4), HISTORY) == "entropy_collapse"
    converged = [healthy(s, entropy=5e-4) for s in range(1, 11)]  # a policy that learnt its task by heart
    assert rule(healthy(11, entropy=3e-4), converged) is None
    assert rule(healthy(1, entropy=1e-6), []) is None  # nothing to fall from
    assert rule(healthy(11, entropy=0.03), HISTORY) == "entropy_collapse"  # 2 nats to 0.03: not a natural step
    assert rule(healthy(11, entropy=0.1), HISTORY) is None  # fell, but not below the floor
    assert rule(healthy(11, entropy=1e-4), HISTORY, WatchdogConfig(entropy_floor=None)) is None


def test_entropy_explosion():
    assert rule(healthy(11, entropy=25.0), HISTORY) == "entropy_explosion"
    assert rule(healthy(11, entropy=15.0), HISTORY) is None
    assert rule(healthy(3, entropy=25.0), HISTORY[:2]) is None


@pytest.mark.parametrize(
    "key, value, name",
    [
        ("importance_weight_max", 500.0, "ratio_blowup"),
        ("clip_fraction", 0.9, "clip_blowup"),
        ("behav_capped_fraction", 0.7, "behav_capped"),
    ],
)
def test_importance_ratio_and_clipping_blowups(key, value, name):
    assert rule(healthy(11, **{key: value}), HISTORY) == name
    assert rule(healthy(11, **{key: value / 10}), HISTORY) is None


def test_reward_collapse_over_a_window_from_a_healthy_level():
    falling = HISTORY + [healthy(s, **{"episode/reward": 0.01}) for s in range(11, 15)]
    alarm = check_rules(CONFIG, 15, healthy(15, **{"episode/reward": 0.0}), falling)
    assert alarm is not None and alarm.rule == "reward_collapse" and alarm.since == 11
    one_bad_step = HISTORY + [healthy(11, **{"episode/reward": 0.0})]
    assert rule(healthy(12, **{"episode/reward": 0.5}), one_bad_step) is None
    never_learnt = [healthy(s, **{"episode/reward": 0.02}) for s in range(1, 15)]  # below reward_level: not watched
    assert rule(healthy(15, **{"episode/reward": 0.0}), never_learnt) is None


def test_a_step_without_an_update_has_nothing_to_judge():
    assert rule({"step": 3, "updated": 0.0, "groups": 2.0, "episode/reward": 0.5}, HISTORY) is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 10.0),
            st.floats(1.0, 6.0),
            st.floats(0.8, 3.0),
            st.floats(0.0, 0.3),
            st.floats(0.2, 1.0),
            st.booleans(),
        ),
        min_size=1,
        max_size=60,
    ),
    st.floats(0.01, 100.0),
)
def test_healthy_sequences_never_trigger(rows, scale):
    """Finite statistics that stay within a band (grad norms within 20x, entropies within 10x, ratios, clipping and
    rewards as a healthy run has them, steps without a gradient mixed in) never trigger, at any grad-norm scale."""
    watchdog = Watchdog.for_run(CONFIG, "unused", "unused", start_step=0)
    for step, (grad, entropy, ratio, clip, reward, updated) in enumerate(rows, start=1):
        metrics = {"updated": float(updated), "episode/reward": reward}
        if updated:
            metrics |= {
                "loss": 0.1,
                "grad_norm": scale * (0.5 + grad / 2),
                "entropy": entropy,
                "importance_weight_max": ratio,
                "clip_fraction": clip,
            }
        assert watchdog.check(step, metrics) is None, (step, metrics)


# ---- which state is healthy, and pruning keeps it ----------------------------------------------------------------


def _save(run_dir, step, model, tokenizer, keep=1):
    save_checkpoint(run_dir, step, model=model, tokenizer=tokenizer, state={"learner": {}}, keep=keep)


def test_the_healthy_checkpoint_predates_the_blamed_weights_and_survives_pruning(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = (
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        AutoTokenizer.from_pretrained(tiny_model_dir),
    )
    watchdog = Watchdog.for_run(WatchdogConfig(reward_drop=None), tmp_path, tiny_model_dir, start_step=0)
    for step in (1, 2, 3):  # healthy steps, a checkpoint after each, keep_checkpoints=1
        assert watchdog.check(step, healthy(step)) is None
        watchdog.protect()
        _save(tmp_path, step, model, tokenizer)
        watchdog.saved(step)
    # step 3's statistics measured step 2's weights, so checkpoint 2 is the one a trigger at step 4 may restore
    assert (tmp_path / "checkpoints" / HEALTHY).read_text().strip() == "step-00002"
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*")) == ["step-00002", "step-00003"]
    alarm = watchdog.check(
        4, healthy(4, loss=math.nan)
    )  # step 4 measured step 3's weights: checkpoint 3 is not healthy
    assert alarm is not None and watchdog.healthy(alarm).path == checkpoint_dir(tmp_path, 2)

    state = watchdog.healthy(alarm)
    watchdog.restored(state)  # the run goes on from checkpoint 2's weights; a trigger at once blames them too
    again = watchdog.check(5, healthy(5, loss=math.nan))
    assert watchdog.healthy(again).step is None and watchdog.healthy(again).path == tiny_model_dir  # the initial


def _fake_checkpoint(run_dir, step):
    path = checkpoint_dir(run_dir, step)
    path.mkdir(parents=True)
    (path / "trainer.pt").write_bytes(b"")  # the watchdog only asks whether it is still on disk


@pytest.mark.parametrize("reward, pinned", [(0.5, "step-00003"), (0.0, "step-00007")])
def test_a_watched_reward_keeps_the_checkpoint_before_its_window(tmp_path, reward, pinned):
    """Once the reward is at a level the reward rule watches, a collapse over its window (5 steps) blames weights that
    far back, so the checkpoint before them is pinned; a run whose reward never got there pins only the last one."""
    watchdog = Watchdog.for_run(CONFIG, tmp_path, "initial", start_step=0)
    for step in range(1, 9):
        assert watchdog.check(step, healthy(step, **{"episode/reward": reward})) is None
        _fake_checkpoint(tmp_path, step)
        watchdog.saved(step)
    watchdog.protect()
    assert (tmp_path / "checkpoints" / HEALTHY).read_text().strip() == pinned


def test_the_initial_weights_are_healthy_before_any_checkpoint(tmp_path, tiny_model_dir):
    watchdog = Watchdog.for_run(CONFIG, tmp_path, tiny_model_dir, start_step=0)
    assert watchdog.check(1, healthy(1)) is None
    alarm = watchdog.check(2, healthy(2, entropy=1e-5))
    assert alarm.rule == "entropy_collapse" and watchdog.healthy(alarm).path == tiny_model_dir


def test_restoring_a_checkpoint_is_bit_for_bit_and_scales_its_own_learning_rate(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    learner = Learner(AutoModelForCausalLM.from_pretrained(tiny_model_dir), LearnerConfig(lr=1e-3), version=7)
    fresh = initial_state(learner)
    saved = {k: v.clone() for k, v in learner.model.state_dict().items()}
    save_checkpoint(
        tmp_path,
        3,
        model=learner.model,
        tokenizer=tokenizer,
        state={"learner": learner.trainer_state(), "watchdog": {"lr_scale": 0.5}},
    )
    with torch.no_grad():
        for p in learner.model.parameters():
            p.add_(1.0)
    lr = restore_learner(learner, checkpoint_dir(tmp_path, 3), from_checkpoint=True, lr_scale=0.25)
    assert all(torch.equal(saved[k], v) for k, v in learner.model.state_dict().items())
    assert lr == pytest.approx(1e-3 * 0.25 / 0.5) and learner.scheduler.base_lrs == [pytest.approx(5e-4)]
    assert learner.version == 7  # versions only grow
    lr = restore_learner(learner, tiny_model_dir, from_checkpoint=False, lr_scale=0.25, initial=fresh)
    assert lr == pytest.approx(2.5e-4) and not learner.optimizer.state


# ---- end to end: a real tiny model made to collapse -------------------------------------------------------------

LETTERS = "searchgym_test/WatchdogLetters-v0"


class LetterShare(SearchEnv):
    """SyntheticQA whose unanswered episodes earn the share of ASCII letters in their last turn: a random tiny
    model's episodes then differ in reward, so every step has a gradient (and a learning rate can wreck it)."""

    async def astep(self, action):
        obs, reward, terminated, truncated, info = await super().astep(action)
        if truncated and not terminated:
            reward = sum(c.isascii() and c.isalpha() for c in action) / max(len(action), 1)
        return obs, reward, terminated, truncated, info


def make_letter_share(**kwargs):
    env = make_synthetic_qa(**kwargs)
    env.__class__ = LetterShare
    return env


if LETTERS not in gym.registry:
    gym.register(id=LETTERS, entry_point=make_letter_share)


def _overrides(run_dir, model_dir, lr, steps, *extra):
    return [
        f"out_dir={run_dir}",
        f"model.path={model_dir}",
        f"steps={steps}",
        "save_every=1",
        "keep_checkpoints=1",
        f"env.id={LETTERS}",
        f"env.kwargs.size={SMALL['size']}",
        f"env.kwargs.n_tasks={SMALL['n_tasks']}",
        "env.kwargs.max_turns=1",
        "rollout.group_size=2",
        "rollout.batch_size=2",
        "rollout.max_new_tokens=8",
        "rollout.max_staleness=1",
        "learner.drop_no_spread=false",
        f"learner.lr={lr}",
        *extra,
    ]


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_an_absurd_learning_rate_collapses_and_the_watchdog_recovers(
    tmp_path, small_bundle, tiny_model_dir, capfd, one_torch_thread
):
    run_dir = tmp_path / "run"
    keep = "keep_checkpoints=5"  # so the checkpoint written at the restore is still there to compare
    config = load_config(None, _overrides(run_dir, tiny_model_dir, 1e2, 4, "watchdog.lr_factor=1e-5", keep))
    history = train(config, progress=False)

    assert [h["step"] for h in history] == [1, 2, 3, 4]  # it finished
    triggered = [h for h in history if h.get("watchdog/trigger")]
    assert [h["step"] for h in triggered] == [2]  # step 2 measured what lr 1e2 made of the weights
    [event] = triggered
    assert event["watchdog/restored_step"] == 0 and event["watchdog/restores"] == 1  # the initial weights
    assert event["watchdog/lr"] == pytest.approx(1e-3)
    assert [h["version"] for h in history] == [1.0, 2.0, 3.0, 4.0]  # the version counter never went back
    assert all(h["staleness_max"] <= 1 for h in history)  # no group of the collapsed weights reached the learner
    assert "watchdog: step 2" in capfd.readouterr().err

    # the checkpoint written at the restore holds the initial weights bit for bit, and the lowered lr
    initial = load_file(tiny_model_dir / "model.safetensors")
    restored = load_file(checkpoint_dir(run_dir, 2) / "model.safetensors")
    assert restored.keys() == initial.keys() and all(torch.equal(initial[k], restored[k]) for k in initial)
    final = load_trainer_state(latest_checkpoint(run_dir))
    assert final["step"] == 4 and final["watchdog"] == {"restores": 1, "lr_scale": pytest.approx(1e-5)}
    assert final["learner"]["optimizer"]["param_groups"][0]["lr"] == pytest.approx(1e-3)
    # after the restore the engines generate with the restored weights (version 2): no token of the collapsed
    # weights (version 1) reached a later step
    for trained_version, allowed in ((2, {2}), (3, {2, 3})):
        rows = (run_dir / "trajectories" / f"version-{trained_version:05d}.jsonl").read_text().splitlines()
        versions = {
            v for row in map(json.loads, rows) for v, m in zip(row["versions"], row["loss_mask"], strict=True) if m
        }
        assert versions and versions <= allowed, (trained_version, versions)
    # the groups the collapse dropped were played again: no data position lost, none trained twice
    trained = [
        group
        for path in sorted((run_dir / "trajectories").glob("version-*.jsonl"))
        for group in sorted({json.loads(line)["group"] for line in path.read_text().splitlines()})
    ]
    [rollout] = final["rollouts"]
    assert len(set(trained)) == len(trained) == 4 * 2 and not set(trained) & set(rollout["replay"])
    assert sorted(set(trained) | set(rollout["replay"])) == list(range(rollout["position"]))
    after = [h for h in history if h["step"] > 2]
    assert all(math.isfinite(h["loss"]) and h["entropy"] > 1.0 for h in after)  # healthy again, still learning
    assert all(h["grad_norm"] > 0 for h in after)

    # --resume keeps the lowered learning rate and the restore count
    resumed = train(
        load_config(None, _overrides(run_dir, tiny_model_dir, 1e2, 5, "watchdog.lr_factor=1e-5", keep)),
        resume=True,
        progress=False,
    )
    assert resumed[-1]["step"] == 5 and resumed[-1]["lr"] == pytest.approx(1e-3)
    assert load_trainer_state(latest_checkpoint(run_dir))["watchdog"]["restores"] == 1


def test_a_run_that_keeps_collapsing_stops_after_max_restores(
    tmp_path, small_bundle, tiny_model_dir, capsys, one_torch_thread
):
    run_dir = tmp_path / "run"
    code = main(["train", *_overrides(run_dir, tiny_model_dir, 1e2, 8, "watchdog.max_restores=1")])
    err = capsys.readouterr().err
    assert code != 0
    assert "training collapsed at step 4" in err and "after 1 restore(s)" in err and "max_restores=1" in err
    # the healthy state is the checkpoint written at the first restore (the initial weights again), and latest names it
    assert "the last healthy state is step-00002" in err and "model.path=" in err
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step-00002"
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # stopped at the second collapse
    assert rows[1]["watchdog/restores"] == 1 and rows[3]["watchdog/stopped"] == 1


def test_with_no_restores_a_collapse_stops_and_latest_no_longer_names_collapsed_weights(
    tmp_path, small_bundle, tiny_model_dir, capsys, one_torch_thread
):
    """max_restores=0 (what a sharded learner runs with): the first trigger stops the run. Its healthy state is the
    initial weights, so step 1's checkpoint (the weights step 2 blamed) must not stay `latest` for --resume."""
    run_dir = tmp_path / "run"
    code = main(["train", *_overrides(run_dir, tiny_model_dir, 1e2, 4, "watchdog.max_restores=0")])
    err = capsys.readouterr().err
    assert code != 0 and "training collapsed at step 2" in err and "checkpoints/latest is removed" in err
    assert (run_dir / "checkpoints" / "step-00001").is_dir()  # kept: nothing the user did not ask to lose
    assert not (run_dir / "checkpoints" / "latest").exists() and latest_checkpoint(run_dir) is None


def test_a_sane_run_triggers_nothing(tmp_path, small_bundle, tiny_model_dir, one_torch_thread):
    history = train(load_config(None, _overrides(tmp_path / "run", tiny_model_dir, 1e-3, 3)), progress=False)
    assert [h["step"] for h in history] == [1, 2, 3] and all(h["grad_norm"] > 0 for h in history)
    assert not [k for h in history for k in h if k.startswith("watchdog/")]
