"""SIGKILL at seeded points of the real CLI (synthesize with the LLM agent and with KB walks, train, eval),
plus what a kill mid-write or a bad disk leaves (a cut last line, a damaged line, a checkpoint file cut
short): each rerun loses nothing written before the kill, repeats nothing, and reports every damaged
line by file and line (issue 15). The drills are searchgym.testing.kills', which `bench reliability` runs."""

import json
import random

import pytest

from searchgym.envs.tasks import TaskPool
from searchgym.testing.kills import drill_agent_synthesis, drill_eval, drill_kbwalk_synthesis, drill_train, json_rows
from searchgym.testing.stand_in_llm import StandInLLM, stand_in_server
from tests.conftest import SMALL, WARM_ENV

SEED = 15  # each test draws its kill points from random.Random(SEED): every run kills at the same rows


def test_agent_synthesis_killed_twice_then_resumed(small_bundle, tmp_path):
    kills = sorted(random.Random(SEED).sample(range(2, 10), 2))
    with stand_in_server(StandInLLM()) as url:
        result = drill_agent_synthesis(tmp_path, small_bundle / "index", url, kill_rows=kills, n=14)
    assert result.ok, result.to_dict()
    assert result.kills == result.kills_survived == 2 and result.items_before_kills >= kills[0]
    assert result.damaged_injected == result.damaged_reported == 2  # the cut pool row and the damaged log row
    pool = TaskPool.from_jsonl(tmp_path / "pool.jsonl")  # loads: nothing glued, nothing cut
    assert len(pool) == 14 and len({t.id for t in pool}) == 14
    logged = [row["url"] for row in json_rows(tmp_path / "pool.jsonl.progress.jsonl")]
    assert len(logged) == len(set(logged))  # no seed finished twice
    assert len({t.metadata["seed_page"] for t in pool}) == 14  # no seed page pooled twice
    aside = [json.loads(line) for line in (tmp_path / "pool.jsonl.progress.damaged.jsonl").read_text().splitlines()]
    assert [row["line"] for row in aside] == [1]  # the damaged line, kept with its number


def test_kbwalk_synthesis_killed_at_random_times(small_bundle, tmp_path):
    rng = random.Random(SEED)
    delays = [round(rng.uniform(0.2, 1.5), 2) for _ in range(3)]
    result = drill_kbwalk_synthesis(tmp_path, small_bundle, kill_after_s=delays, n=400)
    assert result.ok, result.to_dict()
    assert result.kills >= 1 and result.kills == result.kills_survived
    for i in range(result.kills):  # each killed run was finished (or refused to be replaced) equal to the reference
        assert (tmp_path / f"kill-{i}.jsonl").read_bytes() == (tmp_path / "reference.jsonl").read_bytes()


def test_train_killed_resumed_then_a_cut_checkpoint_is_named(small_bundle, tiny_model_dir, tmp_path):
    steps = 3
    kills = [random.Random(SEED).randrange(1, steps)]
    overrides = [
        f"model.path={tiny_model_dir}",
        f"env.kwargs.size={SMALL['size']}",
        f"env.kwargs.n_tasks={SMALL['n_tasks']}",
        "env.kwargs.max_turns=2",
        "rollout.group_size=2",
        "rollout.batch_size=2",
        "rollout.max_new_tokens=8",
        "rollout.max_staleness=1",
        "learner.drop_no_spread=false",
    ]
    result = drill_train(tmp_path, overrides, kill_rows=kills, steps=steps, fallback=False)
    assert result.ok, result.to_dict()
    assert result.kills == result.kills_survived == 1 and result.files_truncated == result.files_named == 1
    run = tmp_path / "run"
    assert [row["step"] for row in json_rows(run / "metrics.jsonl")] == list(range(1, steps + 1))
    superseded = json_rows(run / "metrics.superseded.jsonl")  # steps trained again after a resume: set aside, not lost
    assert all(row["row"]["step"] > row["resumed_after_step"] for row in superseded)


@pytest.mark.usefixtures("one_torch_thread")
def test_eval_killed_then_resumed(small_bundle, tiny_model_dir, tmp_path):
    kills = [random.Random(SEED).randrange(3, 7)]
    result = drill_eval(tmp_path, tiny_model_dir, WARM_ENV, kill_rows=kills, tasks=4, k=2)
    assert result.ok, result.to_dict()
    assert result.kills == result.kills_survived == 1 and result.damaged_injected == result.damaged_reported == 2


def test_a_resumed_run_log_keeps_each_step_once_and_reports_damage(tmp_path):
    """What a kill, a bad disk and a resume leave in metrics.jsonl: each step once, nothing silently dropped."""
    from searchgym.trainers.run.log import RunLog

    rows = [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.4}, {"step": 3, "loss": 0.3}, {"step": 2, "loss": 9.0}]
    lines = [json.dumps(rows[0]), '{"step": 2, "lo', *map(json.dumps, rows[1:])]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 4, "loss"')  # a kill mid-write
    with pytest.warns(
        UserWarning, match=r"metrics\.jsonl: set aside 2 unusable line\(s\): line 2: damaged.*line 6: cut"
    ):
        log = RunLog(tmp_path, {}, resume_step=2)  # resumed from checkpoint step 2
    log.close()
    assert json_rows(tmp_path / "metrics.jsonl") == rows[:2] == log.history()
    assert json_rows(tmp_path / "metrics.superseded.jsonl") == [
        {"resumed_after_step": 2, "row": rows[2]},
        {"resumed_after_step": 2, "row": rows[3]},
    ]
    aside = json_rows(tmp_path / "metrics.damaged.jsonl")
    assert [(row["line"], row["text"]) for row in aside] == [(2, '{"step": 2, "lo')]
