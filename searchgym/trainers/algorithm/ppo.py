"""The learner's math in one file: returns, group advantages and AReaL's decoupled PPO loss.

Read top to bottom:
1. `returns_to_go` adds the verifiable outcome reward paid at the end to per-turn process rewards that the
   learner has already refined with `searchgym.envs.rewards.refine_process_rewards` (the one every integration
   uses too), so they cannot be hacked by repetition (arXiv 2410.15115).
2. `group_advantages` is the group baseline (ASearcher / GRPO): return minus the mean of the trajectories
   sampled for the same question; groups whose returns have no spread carry no signal and are dropped.
3. `token_logprobs` / `entropy_from_logits` recompute, in fp32, the quantity the engines record at sampling:
   log softmax(logits / temperature) at the sampled token.
4. `decoupled_ppo_loss` is AReaL's objective (arXiv 2505.24298) with three policies: behaviour (the weights
   that sampled the tokens, possibly several versions old), proximal (the weights before this update step)
   and current (the weights being trained):
       J = E_{a ~ behav}[ (pi_prox / pi_behav) * min(u * A, clip(u, 1 - eps, 1 + eps_high) * A) ],
       u = pi_theta / pi_prox,
   so the trust region is centred on the recent proximal policy while the behaviour weight corrects for
   staleness; tokens whose behaviour weight exceeds a cap are dropped but still counted in the normaliser,
   and no cap means no behaviour weighting at all (AReaL 1.0.4's semantics, listed in its docstring).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

LOG_RATIO_CLAMP = 20.0  # log(pi_theta / pi_prox) is clamped to [-20, 20] before exp (see decoupled_ppo_loss)


# ---------------------------------------------------------------------------------------------------------------
# 1. Rewards: per-turn returns of (already refined) process rewards plus the outcome
# ---------------------------------------------------------------------------------------------------------------


def returns_to_go(outcome: float, process: Sequence[float]) -> list[float]:
    """Undiscounted per-turn return G_t = sum_{k >= t} process_k + outcome, the outcome being paid after the last turn.

    `process` has one (already refined) reward per turn, zeros when there are none, so its length is the
    number of turns; an episode without process rewards gets [outcome] * n_turns.
    """
    returns, tail = [], float(outcome)
    for reward in reversed(process):
        tail += float(reward)
        returns.append(tail)
    return returns[::-1]


# ---------------------------------------------------------------------------------------------------------------
# 2. Group baseline
# ---------------------------------------------------------------------------------------------------------------


def group_advantages(returns: Tensor, *, std_normalize: bool = False, eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """Advantages = returns minus their group's mean (optionally over its std + eps), and which groups to keep.

    `returns` is [num_groups, group_size], one row per question. The std is the population std (correction 0),
    defined for any group size. `keep` [num_groups] is True where max - min > eps: a group whose trajectories
    all scored the same carries no signal and only dilutes the batch; its advantages are set to exactly 0.
    """
    returns = returns if returns.is_floating_point() else returns.float()
    advantages = returns - returns.mean(dim=1, keepdim=True)
    if std_normalize:
        advantages = advantages / (returns.std(dim=1, correction=0, keepdim=True) + eps)
    keep = (returns.amax(dim=1) - returns.amin(dim=1)) > eps
    # exactly 0 without spread: the mean's rounding error must not become a signal (std_normalize would amplify it)
    return torch.where(keep.unsqueeze(1), advantages, 0.0), keep


# ---------------------------------------------------------------------------------------------------------------
# 3. Log-probabilities and entropy, in the engines' convention
# ---------------------------------------------------------------------------------------------------------------


def token_logprobs(logits: Tensor, labels: Tensor, temperature: float = 1.0) -> Tensor:
    """log softmax(logits / temperature) gathered at `labels`, in fp32: exactly what the engines record when sampling.

    `logits` [..., V] at position t score the token `labels[..., t]` (callers shift by one for next-token models).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logprobs.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy of softmax(logits / temperature) at each position, in fp32 (a health statistic of the policy)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -(logprobs.exp() * logprobs).sum(dim=-1)


# ---------------------------------------------------------------------------------------------------------------
# 4. Decoupled PPO loss
# ---------------------------------------------------------------------------------------------------------------


def _behaviour_weight(prox_logp: Tensor, behav_logp: Tensor) -> Tensor:
    """pi_prox / pi_behav per token, a constant (no gradient), in fp32 at least; a non-finite log-ratio gives 1.

    As AReaL 1.0.4's `apply_rejection_sampling`: log(pi_prox) - log(pi_behav) is computed in fp32 (or wider) and
    a non-finite one (-inf - -inf = NaN, or an engine's -inf log-prob) is replaced by 0, i.e. a weight of 1. No
    clamp: a weight that overflows to inf is above any cap and is masked out with `torch.where`, never multiplied.
    """
    dtype = torch.promote_types(prox_logp.dtype, torch.float32)
    log_ratio = prox_logp.detach().to(dtype) - behav_logp.detach().to(dtype)
    return torch.exp(torch.where(torch.isfinite(log_ratio), log_ratio, 0.0))


def _kept_mask(mask: Tensor, behav_weight: Tensor, behav_weight_cap: float | None) -> Tensor:
    """Trained tokens that reach the loss's numerator: those with behaviour weight <= cap (all when the cap is None)."""
    kept = mask.bool()
    return kept if behav_weight_cap is None else kept & (behav_weight <= behav_weight_cap)


def loss_normalizer(mask: Tensor) -> Tensor:
    """The count the loss divides by: every trained token, capped or not (AReaL 1.0.4), as an int64 scalar.

    Compute it on the whole (mini)batch, or sum it over micro-batches, and pass it as `normalizer` to each
    micro-batch's `decoupled_ppo_loss` so that the micro-batch losses add up to the full-batch loss.
    """
    return mask.bool().sum()


def valid_tokens(mask: Tensor, prox_logp: Tensor, behav_logp: Tensor, behav_weight_cap: float | None = 5.0) -> Tensor:
    """Number of trained tokens the behaviour-weight cap keeps (those carrying gradient), as an int64 scalar."""
    return _kept_mask(mask, _behaviour_weight(prox_logp, behav_logp), behav_weight_cap).sum()


def _masked_mean(x: Tensor, where: Tensor) -> Tensor:
    """Mean of x over `where` (0 when empty)."""
    return torch.where(where, x, 0.0).sum() / where.sum().clamp(min=1)


def _masked_max(x: Tensor, where: Tensor) -> Tensor:
    """Max of x over `where` (0 when empty)."""
    return torch.where(where, x, -torch.inf).amax() if where.any() else x.new_zeros(())


def _masked_min(x: Tensor, where: Tensor) -> Tensor:
    """Min of x over `where` (0 when empty)."""
    return torch.where(where, x, torch.inf).amin() if where.any() else x.new_zeros(())


# Which token count weighs each statistic of `decoupled_ppo_loss` when averaging it over micro-batches or
# minibatches: "valid_tokens" (the kept tokens) or "normalizer_tokens" (all trained tokens). Keys ending in _max
# and _min aggregate as max and min; the counts themselves and "loss" are sums over micro-batches.
STAT_WEIGHTS = {
    "clip_fraction": "valid_tokens",
    "dual_clip_fraction": "valid_tokens",
    "importance_weight_mean": "valid_tokens",
    "behav_weight_mean": "valid_tokens",
    "approx_kl": "valid_tokens",
    "behav_capped_fraction": "normalizer_tokens",
}


class LossCoefficients(Protocol):
    """The loss's coefficients, read by name: `PPOCoefficients`, or the trainer's `LearnerConfig` passed whole."""

    @property
    def eps_clip(self) -> float: ...
    @property
    def eps_clip_high(self) -> float | None: ...
    @property
    def behav_weight_cap(self) -> float | None: ...
    @property
    def c_clip(self) -> float | None: ...


@dataclass(frozen=True)
class PPOCoefficients:
    """`decoupled_ppo_loss`'s coefficients (AReaL 1.0.4's defaults), for callers without a `LearnerConfig`."""

    eps_clip: float = 0.2
    eps_clip_high: float | None = None  # None: eps_clip; a larger one is DAPO's clip-higher
    behav_weight_cap: float | None = 5.0  # None: no behaviour weighting at all
    c_clip: float | None = None  # dual clip (> 1); None: off


AREAL_COEFFICIENTS = PPOCoefficients()


def _clipped_surrogate(ratio: Tensor, advantages: Tensor, coef: LossCoefficients) -> tuple[Tensor, Tensor, Tensor]:
    """PPO's clipped per-token objective to minimise, max(-A * r, -A * clip(r)), then the dual clip where c_clip is
    given; with where the clip bit (for clip_fraction) and where the dual clip bit."""
    eps_high = coef.eps_clip if coef.eps_clip_high is None else coef.eps_clip_high
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - coef.eps_clip, 1.0 + eps_high)
    pg = torch.maximum(unclipped, clipped)
    dual_clipped = torch.zeros_like(pg, dtype=torch.bool)
    if coef.c_clip is not None:
        bound = coef.c_clip * advantages.abs()
        dual_clipped = bound < pg.detach()
        pg = torch.minimum(pg, bound)
    return pg, unclipped < clipped, dual_clipped


def decoupled_ppo_loss(
    logp: Tensor,
    prox_logp: Tensor,
    behav_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    coef: LossCoefficients = AREAL_COEFFICIENTS,
    *,
    normalizer: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """AReaL 1.0.4's decoupled PPO loss (`ppo_actor_loss_fn`, token level, mask mode), to minimise, and statistics.

    All tensors share one shape (e.g. [B, T]); `mask` (bool or 0/1) marks the trained (generated) tokens.
    Only `logp` (current policy) carries gradient; `prox_logp`, `behav_logp` and `advantages` are constants.
    `coef` holds eps_clip, eps_clip_high, behav_weight_cap and c_clip (`PPOCoefficients`, or a `LearnerConfig`).
    Per token, with r = pi_theta / pi_prox and w = pi_prox / pi_behav:
        pg_t   = max(-A * r, -A * clip(r, 1 - eps_clip, 1 + eps_clip_high))
        pg_t   = min(pg_t, c_clip * |A|)                 (dual clip, only when c_clip is given; c_clip > 1)
        loss_t = w * pg_t
    The semantics, each AReaL 1.0.4's:
    - `eps_clip_high` defaults to `eps_clip`; a larger one is DAPO's clip-higher.
    - `behav_weight_cap` None means NO behaviour weighting (w = 1 for every token), not an uncapped weight.
      A number c means: tokens with w > c are dropped from the numerator (rejection, AReaL's "mask" action).
    - The normaliser counts every trained token, capped ones included, so rejecting tokens does not inflate the
      gradient of the others: loss = sum_{kept} loss_t / normalizer, normalizer defaulting to `mask.sum()`
      (micro-batching callers pass the whole batch's `loss_normalizer(mask)`), clamped to >= 1.
    - A non-finite log(pi_prox / pi_behav) counts as 0 (w = 1), as AReaL sanitises it.
    - AReaL does not clamp log r; here log r is clamped to [-20, 20] before exp, so a corrupt log-prob cannot turn
      the loss into inf/NaN. Within that range (r from 2e-9 to 5e8, far outside any trust region) the loss is
      AReaL's exactly; beyond it the token's gradient is 0.

    Statistics (detached) over this call's kept tokens unless named otherwise: clip_fraction, dual_clip_fraction,
    importance_weight_{mean,max,min} (r), behav_weight_{mean,max} (w, also reported when weighting is off),
    behav_capped_fraction (over trained tokens), approx_kl (k3 estimator of KL(prox || current):
    mean((r - 1) - log r)), loss, valid_tokens (kept), normalizer_tokens (trained). See `STAT_WEIGHTS`.
    """
    if coef.c_clip is not None and not coef.c_clip > 1.0:
        raise ValueError(f"c_clip (dual clip) must be > 1, got {coef.c_clip}")
    raw_weight = _behaviour_weight(prox_logp, behav_logp)
    valid = _kept_mask(mask, raw_weight, coef.behav_weight_cap)
    behav_weight = raw_weight if coef.behav_weight_cap is not None else torch.ones_like(raw_weight)

    log_ratio = (logp - prox_logp.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    pg, clip_hit, dual_clipped = _clipped_surrogate(ratio, advantages.detach(), coef)
    # torch.where, not a product: whatever sits on a padding or capped token (garbage, inf) cannot leak into the loss
    # (the weight too: an inf weight on a dropped token would make its gradient 0 * inf = NaN)
    per_token = torch.where(valid, torch.where(valid, behav_weight, 0.0).to(pg.dtype) * pg, 0.0)

    if normalizer is None:
        normalizer = loss_normalizer(mask)
    normalizer = torch.as_tensor(normalizer, device=per_token.device).clamp(min=1)
    loss = per_token.sum() / normalizer

    with torch.no_grad():
        masked_in = mask.bool()
        ratio, log_ratio = ratio.detach(), log_ratio.detach()
        stats = {
            "clip_fraction": _masked_mean(clip_hit.to(loss.dtype), valid),
            "dual_clip_fraction": _masked_mean(dual_clipped.to(loss.dtype), valid),
            "importance_weight_mean": _masked_mean(ratio, valid),
            "importance_weight_max": _masked_max(ratio, valid),
            "importance_weight_min": _masked_min(ratio, valid),
            "behav_weight_mean": _masked_mean(raw_weight.to(loss.dtype), valid),
            "behav_weight_max": _masked_max(raw_weight.to(loss.dtype), valid),
            "behav_capped_fraction": _masked_mean((masked_in & ~valid).to(loss.dtype), masked_in),
            "approx_kl": _masked_mean((ratio - 1.0) - log_ratio, valid),
            "loss": loss.detach(),
            "valid_tokens": valid.sum().to(loss.dtype),
            "normalizer_tokens": masked_in.sum().to(loss.dtype),
        }
    return loss, stats
