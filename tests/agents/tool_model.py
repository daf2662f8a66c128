"""A tiny model taught one tool-calling exchange, so the OpenAI tools path runs end to end on a real model.

Starting from the default tiny model, a few dozen Adam steps make it answer the question below (with
the search tool offered) by calling `search`, and the conversation holding that call and its result
with the answer. Both prompts are rendered by the tiny model's own (Qwen2.5-style) chat template, so
greedy decoding through `serve model` reproduces the exchange exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the knowledge source.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}
TOOLS = [SEARCH_TOOL]
QUESTION = {"role": "user", "content": "Where does the Aldra flow?"}
ARGUMENTS = {"query": "Aldra"}
RESULT = "The Aldra flows through Grishofield."
ANSWER = "Grishofield"


def exchange(call_id: str = "call_0") -> tuple[list[dict], list[dict]]:
    """(first turn's messages, second turn's messages): the question, then question + call + tool result."""
    call = {"id": call_id, "type": "function", "function": {"name": "search", "arguments": json.dumps(ARGUMENTS)}}
    assistant = {"role": "assistant", "content": None, "tool_calls": [call]}
    tool = {"role": "tool", "tool_call_id": call_id, "content": RESULT}
    return [QUESTION], [QUESTION, assistant, tool]


def train_tool_model(base_dir: Path, out_dir: Path, max_steps: int = 80, seed: int = 0) -> Path:
    """Teach the base tiny model the two replies (loss on the replies only); save it to out_dir."""
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    first, second = exchange()
    as_template = [
        QUESTION,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": ARGUMENTS}}],
        },
        second[2],
    ]
    call_text = f"<tool_call>\n{json.dumps({'name': 'search', 'arguments': ARGUMENTS})}\n</tool_call>"
    pairs = [
        (
            tokenizer.apply_chat_template(
                first, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False
            ),
            call_text,
        ),
        (
            tokenizer.apply_chat_template(
                as_template, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False
            ),
            ANSWER,
        ),
    ]
    return teach_replies(base_dir, out_dir, pairs, max_steps=max_steps, seed=seed)


def teach_replies(
    base_dir: Path, out_dir: Path, pairs: list[tuple[list[int], str]], max_steps: int = 80, seed: int = 0
) -> Path:
    """Fine-tune the model at base_dir until it answers each prompt (token ids) with its reply text and eos (loss on
    the replies only, a few dozen Adam steps on a tiny model); save model and tokenizer to out_dir."""
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    examples = [(list(prompt), tokenizer.encode(reply + tokenizer.eos_token)) for prompt, reply in pairs]
    torch.manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(max_steps):
        loss = sum(
            torch.nn.functional.cross_entropy(
                model(torch.tensor([prompt + target]), logits_to_keep=len(target) + 1).logits[0, :-1],
                torch.tensor(target),
            )
            for prompt, target in examples
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.01:
            break
    model.eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
