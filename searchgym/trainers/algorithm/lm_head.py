"""Log-probs and entropies of chosen tokens straight from hidden states, a chunk of positions at a time.

    logp, entropy = chunked_logprobs(hidden, lm_head.weight, labels, temperature, chunk_tokens=512)

The quantity is the engines' (log softmax(logits / temperature) at the label, in fp32), but the [tokens, vocab]
logits never exist whole, in the forward pass or the backward pass: each chunk's logits are made, reduced to a
log-probability, an entropy and a log-sum-exp, and dropped; the backward pass makes them again per chunk and turns
them straight into the chunk's gradients (d logits = g * (onehot - softmax) / temperature). With Qwen's 151,936
vocabulary a trained token's logits and their fp32 copies take ~2.1 MB, so a 32k-token trajectory's loss head
would need ~70 GB at once; chunked it needs `chunk_tokens` positions' worth, whatever the length.

The cost is one more [chunk, hidden] x [hidden, vocab] product per chunk in the backward pass (the logits are
recomputed rather than kept): ~1/3 more loss-head FLOPs, a small share of a step next to the decoder layers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

DEFAULT_CHUNK_TOKENS = 512  # ~300 MB of fp32 logits at a time with a 151,936 vocabulary


def _chunk_logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: float) -> Tensor:
    """fp32 logits / temperature of one chunk, computed in the weights' dtype as the model's own head does (a fresh
    tensor: callers may change it in place)."""
    logits = hidden @ weight.t()
    if bias is not None:
        logits += bias
    logits = logits.float()  # a copy only for a low-precision head; the in-place ops below keep one fp32 buffer
    return logits.div_(temperature) if temperature != 1.0 else logits


class _ChunkedLogprobs(torch.autograd.Function):
    """Autograd for `chunked_logprobs`: saves hidden states, weights and the per-token log-sum-exp, not logits."""

    @staticmethod
    def forward(
        ctx: Any, hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor, temperature: float, chunk: int
    ) -> tuple[Tensor, Tensor]:
        n = hidden.shape[0]
        logp = hidden.new_empty(n, dtype=torch.float32)
        entropy = hidden.new_empty(n, dtype=torch.float32)
        lse = hidden.new_empty(n, dtype=torch.float32)
        for start in range(0, n, chunk):
            part = slice(start, start + chunk)
            logits = _chunk_logits(hidden[part], weight, bias, temperature)
            lse[part] = torch.logsumexp(logits, dim=-1)
            logits -= lse[part].unsqueeze(-1)  # now log-probs: entropy from them, not lse - E[logits], which cancels
            logp[part] = logits.gather(-1, labels[part].unsqueeze(-1)).squeeze(-1)
            probs = torch.exp(logits)
            entropy[part] = -torch.einsum("nv,nv->n", probs, logits)  # a row-wise dot: no third [chunk, vocab] buffer
            del logits, probs
        ctx.save_for_backward(hidden, weight, bias, labels, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, grad_logp: Tensor, _grad_entropy: Tensor | None) -> tuple[Tensor | None, ...]:
        hidden, weight, bias, labels, lse = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        # one chunk: the head's gradients in its own dtype, as autograd's matmul makes them; several: summed in fp32,
        # so a bf16 head does not round once per chunk
        single = hidden.shape[0] <= ctx.chunk
        grad_hidden = torch.zeros_like(hidden) if need_hidden else None
        grad_weight = grad_bias = None
        if not single:
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
            grad_bias = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_bias else None
        for start in range(0, hidden.shape[0], ctx.chunk):
            part = slice(start, start + ctx.chunk)
            g = grad_logp[part].float()
            if not bool(g.any()):
                continue  # untrained or zero-gradient positions contribute nothing
            logits = _chunk_logits(hidden[part], weight, bias, ctx.temperature)
            # d logp / d logits = onehot(label) - softmax, then through the / temperature
            dlogits = logits.sub_(lse[part].unsqueeze(-1)).exp_().mul_(-g.unsqueeze(-1))  # in place: one buffer
            dlogits.scatter_add_(-1, labels[part].unsqueeze(-1), g.unsqueeze(-1))
            if ctx.temperature != 1.0:
                dlogits.div_(ctx.temperature)
            if grad_hidden is not None:
                grad_hidden[part] = (dlogits.to(weight.dtype) @ weight).to(hidden.dtype)
            if need_weight and single:
                grad_weight = dlogits.to(weight.dtype).t() @ hidden[part].to(weight.dtype)
            elif need_weight and grad_weight is not None:  # several chunks: summed into the fp32 buffer
                grad_weight.addmm_(dlogits.t(), hidden[part].float())
            if need_bias and single:
                grad_bias = dlogits.sum(0).to(bias.dtype)
            elif need_bias and grad_bias is not None:
                grad_bias += dlogits.sum(0)
        if need_weight and grad_weight is None:  # every upstream gradient was zero
            grad_weight = torch.zeros_like(weight)
        if need_bias and grad_bias is None:
            grad_bias = torch.zeros_like(bias)
        return (
            grad_hidden,
            None if grad_weight is None else grad_weight.to(weight.dtype),
            None if grad_bias is None else grad_bias.to(bias.dtype),
            None,
            None,
            None,
        )


def chunked_logprobs(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    temperature: float = 1.0,
    *,
    bias: Tensor | None = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> tuple[Tensor, Tensor]:
    """fp32 log softmax(hidden @ weight.T + bias) / temperature) at `labels`, and the distribution's entropy.

    `hidden` [N, H] (the last hidden states at the N scored positions), `weight` [V, H] (the LM head), `labels` [N].
    Gradients flow to `hidden`, `weight` and `bias` through the log-probs; the entropy is a statistic (no gradient).
    Memory beyond the inputs: O(chunk_tokens * V), never O(N * V).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1, got {chunk_tokens}")
    if hidden.dim() != 2 or labels.shape != hidden.shape[:1] or weight.dim() != 2 or weight.shape[1] != hidden.shape[1]:
        raise ValueError(
            f"expected hidden [N, H], weight [V, H], labels [N]; got {tuple(hidden.shape)}, "
            f"{tuple(weight.shape)}, {tuple(labels.shape)}"
        )
    return _ChunkedLogprobs.apply(hidden, weight, bias, labels.long(), float(temperature), int(chunk_tokens))
