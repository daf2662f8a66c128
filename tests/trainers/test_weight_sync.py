"""Weight sync routes: in-process and disk, and the local launcher training against a real SGLang-API server."""

import asyncio
import contextlib
import json
import threading
import urllib.request
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from searchgym.agents.engines.torch_engine import TorchEngine
from searchgym.serve.model.app import serving
from searchgym.serve.settings import ModelServerSettings
from searchgym.trainers.config import load_config
from searchgym.trainers.launchers.local import train
from searchgym.trainers.rollout.weight_sync import DiskSync, InProcessSync, weights_dir
from tests.conftest import SMALL

NAME = "model.embed_tokens.weight"


class RecordingEngine:
    """Takes update_weights calls and checks each path is a whole model dir when it arrives."""

    def __init__(self):
        self.calls = []

    async def update_weights(self, source, version):
        assert Path(source).name == f"version-{version:05d}" and (Path(source) / "config.json").exists()
        self.calls.append((source, version))


def _nudged(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        model.get_parameter(NAME).add_(1.0)
    return model


def test_disk_sync_writes_whole_model_dirs_and_keeps_the_last_few(tmp_path, tiny_model_dir):
    model, tokenizer = _nudged(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    engines = [RecordingEngine(), RecordingEngine()]
    sync = DiskSync(engines, tmp_path / "weights", tokenizer, keep=2)
    for version in (1, 2, 3):
        asyncio.run(sync.push(model, version))
    assert [e.calls for e in engines] == [[(str(weights_dir(tmp_path / "weights", v)), v) for v in (1, 2, 3)]] * 2
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["version-00002", "version-00003"]
    saved = weights_dir(tmp_path / "weights", 3)
    assert torch.equal(AutoModelForCausalLM.from_pretrained(saved).get_parameter(NAME), model.get_parameter(NAME))
    assert AutoTokenizer.from_pretrained(saved)("a b").input_ids == tokenizer("a b").input_ids


def test_in_process_sync_loads_the_state_dict_into_the_engine(tiny_model_dir):
    async def push():
        engine = TorchEngine(tiny_model_dir)
        try:
            await InProcessSync([engine]).push(model, 7)
            return engine.version, engine.model.get_parameter(NAME).detach().clone()
        finally:
            await engine.close()

    model = _nudged(tiny_model_dir)
    version, weight = asyncio.run(push())
    assert version == 7 and torch.equal(weight, model.get_parameter(NAME))


@contextlib.contextmanager
def model_server_thread(model_dir):
    """Our SGLang-API model server on a free loopback port, in a thread with its own event loop; yields host:port."""
    ready, stop, box = threading.Event(), None, {}

    async def serve():
        nonlocal stop
        stop = asyncio.Event()
        engine = TorchEngine(model_dir, seed=0)
        try:
            async with serving(engine, ModelServerSettings(model_path=str(model_dir), port=0)) as url:
                box["url"], box["loop"] = url, asyncio.get_running_loop()
                ready.set()
                await stop.wait()
        finally:
            await engine.close()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    assert ready.wait(60), "the model server did not start"
    try:
        yield box["url"].removeprefix("http://")
    finally:
        box["loop"].call_soon_threadsafe(stop.set)
        thread.join(30)


def test_local_launcher_with_sglang_engine_syncs_weights_through_disk(tmp_path, small_bundle, tiny_model_dir):
    with model_server_thread(tiny_model_dir) as address:
        config = load_config(
            None,
            [
                f"out_dir={tmp_path}",
                "steps=2",
                f"model.path={tiny_model_dir}",
                "rollout.engine=sglang",
                f"rollout.sglang_addresses=[{address}]",
                f"env.kwargs.size={SMALL['size']}",
                f"env.kwargs.n_tasks={SMALL['n_tasks']}",
                "env.kwargs.max_turns=2",
                "rollout.group_size=2",
                "rollout.batch_size=2",
                "rollout.max_new_tokens=12",
                "rollout.max_staleness=1",
                "learner.drop_no_spread=false",
                "learner.lr=1e-3",
            ],
        )
        history = train(config, progress=False)
        with urllib.request.urlopen(f"http://{address}/get_model_info", timeout=10) as resp:
            info = json.load(resp)
    assert [h["version"] for h in history] == [1.0, 2.0]
    assert info["weight_version"] == "2"  # the server loaded what the learner wrote
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["version-00001", "version-00002"]
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoints" / "step-00002").get_parameter(NAME)
    pushed = AutoModelForCausalLM.from_pretrained(tmp_path / "weights" / "version-00002").get_parameter(NAME)
    assert torch.equal(trained, pushed)
    versions = {
        v
        for line in (tmp_path / "trajectories" / "version-00001.jsonl").read_text().splitlines()
        for v in json.loads(line)["versions"]
        if v >= 0
    }
    assert versions and versions <= {0, 1}  # tokens carry the server's weight versions


def test_sglang_engine_needs_addresses_and_a_model_path(tmp_path):
    with pytest.raises(ValueError, match="model.path"):
        train(load_config(None, [f"out_dir={tmp_path}", "rollout.engine=sglang"]), progress=False)
    with pytest.raises(ValueError, match="rollout.engine"):
        load_config(None, ["rollout.engine=vllm"])
