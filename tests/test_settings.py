"""The one settings loader: layers (defaults, file, values, overrides), refusals that name the dotted key and
its source, checks declared once and run on nested configs, and the commands that load through it."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchgym.bench.trainer import TrainerBenchConfig
from searchgym.cli import main
from searchgym.eval.eval_settings import EvalSettings
from searchgym.pipeline.stages import QuickstartConfig, load_quickstart_config
from searchgym.settings import check_settings, load_settings, settings_dict
from searchgym.trainers.config import TrainConfig

CONFIGS = Path(__file__).parents[1] / "configs"


def checked_fields(cls: type, prefix: str = "") -> list[tuple[str, dict]]:
    """(dotted key, declared checks) of every field with checks, nested dataclasses included."""
    out = []
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            out += checked_fields(type(default), f"{prefix}{f.name}.")
        elif f.metadata:
            out.append((f"{prefix}{f.name}", dict(f.metadata)))
    return out


def bad_values(rules: dict) -> st.SearchStrategy:
    """Values that break one declared check."""
    options = []
    if "choices" in rules:
        options.append(
            st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12).filter(
                lambda v: v not in rules["choices"]
            )
        )
    if "at_least" in rules:
        options.append(st.integers(-1000, int(rules["at_least"]) - 1))
    if "above" in rules:
        options.append(st.integers(-1000, int(rules["above"])))
    if "at_most" in rules:
        options.append(st.integers(int(rules["at_most"]) + 1, 1000))
    if "below" in rules:
        options.append(st.integers(int(rules["below"]), 1000))
    return st.one_of(options)


@pytest.mark.parametrize(
    "cls", [TrainConfig, QuickstartConfig, TrainerBenchConfig, EvalSettings], ids=lambda c: c.__name__
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_refused_override_names_its_dotted_key(cls, data):
    key, rules = data.draw(st.sampled_from(checked_fields(cls)))
    value = data.draw(bad_values(rules))
    with pytest.raises(ValueError) as refused:
        load_settings(
            cls, overrides=[f"{key}={value}"], values={"env": "e", "engine": "m"} if cls is EvalSettings else None
        )
    assert str(refused.value).startswith((f"{key} ", f"{key}: ")), refused.value


def test_the_nested_train_config_is_checked_under_its_prefix():
    assert "rl.mode" in dict(checked_fields(QuickstartConfig))  # TrainConfig's checks, declared once, reach it
    with pytest.raises(ValueError, match=r"^rl\.mode must be one of 'async', 'sync', got 'bogus'"):
        load_quickstart_config(["rl.mode=bogus"])
    with pytest.raises(ValueError, match=r"^rl\.rollout\.max_concurrent_rollouts "):  # a dataclass's own check()
        load_quickstart_config(["rl.rollout.max_concurrent_rollouts=3"])


@settings(deadline=None)
@given(
    section=st.sampled_from(["", "rl.", "rl.rollout.", "eval.", "sft."]),
    name=st.from_regex(r"[a-z]{1,10}", fullmatch=True),
    tail=st.sampled_from(["", ".x"]),
)
def test_an_unknown_key_is_refused_naming_it_and_the_source(section, name, tail):
    known = set(_flat(settings_dict(QuickstartConfig())))
    if f"{section}{name}" in known or any(k.startswith(f"{section}{name}.") for k in known):
        return
    override = f"{section}{name}{tail}=1"
    with pytest.raises(ValueError) as refused:
        load_settings(QuickstartConfig, overrides=[override])
    assert str(refused.value).startswith(f"{section}{name}: ") and f"override {override!r}" in str(refused.value)


def _flat(data: dict, prefix: str = "") -> list[str]:
    """Every dotted key of nested plain data."""
    return [
        k
        for key, value in data.items()
        for k in ([f"{prefix}{key}"] + (_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else []))
    ]


def test_the_layers_apply_in_order_and_name_their_source(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("steps: 7\nseed: 3\nlearner:\n  lr: 0.001\n")
    config = load_settings(TrainConfig, path, ["seed=5"], {"steps": 9, "seed": 4})
    assert (config.steps, config.seed, config.learner.lr) == (9, 5, 0.001)  # values over the file, overrides last
    with pytest.raises(ValueError, match=r"^steps: .*from the command's flags"):
        load_settings(TrainConfig, values={"steps": "many"})
    with pytest.raises(ValueError, match=r"^steps must be at least 1, got 0"):
        load_settings(TrainConfig, values={"steps": 0})
    path.write_text("rollout:\n  group_sise: 3\n")
    with pytest.raises(ValueError, match=r"^rollout\.group_sise: .*run\.yaml"):
        load_settings(TrainConfig, path)
    with pytest.raises(ValueError, match="key=value"):
        load_settings(TrainConfig, overrides=["steps"])
    path.write_text("steps: [unclosed\n")
    with pytest.raises(ValueError, match=r"run\.yaml is not valid YAML"):
        load_settings(TrainConfig, path)


def test_a_runs_json_config_reads_back_past_yamls_node_limit(tmp_path):
    """A run writes config.json with its task ids; 12k pass YAML's node limit, so JSON is read as JSON."""
    config = load_settings(TrainConfig, values={"steps": 3, "tasks": [f"q{i}" for i in range(12_000)]})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(settings_dict(config)))
    assert load_settings(TrainConfig, path) == config
    path.write_text('{"steps": 3,')
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON"):
        load_settings(TrainConfig, path)
    path.write_text('{"stepz": 3}')
    with pytest.raises(ValueError, match=r"^stepz: .*config\.json"):
        load_settings(TrainConfig, path)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["steps", "seed", "x"]), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_JSON, raw=st.binary(max_size=40), suffix=st.sampled_from([".json", ".JSON", ".yaml"]))
def test_any_config_file_loads_or_is_one_clear_error(tmp_path, value, raw, suffix):
    """Whatever a config file holds (any JSON value, any bytes), loading it gives settings or a ValueError that names
    the file or the key: never another exception."""
    for i, content in enumerate((json.dumps(value).encode(), raw)):
        path = tmp_path / f"c{i}{suffix}"
        path.write_bytes(content)
        try:
            load_settings(TrainConfig, path)
        except ValueError as e:
            assert path.name in str(e) or re.match(r"(steps|seed|x)\b", str(e)), str(e)


def test_settings_round_trip_through_their_plain_data(tmp_path):
    config = load_quickstart_config(["rl.steps=3", "eval.k=2"])
    assert load_settings(QuickstartConfig, values=settings_dict(config)) == config


def test_settings_built_in_python_are_checked_the_same_way():
    config = TrainConfig()
    config.rollout.engine = "vllm"
    with pytest.raises(ValueError, match=r"^rl\.rollout\.engine must be one of"):
        check_settings(config, "rl.")


def test_train_refuses_a_bad_config_before_anything_starts(tmp_path):
    from searchgym.trainers.launchers.local import train
    from searchgym.trainers.launchers.ray_cluster import train_ray

    config = TrainConfig(out_dir=str(tmp_path / "run"))
    config.mode = "bogus"
    for run in (train, train_ray):
        with pytest.raises(ValueError, match=r"^mode must be one of"):
            run(config, progress=False)
    config.mode, config.watchdog.lr_factor = "async", 0.0
    with pytest.raises(ValueError, match=r"^watchdog\.lr_factor "):
        train(config, progress=False)
    assert not (tmp_path / "run").exists()  # nothing was written


def test_the_shipped_quickstart_file_is_what_the_quickstart_runs():
    assert load_quickstart_config(path=CONFIGS / "quickstart.yaml") == QuickstartConfig() == load_quickstart_config()


def test_the_real_model_preset_names_a_packaged_model_in_quickstart_and_bench_learning(capsys):
    from searchgym.agents.packaged_models import MODELS
    from searchgym.bench.learning import load_learning_config

    preset = load_quickstart_config(preset="smollm2")
    assert preset.base in MODELS and preset.demos.limit and preset.demos.limit <= 1000  # hundreds of demonstrations
    over_seeds = load_learning_config(preset="smollm2")
    assert (over_seeds.base, over_seeds.sft, over_seeds.rl.learner.lr) == (
        preset.base,
        preset.sft,
        preset.rl.learner.lr,
    )
    assert over_seeds.max_demos == preset.demos.limit and over_seeds.hops.eval == [preset.env.kwargs["hops"]] == [1]
    with pytest.raises(ValueError, match="demos.limit"):
        load_quickstart_config(["demos.limit=0"], preset="smollm2")
    with pytest.raises(ValueError, match="base 'no-such-model'"):
        from searchgym.pipeline.stages import resolve_model

        resolve_model("no-such-model")


@pytest.fixture
def nothing_runs(monkeypatch):
    """Any command that gets past its settings fails the test: refusals must come before building anything."""

    def refuse(*args, **kwargs):
        raise AssertionError("the command ran")

    import searchgym.bench.learning
    import searchgym.quickstart
    import searchgym.trainers.launchers.local

    monkeypatch.setattr(searchgym.quickstart, "run_quickstart", refuse)
    monkeypatch.setattr(searchgym.trainers.launchers.local, "train", refuse)
    monkeypatch.setattr(searchgym.bench.learning, "run_learning_bench", refuse)


@pytest.mark.parametrize(
    ("argv", "key"),
    [
        (["quickstart", "rl.mode=bogus"], "rl.mode"),
        (["quickstart", "eval.k=0"], "eval.k"),
        (["quickstart", "--config", "QUICKSTART", "demos.fraction=2"], "demos.fraction"),
        (["train", "--config", "TRAIN", "rollout.engine=vllm"], "rollout.engine"),
        (["bench", "learning", "rl.mode=bogus"], "rl.mode"),
        (["bench", "learning", "hops.rl=[7]"], "hops.rl"),
    ],
)
def test_a_command_with_a_bad_setting_exits_2_naming_the_key(argv, key, capsys, nothing_runs):
    argv = [
        str(CONFIGS / "quickstart.yaml")
        if a == "QUICKSTART"
        else str(CONFIGS / "train-cpu.yaml")
        if a == "TRAIN"
        else a
        for a in argv
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("searchgym: error: ") and f"{key} " in err, err


def test_quickstart_flags_and_file_reach_the_config(tmp_path, monkeypatch):
    seen = []
    import searchgym.quickstart

    monkeypatch.setattr(
        searchgym.quickstart, "run_quickstart", lambda config: seen.append(config) or {"out_dir": config.out_dir}
    )
    path = tmp_path / "q.yaml"
    path.write_text("rl:\n  steps: 5\neval:\n  k: 2\n")
    assert main(["quickstart", "--config", str(path), "--out", str(tmp_path / "o"), "eval.k=3"]) == 0
    assert (seen[0].rl.steps, seen[0].eval.k, seen[0].out_dir) == (5, 3, str(tmp_path / "o"))


@settings(max_examples=80)
@given(
    raw=st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)
    | st.integers(-50, -1).map(str)
    | st.sampled_from(["nan", "inf", "-0.5", "1e400"])
)
def test_junk_llm_retry_settings_are_refused_naming_the_variable(raw):
    import os

    from searchgym.core.llm_calls import llm_backoff, llm_retries

    for name, read in (("SEARCHGYM_LLM_RETRIES", llm_retries), ("SEARCHGYM_LLM_BACKOFF", llm_backoff)):
        old = os.environ.get(name)
        os.environ[name] = raw
        try:
            try:
                value = read()
            except ValueError as e:
                assert str(e).startswith(f"{name}="), e
            else:  # accepted only when it is a value the setting can take
                assert value >= 0 and value != float("inf") and (raw.strip() == "" or float(raw) == value)
        finally:
            os.environ.pop(name) if old is None else os.environ.__setitem__(name, old)


@pytest.mark.parametrize(
    ("flags", "key"),
    [
        (["--steps", "0"], "steps"),
        (["--warmup-steps", "5"], "warmup_steps"),
        (["--staleness", "1,2"], "staleness"),
        (["--lr", "0"], "lr"),
        (["--tail-share", "2"], "tail_share"),
        (["--turns-p90", "99"], "turns_p90"),
        (["--episode-tokens-max", "10"], "episode_tokens_max"),
        (["latency_alpha=0"], "latency_alpha"),
        (["stepz=3"], "stepz"),
    ],
)
def test_bench_trainer_refuses_a_bad_setting_naming_the_key(flags, key, capsys, monkeypatch):
    import searchgym.bench.trainer

    monkeypatch.setattr(searchgym.bench.trainer, "run_trainer_bench", lambda *a, **kw: pytest.fail("the bench ran"))
    assert main(["bench", "trainer", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"searchgym: error: {key} ") or err.startswith(f"searchgym: error: {key}: "), err


def test_bench_trainer_flags_file_and_overrides_reach_the_run(tmp_path, capsys, monkeypatch):
    import searchgym.bench.trainer

    seen = []
    monkeypatch.setattr(searchgym.bench.trainer, "run_trainer_bench", lambda config: seen.append(config) or {})
    path = tmp_path / "bench.yaml"
    path.write_text("steps: 7\nlr: 0.5\nturns_max: 30\n")
    assert (
        main(
            [
                "bench",
                "trainer",
                "--config",
                str(path),
                "--steps",
                "4",
                "--staleness",
                "0,2",
                "--out",
                str(tmp_path / "r.json"),
                "lr=0.25",
            ]
        )
        == 0
    )
    run = seen[0]
    assert (run.steps, run.staleness, run.lr, run.out) == (4, [0, 2], 0.25, str(tmp_path / "r.json"))
    assert run.workload().turns_max == 30 and run.threads == 1  # the file's, and the default
    assert run.context_policy == "end" and run.train_overrides == []


@pytest.mark.parametrize(
    ("argv", "key"),
    [
        (["sft", "--data", "d.jsonl", "--model", "m", "--out", "o", "--epochs", "0"], "epochs"),
        (["sft", "--data", "d.jsonl", "--model", "m", "--out", "o", "--batch-tokens", "0"], "batch_tokens"),
        (["synthesize", "--corpus", "c", "--engine", "e", "--out", "p.jsonl", "--k", "0"], "k"),
        (
            ["synthesize", "--corpus", "c", "--engine", "e", "--out", "p.jsonl", "--max-solve-rate", "1.5"],
            "max_solve_rate",
        ),
        (["model", "tiny", "--out", "m", "--copy-steps", "-2"], "copy_steps"),
    ],
)
def test_other_commands_check_their_flags_through_the_loader(argv, key, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written; if it were, it lands here
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"searchgym: error: {key} "), err
    assert list(tmp_path.iterdir()) == []  # refused before anything was built
