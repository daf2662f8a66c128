"""The Ray launcher for real on a local CPU cluster: learner actors (one, or two FSDP ranks), rollout actors with
TorchEngines, and server actors running our model server as the SGLang stand-in (weights by disk or broadcast)."""

import asyncio
import json
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import psutil
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from searchgym.trainers.config import load_config
from searchgym.trainers.deployment import check_fits, resolve_deployment
from searchgym.trainers.launchers.ray_actors import global_group
from searchgym.trainers.launchers.ray_cluster import RayRollouts, RayTrainer, local_cluster_kwargs, train_ray
from searchgym.trainers.launchers.ray_servers import server_hosts
from searchgym.trainers.run.checkpoint import latest_checkpoint, load_trainer_state
from tests.agents.servers import model_server
from tests.conftest import SMALL

# under pytest-xdist, the tests that start a local Ray cluster run on one worker, one cluster at a time
pytestmark = pytest.mark.xdist_group("ray")

ray = pytest.importorskip("ray")

ACTORS = 2
NAME = "model.embed_tokens.weight"


@pytest.fixture(scope="module")
def ray_cluster():
    """A small local CPU cluster; workers inherit SEARCHGYM_CACHE, which conftest set before this starts."""
    ray.init(num_cpus=6, include_dashboard=False, object_store_memory=200 * 1024**2, log_to_driver=False)
    yield
    ray.shutdown()


def _overrides(run_dir: Path, model_dir: Path, steps: int) -> list[str]:
    return [
        f"out_dir={run_dir}",
        f"steps={steps}",
        "save_every=1",
        "launcher=ray",
        f"model.path={model_dir}",
        f"env.kwargs.size={SMALL['size']}",
        f"env.kwargs.n_tasks={SMALL['n_tasks']}",
        "env.kwargs.max_turns=2",
        "rollout.group_size=2",
        "rollout.batch_size=2",
        "rollout.max_new_tokens=12",
        "rollout.max_staleness=1",
        "learner.drop_no_spread=false",
        "learner.lr=1e-3",
        f"ray.num_rollout_actors={ACTORS}",
        "learner.weight_decay=0.1",  # a fresh model earns no reward spread: decay makes every step move the weights
    ]


def _groups_by_version(run_dir: Path) -> list[list[int]]:
    """The run-wide group positions each step trained on (one list per trajectories file, in version order)."""
    return [
        sorted({json.loads(line)["group"] for line in path.read_text().splitlines()})
        for path in sorted((run_dir / "trajectories").glob("version-*.jsonl"))
    ]


def test_two_rollout_actors_feed_each_step_and_get_the_new_weights(tmp_path, small_bundle, tiny_model_dir, ray_cluster):
    run_dir = tmp_path / "run"
    config = load_config(None, _overrides(run_dir, tiny_model_dir, steps=2))
    with RayTrainer(config, resolve_deployment(config), progress=False) as trainer:
        history = trainer.train()
        engine_versions = ray.get([actor.engine_version.remote() for actor in trainer.rollout_actors])
        engine_weights = ray.get([actor.engine_weight.remote(NAME) for actor in trainer.rollout_actors])

    assert [h["step"] for h in history] == [1, 2] and [h["version"] for h in history] == [1.0, 2.0]
    assert all(h["staleness_max"] <= 1 and h["updated"] == 1.0 for h in history)
    assert all(h["rollout/episodes"] >= 2 * 2 for h in history)
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    # what limited the run, over both actors: learner seconds, episodes in flight (at most 32), both engines' work
    assert all(h["learner/step_s"] > 0 and 0 < h["rollout/episodes_in_flight_mean"] <= 32 for h in history)
    assert all(0.0 <= h["rollout/admission_blocked_share"] <= 1.0 for h in history)
    assert all(h["engine/generated_tokens"] >= h["engine/decode_steps"] > 0 for h in history)
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    trained = _groups_by_version(run_dir)
    assert len(trained) == 2 and all(len(groups) == 2 for groups in trained)
    assert all({g % ACTORS for g in groups} == {0, 1} for groups in trained)  # one group from each actor per step
    # the actors' engines run the learner's version-2 weights, which differ from the initial ones
    assert engine_versions == [2, 2]
    checkpoint = latest_checkpoint(run_dir)
    assert checkpoint.name == "step-00002"
    final = load_file(checkpoint / "model.safetensors")[NAME]
    initial = load_file(tiny_model_dir / "model.safetensors")[NAME]
    assert all(torch.equal(w, final) for w in engine_weights) and not torch.equal(final, initial)
    state = load_trainer_state(checkpoint)
    assert state["step"] == 2 and state["learner"]["version"] == 2 and len(state["rollouts"]) == ACTORS

    # --resume continues the same versions with both actors' data positions: no group lost or repeated
    history = train_ray(load_config(None, _overrides(run_dir, tiny_model_dir, steps=3)), resume=True, progress=False)
    assert [h["step"] for h in history] == [1, 2, 3] and [h["version"] for h in history] == [1.0, 2.0, 3.0]
    trained = [g for groups in _groups_by_version(run_dir) for g in groups]
    assert len(trained) == 3 * 2 and len(set(trained)) == len(trained), trained
    state = load_trainer_state(latest_checkpoint(run_dir))
    assert state["step"] == 3 and state["learner"]["version"] == 3
    for i, rollout in enumerate(state["rollouts"]):
        mine = {g // ACTORS for g in trained if g % ACTORS == i}
        assert not mine & set(rollout["replay"])
        assert sorted(mine | set(rollout["replay"])) == list(range(rollout["position"]))


def _greedy(address: str, prompt: list[int], tokens: int) -> tuple[list[int], list[float], str]:
    """A server's greedy continuation of `prompt` through SGLang's /generate: ids, their logprobs, weight version."""
    body = {
        "input_ids": prompt,
        "return_logprob": True,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": tokens, "ignore_eos": True},
    }
    request = urllib.request.Request(
        f"http://{address}/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        out = json.load(response)
    meta = out["meta_info"]
    return out["output_ids"], [lp for lp, _, _ in meta["output_token_logprobs"]], meta["weight_version"]


def _logprobs(model_dir: Path, ids: list[int], start: int) -> torch.Tensor:
    """Log-probs a model directory's weights give tokens ids[start:] after ids[:start]."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, start - 1 : -1]
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(ids[start:]).unsqueeze(1)).squeeze(1)


def test_disk_weight_sync_reaches_model_server_actors(tmp_path, small_bundle, tiny_model_dir, ray_cluster):
    """rollout.engine=sglang with two server actors running our CPU model server as the SGLang stand-in."""
    run_dir = tmp_path / "run"
    config = load_config(
        None,
        [
            *_overrides(run_dir, tiny_model_dir, steps=2),
            "rollout.engine=sglang",
            "ray.num_rollout_actors=1",
            "ray.sglang_server=searchgym",
            "ray.sglang_servers=2",
            "ray.weight_sync=disk",
            "ray.sglang_gpus_per_server=0",
            "ray.sglang_start_timeout_s=120",
        ],
    )
    prompt = list(range(5, 25))
    with RayTrainer(config, resolve_deployment(config), progress=False) as trainer:
        servers = trainer.server_addresses
        for address in servers:  # a local cluster's servers listen on loopback only (ray.local_host)
            port = int(address.rpartition(":")[2])
            assert {
                c.laddr.ip
                for c in psutil.net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN and c.laddr.port == port
            } == {"127.0.0.1"}
        before = [_greedy(address, prompt, 4) for address in servers]
        history = trainer.train()
        after = [_greedy(address, prompt, 4) for address in servers]

    assert [h["version"] for h in history] == [1.0, 2.0] and all(h["updated"] == 1.0 for h in history)
    # two servers on this machine (loopback: a local cluster's), both dealt to the one rollout actor
    assert len(set(servers)) == 2 and all(a.rpartition(":")[0] == "127.0.0.1" for a in servers)
    assert [version for _, _, version in before] == ["0", "0"] and [version for _, _, version in after] == ["2", "2"]
    # each server computes with the learner's version-2 weights: the checkpoint's log-probs, not the initial ones
    checkpoint = run_dir / "checkpoints" / "step-00002"
    for ids, logprobs, _ in after:
        expected = _logprobs(checkpoint, prompt + ids, len(prompt))
        torch.testing.assert_close(torch.tensor(logprobs), expected, atol=1e-4, rtol=1e-4)
        assert not torch.allclose(
            torch.tensor(logprobs), _logprobs(tiny_model_dir, prompt + ids, len(prompt)), atol=1e-3
        )
    # they loaded them from disk: the last versions the learner wrote, equal to the checkpoint
    assert sorted(p.name for p in (run_dir / "weights").iterdir()) == ["version-00001", "version-00002"]
    pushed = load_file(run_dir / "weights" / "version-00002" / "model.safetensors")[NAME]
    assert torch.equal(pushed, load_file(checkpoint / "model.safetensors")[NAME])
    # and the rollouts' tokens carry the servers' weight versions: the step from version 1 trained on tokens of 0 and 1
    versions = {
        v
        for line in (run_dir / "trajectories" / "version-00001.jsonl").read_text().splitlines()
        for v in json.loads(line)["versions"]
        if v >= 0
    }
    assert versions and versions <= {0, 1}


def _wait_idle(address: str) -> None:
    """Until the server runs no request (its /flush_cache answers 400 while any runs, as SGLang's does)."""
    for _ in range(600):
        try:
            with urllib.request.urlopen(
                urllib.request.Request(f"http://{address}/flush_cache", b"", method="POST"), timeout=60
            ):
                return
        except urllib.error.HTTPError:
            time.sleep(0.1)
    raise AssertionError(f"{address} kept running requests")


def _model_info(address: str) -> dict:
    with urllib.request.urlopen(f"http://{address}/model_info", timeout=60) as response:
        return json.load(response)


def test_two_learner_ranks_broadcast_weights_to_model_server_actors(
    tmp_path, small_bundle, tiny_model_dir, ray_cluster, one_torch_thread
):
    """learner.ranks=2 (FSDP2 on gloo, two learner actors) and ray.weight_sync=distributed: rank 0 broadcasts the
    consolidated weights to two `serve model` servers (SGLang's protocol), one per rollout actor."""
    run_dir = tmp_path / "run"
    config = load_config(
        None,
        [
            *_overrides(run_dir, tiny_model_dir, steps=2),
            "learner.ranks=2",
            "rollout.engine=sglang",
            "ray.sglang_server=searchgym",
            "ray.sglang_servers=2",
            "ray.weight_sync=distributed",
            "ray.sglang_gpus_per_server=0",
            "ray.sglang_start_timeout_s=120",
        ],
    )
    prompt = list(range(5, 25))
    with RayTrainer(config, resolve_deployment(config), progress=False) as trainer:
        servers = trainer.server_addresses
        history = trainer.train()
        engine_versions = ray.get([actor.engine_version.remote() for actor in trainer.rollout_actors])
        ray.get([actor.stop.remote() for actor in trainer.rollout_actors])
        for address in servers:  # requests the stopped actors left finish: ours then runs alone, unbatched
            _wait_idle(address)
        after = [_greedy(address, prompt, 4) for address in servers]
        infos = [_model_info(address) for address in servers]

    assert [h["version"] for h in history] == [1.0, 2.0] and all(h["updated"] == 1.0 for h in history)
    assert load_trainer_state(latest_checkpoint(run_dir))["learner"]["sharded_ranks"] == 2
    # every server serves version 2 and each rollout actor's engine sees it
    assert [info["weight_version"] for info in infos] == ["2", "2"] and engine_versions == [2, 2]
    assert [version for _, _, version in after] == ["2", "2"]
    assert not (run_dir / "weights").exists()  # nothing went through disk
    # the servers hold the learner's consolidated step-2 weights bit for bit: a server started on the checkpoint
    # computes the very same log-probs (any changed bit of a weight shows in them), and the initial ones differ
    checkpoint = run_dir / "checkpoints" / "step-00002"
    assert (checkpoint / "sharded").is_dir()

    async def reference() -> tuple[list[int], list[float]]:
        async with model_server(checkpoint) as (url, _), aiohttp.ClientSession() as http:
            body = {
                "input_ids": prompt,
                "return_logprob": True,
                "sampling_params": {"temperature": 0.0, "max_new_tokens": 4, "ignore_eos": True},
            }
            async with http.post(url + "/generate", json=body) as response:
                out = await response.json()
        return out["output_ids"], [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]

    want_ids, want_logprobs = asyncio.run(reference())
    for ids, logprobs, _ in after:
        assert (ids, logprobs) == (want_ids, want_logprobs)
    assert not torch.allclose(
        torch.tensor(want_logprobs), _logprobs(tiny_model_dir, prompt + want_ids, len(prompt)), atol=1e-3
    )
    # the rollouts' tokens carry the versions the broadcasts set: the step from version 1 trained on tokens of 0 and 1
    versions = {
        v
        for line in (run_dir / "trajectories" / "version-00001.jsonl").read_text().splitlines()
        for v in json.loads(line)["versions"]
        if v >= 0
    }
    assert versions and versions <= {0, 1}


def test_a_local_cluster_keeps_to_this_machine_unless_asked(tiny_model_dir):
    """ray.init gets no dashboard (or one on ray.local_host); launched servers bind ray.local_host, loopback by
    default, or the node's IP on a joined cluster; a bad ray.local_host is refused naming it."""
    config = load_config(None, ["launcher=ray"])
    assert config.ray.local_host == "127.0.0.1" and config.ray.dashboard is False
    kwargs = local_cluster_kwargs(config, 3)
    assert kwargs["include_dashboard"] is False and "dashboard_host" not in kwargs and kwargs["num_cpus"] >= 3
    assert server_hosts(config.ray, "10.1.2.3") == ("127.0.0.1", "127.0.0.1")
    config = load_config(None, ["launcher=ray", "ray.dashboard=true", "ray.local_host=0.0.0.0"])
    assert local_cluster_kwargs(config, 1)["dashboard_host"] == "0.0.0.0"
    assert server_hosts(config.ray, "10.1.2.3") == ("0.0.0.0", "10.1.2.3")  # asked for: every interface
    joined = load_config(None, ["launcher=ray", "ray.address=auto"])
    assert local_cluster_kwargs(joined, 1) == {} and server_hosts(joined.ray, "10.1.2.3") == ("10.1.2.3", "10.1.2.3")
    for bad in ("localhost:1", "my.host", "300.1.1.1", "::1"):  # IPv6 would make host:port URLs ambiguous
        with pytest.raises(ValueError, match="ray.local_host"):
            load_config(None, [f"ray.local_host={bad}"])


def test_topology_errors_name_the_setting(tmp_path, tiny_model_dir):
    def resolve(*extra):
        return resolve_deployment(load_config(None, [*_overrides(tmp_path, tiny_model_dir, 1), *extra]))

    with pytest.raises(ValueError, match="batch_size"):
        resolve("rollout.batch_size=3")
    with pytest.raises(ValueError, match="max_concurrent_rollouts"):
        resolve("rollout.max_concurrent_rollouts=2", "rollout.group_size=2")
    with pytest.raises(ValueError, match="SGLang servers for 2 rollout actors"):
        resolve("rollout.engine=sglang", "rollout.sglang_addresses=[127.0.0.1:1]")
    with pytest.raises(ValueError, match="weight_sync"):
        resolve("rollout.engine=sglang", "ray.sglang_servers=2", "ray.weight_sync=object_store")
    with pytest.raises(ValueError, match="rollout.engine=sglang"):
        resolve("ray.sglang_servers=2")
    with pytest.raises(ValueError, match="weight_sync=distributed broadcasts to SGLang servers"):
        resolve("ray.weight_sync=distributed")
    # by default servers launched here get the broadcast, servers given by address the disk route
    assert resolve("rollout.engine=sglang", "ray.sglang_servers=2").weight_route == "distributed"
    assert resolve("rollout.engine=sglang", "rollout.sglang_addresses=[h:1,h:2]").weight_route == "disk"
    on_gpu = resolve("ray.learner_gpus=1", "model.device=cuda")
    assert on_gpu.resources == {"CPU": 3.0, "GPU": 1.0}
    sharded = resolve("ray.learner_gpus=1", "model.device=cuda", "learner.ranks=4")
    assert sharded.resources == {"CPU": 6.0, "GPU": 4.0}  # cpus and gpus per learner rank
    with pytest.raises(ValueError, match="1 GPU needed, 0 in the cluster"):
        check_fits(on_gpu.resources, {"CPU": 4.0})  # refused at once, not a hang on unplaceable actors


class _SubBatches:
    """A rollout actor's get_batch and state_dict: actor 0 hands out its group at once, actor 1's never comes."""

    def __init__(self, index: int):
        self.index, self.cancelled = index, False

    async def get_batch(self):
        if self.index == 0:
            return [[types.SimpleNamespace(group=global_group(3, 0, 2))]]
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise

    def state_dict(self):
        return {"position": 5, "replay": [4], "staleness": {"accepted": 4, "rejected": 0, "failed": 0}}

    def was_cancelled(self):
        return self.cancelled


def test_a_stopped_ray_batch_wait_is_cancelled_and_owes_the_groups_handed_out(ray_cluster):
    actors = [ray.remote(num_cpus=0)(_SubBatches).options(max_concurrency=4).remote(i) for i in range(2)]
    ray.get([actor.was_cancelled.remote() for actor in actors])  # both actors' processes are up

    async def stop_while_waiting():
        rollouts = RayRollouts(actors)
        waiting = asyncio.ensure_future(rollouts.get_batch())
        await asyncio.sleep(1)  # actor 0 has handed out its group; actor 1 is still waiting
        waiting.cancel()  # what the loop does on SIGTERM
        await asyncio.gather(waiting, return_exceptions=True)
        return await rollouts.state_dicts()

    states = asyncio.run(stop_while_waiting())
    # actor 0's handed-out group (local position 3) is owed first and no longer counted as trained; actor 1's
    # wait was cancelled on the actor, which took nothing
    assert states[0]["replay"] == [3, 4] and states[0]["staleness"]["accepted"] == 3
    assert states[1]["replay"] == [4] and states[1]["staleness"]["accepted"] == 4
    assert ray.get(actors[1].was_cancelled.remote())
    for actor in actors:
        ray.kill(actor)
