"""An eval's settings are one object: `searchgym eval` loads it from flags, a file and overrides through the one
loader, refusals name the key before anything runs, and `run.json` is that object (it reads back equal)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchgym.cli import main
from searchgym.eval.eval_settings import EvalSettings, load_eval_settings, read_run, run_record
from searchgym.settings import settings_dict
from tests.conftest import SMALL

SYN = "searchgym/SyntheticQA-v0"
words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz/:._-0123456789", min_size=1, max_size=20)
maybe = lambda s: st.none() | s  # noqa: E731

eval_settings = st.builds(
    EvalSettings,
    env=words,
    engine=words,
    k=st.integers(1, 64),
    judge=maybe(words),
    env_kwargs=st.dictionaries(st.sampled_from(["size", "seed", "judge", "max_turns"]), st.integers(0, 9) | words),
    max_tasks=maybe(st.integers(1, 10_000)),
    concurrency=st.integers(1, 512),
    temperature=st.floats(0, 2, allow_nan=False),
    max_new_tokens=st.integers(1, 4096),
    max_context=st.integers(1, 1 << 17),
    seed=st.integers(0, 2**31),
    device=st.sampled_from(["cpu", "cuda"]),
    tokenizer=maybe(words),
    judge_model=maybe(words),
    workflow=maybe(words),
    labels=maybe(words),
    context_policy=st.sampled_from(["end", "fold", "summarise"]),
)


@given(settings=eval_settings, model=maybe(words))
def test_run_json_round_trips_into_the_settings_object(settings, model, tmp_path_factory):
    path = tmp_path_factory.mktemp("run") / "run.json"
    path.write_text(json.dumps(run_record(settings, model)))
    assert read_run(path) == (settings, model)


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        (["k=0"], "k"),
        (["--k", "0"], "k"),
        (["max_tasks=-3"], "max_tasks"),
        (["concurrency=0"], "concurrency"),
        (["temperature=-1"], "temperature"),
        (["context_policy=squash"], "context_policy"),
        (["nope=1"], "nope"),
        (["max_new_tokens=many"], "max_new_tokens"),
    ],
)
def test_a_bad_setting_exits_2_naming_the_key_before_anything_runs(extra, key, tmp_path, capsys):
    out = tmp_path / "eval"
    assert main(["eval", "--env", SYN, "--engine", "openai:http://127.0.0.1:9/v1", "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("searchgym: error: ") and (f"{key} " in err or f"{key}: " in err), err
    assert not out.exists()  # nothing was started or written


def test_a_bad_key_in_the_file_names_the_key_and_the_file(tmp_path, capsys):
    config = tmp_path / "eval.yaml"
    config.write_text(f"env: {SYN}\nengine: x\nmax_taks: 3\n")
    assert main(["eval", "--config", str(config), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "max_taks" in err and "eval.yaml" in err, err
    config.write_text(f"env: {SYN}\n")  # no engine anywhere
    assert main(["eval", "--config", str(config), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.startswith("searchgym: error: engine: ")
    assert not (tmp_path / "o").exists()


def test_the_eval_command_runs_the_settings_it_loaded_and_records_them(tmp_path, tiny_model_dir, small_bundle, capsys):
    config = tmp_path / "eval.yaml"
    config.write_text(
        f"env: {SYN}\nk: 3\nmax_tasks: 2\nmax_new_tokens: 6\nmax_context: 300\nconcurrency: 2\n"
        f"judge: em,f1\nenv_kwargs: {json.dumps(SMALL)}\n"
    )
    out = tmp_path / "eval"
    # the file, then the flags (--engine, --k), then the dotted overrides (k=1)
    assert (
        main(
            [
                "eval",
                "--config",
                str(config),
                "--engine",
                str(tiny_model_dir),
                "--k",
                "2",
                "--out",
                str(out),
                "k=1",
                "temperature=0.5",
            ]
        )
        == 0
    ), capsys.readouterr().err
    settings, model = read_run(out / "run.json")
    expected = load_eval_settings(config, ["k=1", "temperature=0.5"], {"engine": str(tiny_model_dir), "k": 2})
    assert settings == expected and (settings.k, settings.max_tasks, settings.temperature) == (1, 2, 0.5)
    assert model is not None  # the weights' identity, which a rerun must match
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metrics"]["samples"] == 2  # what ran is what was recorded: 2 tasks x k=1
    assert settings_dict(settings) == {
        k: v for k, v in json.loads((out / "run.json").read_text()).items() if k != "model"
    }
