"""The chunked LM head equals the whole-logits computation it replaces, in values and in gradients."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from searchgym.trainers.algorithm.lm_head import chunked_logprobs
from searchgym.trainers.algorithm.ppo import entropy_from_logits, token_logprobs


def _reference(hidden, weight, bias, labels, temperature):
    """Today's path: whole logits, then fp32 log-softmax and entropy."""
    logits = hidden @ weight.t() + (bias if bias is not None else 0)
    return token_logprobs(logits, labels, temperature), entropy_from_logits(logits.detach(), temperature)


def _inputs(seed, n, hidden_size, vocab, with_bias, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(n, hidden_size, generator=gen) * 2).to(dtype).requires_grad_()
    weight = torch.randn(vocab, hidden_size, generator=gen).to(dtype).requires_grad_()
    bias = torch.randn(vocab, generator=gen).to(dtype).requires_grad_() if with_bias else None
    labels = torch.randint(0, vocab, (n,), generator=gen)
    upstream = torch.randn(n, generator=gen) * (torch.rand(n, generator=gen) > 0.3)  # some positions untrained
    return hidden, weight, bias, labels, upstream


def _grads(logp, upstream, *tensors):
    return torch.autograd.grad((logp * upstream).sum(), [t for t in tensors if t is not None])


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    n=st.integers(1, 70),
    hidden_size=st.integers(1, 24),
    vocab=st.integers(2, 300),
    chunk=st.integers(1, 80),
    temperature=st.sampled_from([0.3, 0.7, 1.0, 1.6]),
    with_bias=st.booleans(),
)
def test_chunked_logprobs_equal_whole_logits_in_values_and_gradients(
    seed, n, hidden_size, vocab, chunk, temperature, with_bias
):
    hidden, weight, bias, labels, upstream = _inputs(seed, n, hidden_size, vocab, with_bias)
    logp, entropy = chunked_logprobs(hidden, weight, labels, temperature, bias=bias, chunk_tokens=chunk)
    ref_logp, ref_entropy = _reference(hidden, weight, bias, labels, temperature)
    assert logp.dtype == torch.float32 and logp.shape == (n,)
    torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-5, rtol=1e-5)
    for got, want in zip(
        _grads(logp, upstream, hidden, weight, bias), _grads(ref_logp, upstream, hidden, weight, bias), strict=True
    ):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_float64_agrees_to_1e_12_so_the_math_is_exact_not_approximately_right():
    hidden, weight, bias, labels, upstream = _inputs(3, 33, 8, 97, True, torch.float64)
    logp, _ = chunked_logprobs(hidden, weight, labels, 0.8, bias=bias, chunk_tokens=5)
    logits = (hidden @ weight.t() + bias) / 0.8
    ref = torch.log_softmax(logits, -1).gather(-1, labels[:, None]).squeeze(-1)
    # the chunked head computes in fp32; compare with fp64 reference loosely, and gradients by gradcheck in fp64
    torch.testing.assert_close(logp.double(), ref, atol=1e-5, rtol=0)
    small = [t.detach()[:4, :3].clone().requires_grad_() for t in (hidden,)] + [
        weight.detach()[:6, :3].clone().requires_grad_()
    ]
    assert torch.autograd.gradcheck(
        lambda h, w: chunked_logprobs(h, w, labels[:4] % 6, 0.8, chunk_tokens=3)[0],
        small,
        eps=1e-3,
        atol=1e-2,
        rtol=1e-2,
    )


def test_tied_weights_get_both_gradients_and_bf16_stays_within_bf16_rounding():
    hidden, weight, _, labels, upstream = _inputs(5, 40, 16, 64, False, torch.bfloat16)
    logp, _ = chunked_logprobs(hidden, weight, labels, chunk_tokens=7)
    ref_logp, _ = _reference(hidden, weight, None, labels, 1.0)
    torch.testing.assert_close(logp, ref_logp, atol=2e-2, rtol=0)
    got = _grads(logp, upstream, hidden, weight)
    want = _grads(ref_logp, upstream, hidden, weight)
    assert got[0].dtype == torch.bfloat16 and got[1].dtype == torch.bfloat16
    for g, w in zip(got, want, strict=True):
        assert float((g.float() - w.float()).abs().max()) <= 0.05 * float(w.float().abs().max()) + 1e-2


def test_untrained_positions_get_exactly_zero_gradient():
    hidden, weight, _, labels, _ = _inputs(1, 12, 4, 10, False)
    upstream = torch.zeros(12)
    upstream[3] = 1.0
    (grad_hidden,) = torch.autograd.grad(
        (chunked_logprobs(hidden, weight, labels, chunk_tokens=4)[0] * upstream).sum(), [hidden]
    )
    assert grad_hidden[3].abs().sum() > 0
    assert torch.count_nonzero(grad_hidden[torch.arange(12) != 3]) == 0


@pytest.mark.parametrize("bad", [dict(temperature=0.0), dict(chunk_tokens=0)])
def test_bad_settings_are_refused_by_name(bad):
    hidden, weight, _, labels, _ = _inputs(0, 3, 4, 5, False)
    kwargs = {"temperature": 1.0, "chunk_tokens": 2, **bad}
    with pytest.raises(ValueError, match=next(iter(bad))):
        chunked_logprobs(hidden, weight, labels, kwargs.pop("temperature"), **kwargs)


def test_mismatched_shapes_are_refused():
    with pytest.raises(ValueError, match="expected hidden"):
        chunked_logprobs(torch.zeros(3, 4), torch.zeros(5, 3), torch.zeros(3, dtype=torch.long))


def test_memory_of_the_backward_pass_does_not_hold_whole_logits():
    """What autograd keeps after the forward pass: hidden states, weights and one float per token, no [N, V]."""
    n, hidden_size, vocab = 512, 8, 4096
    hidden, weight, _, labels, _ = _inputs(2, n, hidden_size, vocab, False)
    saved: list[int] = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        chunked_logprobs(hidden, weight, labels, chunk_tokens=64)
    assert max(saved) < n * vocab / 8  # nothing near the whole logits' n x vocab elements
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _reference(hidden, weight, None, labels, 1.0)
    assert max(saved) >= n * vocab  # while the whole-logits path keeps them
