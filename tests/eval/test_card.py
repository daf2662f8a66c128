"""The protocol card: model fingerprints (weights, SGLang /model_info, OpenAI /models), question-set and tool-stack
hashes, and a resume with other weights at the same path refused."""

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from searchgym.envs.tasks import Task
from searchgym.eval import fingerprint
from searchgym.eval.card import canonical_sha256, differences, question_set, tool_stack
from searchgym.eval.fingerprint import engine_fingerprint, weights_fingerprint
from searchgym.eval.harness import run_eval
from tests.conftest import SMALL

SYN = "searchgym/SyntheticQA-v0"
NOISY = f"{Path(__file__).parent / 'stubs.py'}:NoisyOracle"


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


def test_the_weights_hash_names_the_weights_and_writes_nothing_beside_them(tiny_model_dir, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    copy = Path(shutil.copytree(tiny_model_dir, tmp_path / "copy"))
    files = sorted(p.name for p in copy.iterdir())
    a, b = weights_fingerprint(tiny_model_dir, cache_dir=cache), weights_fingerprint(copy, cache_dir=cache)
    assert a["sha256"] == b["sha256"] and a["method"].startswith("full") and a["weight_files"] == 1
    assert a["weight_bytes"] == (copy / "model.safetensors").stat().st_size
    assert sorted(p.name for p in copy.iterdir()) == files  # the user's model directory is left as it was
    assert len(list((cache / "fingerprints").glob("*.json"))) == 2  # the per-file digests live in searchgym's cache

    # a cached digest is reused while the file's size and mtime stand (no second read of the weights)
    def no_reading(path):
        raise AssertionError(f"{path} was hashed again")

    monkeypatch.setattr(
        fingerprint,
        "file_sha256",
        lambda p: no_reading(p) if p.suffix == ".safetensors" else hashlib.sha256(p.read_bytes()).hexdigest(),
    )
    assert weights_fingerprint(copy, cache_dir=cache)["sha256"] == a["sha256"]
    monkeypatch.undo()

    flip_last_byte(copy / "model.safetensors")  # one changed weight: another model
    changed = weights_fingerprint(copy, cache_dir=cache)
    assert changed["sha256"] != a["sha256"]
    (copy / "tokenizer.json").write_text((copy / "tokenizer.json").read_text().replace("<|im_end|>", "<|im_stop|>"))
    assert weights_fingerprint(copy, cache_dir=cache)["sha256"] != changed["sha256"]  # another tokenizer too


def test_large_models_are_sampled_and_the_card_says_so(tiny_model_dir, tmp_path):
    copy = Path(shutil.copytree(tiny_model_dir, tmp_path / "copy"))
    sampled = weights_fingerprint(copy, cache_dir=tmp_path / "cache", full_hash_max_bytes=1)
    assert sampled["method"].startswith("sampled") and "mtime" in sampled["method"]
    assert weights_fingerprint(copy, cache_dir=tmp_path / "cache", full_hash_max_bytes=1) == sampled
    weights = copy / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    assert weights_fingerprint(copy, cache_dir=tmp_path / "cache", full_hash_max_bytes=1)["sha256"] != sampled["sha256"]
    with pytest.raises(ValueError, match="no weight files"):
        weights_fingerprint(tmp_path / "cache")


async def test_servers_are_named_by_what_they_say_they_serve(tiny_model_dir):
    from searchgym.agents.engines.torch_engine import TorchEngine
    from searchgym.serve.model import ModelServerSettings, serving

    engine = TorchEngine(tiny_model_dir, seed=0)
    try:
        async with serving(engine, ModelServerSettings(model_path=str(tiny_model_dir), port=0)) as url:
            sglang = await engine_fingerprint(f"sglang:{url}")
            (server,) = sglang["servers"]
            assert server["model_path"] == str(tiny_model_dir) and "error" not in server
            assert sglang["identity"] == f"{server['served_model_name']} (weight version {server['weight_version']})"
            openai = await engine_fingerprint(f"openai:{url}/v1:{server['served_model_name']}")
            assert openai["identity"] == openai["served"]["id"] == server["served_model_name"]
    finally:
        await engine.close()
    gone = await engine_fingerprint(f"sglang:{url}")  # the server is down: recorded, not raised
    assert gone["identity"] is None and "error" in gone["servers"][0]


def test_the_question_set_hash_covers_ids_questions_and_answers_not_order():
    tasks = [Task("a", "Who?", ("X",)), Task("b", "Where?", ("Y", "Z"))]
    base = question_set(tasks)
    assert base == question_set(tasks[::-1]) and base["questions"] == 2
    for changed in (
        [Task("a", "Who?", ("X",)), Task("b", "Where?", ("Y",))],
        [Task("a", "Who?", ("X",)), Task("c", "Where?", ("Y", "Z"))],
        [Task("a", "Who is it?", ("X",)), Task("b", "Where?", ("Y", "Z"))],
    ):
        assert question_set(changed)["sha256"] != base["sha256"]


def test_a_replayed_web_cache_is_part_of_the_protocol_a_recording_one_is_not(tmp_path, small_pool):
    from searchgym.envs.tools.web_cache import WebCache
    from searchgym.envs.web_env import make_web_qa

    path = tmp_path / "web.sqlite"
    cache = WebCache(path, "read_write")
    cache.put("search", "who wrote it|5", [{"title": "A page", "url": "https://example.org/a"}])
    cache.close()

    def stack(mode, **kwargs):
        env = make_web_qa(small_pool, cache=str(path), cache_mode=mode, search_api_key="unused", **kwargs)
        try:
            return tool_stack(env)
        finally:
            env.close()

    replay, info = stack("replay_only")
    assert replay["web_cache"]["mode"] == "replay_only" and replay["web_cache"]["entries"] == 1
    assert info["web_cache"] == replay["web_cache"] and replay["search"]["kind"] == "web_search"
    recording, info = stack("read_write", block=["answers.example"])
    assert recording["web_cache"] == {"mode": "read_write"} and info["web_cache"]["entries"] == 1
    assert recording["search"]["blocked_domains"] == ["answers.example"]
    cache = WebCache(path, "read_write")
    cache.put("page", "https://example.org/a", {"title": "A page", "text": "new text"})
    cache.close()
    assert (
        stack("replay_only")[0]["web_cache"]["sha256"] != replay["web_cache"]["sha256"]
    )  # other pages, other protocol
    assert stack("read_write", block=["answers.example"])[0] == recording


def test_a_run_card_records_the_env_it_ran(tiny_model_dir, small_bundle, tmp_path):
    kwargs = {**SMALL, "top_k": 3, "doc_chars": 120, "max_turns": 5, "tool_format": "hermes"}
    summary = run_eval(
        SYN,
        str(tiny_model_dir),
        tmp_path / "run",
        k=1,
        judge="f1,em",
        env_kwargs=kwargs,
        max_tasks=2,
        concurrency=2,
        max_new_tokens=6,
        max_context=300,
        temperature=0.7,
        progress=False,
        workflow=NOISY,
    )
    card = summary["card"]
    assert card["hash"] == canonical_sha256(card["protocol"])
    protocol = card["protocol"]
    assert protocol["suite"]["env"] == SYN and protocol["suite"]["questions"] == 2
    assert protocol["primary"] == "f1" and set(protocol["judges"]) == {"f1", "em"}
    assert protocol["k"] == 1 and protocol["sampling"]["temperature"] == 0.7
    assert protocol["budgets"] == {
        "max_turns": 5,
        "max_new_tokens_per_turn": 6,
        "max_context_tokens": 300,
        "max_obs_tokens": None,
    }
    tools = protocol["tools"]
    assert (tools["top_k"], tools["doc_chars"], tools["format"]) == (3, 120, "hermes")
    manifest = json.loads((small_bundle / "index" / "index.json").read_text())
    assert tools["search"]["kind"] == "bm25" and tools["search"]["corpus_sha256"] == manifest["corpus_sha256"]
    assert tools["pages"] == "same as search"
    assert card["agent"]["model"]["weights"]["sha256"] == weights_fingerprint(tiny_model_dir)["sha256"]
    assert card["agent"]["workflow"] == NOISY and card["run"]["searchgym"]["version"]
    assert len(card["run"]["searchgym"]["commit"] or "0" * 40) == 40
    text = (tmp_path / "run" / "summary.md").read_text()
    assert text.index("## Protocol card") < text.index("## Scores") and card["hash"] in text

    again = run_eval(
        SYN,
        str(tiny_model_dir),
        tmp_path / "other",
        k=1,
        judge="f1,em",
        env_kwargs={**kwargs, "top_k": 4},
        max_tasks=2,
        concurrency=2,
        max_new_tokens=6,
        max_context=300,
        temperature=0.7,
        progress=False,
        workflow=NOISY,
    )
    assert differences([card, again["card"]]) == {"protocol.tools.top_k": [3, 4]}


def test_a_resume_with_other_weights_at_the_same_path_is_refused(tiny_model_dir, small_bundle, tmp_path):
    model = Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))
    args = dict(
        k=1,
        judge="em",
        env_kwargs=dict(SMALL),
        max_tasks=1,
        concurrency=1,
        max_new_tokens=4,
        max_context=300,
        progress=False,
        workflow=NOISY,
    )
    run_eval(SYN, str(model), tmp_path / "run", **args)
    run_eval(SYN, str(model), tmp_path / "run", **args)  # same weights: resumes
    flip_last_byte(model / "model.safetensors")
    with pytest.raises(ValueError, match="another run.*'model'"):
        run_eval(SYN, str(model), tmp_path / "run", **args)


def test_secrets_in_env_kwargs_never_reach_the_card(small_pool, small_index):
    from searchgym.agents.engines.types import SamplingParams
    from searchgym.envs.judges import ExactMatch
    from searchgym.envs.search_env import SearchEnv
    from searchgym.eval.card import CardFacts, build_card
    from searchgym.eval.eval_settings import EvalSettings

    kwargs = {
        "search_api_key": "sk-1",
        "search_options": {"token": "t", "max_obs_tokens": 5},
        "top_k": 3,
        "servers": ["http://h"],
        "password": None,
    }
    env = SearchEnv(small_pool, small_index)
    settings = EvalSettings(env="searchgym/LocalQA-v0", engine="x", k=1, max_context=100, env_kwargs=kwargs)
    facts = CardFacts(
        env=env, tasks=small_pool.tasks[:2], judges={"em": ExactMatch()}, primary="em", sampling=SamplingParams()
    )
    card = build_card(settings, facts)
    assert "sk-1" not in json.dumps(card) and '"t"' not in json.dumps(card)
    assert card["run"]["env_kwargs"] == {
        "search_api_key": "<redacted>",
        "search_options": {"token": "<redacted>", "max_obs_tokens": 5},
        "top_k": 3,
        "servers": ["http://h"],
        "password": None,
    }
