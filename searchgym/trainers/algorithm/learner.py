"""The learner: one decoupled-PPO update from a batch of trajectory groups.

    1. returns: outcome reward, plus optional process rewards refined by Clip or Delta (so repeating a
       rewarded action cannot raise the return), as a return-to-go per turn;
    2. advantages: group baseline (mean, optionally std) over each task's group; groups whose returns
       have no spread carry no signal and are dropped;
    3. proximal log-probs: the pre-update weights' log-probs, fixed for the whole step (the first minibatch
       trains on the pre-update weights, so its own forward pass gives them; later minibatches get a no-grad
       pass before any update; a model with dropout gets the no-grad pass for all, in eval mode); with
       `proximal: behaviour` (plain PPO, AReaL's use_decoupled_loss=False) they are the behaviour log-probs;
    4. the decoupled PPO loss, token-mean over the whole batch, accumulated over micro-batches packed
       to a token budget so long trajectories fit memory; AdamW, gradient clipping, LR warm-up.

Log-probs and entropies come from the last hidden states through the LM head a chunk of positions at a time
(`lm_head.chunked_logprobs`): the [tokens, vocab] logits never exist whole, so a trajectory's memory per token does
not grow with the vocabulary.

Log-probs are log softmax(logits / temperature), the quantity the engines report for the behaviour
policy, so behaviour, proximal and current policies are compared like for like.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import torch

from searchgym.agents.trajectory import Segment, Trajectory
from searchgym.core.heap import release_free_heap
from searchgym.envs.rewards import answer_page_rewards, refine_process_rewards
from searchgym.trainers.algorithm.lm_head import DEFAULT_CHUNK_TOKENS, chunked_logprobs
from searchgym.trainers.algorithm.ppo import (
    STAT_WEIGHTS,
    decoupled_ppo_loss,
    group_advantages,
    loss_normalizer,
    returns_to_go,
)
from searchgym.trainers.config import LearnerConfig
from searchgym.trainers.run.checkpoint import save_checkpoint

if TYPE_CHECKING:
    from transformers import PreTrainedModel  # base_model and get_output_embeddings: a Transformers causal LM

T = TypeVar("T")

_COUNTS = ("valid_tokens", "normalizer_tokens")


def aggregate_stats(parts: list[dict[str, float]], *, summed: tuple[str, ...] = ("loss",)) -> dict[str, float]:
    """Statistics of several micro-batches (or minibatches) as one: extremes, sums and token-weighted means.

    Keys ending in _max / _min take the max / min; the token counts and the keys in `summed` add up; every other
    key is a mean weighted by the count `STAT_WEIGHTS` names for it ("normalizer_tokens", the trained tokens, for
    keys it does not list), so a minibatch of 3 tokens weighs 3/100 of a step of 100, not 1/2.
    """
    out: dict[str, float] = {}
    for key in {k for part in parts for k in part}:
        values = [(part[key], part) for part in parts if key in part]
        if key.endswith("_max"):
            out[key] = max(v for v, _ in values)
        elif key.endswith("_min"):
            out[key] = min(v for v, _ in values)
        elif key in _COUNTS or key in summed:
            out[key] = sum(v for v, _ in values)
        else:
            weights = [part.get(STAT_WEIGHTS.get(key, "normalizer_tokens"), 0.0) for _, part in values]
            out[key] = sum(v * w for (v, _), w in zip(values, weights, strict=True)) / max(sum(weights), 1.0)
    return out


@dataclass(eq=False)
class _Sample:
    """One trajectory as tensors aligned for next-token prediction (position i predicts token i+1)."""

    ids: torch.Tensor
    mask: torch.Tensor
    behav: torch.Tensor
    advantages: torch.Tensor
    versions: torch.Tensor
    prox: torch.Tensor | None = None  # filled once per step by the pre-update weights


class _Layout(NamedTuple):
    """A micro-batch as tensors: rows of ids, and per position t the mask, behaviour log-prob, advantage and
    proximal log-prob of token t+1. Padded: one sample a row, `attention` marks the real tokens. Packed: the samples
    one after another in one row, `positions` restarting at 0 for each and `attention` None, so attention stays
    inside each sample; the position ending a sample (which would predict the next one's first token) is masked.
    `spans` says where each sample's n-1 positions are: (row, start)."""

    ids: torch.Tensor
    attention: torch.Tensor | None
    positions: torch.Tensor | None
    mask: torch.Tensor
    behav: torch.Tensor
    adv: torch.Tensor
    prox: torch.Tensor
    spans: list[tuple[int, int]]


def padded_batches(items: Iterable[T], budget: int, length: Callable[[T], int]) -> list[list[T]]:
    """Consecutive runs of `items` (sorted by length, either way) whose padded size, longest times count, stays
    within `budget` tokens; an item longer than the budget is a batch alone. The learner's and the warm start's."""
    batches: list[list[T]] = []
    width = 0
    for item in items:
        n = length(item)
        if batches and max(width, n) * (len(batches[-1]) + 1) <= budget:
            batches[-1].append(item)
            width = max(width, n)
        else:
            batches.append([item])
            width = n
    return batches


def next_token_hidden(
    model: PreTrainedModel,
    ids: torch.Tensor,
    attention: torch.Tensor | None,
    where: torch.Tensor,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Last hidden states [N, hidden] predicting token t+1 at the N positions t where `where` [B, T-1] is set.

    Only trained tokens need the LM head, and they are a small share of an agent's context (observations and
    the prompt are most of it). For models whose logits are `output_embeddings(last hidden state)` (Qwen2, Llama
    and most causal LMs; not ones with logit soft-capping such as Gemma 2). With `positions` (packed rows) and no
    `attention`, Hugging Face models keep attention inside each run of restarting positions.
    """
    if positions is not None:
        out = model.base_model(input_ids=ids, position_ids=positions, attention_mask=None, use_cache=False)
    else:
        out = model.base_model(input_ids=ids, attention_mask=attention)
    return out.last_hidden_state[:, :-1][where.bool()]


def next_token_logits(
    model: PreTrainedModel,
    ids: torch.Tensor,
    attention: torch.Tensor | None,
    where: torch.Tensor,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits [N, vocab] at the positions `where` marks (`next_token_hidden` through the LM head), for callers
    that want whole logits of few positions (warm starts); the learner uses `next_token_logprobs` instead."""
    return model.get_output_embeddings()(next_token_hidden(model, ids, attention, where, positions))


def next_token_logprobs(
    model: PreTrainedModel,
    ids: torch.Tensor,
    attention: torch.Tensor | None,
    where: torch.Tensor,
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 log-probs [N] of the next tokens at the positions `where` [B, T-1] marks, and the entropies [N] there.

    The same quantity as log softmax(next_token_logits / temperature) at the labels, computed a chunk of positions
    at a time (`lm_head.chunked_logprobs`), so memory does not grow with tokens x vocabulary.
    """
    head = model.get_output_embeddings()
    hidden = next_token_hidden(model, ids, attention, where, positions)
    return chunked_logprobs(
        hidden,
        head.weight,
        ids[:, 1:][where.bool()],
        temperature,
        bias=getattr(head, "bias", None),
        chunk_tokens=chunk_tokens,
    )


_VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3")  # attention that runs packed rows per sample


def packs_sequences(model: torch.nn.Module, packing: str = "auto") -> bool:
    """Whether micro-batches are packed rows (several trajectories, positions restarting) rather than padded ones.

    "auto" packs where the model's attention treats each packed sample on its own at no extra cost (flash
    attention's variable-length kernels); elsewhere a packed row needs a dense [row, row] mask and attention over
    the whole row, O(row^2) instead of the sum of O(n^2), so micro-batches stay padded and length-bucketed.
    "on" packs anyway (exact with Hugging Face's sdpa and eager attention too), "off" never does.
    """
    if packing not in ("auto", "on", "off"):
        raise ValueError(f"learner.packing must be one of 'auto', 'on', 'off', got {packing!r}")
    if packing != "auto":
        return packing == "on"
    return getattr(getattr(model, "config", None), "_attn_implementation", None) in _VARLEN_ATTENTION


_TRAIN_MODE_NOISE = ("dropout", "jitter", "layerdrop")  # config rates that make train-mode passes random


def has_train_mode_noise(model: torch.nn.Module) -> bool:
    """Whether a train-mode forward pass can differ from an eval-mode one: a dropout module, or a config rate above 0
    named like dropout, router jitter or layer drop (nested configs included, e.g. a multimodal model's text_config)."""
    if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        return True
    config: Any = getattr(model, "config", None)
    return _noisy(config.to_dict()) if hasattr(config, "to_dict") else False


def _noisy(settings: dict[str, Any]) -> bool:
    for key, value in settings.items():
        if isinstance(value, dict) and _noisy(value):
            return True
        if (
            isinstance(key, str)
            and any(word in key for word in _TRAIN_MODE_NOISE)
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
            and value > 0
        ):
            return True
    return False


def freeze_lower_layers(model: torch.nn.Module, trainable: int) -> int:
    """Leave only the top `trainable` decoder layers and the final norm trainable (the embeddings, and a tied lm_head
    with them, frozen); the number of parameters left trainable. ValueError for a model without decoder layers or
    with fewer layers than asked."""
    hf: Any = model  # a Hugging Face model's accessors (nn.Module's own typing says attributes are tensors)
    decoder = hf.get_decoder() if hasattr(hf, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError("learner.trainable_layers needs a decoder-only model with `.get_decoder().layers`")
    if trainable > len(layers):
        raise ValueError(f"learner.trainable_layers is {trainable}, but the model has {len(layers)} decoder layers")
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    kept = [*layers[len(layers) - trainable :], getattr(decoder, "norm", None)]
    head = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else None
    embeddings = hf.get_input_embeddings() if hasattr(hf, "get_input_embeddings") else None
    if head is not None and (embeddings is None or head.weight is not embeddings.weight):
        kept.append(head)  # an untied lm_head is trained with the top layers
    for module in kept:
        if module is not None:
            for parameter in module.parameters():
                parameter.requires_grad_(True)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class Learner:
    """Owns the trained model and its optimizer; `step` turns groups of trajectories into one new version."""

    def __init__(
        self, model: torch.nn.Module, config: LearnerConfig | None = None, *, pad_id: int = 0, version: int = 0
    ):
        config = config or LearnerConfig()
        self.model, self.config, self.pad_id, self.version = model, config, pad_id, version
        self.device = next(model.parameters()).device
        self._gradient_scale = 1.0  # the sharded learner's ranks multiply by their number (FSDP averages gradients)
        self._prox_from_training_pass = not has_train_mode_noise(
            model
        )  # else train-mode passes differ from eval-mode ones
        self.packed = packs_sequences(model, config.packing)
        if config.trainable_layers is not None:
            freeze_lower_layers(model, config.trainable_layers)
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=config.lr,
            betas=config.betas,
            weight_decay=config.weight_decay,
        )
        warmup = max(config.warmup_steps, 0)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
        )

    # --- one update ----------------------------------------------------------------------------

    def step(self, groups: list[list[Trajectory]]) -> dict[str, float]:
        """One PPO update (split into `minibatches` optimizer steps) on the kept groups.

        The version advances on every step, also when no group carried signal: the staleness rule
        counts learner steps, and rollouts must never wait on a step that had nothing to learn.
        """
        samples, stats = self._samples(groups)
        if not samples:
            self.version += 1
            return {**stats, "updated": 0.0, "version": float(self.version)}
        minibatches = [samples[i :: self.config.minibatches] for i in range(self.config.minibatches)]
        minibatches = [m for m in minibatches if m]
        self._assign(samples)
        if self.config.proximal == "behaviour":  # plain PPO: the trust region is centred on the sampling policy
            for sample in samples:
                sample.prox = sample.behav
        else:
            later = minibatches[1:] if self._prox_from_training_pass else minibatches  # the first one's pass serves
            self._proximal_logprobs([sample for minibatch in later for sample in minibatch])
        parts = [self._update(minibatch) for minibatch in minibatches]
        totals = aggregate_stats(parts, summed=())  # the step's loss: minibatch losses weighted by their tokens
        totals["lr"] = parts[-1]["lr"]
        self.version += 1
        if self.device.type == "cpu":  # the step's freed activations go back to the OS, not kept beside the engine
            release_free_heap()
        return {**stats, **totals, "updated": 1.0, "version": float(self.version)}

    def _update(self, samples: list[_Sample]) -> dict[str, float]:
        """Accumulate the loss over micro-batches with the minibatch's trained-token count as normaliser, then step."""
        cfg = self.config
        normalizer = sum(int(loss_normalizer(s.mask)) for s in samples)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        parts = []
        for batch in self._micro_batches(samples):
            layout = self._layout(batch)
            mask, prox = layout.mask, layout.prox
            logp, entropy, where = self._logprobs(layout)
            if any(s.prox is None for s in batch):  # the first minibatch: these weights are the pre-update ones
                prox = prox.clone()
                for (row, start), s in zip(layout.spans, batch, strict=True):
                    if s.prox is None:
                        prox[row, start : start + len(s.ids) - 1] = logp[row, start : start + len(s.ids) - 1].detach()
            loss, stats = decoupled_ppo_loss(
                logp,
                prox,
                layout.behav,
                layout.adv,
                mask,
                cfg,  # the coefficients (eps_clip, eps_clip_high, behav_weight_cap, c_clip) by name
                normalizer=max(normalizer, 1),
            )
            (loss * self._gradient_scale).backward()
            with torch.no_grad():
                stats["entropy"] = (entropy * mask[where]).sum() / max(float(mask.sum()), 1.0)
            parts.append({key: float(value) for key, value in stats.items()})
        grad_norm = self._clip_gradients()
        self.optimizer.step()
        self.scheduler.step()
        # micro-batch losses share the minibatch's normaliser, so they add up to the minibatch loss
        return {
            **aggregate_stats(self._gather_stats(parts)),
            "grad_norm": grad_norm,
            "lr": float(self.scheduler.get_last_lr()[0]),
        }

    def _clip_gradients(self) -> float:
        """Clip the gradient to `grad_clip` in global norm; the norm before clipping."""
        return float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip))

    def _gather_stats(self, parts: list[dict[str, float]]) -> list[dict[str, float]]:
        """The micro-batch statistics of every rank (here one): the sharded learner gathers them."""
        return parts

    # --- data --------------------------------------------------------------------------------

    def _samples(self, groups: list[list[Trajectory]]) -> tuple[list[_Sample], dict[str, float]]:
        """Returns, advantages and aligned tensors of every trajectory in the groups that carry signal."""
        cfg = self.config
        turn_returns = [[self._turn_returns(t) for t in group] for group in groups]
        if not groups:
            return [], {"groups": 0.0, "dropped_groups": 0.0}
        first = torch.tensor([[r[0] for r in group] for group in turn_returns], dtype=torch.float64)
        advantages, keep = group_advantages(first, std_normalize=cfg.std_normalize)
        scale = (
            first.std(dim=1, keepdim=True, correction=0) + 1e-6 if cfg.std_normalize else torch.ones_like(first[:, :1])
        )
        samples: list[_Sample] = []
        trained_segments = []
        for g, group in enumerate(groups):
            if cfg.drop_no_spread and not keep[g]:
                continue
            for i, traj in enumerate(group):
                per_turn = [float(advantages[g, i] + (r - first[g, i]) / scale[g, 0]) for r in turn_returns[g][i]]
                segments = traj.token_segments()  # each context segment is its own sample, same advantages
                samples.extend(self._sample(segment, per_turn) for segment in segments)
                trained_segments.append(len(segments))
        versions = torch.cat([s.versions[s.mask.bool()] for s in samples]) if samples else torch.zeros(0)
        stale = (self.version - versions).float() if len(versions) else torch.zeros(1)
        return samples, {
            "groups": float(len(groups)),
            "dropped_groups": float(len(groups) - int(keep.sum())) if cfg.drop_no_spread else 0.0,
            "reward_mean": float(sum(t.reward for g in groups for t in g) / sum(len(g) for g in groups)),
            "trained_tokens": float(len(versions)),
            "staleness_mean": float(stale.mean()),
            "staleness_max": float(stale.max()),
            "segments_mean": float(sum(t.num_segments for g in groups for t in g) / sum(len(g) for g in groups)),
            "trained_segments": float(sum(trained_segments)),
        }

    def _turn_returns(self, traj: Trajectory) -> list[float]:
        """Return-to-go per turn: outcome plus refined process rewards (a search that finds the answer page)."""
        cfg = self.config
        process = answer_page_rewards([t.info for t in traj.turns], cfg.process_reward_weight) or [0.0]
        refined = refine_process_rewards(process, mode=cfg.process_reward, threshold=cfg.process_reward_threshold)
        return returns_to_go(traj.reward, refined)

    def _sample(self, segment: Segment, per_turn_advantage: list[float]) -> _Sample:
        """Tensors shifted by one (target token i+1 at position i), each turn's advantage on its tokens."""
        # each run of loss_mask == 1 is one engine call's output; `run_turns` names the turn whose advantage it gets
        run_advantages = [per_turn_advantage[min(turn, len(per_turn_advantage) - 1)] for turn in segment.run_turns]
        token_advantage = torch.zeros(len(segment.input_ids), dtype=torch.float32)
        run, previous = -1, 0
        for i, generated in enumerate(segment.loss_mask):
            if generated and not previous:
                run += 1
            if generated and run_advantages:
                token_advantage[i] = run_advantages[min(run, len(run_advantages) - 1)]
            previous = generated
        return _Sample(
            ids=torch.tensor(segment.input_ids, dtype=torch.long),
            mask=torch.tensor(segment.loss_mask[1:], dtype=torch.float32),
            behav=torch.tensor(segment.logprobs[1:], dtype=torch.float32),
            advantages=token_advantage[1:],
            versions=torch.tensor(segment.versions[1:], dtype=torch.long),
        )

    def _micro_batches(self, samples: list[_Sample]) -> list[list[_Sample]]:
        """Group samples (longest first) so each micro-batch stays within the token budget: padded, its longest
        sample times its count (neighbours in length share a batch, so padding stays small); packed, the sum of its
        lengths (first fit). A sample longer than the budget is trained alone."""
        budget = self.config.micro_batch_tokens
        batches: list[list[_Sample]] = []
        if self.packed:
            room: list[int] = []
            for sample in sorted(samples, key=lambda s: -len(s.ids)):
                fit = next((i for i, left in enumerate(room) if len(sample.ids) <= left), None)
                if fit is None:
                    batches.append([sample])
                    room.append(budget - len(sample.ids))
                else:
                    batches[fit].append(sample)
                    room[fit] -= len(sample.ids)
            return batches
        return padded_batches(sorted(samples, key=lambda s: -len(s.ids)), budget, lambda s: len(s.ids))

    def _assign(self, samples: list[_Sample]) -> None:
        """Which of the step's samples this process trains: all of them (a sharded learner's rank takes its share)."""

    @torch.no_grad()
    def _proximal_logprobs(self, samples: list[_Sample]) -> None:
        """Log-probs of the pre-update weights, computed once when the batch arrives (no grad)."""
        self.model.eval()
        for batch in self._micro_batches(samples):
            layout = self._layout(batch)
            logp, _, _ = self._logprobs(layout)
            for (row, start), sample in zip(layout.spans, batch, strict=True):
                sample.prox = logp[row, start : start + len(sample.ids) - 1].cpu()

    def _logprobs(self, layout: _Layout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probs [B, T-1] of the trained tokens (0 elsewhere), their entropies [N], and where they are (under
        bf16 autocast where `autocast` says so: the log-softmax itself stays fp32)."""
        where = layout.mask > 0
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.config.autocast == "bf16"):
            logp_trained, entropy = self._trained_logprobs(layout.ids, layout.attention, where, layout.positions)
        logp_trained, entropy = logp_trained.float(), entropy.float()
        logp = torch.zeros_like(layout.mask)
        logp[where] = logp_trained
        return logp, entropy, where

    def _trained_logprobs(
        self,
        ids: torch.Tensor,
        attention: torch.Tensor | None,
        where: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`next_token_logprobs` of the trained model (the sharded learner calls it through its FSDP root)."""
        return next_token_logprobs(
            self.model, ids, attention, where, self.config.temperature, self.config.logit_chunk_tokens, positions
        )

    def _layout(self, batch: list[_Sample]) -> _Layout:
        """The micro-batch as a `_Layout` on the learner's device: packed in one row, or one padded row a sample."""
        rows, width = (
            (1, sum(len(s.ids) for s in batch)) if self.packed else (len(batch), max(len(s.ids) for s in batch))
        )
        ids = torch.full((rows, width), self.pad_id, dtype=torch.long)
        attention = None if self.packed else torch.zeros((rows, width), dtype=torch.long)
        positions = torch.zeros((rows, width), dtype=torch.long) if self.packed else None
        mask, behav, adv, prox = (torch.zeros((rows, width - 1)) for _ in range(4))
        spans, start = [], 0
        for i, s in enumerate(batch):
            row, start = (0, start) if self.packed else (i, 0)
            n = len(s.ids)
            ids[row, start : start + n] = s.ids
            if positions is not None:
                positions[row, start : start + n] = torch.arange(n)
            if attention is not None:
                attention[row, :n] = 1
            # n - 1 positions predict this sample's own tokens; the n-th (packed: the next sample's first) stays 0
            mask[row, start : start + n - 1], behav[row, start : start + n - 1] = s.mask, s.behav
            adv[row, start : start + n - 1] = s.advantages
            if s.prox is not None:
                prox[row, start : start + n - 1] = s.prox
            spans.append((row, start))
            start += n
        move = lambda t: None if t is None else t.to(self.device)  # noqa: E731
        dev = self.device
        return _Layout(
            ids.to(dev), move(attention), move(positions), mask.to(dev), behav.to(dev), adv.to(dev), prox.to(dev), spans
        )

    # --- checkpoints and what the launchers send ------------------------------------------------

    restorable = True  # the collapse watchdog can put this learner back on healthy weights (run/restore.py)

    def full_model(self) -> torch.nn.Module | None:
        """The whole model, to send to the engines: this learner's own (a sharded learner's: on rank 0 only)."""
        return self.model

    def follow(self) -> None:
        """A sharded learner's ranks > 0 replay rank 0's collectives here; a single-rank learner has no leader."""
        raise RuntimeError("follow() is for the ranks > 0 of a sharded learner (learner.ranks > 1)")

    def stop(self) -> None:
        """Release the ranks following this one (a sharded learner's rank 0); a single-rank learner has none."""

    def save_checkpoint(
        self,
        run_dir: str | os.PathLike,
        step: int,
        *,
        tokenizer: Any,
        state: dict[str, Any] | None = None,
        keep: int = 2,
    ) -> Path:
        """Checkpoint `step`: the model dir and trainer.pt (`state` plus this learner's under "learner")."""
        return save_checkpoint(
            run_dir,
            step,
            model=self.model,
            tokenizer=tokenizer,
            keep=keep,
            state={**(state or {}), "learner": self.trainer_state()},
        )

    def trainer_state(self) -> dict[str, Any]:
        """Everything but the weights (which checkpoints save as a model directory): optimizer, scheduler, version."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "version": self.version,
        }

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), **self.trainer_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict` or `trainer_state` (then the weights come from the checkpoint's model dir)."""
        if "model" in state:
            self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.version = state["version"]
