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
    assert main(["tasks", "build", "--world", str(world), "--n", "40", "--out", str(out), "--dataset", str(tmp_path / "ds")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["accepted"] == 40 and report["oracle_solve_rate_by_hops"]
    pool = TaskPool.load(out)
    assert len(pool) == 40 and list(TaskPool.load(tmp_path / "ds")) == list(pool)


def test_demo_prints_episodes(tmp_path, capsys):
    assert main(["demo", "--size", "400", "--episodes", "2", "--cache", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("reward 1.0") == 2 and "<search>" in out and ">>>> Page 1 >>>>" in out
    assert "baseline 'search the question once" in out


def test_errors_are_reported_not_raised(tmp_path, capsys):
    assert main(["world", "build", "--size", "5", "--out", str(tmp_path / "w")]) == 2
    assert "searchgym: error:" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["world", "explode"])


def test_demos_then_sft(tmp_path, capsys, small_bundle, tiny_model_dir):
    from tests.conftest import SMALL

    demos = tmp_path / "demos.jsonl"
    kwargs = json.dumps({**SMALL, "split": "train", "hops": 1})
    assert main(["demos", "--env-kwargs", kwargs, "--out", str(demos)]) == 0
    assert "demonstrations of" in capsys.readouterr().out
    rows = [json.loads(line) for line in demos.read_text().splitlines()]
    assert rows and all(row["messages"][0]["role"] == "user" for row in rows)
    assert main(["sft", "--data", str(demos), "--model", str(tiny_model_dir), "--out", str(tmp_path / "sft"),
                 "--epochs", "0.1", "--batch-tokens", "4096"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] >= 1
    assert (tmp_path / "sft" / "model.safetensors").exists()


def test_model_tiny_with_copy_pretraining(tmp_path, capsys):
    out = tmp_path / "tiny"
    assert main(["model", "tiny", "--out", str(out), "--hidden", "32", "--vocab", "512", "--copy-steps", "3"]) == 0
    assert "copy accuracy after 3 copy-pretraining steps" in capsys.readouterr().out
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
    assert (out / "copy_pretrain_history.jsonl").read_text().count("\n") == 3
