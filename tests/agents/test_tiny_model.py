"""The tiny model loads with the Auto classes, its tokenizer round-trips text, and builds are deterministic."""

import unicodedata

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, Qwen2ForCausalLM

from searchgym.agents.tiny_model import (
    IM_END,
    IM_START,
    PAD,
    TOOL_TAGS,
    TinyShape,
    build_tiny_model,
    default_texts,
    train_tokenizer,
)

TEXTS = ["The river Aldra flows through Grishofield.", "<think> search first </think> <answer> 1750 </answer>"] * 50


@pytest.fixture(scope="module")
def trained_tokenizer():
    """The in-memory tokenizer of a default build, before saving."""
    return train_tokenizer(default_texts())


def test_loads_with_auto_classes(model, tokenizer):
    assert isinstance(model, Qwen2ForCausalLM) and model.dtype == torch.float32
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert tokenizer.eos_token == IM_END and tokenizer.pad_token == PAD
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids(IM_END)
    assert len(tokenizer) == model.config.vocab_size == 2048


def test_size_is_a_few_hundred_thousand_parameters(model):
    assert 100_000 < sum(p.numel() for p in model.parameters()) < 1_000_000


@given(st.text())
@settings(max_examples=300, deadline=None)
def test_any_text_round_trips_up_to_nfc(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text)) == unicodedata.normalize("NFC", text)


@given(st.text().map(lambda s: unicodedata.normalize("NFC", s)))
@settings(max_examples=300, deadline=None)
def test_trained_and_reloaded_tokenizers_agree(trained_tokenizer, tokenizer, text):
    assert trained_tokenizer.encode(text) == tokenizer.encode(text)


def test_chat_template_renders_chatml(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who founded it?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWho founded it?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert ids.count(tokenizer.convert_tokens_to_ids(IM_START)) == 3


def test_special_and_tool_tokens_are_short(tokenizer):
    for special in (PAD, IM_START, IM_END):
        assert len(tokenizer.encode(special)) == 1
    for tag in TOOL_TAGS:
        assert len(tokenizer.encode(f" {tag}")) <= 3, tag


def test_greedy_text_varies_with_the_prompt(model, tokenizer):
    outputs = set()
    for prompt in ("Where was Krimar Therth born?", "<search> Ganin Brewery </search>"):
        ids = torch.tensor([tokenizer.encode(prompt)])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16)
        outputs.add(tuple(out[0, ids.shape[1] :].tolist()))
        assert len(set(out[0, ids.shape[1] :].tolist())) > 4
    assert len(outputs) == 2


def test_build_is_deterministic(tmp_path, tiny_model_dir):
    again = build_tiny_model(tmp_path / "again")
    for name in ("model.safetensors", "tokenizer.json", "config.json", "chat_template.jinja"):
        assert (again / name).read_bytes() == (tiny_model_dir / name).read_bytes(), name


def test_custom_texts_and_seed(tmp_path):
    a = build_tiny_model(tmp_path / "a", TinyShape(vocab_size=300), texts=TEXTS, seed=1)
    b = build_tiny_model(tmp_path / "b", TinyShape(vocab_size=300), texts=TEXTS, seed=2)
    assert len(AutoTokenizer.from_pretrained(a)) == 300
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    assert (a / "model.safetensors").read_bytes() != (b / "model.safetensors").read_bytes()


def test_chat_template_renders_tools_calls_and_results_qwen25_style(tokenizer):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "search",
                "description": "Search.",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Who?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": {"query": "Aldra"}}}],
        },
        {"role": "tool", "content": "first"},
        {"role": "tool", "content": "second"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    system, rest = text.split("<|im_end|>\n", 1)
    assert (
        system.startswith("<|im_start|>system\nBe brief.\n\n")
        and '{"type": "function", "function": {"name": "search"' in system
        and "<tool_call>" in system
    )  # the tools and how to call them, after the system text
    assert rest == (
        "<|im_start|>user\nWho?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "search", "arguments": {"query": "Aldra"}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nfirst\n</tool_response>\n<tool_response>\nsecond\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    no_tools = tokenizer.apply_chat_template(messages[:2], add_generation_prompt=True, tokenize=False)
    assert no_tools == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWho?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_observations_as_tool_messages_extend_the_conversation(tokenizer):
    from searchgym.agents.formats import ChatTemplateDelta

    delta = ChatTemplateDelta(tokenizer, observation_role="tool")
    assert delta.observation_text("42", ended_with_eos=True) == (
        "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
