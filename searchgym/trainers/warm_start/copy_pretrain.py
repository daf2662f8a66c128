"""Copy pretraining: a fresh tiny model learns to copy from its context before it learns the tools.

A search agent copies all the time: the entity from the question into its query, the answer from a
search result into its reply. Real base LMs learn in-context copying from web text (induction heads:
find the earlier occurrence of the current token and predict what followed it). A tiny model
initialised from scratch has not, and demonstrations alone teach it too slowly: after supervised
warm starts of 900 steps, 46-74% of the held-out name tokens in its actions were still wrong, so it
wrote queries and answers with made-up names.

Here every sequence is random tokens in which one random segment appears twice, with random
filler before and between; the loss is on the second copy (after its first token). Only copying
predicts it, and because lengths and gaps are random no fixed-offset shortcut does. A 2-layer,
128-wide Qwen2 goes from chance to 99% copy accuracy in a sharp phase change after 300-600 steps.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from searchgym.agents.hf_bars import no_hf_bars
from searchgym.settings import setting
from searchgym.trainers.algorithm.learner import next_token_logits
from searchgym.trainers.warm_start.sft import save_trained


@dataclass
class CopyPretrainConfig:
    """Steps and the shape of the random sequences (segment lengths and gaps in tokens)."""

    steps: int = setting(600, at_least=0)
    batch_size: int = setting(64, at_least=1)
    lr: float = 3e-3
    warmup_steps: int = setting(50, at_least=0)
    grad_clip: float = 1.0
    min_segment: int = setting(4, at_least=1)
    max_segment: int = 24
    max_gap: int = setting(
        16, at_least=0
    )  # filler before the first copy and between the copies: 0..max_gap tokens each
    seed: int = 0

    def check(self) -> Iterator[tuple[str, str]]:
        """A segment's length is drawn from min_segment..max_segment."""
        if self.max_segment < self.min_segment:
            yield ("max_segment", f"must be at least min_segment ({self.min_segment}), got {self.max_segment}")


def copy_batch(
    rng: random.Random, vocabulary: list[int], config: CopyPretrainConfig, pad_id: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, attention mask, loss mask) of `batch_size` sequences `filler, S, filler, S`, right-padded.

    The loss mask marks the second S but its first token (which nothing in the context predicts).
    """
    rows: list[tuple[list[int], list[int]]] = []
    for _ in range(config.batch_size):
        segment = rng.choices(vocabulary, k=rng.randint(config.min_segment, config.max_segment))
        before = rng.choices(vocabulary, k=rng.randint(0, config.max_gap))
        between = rng.choices(vocabulary, k=rng.randint(0, config.max_gap))
        sample = before + segment + between + segment
        learn = [0] * (len(sample) - len(segment) + 1) + [1] * (len(segment) - 1)
        rows.append((sample, learn))
    width = max(len(sample) for sample, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    for row, (sample, learn) in enumerate(rows):
        ids[row, : len(sample)] = torch.tensor(sample)
        attention[row, : len(sample)] = 1
        mask[row, : len(sample)] = torch.tensor(learn)
    return ids, attention, mask


def copy_pretrain(
    model_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    config: CopyPretrainConfig | None = None,
    *,
    device: str = "cpu",
    progress: bool = True,
    progress_label: str = "copy pretraining",
) -> list[dict[str, float]]:
    """Train the model in `model_dir` to copy repeated segments; save it (with its tokenizer) to `out_dir`.

    Returns one record per step: loss and copy accuracy (argmax right on the learned tokens), lr.
    `progress_label` names the progress bar.
    """
    config = config or CopyPretrainConfig()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    with no_hf_bars():
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    special = set(tokenizer.all_special_ids)
    vocabulary = [i for i in range(len(tokenizer)) if i not in special]
    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    warmup = max(1, config.warmup_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    history: list[dict[str, float]] = []
    model.train()
    for step in tqdm(range(config.steps), desc=progress_label, disable=not progress):
        ids, attention, mask = (t.to(device) for t in copy_batch(rng, vocabulary, config, pad))
        where = mask[:, 1:].bool()
        logits = next_token_logits(model, ids, attention, where)
        targets = ids[:, 1:][where]
        loss = torch.nn.functional.cross_entropy(logits, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        scheduler.step()
        accuracy = (logits.argmax(-1) == targets).float().mean()
        history.append(
            {
                "step": step + 1,
                "loss": loss.item(),
                "copy_accuracy": accuracy.item(),
                "lr": float(scheduler.get_last_lr()[0]),
            }
        )
    save_trained(model, tokenizer, out_dir, history, "copy_pretrain_history.jsonl")
    return history
