"""The run's deployment (trainers/deployment.py): resolved once from a config, for every kind of run; contradictions
refused naming the key; the very object the plan and both launchers use; and nothing else in the package reads
`learner.ranks`."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import searchgym
from searchgym.trainers.config import TrainConfig, load_config
from searchgym.trainers.deployment import LOCAL_CLUSTER, Deployment, DeploymentError, resolve_deployment

PACKAGE = Path(searchgym.__file__).parent
CONFIGS = Path(__file__).parents[2] / "configs"
SGLANG = ["model.path=some/model", "rollout.engine=sglang"]  # what every SGLang deployment needs
RAY = ["launcher=ray"]


def resolve(*overrides: str) -> Deployment:
    return resolve_deployment(load_config(None, list(overrides)))


def is_key(dotted: str) -> bool:
    """Whether `dotted` names a setting of TrainConfig (`rollout.engine`, `ray.learner_gpus`, ...)."""
    settings_object: object = TrainConfig()
    for name in dotted.split("."):
        if not dataclasses.is_dataclass(settings_object) or name not in {
            f.name for f in dataclasses.fields(settings_object)
        }:
            return False
        settings_object = getattr(settings_object, name)
    return True


# ---- each kind of deployment ---------------------------------------------------------------------------------


def test_one_process_with_its_torch_engine_is_the_default():
    d = resolve()
    assert (d.launcher, d.cluster, d.engine, d.servers, d.server_count) == ("local", None, "torch", "none", 0)
    assert (d.learner_ranks, d.sharded, d.learner_device, d.engine_device) == (1, False, "cpu", "cpu")
    assert (d.weight_route, d.backend, d.rank_device, d.rollout_actors) == ("in_process", "gloo", "cpu", 0)
    assert [p.name for p in d.processes] == ["this process"] and d.resources == {"CPU": 1.0, "GPU": 0.0}


def test_a_local_sharded_learner_adds_follower_processes():
    d = resolve("learner.ranks=3")
    assert d.sharded and d.backend == "gloo" and d.weight_route == "in_process"
    assert [(p.name, p.count) for p in d.processes] == [("this process", 1), ("follower ranks", 2)]
    assert d.resources == {"CPU": 3.0, "GPU": 0.0}
    gpu = resolve("learner.ranks=2", "model.device=cuda")
    assert (gpu.learner_device, gpu.rank_device, gpu.backend, gpu.learner_on_gpu) == ("cuda", "cuda", "nccl", True)
    assert gpu.resources == {"CPU": 2.0, "GPU": 2.0} and "cuda:0" in gpu.processes[0].detail


def test_local_sglang_servers_get_weights_through_disk():
    d = resolve(*SGLANG, "rollout.sglang_addresses=[h:1,h:2]")
    assert (d.engine, d.servers, d.server_count, d.weight_route) == ("sglang", "given", 2, "disk")
    assert d.server_program is None and d.launcher == "local"
    # the local launcher has one route per engine: ray.weight_sync is the Ray launcher's setting
    assert resolve(*SGLANG, "rollout.sglang_addresses=[h:1]", "ray.weight_sync=distributed").weight_route == "disk"


def test_ray_torch_engines_get_weights_through_the_object_store_or_disk():
    d = resolve(*RAY)
    assert (d.launcher, d.cluster, d.engine, d.rollout_actors) == ("ray", LOCAL_CLUSTER, "torch", 2)
    assert d.weight_route == "object_store" and d.engine_device == "cpu"
    assert [p.name for p in d.processes] == ["learner ranks", "rollout actors"]
    assert resolve(*RAY, "ray.weight_sync=disk").weight_route == "disk"
    on_gpus = resolve(*RAY, "ray.rollout_gpus=1", "ray.address=auto")
    assert on_gpus.engine_device == "cuda" and on_gpus.cluster == "auto" and on_gpus.resources["GPU"] == 2


def test_ray_servers_launched_here_get_the_broadcast_and_given_ones_disk():
    launched = resolve(*RAY, *SGLANG, "ray.sglang_servers=4", "ray.sglang_server=searchgym")
    assert (launched.servers, launched.server_count, launched.server_program) == ("launched", 4, "searchgym")
    assert launched.weight_route == "distributed" and launched.backend == "gloo"
    assert [p.name for p in launched.processes] == ["learner ranks", "inference servers", "rollout actors"]
    given_ = resolve(*RAY, *SGLANG, "rollout.sglang_addresses=[h:1,h:2]")
    assert (given_.servers, given_.weight_route, given_.server_program) == ("given", "disk", None)
    asked = resolve(*RAY, *SGLANG, "rollout.sglang_addresses=[h:1,h:2]", "ray.weight_sync=distributed")
    assert asked.weight_route == "distributed"
    assert resolve(*RAY, *SGLANG, "ray.sglang_servers=2", "ray.weight_sync=disk").weight_route == "disk"


def test_a_sharded_ray_learner_on_gpus():
    d = resolve(*RAY, "learner.ranks=4", "ray.learner_gpus=1", "model.device=cuda:0")
    assert d.sharded and (d.learner_device, d.backend) == ("cuda", "nccl")  # Ray gives each actor its own GPUs
    assert d.processes[0].count == 4 and d.processes[0].gpus == 1 and "PACK" in d.processes[0].detail
    assert d.resources == {"CPU": 6.0, "GPU": 4.0}


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("asearcher-7b-*.yaml")), ids=lambda p: p.name)
def test_the_7b_configs_deploy_as_their_comments_say(path):
    d = resolve_deployment(load_config(path))
    assert (d.launcher, d.engine, d.servers, d.server_program) == ("ray", "sglang", "launched", "sglang")
    assert (d.learner_ranks, d.learner_device, d.backend, d.weight_route) == (4, "cuda", "nccl", "distributed")
    assert d.resources["GPU"] == 16  # 4 learner ranks and 12 servers, one GPU each


# ---- contradictions, refused naming the key ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["rollout.engine=sglang", "rollout.sglang_addresses=[h:1]"], "model.path"),
        (SGLANG, "rollout.sglang_addresses"),
        (["learner.ranks=2", "model.device=mps"], "model.device"),
        ([*RAY, "ray.num_rollout_actors=0"], "ray.num_rollout_actors"),
        ([*RAY, "rollout.batch_size=3"], "rollout.batch_size"),
        ([*RAY, "rollout.max_concurrent_rollouts=6", "rollout.group_size=4"], "rollout.max_concurrent_rollouts"),
        ([*RAY, "ray.sglang_servers=2"], "ray.sglang_servers"),
        ([*RAY, *SGLANG, "ray.sglang_servers=2", "rollout.sglang_addresses=[h:1,h:2]"], "ray.sglang_servers"),
        ([*RAY, *SGLANG, "ray.sglang_servers=1"], "ray.sglang_servers"),
        ([*RAY, *SGLANG, "rollout.sglang_addresses=[h:1]"], "rollout.sglang_addresses"),
        ([*RAY, *SGLANG, "ray.sglang_servers=2", "ray.weight_sync=object_store"], "ray.weight_sync"),
        ([*RAY, "ray.weight_sync=distributed"], "ray.weight_sync"),
        ([*RAY, "ray.learner_gpus=1"], "model.device"),  # GPUs reserved for a CPU learner
        ([*RAY, "model.device=cuda"], "ray.learner_gpus"),  # a CUDA learner holding no GPU
        ([*RAY, "learner.ranks=2", "model.device=mps"], "model.device"),
    ],
)
def test_a_contradiction_is_refused_naming_the_key(overrides, key):
    with pytest.raises(DeploymentError) as refused:
        resolve(*overrides)
    assert refused.value.key == key and str(refused.value).startswith(key) and is_key(key)


# ---- any config: it resolves, or names what to change ----------------------------------------------------------


@st.composite
def consistent_configs(draw) -> list[str]:
    """Overrides of a config whose settings agree with each other: any launcher, engine, ranks and devices."""
    launcher = draw(st.sampled_from(["local", "ray"]))
    engine = draw(st.sampled_from(["torch", "sglang"]))
    ranks = draw(st.integers(1, 8))
    on_gpu = draw(st.booleans())
    actors = draw(st.integers(1, 4)) if launcher == "ray" else 1
    group = draw(st.integers(1, 4))
    overrides = [
        f"launcher={launcher}",
        f"rollout.engine={engine}",
        f"learner.ranks={ranks}",
        f"model.device={'cuda' if on_gpu else 'cpu'}",
        f"rollout.group_size={group}",
        f"rollout.batch_size={actors * draw(st.integers(1, 3))}",
        f"rollout.max_concurrent_rollouts={actors * group * draw(st.integers(1, 3))}",
        f"ray.num_rollout_actors={actors}",
        f"ray.learner_gpus={draw(st.sampled_from([1, 2])) if on_gpu and launcher == 'ray' else 0}",
        f"ray.rollout_gpus={draw(st.sampled_from([0, 1]))}",
    ]
    if engine == "sglang":
        overrides.append("model.path=some/model")
        servers = actors * draw(st.integers(1, 3))
        if launcher == "ray" and draw(st.booleans()):
            overrides += [
                f"ray.sglang_servers={servers}",
                f"ray.sglang_server={draw(st.sampled_from(['sglang', 'searchgym']))}",
            ]
            overrides.append(f"ray.weight_sync={draw(st.sampled_from(['auto', 'disk', 'distributed']))}")
        else:
            overrides.append(f"rollout.sglang_addresses=[{','.join(f'h:{i}' for i in range(servers))}]")
            overrides.append(f"ray.weight_sync={draw(st.sampled_from(['auto', 'disk', 'distributed']))}")
    else:
        overrides.append(f"ray.weight_sync={draw(st.sampled_from(['auto', 'disk', 'object_store']))}")
    return overrides


def check_invariants(config: TrainConfig, d: Deployment) -> None:
    """What a deployment promises whatever the config: one rule per field (deployment.py's docstring)."""
    assert d.launcher == config.launcher and d.engine == config.rollout.engine
    assert d.learner_ranks == config.learner.ranks and d.sharded == (config.learner.ranks > 1)
    assert d.backend == ("nccl" if d.learner_device.startswith("cuda") else "gloo")
    assert d.rank_device in ("cpu", "cuda")
    if d.sharded:  # a rank takes a device of the learner's kind (locally rank r: cuda:r)
        assert d.rank_device == d.learner_device.split(":")[0]
    routes = {
        ("local", "torch"): {"in_process"},
        ("local", "sglang"): {"disk"},
        ("ray", "torch"): {"object_store", "disk"},
        ("ray", "sglang"): {"disk", "distributed"},
    }
    assert d.weight_route in routes[d.launcher, d.engine]
    assert (d.servers == "none") == (d.engine == "torch") and (d.server_count > 0) == (d.engine == "sglang")
    assert d.resources["CPU"] == sum(p.count * p.cpus for p in d.processes)
    assert sum(p.count for p in d.processes if p.name in ("this process", "follower ranks", "learner ranks")) == (
        d.learner_ranks
    )
    if d.launcher == "ray":
        assert d.rollout_actors == config.ray.num_rollout_actors
        assert d.engine == "torch" or d.server_count >= d.rollout_actors  # each actor has its own server(s)
        assert d.learner_on_gpu == (config.ray.learner_gpus > 0)
    else:
        assert d.rollout_actors == 0 and d.learner_device == d.engine_device == config.model.device
    json.dumps(d.to_json())  # plain data


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(consistent_configs())
def test_any_consistent_config_resolves_and_keeps_the_rules(overrides):
    config = load_config(None, overrides)
    check_invariants(config, resolve_deployment(config))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    consistent_configs(),
    st.lists(
        st.sampled_from(
            [
                "model.device=cpu",
                "model.device=cuda",
                "model.device=mps",
                "ray.learner_gpus=0",
                "ray.learner_gpus=1",
                "ray.sglang_servers=0",
                "ray.sglang_servers=3",
                "rollout.sglang_addresses=[]",
                "rollout.batch_size=5",
                "ray.num_rollout_actors=3",
                "ray.weight_sync=object_store",
                "ray.weight_sync=distributed",
                "model.path=null",
                "rollout.engine=torch",
                "rollout.engine=sglang",
            ]
        ),
        max_size=3,
    ),
)
def test_any_valid_config_resolves_or_names_the_key_to_change(overrides, changes):
    config = load_config(None, [*overrides, *changes])  # every settings check passes: a valid config
    try:
        deployment = resolve_deployment(config)
    except DeploymentError as e:
        assert is_key(e.key) and str(e).startswith(e.key), str(e)
        return
    check_invariants(config, deployment)


# ---- the resolution is what the plan and the launchers use -------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(consistent_configs())
def test_the_plan_reports_the_deployment_the_launchers_resolve(overrides):
    from searchgym.trainers.plan import make_plan, plan_text

    config = load_config(None, [*overrides, "model.path=null", "rollout.engine=torch", "ray.sglang_servers=0"])
    config = dataclasses.replace(config, rollout=dataclasses.replace(config.rollout, sglang_addresses=[]))
    if config.ray.weight_sync == "distributed":
        config = dataclasses.replace(config, ray=dataclasses.replace(config.ray, weight_sync="auto"))
    deployment = resolve_deployment(config)
    plan = make_plan(config, deployment, host_memory_gib=1024)
    assert plan.deployment == deployment and plan.groups == list(deployment.processes)
    assert plan.total == deployment.resources and plan.on_gpu == deployment.learner_on_gpu
    data = plan.to_json()
    assert data["deployment"] == json.loads(json.dumps(deployment.to_json()))
    assert data["learner_ranks"] == deployment.learner_ranks and data["launcher"] == deployment.launcher
    assert plan_text(plan).count("deployment (resolved once") == 1  # one block in `train --dry-run`


def test_searchgym_train_resolves_once_and_hands_it_to_the_plan_or_the_launcher(monkeypatch, tmp_path, capsys):
    from searchgym.trainers import deployment as deployment_module
    from searchgym.trainers import plan as plan_module
    from searchgym.trainers.command import TrainCommand, train_command
    from searchgym.trainers.launchers import local

    resolved, handed = [], []
    real = deployment_module.resolve_deployment
    monkeypatch.setattr(deployment_module, "resolve_deployment", lambda c: resolved.append(real(c)) or resolved[-1])
    monkeypatch.setattr(local, "resolve_deployment", None)  # the launcher must not resolve again
    monkeypatch.setattr(local, "check_settings", None)  # nor check again: load_config checked
    monkeypatch.setattr(local, "_train", lambda config, deployment, *a: handed.append(deployment) or asyncio.sleep(0))
    train_command(TrainCommand(overrides=[f"out_dir={tmp_path / 'run'}"]))
    assert len(resolved) == 1 and handed == resolved
    capsys.readouterr()
    monkeypatch.setattr(plan_module, "resolve_deployment", None, raising=False)
    train_command(TrainCommand(dry_run=True, json=True, host_memory_gib=1024, overrides=["learner.ranks=2"]))
    shown = json.loads(capsys.readouterr().out)["deployment"]
    assert len(resolved) == 2 and shown == json.loads(json.dumps(resolved[-1].to_json()))


def test_the_local_launcher_resolves_once_and_runs_that_deployment(monkeypatch, tmp_path):
    from searchgym.trainers.launchers import local

    calls, ran = [], []
    monkeypatch.setattr(local, "resolve_deployment", lambda c: calls.append(c) or resolve_deployment(c))

    async def fake_train(config, deployment, *args):
        ran.append(deployment)
        return []

    monkeypatch.setattr(local, "_train", fake_train)
    config = load_config(None, [f"out_dir={tmp_path / 'run'}", "learner.ranks=2"])
    assert local.train(config, progress=False) == []
    assert calls == [config] and ran == [resolve_deployment(config)]
    # what cannot be deployed is refused before anything starts; a Ray config is the other launcher's
    with pytest.raises(DeploymentError, match="^rollout.sglang_addresses"):
        local.train(load_config(None, [f"out_dir={tmp_path / 'run'}", *SGLANG]))
    with pytest.raises(ValueError, match="launcher is 'ray'"):
        local.train(load_config(None, [f"out_dir={tmp_path / 'run'}", *RAY]))
    assert not (tmp_path / "run").exists()


def test_the_ray_launcher_takes_the_deployment_resolved_once():
    from searchgym.trainers.launchers.ray_cluster import RayTrainer, train_ray

    config = load_config(None, [*RAY, "learner.ranks=2"])
    deployment = resolve_deployment(config)
    assert RayTrainer(config, deployment).deployment is deployment  # starts nothing until start()
    local_config = load_config(None, [])
    with pytest.raises(ValueError, match="launcher is 'local'"):
        RayTrainer(local_config, resolve_deployment(local_config))
    with pytest.raises(DeploymentError, match="^rollout.batch_size"):  # refused before a cluster starts
        train_ray(load_config(None, [*RAY, "rollout.batch_size=3"]))


def test_the_dry_run_shows_the_deployment_as_one_block(capsys, tmp_path):
    from searchgym.cli import main

    code = main(["train", "--dry-run", "--host-memory-gib", "1024", "launcher=ray", f"out_dir={tmp_path}"])
    out = capsys.readouterr().out
    assert code == 0 and out.count("deployment (resolved once") == 1
    block = out.split("deployment (resolved once", 1)[1].split("\n\n", 1)[0]
    for line in ("launcher       ray (cluster: a local cluster started here)", "weight route   object_store"):
        assert line in block, block


# ---- nothing else reads learner.ranks ----------------------------------------------------------------------------

RANKS_HOME = "trainers/deployment.py"  # the one reader, besides LearnerConfig's own field and check in config.py
ATTRIBUTE_CALLS = {"getattr", "hasattr", "setattr", "delattr", "attrgetter", "select"}  # (x, "ranks"), OmegaConf's
COPY_CALLS = {"replace", "LearnerConfig"}  # dataclasses.replace(learner, ranks=...): a learner of other ranks


def ranks_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) for every use of an attribute named `ranks` in `source`: `x.ranks` (read or written), a string
    "ranks" or "...ranks" given to getattr-like calls, `x["ranks"]`, and `ranks=` in a replace() or LearnerConfig()
    call. No other attribute of the package is named `ranks`, so every hit is LearnerConfig's (plan.py's Plan had
    one; it holds the Deployment now), however the learner settings were reached (`config.learner`, an alias)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "ranks":
            found.append((node.lineno, f"{ast.unparse(node)}"))
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "ranks":
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            texts = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if name in ATTRIBUTE_CALLS and any(t == "ranks" or t.endswith(".ranks") for t in texts):
                found.append((node.lineno, ast.unparse(node)))
            if name in COPY_CALLS and any(k.arg == "ranks" for k in node.keywords):
                found.append((node.lineno, ast.unparse(node)))
    return found


def _learner_config_lines(source: str) -> range:
    """The lines of config.py's LearnerConfig class: its `ranks` field and its own check may use it."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == "LearnerConfig":
            return range(node.lineno, (node.end_lineno or node.lineno) + 1)
    raise AssertionError("config.py has no LearnerConfig")


def test_the_ranks_checker_sees_every_way_to_reach_them():
    source = """
learner = config.learner
a = config.learner.ranks
b = learner.ranks
c = getattr(learner, "ranks")
d = settings_dict(config)["learner"]["ranks"]
e = OmegaConf.select(cfg, "learner.ranks")
f = dataclasses.replace(learner, ranks=4)
g = operator.attrgetter("learner.ranks")(config)
h = self.deployment.learner_ranks  # the deployment's field: not a use
i = f"learner.ranks={n}"  # a message naming the key: not a use
"""
    assert [line for line, _ in ranks_uses(source)] == [3, 4, 5, 6, 7, 8, 9]


def test_nothing_but_the_deployment_reads_learner_ranks():
    outside = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative == RANKS_HOME:
            continue
        source = path.read_text()
        allowed = _learner_config_lines(source) if relative == "trainers/config.py" else range(0)
        outside += [f"{relative}:{line}: {what}" for line, what in ranks_uses(source) if line not in allowed]
    assert not outside, (
        "learner.ranks is the deployment's to read (trainers/deployment.py: resolve_deployment); read "
        f"deployment.learner_ranks or deployment.sharded instead: {outside}"
    )
    home = (PACKAGE / RANKS_HOME).read_text()
    assert ranks_uses(home), "deployment.py no longer reads learner.ranks: the checker may be blind"
