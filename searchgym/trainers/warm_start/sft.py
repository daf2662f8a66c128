"""Supervised warm start: teach a policy to use the tools from demonstrations before RL.

A fresh model earns no reward, so RL has no signal to follow. Demonstrations (the synthesis oracle's
episodes, or an RL run's own successful trajectories) are chats: prompt, then action and
observation turns. Each is laid out token for token as the episode runner builds it while playing
(`ChatTemplateDelta.conversation_ids`), and the model learns the action tokens (the loss is the token
mean of cross-entropy over assistant tokens; `observation_weight` > 0 also models the tool results,
whose repeated names are a dense lesson in copying for a model too small to have learnt it). AdamW,
warm-up then linear decay, micro-batches packed to a token budget.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from searchgym.agents.formats import ChatTemplateDelta
from searchgym.agents.hf_bars import no_hf_bars
from searchgym.agents.model_dir import check_policy_dir
from searchgym.settings import setting
from searchgym.trainers.algorithm.learner import next_token_logits, padded_batches
from searchgym.trainers.run.checkpoint import write_model_dir


@dataclass
class SFTConfig:
    """Optimisation settings of the warm start."""

    epochs: float = setting(3.0, above=0)
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = setting(10, at_least=0)
    grad_clip: float = 1.0
    batch_tokens: int = setting(16_384, at_least=1)  # tokens (padded) per optimizer step
    # tokens (padded) per forward/backward pass, the step's gradient accumulated over them: the same update in less
    # memory (a 135M real model holds ~1.4 MB of activations per token); None: the whole batch at once
    micro_batch_tokens: int | None = setting(None, at_least=1)
    max_length: int = setting(4096, at_least=1)  # longer demonstrations are cut (their tail is not learned)
    observation_role: str = "user"
    system_prompt: str | None = None  # as the workflow's (WorkflowSettings.system_prompt): the same layout is learned
    observation_weight: float = 0.0  # loss weight of the other tokens (prompt, tool results); 0: actions only
    seed: int = 0


def load_demonstrations(path: str | os.PathLike) -> list[list[dict[str, str]]]:
    """Chats from a JSONL file whose rows have "messages" (trajectory dumps and demo files do); errors name the line."""
    chats = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                messages = json.loads(line)["messages"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{line_no}: not a JSON object with 'messages' ({exc})") from None
            chats.append(messages)
    return chats


def encode_demonstrations(
    tokenizer: Any,
    chats: Iterable[list[dict[str, str]]],
    *,
    max_length: int,
    observation_role: str = "user",
    system_prompt: str | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(ids, loss mask) per chat, in the runner's exact layout; chats with nothing to learn are skipped."""
    template = ChatTemplateDelta(tokenizer, observation_role, system_prompt)
    encoded = []
    for chat in chats:
        ids, mask = template.conversation_ids(chat)
        ids, mask = ids[:max_length], mask[:max_length]
        if sum(mask[1:]):
            encoded.append((torch.tensor(ids), torch.tensor(mask)))
    return encoded


def sft(
    model_dir: str | os.PathLike,
    chats: list[list[dict[str, str]]],
    out_dir: str | os.PathLike,
    config: SFTConfig | None = None,
    *,
    device: str = "cpu",
    progress: bool = True,
    progress_label: str = "sft",
) -> list[dict[str, float]]:
    """Fine-tune the model in `model_dir` on `chats` and save it (with its tokenizer) to `out_dir`.

    Returns one record per optimizer step (loss, token accuracy on the action tokens, lr). `progress_label` names the
    progress bar.
    """
    config = config or SFTConfig()
    check_model_out(out_dir)
    check_policy_dir(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    with no_hf_bars():
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    samples = encode_demonstrations(
        tokenizer,
        chats,
        max_length=config.max_length,
        observation_role=config.observation_role,
        system_prompt=config.system_prompt,
    )
    if not samples:
        raise ValueError("no demonstration has an assistant token to learn")
    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    batches = _batches(samples, config.batch_tokens, rng)  # the first epoch; later ones are reshuffled as needed
    total = max(1, math.ceil(config.epochs * len(batches)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    warmup = max(1, config.warmup_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup, max(0.0, (total - step) / max(1, total - warmup)))
    )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    history: list[dict[str, float]] = []
    model.train()
    for step in tqdm(range(total), desc=progress_label, disable=not progress):
        if not batches:
            batches = _batches(samples, config.batch_tokens, rng)
        parts = [
            [t.to(device) for t in _pad(part, pad)]
            for part in padded_batches(batches.pop(), config.micro_batch_tokens or 1 << 62, lambda s: len(s[0]))
        ]
        weight_sum = sum(float(_weights(m, a, config.observation_weight).sum()) for _, a, m in parts)
        optimizer.zero_grad(set_to_none=True)
        loss_sum, correct, acted = 0.0, 0.0, 0.0
        for ids, attention, mask in parts:  # the batch's loss, one micro-batch's share at a time
            weights = _weights(mask, attention, config.observation_weight)
            where = weights > 0
            logits = next_token_logits(model, ids, attention, where)  # [N, vocab], trained positions only
            targets, weights, actions = ids[:, 1:][where], weights[where], mask[:, 1:][where].float()
            losses = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
            loss = (losses * weights).sum() / weight_sum
            loss.backward()
            loss_sum += loss.item()
            correct += float(((logits.argmax(-1) == targets).float() * actions).sum())
            acted += float(actions.sum())
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        scheduler.step()
        history.append(
            {
                "step": step + 1,
                "loss": loss_sum,
                "token_accuracy": correct / max(acted, 1.0),
                "grad_norm": float(grad_norm),
                "lr": float(scheduler.get_last_lr()[0]),
            }
        )
    save_trained(model, tokenizer, out_dir, history, "sft_history.jsonl")
    return history


def save_trained(
    model: Any, tokenizer: Any, out_dir: str | os.PathLike, history: list[dict[str, float]], history_name: str
) -> None:
    """Save a trained model with its tokenizer (a loadable model directory) and its per-step history, atomically:
    a reader (the next stage, a server loading it) never sees a half-written directory."""
    check_model_out(out_dir)
    model.eval()

    def write_history(partial: Path) -> None:
        (partial / history_name).write_text("".join(json.dumps(h) + "\n" for h in history))

    write_model_dir(out_dir, model=model, tokenizer=tokenizer, extra=write_history)


def check_model_out(out_dir: str | os.PathLike) -> None:
    """Refuse an output directory that holds something other than a model: saving replaces the whole directory."""
    out = Path(out_dir)
    if out.is_dir() and any(out.iterdir()) and not (out / "config.json").exists():
        raise ValueError(
            f"{out} holds files that are not a model directory; the trained model replaces the whole "
            "directory, so save it to a new or empty one"
        )


def _batches(
    samples: list[tuple[torch.Tensor, torch.Tensor]], batch_tokens: int, rng: random.Random
) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """One epoch: shuffled samples grouped by length into batches of at most `batch_tokens` padded tokens."""
    order = sorted(samples, key=lambda s: (len(s[0]), rng.random()))
    batches = padded_batches(order, batch_tokens, lambda s: len(s[0]))
    rng.shuffle(batches)
    return batches


def _weights(mask: torch.Tensor, attention: torch.Tensor, observation_weight: float) -> torch.Tensor:
    """Loss weight of each next-token position: 1 on the policy's tokens, `observation_weight` on the rest."""
    actions = mask[:, 1:].float()
    return actions + observation_weight * (1 - actions) * attention[:, 1:]


def _pad(batch: list[tuple[torch.Tensor, torch.Tensor]], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Right-pad a batch: ids, attention mask, loss mask."""
    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (sample_ids, sample_mask) in enumerate(batch):
        ids[row, : len(sample_ids)], attention[row, : len(sample_ids)] = sample_ids, 1
        mask[row, : len(sample_ids)] = sample_mask
    return ids, attention, mask
