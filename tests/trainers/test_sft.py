"""Supervised warm start on the oracle's demonstrations: exact token layout, and a model that learns them."""

import asyncio
import json

import gymnasium as gym
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import searchgym  # noqa: F401
from searchgym.agents.formats import ChatTemplateDelta
from searchgym.trainers.warm_start.sft import SFTConfig, encode_demonstrations, load_demonstrations, sft
from searchgym.world.oracle import OracleAgent
from tests.conftest import SMALL


@pytest.fixture(scope="module")
def demos(small_bundle):
    env = gym.make("searchgym/SyntheticQA-v0", **SMALL, hops=1, top_k=3, doc_chars=300).unwrapped

    async def play():
        results = [await OracleAgent(skim=True, think=False).arun(env, task) for task in list(env.tasks)[:48]]
        return [r.messages() for r in results if r.solved]

    return asyncio.run(play())


def test_demonstrations_are_laid_out_as_the_runner_plays(demos, tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    chat = demos[0]
    assert [m["role"] for m in chat] == ["user", "assistant", "user", "assistant"]  # skim: search, then answer
    ids, mask = ChatTemplateDelta(tokenizer).conversation_ids(chat)
    # Everything the runner would hold at the last action, as the chat template renders it...
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(chat, tokenize=False)[: -len("<|im_end|>\n")]
    # ...and the loss mask covers exactly the actions' tokens.
    learned = [i for i, m in zip(ids, mask, strict=True) if m]
    assert tokenizer.decode(learned) == "".join(m["content"] for m in chat if m["role"] == "assistant")
    with pytest.raises(ValueError, match="assistant"):
        ChatTemplateDelta(tokenizer).conversation_ids([chat[0], chat[0]])


def test_sft_learns_the_demonstrated_actions(demos, tiny_model_dir, tmp_path):
    train, held_out = demos[:-8], demos[-8:]
    history = sft(
        tiny_model_dir,
        train,
        tmp_path / "sft",
        SFTConfig(epochs=6, lr=3e-3, batch_tokens=4096, warmup_steps=3),
        progress=False,
    )
    assert history[-1]["loss"] < 0.5 * history[0]["loss"]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "sft")

    def held_out_nll(model_dir) -> float:
        model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        total = count = 0.0
        for ids, mask in encode_demonstrations(tokenizer, held_out, max_length=4096):
            with torch.no_grad():
                logits = model(input_ids=ids[None]).logits[0, :-1]
            losses = torch.nn.functional.cross_entropy(logits, ids[1:], reduction="none")
            total += float((losses * mask[1:]).sum())
            count += float(mask[1:].sum())
        return total / count

    assert held_out_nll(tmp_path / "sft") < 0.6 * held_out_nll(tiny_model_dir)
    assert [
        json.loads(line)["step"] for line in (tmp_path / "sft" / "sft_history.jsonl").read_text().splitlines()
    ] == list(range(1, len(history) + 1))


def test_demonstration_files_name_the_bad_line(tmp_path, demos):
    path = tmp_path / "demos.jsonl"
    path.write_text(json.dumps({"messages": demos[0]}) + "\n\n" + '{"turns": []}\n')
    with pytest.raises(ValueError, match=r"demos.jsonl:3"):
        load_demonstrations(path)
    path.write_text(json.dumps({"messages": demos[0], "reward": 1.0}) + "\n")
    assert load_demonstrations(path) == [demos[0]]


def test_observation_weight_also_models_the_tool_results(demos, tiny_model_dir, tmp_path):
    """Weight 0 trains on the actions alone; a positive weight adds the prompt and tool results to the loss."""
    actions_only = sft(
        tiny_model_dir, demos[:2], tmp_path / "a", SFTConfig(epochs=1, batch_tokens=100_000), progress=False
    )
    everything = sft(
        tiny_model_dir,
        demos[:2],
        tmp_path / "b",
        SFTConfig(epochs=1, batch_tokens=100_000, observation_weight=1.0),
        progress=False,
    )
    assert len(actions_only) == len(everything) == 1
    assert actions_only[0]["loss"] != pytest.approx(everything[0]["loss"], rel=1e-3)
    assert actions_only[0]["token_accuracy"] == everything[0]["token_accuracy"]  # accuracy is over actions either way


def test_the_model_dir_is_written_whole_and_never_over_other_files(demos, tiny_model_dir, tmp_path):
    """The saved dir is complete (model, tokenizer, history) with no partial left beside it; rerunning into it
    replaces the model, while a directory of other files is refused before any training."""
    out = tmp_path / "sft"
    for _ in range(2):
        sft(tiny_model_dir, demos[:1], out, SFTConfig(epochs=1, batch_tokens=100_000), progress=False)
        assert {"config.json", "sft_history.jsonl", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
        assert [p.name for p in tmp_path.iterdir()] == ["sft"]
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="notes holds files that are not a model directory"):
        sft(tiny_model_dir, demos[:1], other, SFTConfig(epochs=1), progress=False)
    assert (other / "keep.txt").read_text() == "mine"


def test_micro_batches_accumulate_the_same_update_in_less_memory(demos, tiny_model_dir, tmp_path, monkeypatch):
    """The step's gradient summed over micro-batches is the whole batch's: same losses, same weights (float noise),
    with no forward pass over more padded tokens than the micro-batch budget."""
    import searchgym.trainers.warm_start.sft as sft_module

    widths: list[int] = []
    forward = sft_module.next_token_logits

    def measured(model, ids, *args, **kwargs):
        widths.append(ids.numel())
        return forward(model, ids, *args, **kwargs)

    monkeypatch.setattr(sft_module, "next_token_logits", measured)
    base = SFTConfig(epochs=1.0, lr=1e-3, warmup_steps=1, batch_tokens=8192, observation_weight=0.1, seed=3)
    whole = sft(tiny_model_dir, demos[:16], tmp_path / "whole", base, progress=False)
    whole_widest, widths[:] = max(widths), []
    split_config = SFTConfig(**{**vars(base), "micro_batch_tokens": 1024})
    split = sft(tiny_model_dir, demos[:16], tmp_path / "split", split_config, progress=False)
    longest = max(
        len(ids)
        for ids, _ in encode_demonstrations(AutoTokenizer.from_pretrained(tiny_model_dir), demos[:16], max_length=4096)
    )
    assert max(widths) <= max(1024, longest) < whole_widest
    assert len(whole) == len(split) >= 2
    steps = len(whole)  # the lr decays linearly to 0 over the run's steps, micro-batched or not
    assert [h["lr"] for h in split] == pytest.approx([base.lr * (steps - n) / (steps - 1) for n in range(1, steps + 1)])
    for a, b in zip(whole, split, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4) and a["token_accuracy"] == b["token_accuracy"]
    one = AutoModelForCausalLM.from_pretrained(tmp_path / "whole").state_dict()
    other = AutoModelForCausalLM.from_pretrained(tmp_path / "split").state_dict()
    moved = max(
        float((one[k] - AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()[k]).abs().max()) for k in one
    )
    differs = max(float((one[k] - other[k]).abs().max()) for k in one)
    assert moved > 1e-4 and differs < moved * 1e-2
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        from searchgym.settings import load_settings

        load_settings(SFTConfig, values={"micro_batch_tokens": 0})


def test_the_bar_carries_the_stage_label_and_hugging_face_draws_none(demos, tiny_model_dir, tmp_path, capfd):
    """The quickstart names this bar by its stage ("stage 4 of 6: warm start", not "sft"); the load and the save of
    the model drew no Hugging Face bar of their own."""
    config = SFTConfig(epochs=1, batch_tokens=100_000)
    sft(tiny_model_dir, demos[:1], tmp_path / "sft", config, progress=True, progress_label="stage 4 of 6: warm start")
    err = capfd.readouterr().err
    assert "stage 4 of 6: warm start: 100%" in err and "sft:" not in err
    assert "Loading weights" not in err and "Writing model shards" not in err
