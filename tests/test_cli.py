"""The `searchgym` command, run in-process the way a user runs it from a shell."""

import json

import pytest

from searchgym.cli import main
from searchgym.envs.tasks import TaskPool


def test_world_index_tasks_pipeline(tmp_path, capsys):
    world = tmp_path / "world"
    assert main(["world", "build", "--size", "300", "--seed", "3", "--out", str(world), "--html"]) == 0
    assert {p.name for p in world.iterdir()} >= {"corpus.jsonl", "kb.jsonl", "html.jsonl", "world.json"}
    assert main(["index", "build", "--corpus", str(world / "corpus.jsonl"), "--out", str(world / "index")]) == 0
    assert "indexed 300 documents" in capsys.readouterr().out
    out = tmp_path / "tasks.jsonl"
    assert (
        main(
            ["tasks", "build", "--world", str(world), "--n", "40", "--out", str(out), "--dataset", str(tmp_path / "ds")]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["accepted"] == 40 and report["oracle_solve_rate_by_hops"]
    pool = TaskPool.load(out)
    assert len(pool) == 40 and list(TaskPool.load(tmp_path / "ds")) == list(pool)


def test_demo_prints_episodes(tmp_path, capsys):
    assert main(["demo", "--size", "400", "--episodes", "2", "--cache", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("reward 1.0") == 2 and "<search>" in out and ">>>> Page 1 >>>>" in out
    assert "baseline 'search the question once" in out


def test_demo_shows_a_question_that_needs_min_calls(tmp_path, capsys):
    assert main(["demo", "--size", "400", "--episodes", "1", "--min-calls", "4", "--cache", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "proof: min_calls=4" in out and "reward 1.0 after 4 tool calls" in out
    assert out.count("--- turn ") == 5  # four calls and the answer


def test_errors_are_reported_not_raised(tmp_path, capsys):
    assert main(["world", "build", "--size", "5", "--out", str(tmp_path / "w")]) == 2
    assert "searchgym: error:" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["world", "explode"])


def test_demos_then_sft(tmp_path, capsys, small_bundle, tiny_model_dir, one_torch_thread):
    import gymnasium as gym
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from searchgym.envs.actions import parse_action
    from tests.conftest import SMALL

    demos = tmp_path / "demos.jsonl"
    kwargs = {**SMALL, "split": "train", "hops": 1}
    assert main(["demos", "--env-kwargs", json.dumps(kwargs), "--out", str(demos)]) == 0
    rows = [json.loads(line) for line in demos.read_text().splitlines()]
    tasks = list(gym.make("searchgym/SyntheticQA-v0", **kwargs).unwrapped.tasks)
    assert f"{len(rows)} demonstrations of {len(tasks)} tasks written" in capsys.readouterr().out
    assert len(rows) >= len(tasks) // 2  # the oracle solves most one-hop tasks from the search results
    by_question = {t.question: t for t in tasks}
    for row in rows:  # each row is a solved episode: the env's prompt, then valid calls ending in the right answer
        chat = row["messages"]
        assert [m["role"] for m in chat] == ["user", "assistant"] * (len(chat) // 2)
        task = by_question[chat[0]["content"].rsplit("Question: ", 1)[1]]
        actions = [parse_action(m["content"]) for m in chat[1::2]]
        assert all(a.ok for a in actions) and [a.tool for a in actions[:-1]] == ["search"] * (len(actions) - 1)
        assert actions[-1].tool == "answer" and actions[-1].argument in task.answers

    out = tmp_path / "sft"
    assert (
        main(
            [
                "sft",
                "--data",
                str(demos),
                "--model",
                str(tiny_model_dir),
                "--out",
                str(out),
                "--epochs",
                "0.1",
                "--batch-tokens",
                "4096",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    history = [json.loads(line) for line in (out / "sft_history.jsonl").read_text().splitlines()]
    assert report["steps"] == len(history) >= 1 and report["final"] == history[-1] and report["out"] == str(out)
    before, after = load_file(tiny_model_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert before.keys() == after.keys() and any(not before[k].equal(after[k]) for k in before), "sft trained nothing"
    text = json.dumps(rows[0]["messages"])
    assert AutoTokenizer.from_pretrained(out).encode(text) == AutoTokenizer.from_pretrained(tiny_model_dir).encode(text)


def test_model_tiny_with_copy_pretraining(tmp_path, capsys, one_torch_thread):
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from searchgym.agents.tiny_model import TinyShape, build_tiny_model

    out = tmp_path / "tiny"
    assert main(["model", "tiny", "--out", str(out), "--hidden", "32", "--vocab", "512", "--copy-steps", "3"]) == 0
    history = [json.loads(line) for line in (out / "copy_pretrain_history.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == [1, 2, 3]
    assert (
        f"copy accuracy after 3 copy-pretraining steps: {history[-1]['copy_accuracy']:.3f}" in capsys.readouterr().out
    )
    config = AutoConfig.from_pretrained(out)
    assert config.hidden_size == 32 and config.vocab_size <= 512
    # the model it started from (same flags, same seed) is not the one written: three steps trained it
    shape = TinyShape(hidden_size=32, vocab_size=512, intermediate_size=96, init_std=0.02)
    fresh = build_tiny_model(tmp_path / "fresh", shape)
    before, after = load_file(fresh / "model.safetensors"), load_file(out / "model.safetensors")
    assert before.keys() == after.keys() and all(before[k].shape == after[k].shape for k in before)
    assert any(not before[k].equal(after[k]) for k in before)


def test_help_is_written_for_users(capsys):
    """`searchgym --help` opened with "thin argument parsing that dispatches to the rooms", and commands were
    described as "servers", "models" or "task pools": it now says what the package is for and where to start,
    each command says what it does for its user, and `searchgym COMMAND --help` opens with that."""
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "rooms" not in text and "dispatches" not in text and "FUZZ/INJECT" not in text
    assert "New here? `searchgym quickstart` runs the whole pipeline" in text and "searchgym COMMAND --help" in text
    from searchgym.cli import build_parser

    commands = next(a for a in build_parser()._actions if a.dest == "command")
    for command in commands._choices_actions:
        assert len(command.help.split()) >= 6, command.dest  # a sentence, not a noun ("servers")
        assert commands.choices[command.dest].description, command.dest
    with pytest.raises(SystemExit):
        main(["quickstart", "--help"])
    assert "The whole pipeline on one CPU box" in capsys.readouterr().out


def test_python_dash_m_searchgym_is_the_same_command(tmp_path):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "searchgym", "view", str(tmp_path / "missing")], capture_output=True, text=True
    )
    assert done.returncode == 2 and "no run to show" in done.stderr


def test_serve_ray_search_flags_reach_its_settings_and_a_bad_one_names_the_key():
    from searchgym.cli import build_parser
    from searchgym.serve.settings import RaySearchSettings, server_settings

    args = build_parser().parse_args(["serve", "ray-search", "--index", "idx", "--replicas", "2", "--snippets"])
    settings = server_settings(args, RaySearchSettings)
    assert (settings.index, settings.replicas, settings.snippets, settings.host) == ("idx", 2, True, "127.0.0.1")
    with pytest.raises(ValueError, match="replicas must be at least 1"):
        server_settings(build_parser().parse_args(["serve", "ray-search", "--replicas", "0"]), RaySearchSettings)
