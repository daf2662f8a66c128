"""Training configs: every shipped YAML loads and is accepted by its launcher, overrides apply with their types,
and wrong keys, types, choices and ranges are refused with an error that names the key."""

import json
from pathlib import Path

import pytest

from searchgym.trainers.config import TrainConfig, config_dict, load_config
from searchgym.trainers.deployment import resolve_deployment

CONFIGS = Path(__file__).parents[2] / "configs"
SHIPPED = sorted(p for p in CONFIGS.glob("*.yaml") if not p.name.startswith("quickstart"))  # those are the quickstart's


def test_configs_are_shipped():
    assert len(SHIPPED) >= 3, SHIPPED


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_a_shipped_config_loads_and_its_launcher_accepts_it(path, tmp_path):
    from searchgym.envs.env_kwargs import check_env_kwargs

    config = load_config(path)
    assert isinstance(config, TrainConfig) and config != TrainConfig()  # the file changed something
    check_env_kwargs(config.env.id, config.env.kwargs)  # its env takes every kwarg (the defaults are SyntheticQA's)
    assert resolve_deployment(config).launcher == config.launcher  # e.g. Ray's batch and servers split over its actors
    # a run directory's config.json (what the launchers write) loads back to the very same config
    (tmp_path / "config.json").write_text(json.dumps(config_dict(config)))
    assert load_config(tmp_path / "config.json") == config


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("asearcher-7b-*.yaml")), ids=lambda p: p.name)
def test_the_asearcher_configs_reward_with_asearchers_f1(path):
    """The configs that mirror ASearcher's training reward build the judge that equals it (format gate on top)."""
    from searchgym.envs.judges import ASearcherF1, FormatGate, make_judge

    kwargs = load_config(path).env.kwargs
    judge = make_judge(kwargs["judge"])
    assert isinstance(judge, ASearcherF1) and kwargs["format_gate"] is True
    assert FormatGate(judge).judge("the Paris", ["Paris"], aug_references=["x"]).score == pytest.approx(2 / 3)


def test_the_file_overrides_the_defaults_and_overrides_override_the_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("steps: 7\nlearner:\n  lr: 0.001\nrollout:\n  group_size: 8\n  max_concurrent_rollouts: 64\n")
    config = load_config(
        path,
        [
            "learner.lr=1e-6",
            "rollout.max_staleness=4",
            "tasks=[a,b]",
            "rollout.sglang_addresses=[h:1,h:2]",
            "model.path=/models/x",
            "ray.address=auto",
        ],
    )
    assert (config.steps, config.rollout.group_size) == (7, 8)  # from the file
    assert config.learner.lr == 1e-6 and isinstance(config.learner.lr, float)  # the override wins, typed
    assert config.rollout.max_staleness == 4 and config.tasks == ["a", "b"]
    assert config.rollout.sglang_addresses == ["h:1", "h:2"] and config.model.path == "/models/x"
    assert config.rollout.batch_size == TrainConfig().rollout.batch_size  # untouched: the default
    assert load_config(None, ["env.kwargs.max_turns=9"]).env.kwargs["max_turns"] == 9  # env kwargs are free-form


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("learner.nope=1", "learner.nope"),  # unknown keys
        ("nope=1", "nope"),
        ("rollout.batch_sise=3", "rollout.batch_sise"),
        ("steps=many", "steps"),  # wrong types
        ("rollout.batch_size=1.5", "rollout.batch_size"),
        ("tasks=3", "tasks"),
        ("learner.betas=[0.9]", "learner.betas"),
        ("rollout=3", "rollout"),
        ("mode=fast", "mode"),  # outside the choices
        ("launcher=slurm", "launcher"),
        ("rollout.engine=vllm", "rollout.engine"),
        ("rollout.observation_role=system", "rollout.observation_role"),
        ("learner.process_reward=sum", "learner.process_reward"),
        ("ray.weight_sync=nccl", "ray.weight_sync"),
        ("ray.sglang_server=vllm", "ray.sglang_server"),
        ("save_every=0", "save_every"),  # outside the range
        ("rollout.max_staleness=-1", "rollout.max_staleness"),
        ("rollout.max_concurrent_rollouts=2", "rollout.max_concurrent_rollouts"),  # less than one group of 4
        ("learner.minibatches=0", "learner.minibatches"),
    ],
)
def test_a_wrong_setting_is_refused_naming_the_key(override, named):
    with pytest.raises(ValueError) as refused:
        load_config(None, [override])
    assert str(refused.value).startswith(named + " ") or str(refused.value).startswith(named + ":"), refused.value


def test_a_wrong_key_in_the_file_is_refused_naming_the_key_and_the_file(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("rollout:\n  batch_sise: 3\n")
    with pytest.raises(ValueError, match=r"^rollout\.batch_sise: .*typo\.yaml"):
        load_config(path)


def test_a_run_can_train_on_a_chosen_subset_of_the_tasks(small_pool, small_index):
    from searchgym.envs.search_env import SearchEnv
    from searchgym.trainers.build import task_ids

    make_env = lambda: SearchEnv(small_pool, small_index)  # noqa: E731
    ids = [t.id for t in small_pool]
    assert task_ids(make_env) == ids
    assert task_ids(make_env, ids[5:1:-1]) == ids[5:1:-1]  # the given order is the data order
    with pytest.raises(ValueError, match="not in the env's pool"):
        task_ids(make_env, [ids[0], "no-such-task"])
    assert load_config(None, [f"tasks=[{ids[0]},{ids[1]}]"]).tasks == ids[:2]


def test_another_env_id_keeps_only_the_default_kwargs_it_takes():
    """SyntheticQA's default kwargs (size, n_tasks, split) do not follow a config to LocalQA, which takes none of
    them; max_turns, which every env takes, does; and a kwarg the user set is never dropped."""
    local = load_config(None, ["env.id=searchgym/LocalQA-v0", "env.kwargs.tasks=t.jsonl", "env.kwargs.index=i"])
    assert local.env.kwargs == {"max_turns": 4, "tasks": "t.jsonl", "index": "i"}
    typo = load_config(None, ["env.id=searchgym/LocalQA-v0", "env.kwargs.size=5"])
    assert typo.env.kwargs["size"] == 5  # not a default: kept, and refused by name when the env is made
    assert load_config(None, []).env.kwargs == {"size": 1000, "n_tasks": 200, "split": "train", "max_turns": 4}
