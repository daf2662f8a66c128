"""The local launcher end to end on CPU: real env, real tiny model, real learner, async and sync."""

import json
import math

import pytest

from searchgym.trainers.config import load_config
from searchgym.trainers.launchers.local import train
from tests.conftest import SMALL

MAX_STALENESS = 1
MAX_EPISODES = 4  # 2 groups of 2 in flight at most


def small_run(tmp_path, *overrides):
    """A short run on the small world: groups of 2, two a batch, one batch's groups in flight at most (the limit
    binds while they play), then `overrides`."""
    return load_config(
        None,
        [
            f"out_dir={tmp_path}",
            f"env.kwargs.size={SMALL['size']}",
            f"env.kwargs.n_tasks={SMALL['n_tasks']}",
            "env.kwargs.max_turns=2",
            "rollout.group_size=2",
            "rollout.batch_size=2",
            "rollout.max_new_tokens=16",
            f"rollout.max_concurrent_rollouts={MAX_EPISODES}",
            *overrides,
        ],
    )


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_training_steps_move_versions_within_the_staleness_bound(tmp_path, small_bundle, mode):
    config = small_run(
        tmp_path,
        "steps=3",
        f"mode={mode}",
        f"rollout.max_staleness={MAX_STALENESS}",
        "learner.drop_no_spread=false",
        "learner.lr=1e-3",
    )
    history = train(config, progress=False)
    assert [h["version"] for h in history] == [1.0, 2.0, 3.0]
    bound = 0 if mode == "sync" else MAX_STALENESS
    assert all(h["staleness_max"] <= bound for h in history), [h["staleness_max"] for h in history]
    assert all(h["updated"] == 1.0 for h in history)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    dumped = (tmp_path / "trajectories" / "version-00000.jsonl").read_text().splitlines()
    assert len(dumped) == 2 * 2 and all(json.loads(row)["input_ids"] for row in dumped)
    for h in history:  # each step trained on what it recorded: a gradient exactly where a group's rewards differ
        rows = [
            json.loads(line)
            for line in (tmp_path / "trajectories" / f"version-{int(h['version']) - 1:05d}.jsonl")
            .read_text()
            .splitlines()
        ]
        spread = any(len({r["reward"] for r in rows if r["group"] == g}) > 1 for g in {r["group"] for r in rows})
        assert math.isfinite(h["grad_norm"]) and (h["grad_norm"] > 0) == spread, (h["grad_norm"], spread)
        assert h["reward_mean"] == pytest.approx(sum(r["reward"] for r in rows) / len(rows))
    assert json.loads((tmp_path / "config.json").read_text())["mode"] == mode
    rows = [json.loads(line) for line in lines]
    assert rows == json.loads(json.dumps(history))  # what the run returns is what metrics.jsonl holds
    _assert_throughput_limits(rows, mode)


def _assert_throughput_limits(rows, mode):
    """What limited the run, recorded by the trainer itself in every row: learner time, occupancy, engine work."""
    assert all(row["learner/step_s"] > 0 for row in rows)
    assert sum(row["learner/step_s"] for row in rows) < rows[-1]["elapsed_s"]
    for row in rows:
        assert 0 < row["rollout/episodes_in_flight_mean"] <= MAX_EPISODES
        assert 0.0 <= row["rollout/admission_blocked_share"] <= 1.0
    if mode == "sync":
        # each step's window holds its batch playing at the limit, then the learner step with nothing admitted
        assert all(0.0 < row["rollout/admission_blocked_share"] < 1.0 for row in rows)
    # the engine's cumulative counters: it decoded and prefilled, and generated every token trained so far
    trained = 0.0
    for before, row in zip([None, *rows], rows, strict=False):  # (the previous row, this one)
        trained += row["trained_tokens"]
        assert row["engine/generated_tokens"] >= trained and row["engine/prefill_tokens"] > 0
        assert row["engine/decode_steps"] > 0 and row["engine/reused_tokens"] >= 0 and row["engine/busy_s"] > 0
        if before is not None:
            assert all(
                row[f"engine/{k}"] >= before[f"engine/{k}"]
                for k in ("decode_steps", "prefill_tokens", "reused_tokens", "generated_tokens", "busy_s")
            )


@pytest.mark.parametrize("capacity_gib", [0.0, 64.0])
def test_the_engine_batch_takes_only_what_the_plan_leaves_the_learner(
    tmp_path, small_bundle, monkeypatch, capacity_gib
):
    """The in-process engine's batch budget is the plan's (`plan.engine_budget`): what this machine's memory leaves
    after the learner's step (run beside it), the engine's weights and the rest. With nothing left the engine decodes
    one row at a time; with room, the episodes in flight decode together."""
    from searchgym.agents.engines import torch_engine
    from searchgym.trainers.deployment import resolve_deployment
    from searchgym.trainers.launchers import local
    from searchgym.trainers.plan import GIB, engine_budget, model_shape

    engines = []
    opened = torch_engine.TorchEngine.__init__

    def spy(self, *args, **kwargs):
        opened(self, *args, **kwargs)
        engines.append(self)

    monkeypatch.setattr(torch_engine.TorchEngine, "__init__", spy)
    monkeypatch.setattr(local, "memory_after_release", lambda: (int(capacity_gib * GIB), "test"))
    config = small_run(tmp_path, "steps=1")
    train(config, progress=False)
    (engine,) = engines
    expected = engine_budget(
        config, resolve_deployment(config), model_shape(config.model.path), int(capacity_gib * GIB)
    )
    assert engine.memory_budget_bytes == expected and (expected == 0) == (capacity_gib == 0)
    rows = engine.stats()["max_rows"]
    assert rows == 1 if capacity_gib == 0 else rows > 1


def test_a_model_dir_whose_shapes_cannot_be_read_leaves_the_engine_its_default(tmp_path, monkeypatch):
    """The budget needs the model's shapes; where they cannot be read the engine keeps its own default and loading
    the model, next, says what is wrong."""
    from searchgym.trainers.deployment import resolve_deployment
    from searchgym.trainers.launchers import local

    broken = tmp_path / "model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    config = load_config(None, [f"out_dir={tmp_path / 'run'}", f"model.path={broken}"])
    assert local.engine_memory_budget(config, resolve_deployment(config)) == "auto"
