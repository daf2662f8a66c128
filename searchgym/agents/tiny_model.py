"""Tiny Qwen2 models built on the spot: a byte-level BPE tokenizer and random weights, no downloads.

Tests and CPU runs need a real causal LM with a real tokenizer and chat template, but must never
touch the hub. `build_tiny_model` trains a byte-level BPE (every NFC string round-trips) on pages of
the synthetic world plus the agent's tool tags, initialises a Qwen2 of a few hundred thousand
parameters from a seed, and saves both so the usual `Auto*.from_pretrained(dir)` calls load them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from searchgym.agents.formats import CHATML_TOOLS_TEMPLATE as CHAT_TEMPLATE
from searchgym.agents.hf_bars import no_hf_bars
from searchgym.core.extras import needs

with needs("the tiny model"):
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END]
TOOL_TAGS = (
    "<think>",
    "</think>",
    "<search>",
    "</search>",
    "<access>",
    "</access>",
    "<answer>",
    "</answer>",
    "<information>",
    "</information>",
)
INIT_STD = 0.3  # weight init std: at HF's 0.02 a random tiny model repeats one token; at 0.3 greedy text varies
_WORLD_SIZE, _WORLD_SEED = 2000, 0
_TAG_REPEATS = 200
_INSTRUCTION_LINES = (
    "Answer the question below by searching a knowledge source.",
    "You may think step by step inside <think> </think>.",
    "<search> query </search> searches and returns the top results with their urls.",
    "<access> url </access> opens a page from the results.",
    "<answer> final answer </answer> ends the episode; give a short answer (a name, a year, a number).",
    "Tool results come back inside <information> </information>.",
    "Question: Where was the founder of the company born?",
    "<think> I should search for the founder first. </think>",
)


def default_texts() -> Iterator[str]:
    """Tokenizer training text: synthetic-world pages, tool tags and instruction-like lines."""
    from searchgym.world.world import World

    world = World(_WORLD_SIZE, _WORLD_SEED)
    for eid in range(len(world)):
        yield world.render_text(world.entity(eid))
    for _ in range(_TAG_REPEATS):
        yield " ".join(TOOL_TAGS)
        yield from _INSTRUCTION_LINES


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE with ChatML special tokens; decode(encode(s)) == NFC(s) for any string.

    The pipeline is Qwen2's own (NFC, Qwen's split regex, byte-level), because `AutoTokenizer` rebuilds
    any qwen2 model's tokenizer with it: this way the trained and the reloaded tokenizer are the same.
    """
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token=IM_END, pad_token=PAD, clean_up_tokenization_spaces=False
    )
    tokenizer.add_special_tokens({"additional_special_tokens": [IM_START]})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@dataclass
class TinyShape:
    """The tiny Qwen2's shape and weight init; the defaults are the small untrained model engine tests use."""

    vocab_size: int = 2048
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 176
    max_position_embeddings: int = 8192
    init_std: float = INIT_STD


def tiny_config(tokenizer: PreTrainedTokenizerFast, shape: TinyShape) -> Qwen2Config:
    """A Qwen2 config of `shape`, with tied embeddings and the tokenizer's special ids (its vocabulary's size)."""
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        intermediate_size=shape.intermediate_size,
        max_position_embeddings=shape.max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        initializer_range=shape.init_std,
    )


def build_tiny_model(
    out_dir: str | Path, shape: TinyShape | None = None, *, texts: Iterable[str] | None = None, seed: int = 0
) -> Path:
    """Train a tokenizer, initialise a seeded fp32 Qwen2 of `shape` and save both to `out_dir`; same args, same files.

    The default `init_std` makes an untrained model write varied text (what engine tests need); a model
    that is going to be trained wants a small one (0.02, as Hugging Face initialises Qwen2).
    """
    shape = shape or TinyShape()
    out = Path(out_dir)
    tokenizer = train_tokenizer(default_texts() if texts is None else texts, shape.vocab_size)
    config = tiny_config(tokenizer, shape)
    with torch.random.fork_rng(devices=[]):  # seeded weights without disturbing the caller's random state
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32).eval()
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    with no_hf_bars():
        model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
