"""The learner's math in one file: reward refinement, returns, group advantages and AReaL's decoupled PPO loss.

Read top to bottom:
1. `refine_process_rewards` turns per-turn process rewards into ones that cannot be hacked by repetition
   (arXiv 2410.15115), and `returns_to_go` adds the verifiable outcome reward paid at the end.
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
   staleness; tokens whose behaviour weight exceeds a cap are dropped.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

LOG_RATIO_CLAMP = 20.0  # log-ratios are clamped to [-20, 20] before exp, so no ratio overflows


# ---------------------------------------------------------------------------------------------------------------
# 1. Rewards: refinement of process rewards, and per-turn returns
# ---------------------------------------------------------------------------------------------------------------

def refine_process_rewards(step_rewards: Sequence[float], *, mode: str = "clip", threshold: float = 0.0) -> list[float]:
    """Per-step process rewards refined so that repeating a rewarded step cannot raise the return (2410.15115).

    - "clip":  r_t -> min(r_t - threshold, 0). Every refined reward is <= 0, so each extra step can only lower
      the return: the sum of process rewards is bounded above by 0.
    - "delta": r_t -> r_t - r_{t+1} with r_{T+1} = 0. The sum from step t telescopes to r_t, so the return of
      the whole trajectory gets exactly one step's reward, however many steps it takes.
    - "none":  unchanged. Hackable: a policy can raise its return by repeating any positively rewarded step.
    """
    rewards = [float(r) for r in step_rewards]
    if mode == "clip":
        return [min(r - threshold, 0.0) for r in rewards]
    if mode == "delta":
        return [r - nxt for r, nxt in zip(rewards, rewards[1:] + [0.0])]
    if mode == "none":
        return rewards
    raise ValueError(f"unknown reward refinement mode {mode!r}: expected 'clip', 'delta' or 'none'")


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
    """pi_prox / pi_behav per token, a constant (no gradient), from a clamped log-ratio so it never overflows."""
    return torch.exp((prox_logp.detach() - behav_logp.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def _valid_mask(mask: Tensor, behav_weight: Tensor, behav_weight_cap: float | None) -> Tensor:
    """Trained tokens whose behaviour weight is within the cap (all trained tokens when the cap is None)."""
    valid = mask.bool()
    return valid if behav_weight_cap is None else valid & (behav_weight <= behav_weight_cap)


def valid_tokens(mask: Tensor, prox_logp: Tensor, behav_logp: Tensor, behav_weight_cap: float | None = 5.0) -> Tensor:
    """Number of tokens the loss averages over (trained and not capped), as an int64 scalar.

    Compute it once on the whole batch (or sum it over micro-batches) and pass it as `normalizer` to
    `decoupled_ppo_loss` for each micro-batch, so that the micro-batch losses add up to the full-batch loss.
    """
    return _valid_mask(mask, _behaviour_weight(prox_logp, behav_logp), behav_weight_cap).sum()


def _masked_mean(x: Tensor, where: Tensor) -> Tensor:
    """Mean of x over `where` (0 when empty)."""
    return torch.where(where, x, 0.0).sum() / where.sum().clamp(min=1)


def _masked_max(x: Tensor, where: Tensor) -> Tensor:
    """Max of x over `where` (0 when empty)."""
    return torch.where(where, x, -torch.inf).amax() if where.any() else x.new_zeros(())


def _masked_min(x: Tensor, where: Tensor) -> Tensor:
    """Min of x over `where` (0 when empty)."""
    return torch.where(where, x, torch.inf).amin() if where.any() else x.new_zeros(())


def decoupled_ppo_loss(logp: Tensor, prox_logp: Tensor, behav_logp: Tensor, advantages: Tensor, mask: Tensor, *,
                       eps_clip: float = 0.2, eps_clip_high: float | None = None, behav_weight_cap: float | None = 5.0,
                       normalizer: float | Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """AReaL's decoupled PPO loss (to minimise), a token mean over the whole batch, and detached statistics.

    All tensors share one shape (e.g. [B, T]); `mask` (bool or 0/1) marks the trained (generated) tokens.
    Only `logp` (current policy) carries gradient; `prox_logp`, `behav_logp` and `advantages` are constants.
    Per token, with r = pi_theta / pi_prox and w = pi_prox / pi_behav:
        loss_t = -w * min(r * A, clip(r, 1 - eps_clip, 1 + eps_clip_high) * A)
    `eps_clip_high` defaults to `eps_clip`; a larger one is DAPO's clip-higher. Tokens with w > behav_weight_cap
    are dropped (None: no cap). The valid tokens are mask & (w <= cap): capped tokens are NOT counted in the
    denominator. loss = sum over valid tokens / normalizer, where normalizer defaults to this call's valid
    count; micro-batching callers pass the whole batch's `valid_tokens(...)` so micro-batch losses sum to the
    full-batch loss. The normalizer is clamped to >= 1: with no valid tokens the loss is 0 and still has a
    (zero) gradient. Log-ratios are clamped to [-20, 20] before exp (no gradient flows beyond that range).

    Statistics are over this call's valid tokens (behav_capped_fraction: over its masked-in tokens):
    clip_fraction, importance_weight_{mean,max,min} (r), behav_weight_{mean,max}, behav_capped_fraction,
    approx_kl (k3 estimator of KL(prox || current): mean((r - 1) - log r)), loss, valid_tokens.
    """
    eps_high = eps_clip if eps_clip_high is None else eps_clip_high
    behav_weight = _behaviour_weight(prox_logp, behav_logp)
    valid = _valid_mask(mask, behav_weight, behav_weight_cap)

    log_ratio = (logp - prox_logp.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    advantages = advantages.detach()
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - eps_clip, 1.0 + eps_high) * advantages
    per_token = -behav_weight * torch.minimum(unclipped, clipped)

    if normalizer is None:
        normalizer = valid.sum()
    normalizer = torch.as_tensor(normalizer, device=per_token.device).clamp(min=1)
    # torch.where, not a product: whatever sits on a padding token (garbage, inf) cannot leak into the loss
    loss = torch.where(valid, per_token, 0.0).sum() / normalizer

    with torch.no_grad():
        masked_in = mask.bool()
        ratio, log_ratio = ratio.detach(), log_ratio.detach()
        stats = {
            "clip_fraction": _masked_mean((clipped < unclipped).to(loss.dtype), valid),
            "importance_weight_mean": _masked_mean(ratio, valid),
            "importance_weight_max": _masked_max(ratio, valid),
            "importance_weight_min": _masked_min(ratio, valid),
            "behav_weight_mean": _masked_mean(behav_weight, valid),
            "behav_weight_max": _masked_max(behav_weight, valid),
            "behav_capped_fraction": _masked_mean((masked_in & ~valid).to(loss.dtype), masked_in),
            "approx_kl": _masked_mean((ratio - 1.0) - log_ratio, valid),
            "loss": loss.detach(),
            "valid_tokens": valid.sum().float(),
        }
    return loss, stats
