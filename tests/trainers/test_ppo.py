"""The learner's math against obviously-correct references: the decoupled PPO loss, advantages, returns, logprobs."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from searchgym.envs.rewards import refine_process_rewards
from searchgym.trainers.algorithm.ppo import (
    PPOCoefficients,
    decoupled_ppo_loss,
    entropy_from_logits,
    group_advantages,
    loss_normalizer,
    returns_to_go,
    token_logprobs,
    valid_tokens,
)

# ---------------------------------------------------------------------------------------------------------------
# A direct per-token reference of the decoupled PPO loss, and random batches to compare it on
# ---------------------------------------------------------------------------------------------------------------


def reference_loss(logp, prox, behav, adv, mask, eps, eps_high, cap):
    """Loss, d loss / d logp and statistics, one token at a time in Python floats, straight from the formula."""
    rows, cols = len(logp), len(logp[0])
    total, valid, clipped, capped, masked_in, kl = 0.0, 0, 0, 0, 0, 0.0
    grad = [[0.0] * cols for _ in range(rows)]
    ratios, weights = [], []
    for i in range(rows):
        for j in range(cols):
            if not mask[i][j]:
                continue
            masked_in += 1
            w = math.exp(prox[i][j] - behav[i][j])  # reported always; weighs the loss only under a cap (AReaL 1.0.4)
            if cap is not None and w > cap:
                capped += 1
                continue
            r = math.exp(logp[i][j] - prox[i][j])
            a = adv[i][j]
            unclipped, clipped_term = r * a, min(max(r, 1 - eps), 1 + eps_high) * a
            weight = 1.0 if cap is None else w
            if clipped_term < unclipped:  # the clipped branch is the min: constant in logp
                clipped += 1
                total += -weight * clipped_term
            else:
                total += -weight * unclipped
                grad[i][j] = -weight * r * a  # d(r)/d(logp) = r
            valid += 1
            kl += (r - 1) - math.log(r)
            ratios.append(r)
            weights.append(w)
    n, d = max(valid, 1), max(masked_in, 1)  # statistics over kept tokens; the loss over all trained ones
    stats = {
        "clip_fraction": clipped / n,
        "approx_kl": kl / n,
        "valid_tokens": valid,
        "normalizer_tokens": masked_in,
        "dual_clip_fraction": 0.0,
        "importance_weight_mean": sum(ratios) / n,
        "importance_weight_max": max(ratios, default=0.0),
        "importance_weight_min": min(ratios, default=0.0),
        "behav_weight_mean": sum(weights) / n,
        "behav_weight_max": max(weights, default=0.0),
        "behav_capped_fraction": capped / max(masked_in, 1),
        "loss": total / d,
    }
    return total / d, [[g / d for g in row] for row in grad], stats


def random_batch(seed, rows, cols, *, ratio_scale=0.5, staleness_scale=1.0, float_mask=False):
    """float64 logp/prox/behav/advantages and a mask of unequal lengths with holes (tool outputs), garbage outside
    it."""
    gen = torch.Generator().manual_seed(seed)
    prox = -torch.rand(rows, cols, generator=gen, dtype=torch.float64) * 5
    logp = prox + torch.randn(rows, cols, generator=gen, dtype=torch.float64) * ratio_scale
    behav = prox - torch.randn(rows, cols, generator=gen, dtype=torch.float64) * staleness_scale
    adv = torch.randn(rows, cols, generator=gen, dtype=torch.float64) * 2
    lengths = torch.randint(0, cols + 1, (rows, 1), generator=gen)
    mask = (torch.arange(cols) < lengths) & (torch.rand(rows, cols, generator=gen) < 0.85)
    logp = torch.where(mask, logp, torch.tensor(1e4, dtype=torch.float64))  # padding must not leak into anything
    return logp, prox, behav, adv, (mask.double() if float_mask else mask)


batches = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 2**31 - 1),
        "rows": st.integers(1, 5),
        "cols": st.integers(1, 12),
        "ratio_scale": st.sampled_from([0.05, 0.3, 1.0]),
        "float_mask": st.booleans(),
    }
)
clips = st.tuples(
    st.floats(0.05, 0.5), st.one_of(st.none(), st.floats(0.0, 0.5)), st.sampled_from([None, 1.2, 2.0, 5.0])
)


@given(batches, clips)
@settings(max_examples=150, deadline=None)
def test_loss_gradient_and_stats_match_a_per_token_loop(batch, clip):
    eps, extra_high, cap = clip
    eps_high = None if extra_high is None else eps + extra_high  # clip-higher: eps_high >= eps
    logp, prox, behav, adv, mask = random_batch(**batch)
    logp.requires_grad_(True)
    loss, stats = decoupled_ppo_loss(
        logp, prox, behav, adv, mask, PPOCoefficients(eps_clip=eps, eps_clip_high=eps_high, behav_weight_cap=cap)
    )
    loss.backward()
    want, want_grad, want_stats = reference_loss(
        logp.tolist(),
        prox.tolist(),
        behav.tolist(),
        adv.tolist(),
        mask.bool().tolist(),
        eps,
        eps if eps_high is None else eps_high,
        cap,
    )
    assert loss.item() == pytest.approx(want, rel=1e-9, abs=1e-12)
    torch.testing.assert_close(logp.grad, torch.tensor(want_grad, dtype=torch.float64), rtol=1e-9, atol=1e-12)
    assert set(stats) == set(want_stats)
    for key, value in want_stats.items():
        assert not stats[key].requires_grad
        assert stats[key].item() == pytest.approx(value, rel=1e-9, abs=1e-12), key


def one_token_loss(log_ratio, advantage, *, eps=0.2, eps_high=None, log_behav_weight=0.0):
    """Loss and d loss / d logp of a single valid token."""
    logp = torch.tensor([[log_ratio]], dtype=torch.float64, requires_grad=True)
    zero = torch.zeros(1, 1, dtype=torch.float64)
    loss, stats = decoupled_ppo_loss(
        logp,
        zero,
        zero - log_behav_weight,
        torch.tensor([[advantage]], dtype=torch.float64),
        torch.ones(1, 1, dtype=torch.bool),
        PPOCoefficients(eps_clip=eps, eps_clip_high=eps_high),
    )
    loss.backward()
    return loss.item(), logp.grad.item(), stats


@pytest.mark.parametrize(
    "ratio, advantage, clipped",
    [
        (1.5, 1.0, True),  # A > 0, r above 1 + eps: no incentive to push r higher
        (0.5, -1.0, True),  # A < 0, r below 1 - eps: no incentive to push r lower
        (0.5, 1.0, False),  # A > 0, r low: the pessimistic min keeps the unclipped term, gradient pulls r up
        (1.5, -1.0, False),  # A < 0, r high: unclipped, gradient pulls r down
        (1.1, 1.0, False),  # inside the trust region
    ],
)
def test_clipping_on_both_sides(ratio, advantage, clipped):
    loss, grad, stats = one_token_loss(math.log(ratio), advantage)
    bound = min(max(ratio, 0.8), 1.2)
    assert loss == pytest.approx(-(bound if clipped else ratio) * advantage)
    assert grad == pytest.approx(0.0 if clipped else -ratio * advantage)
    assert stats["clip_fraction"].item() == float(clipped)


def test_clip_higher_widens_only_the_upper_side():
    loss, grad, _ = one_token_loss(math.log(1.25), 1.0, eps=0.2)
    assert grad == 0.0 and loss == pytest.approx(-1.2)
    loss, grad, _ = one_token_loss(math.log(1.25), 1.0, eps=0.2, eps_high=0.28)
    assert grad == pytest.approx(-1.25) and loss == pytest.approx(-1.25)
    loss, grad, _ = one_token_loss(math.log(0.75), -1.0, eps=0.2, eps_high=0.28)  # lower side still at 1 - eps
    assert grad == 0.0 and loss == pytest.approx(0.8)


def test_behaviour_weight_scales_the_token_and_is_a_constant():
    loss, grad, stats = one_token_loss(0.0, 1.0, log_behav_weight=math.log(3.0))
    assert loss == pytest.approx(-3.0) and grad == pytest.approx(-3.0)
    assert stats["behav_weight_mean"].item() == pytest.approx(3.0)


def test_capped_tokens_leave_the_numerator_but_stay_in_the_denominator():
    logp = torch.zeros(1, 3, requires_grad=True)
    prox = torch.zeros(1, 3)
    behav = torch.tensor([[0.0, 0.0, -math.log(6.0)]])  # third token: behaviour weight 6 > cap 5
    adv = torch.tensor([[1.0, 3.0, 100.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss, stats = decoupled_ppo_loss(logp, prox, behav, adv, mask, PPOCoefficients(behav_weight_cap=5.0))
    assert loss.item() == pytest.approx(-4.0 / 3)  # -A summed over the two kept tokens, over all three (AReaL 1.0.4)
    assert stats["valid_tokens"].item() == 2 and valid_tokens(mask, prox, behav, 5.0).item() == 2
    assert stats["behav_capped_fraction"].item() == pytest.approx(1 / 3)
    loss.backward()
    assert logp.grad[0, 2].item() == 0.0
    unweighted, _ = decoupled_ppo_loss(logp, prox, behav, adv, mask, PPOCoefficients(behav_weight_cap=None))
    assert unweighted.item() == pytest.approx(-(1 + 3 + 100) / 3)  # no cap: no behaviour weighting at all


def test_token_mean_over_the_whole_batch_weighs_every_token_equally():
    """A row of 1 token and a row of 3: the loss is the mean over the 4 tokens, not the mean of row means."""
    logp = torch.zeros(2, 3, requires_grad=True)
    adv = torch.tensor([[4.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]], dtype=torch.float32)
    loss, _ = decoupled_ppo_loss(logp, logp.detach(), logp.detach(), adv, mask)
    assert loss.item() == pytest.approx(-(4 + 1 + 1 + 1) / 4)


# ---------------------------------------------------------------------------------------------------------------
# Micro-batches, gradcheck, the on-policy limit, degenerate batches
# ---------------------------------------------------------------------------------------------------------------


@given(batches, st.integers(1, 5), st.sampled_from([None, 2.0]))
@settings(max_examples=60, deadline=None)
def test_micro_batches_with_the_whole_batch_normalizer_reproduce_the_full_batch(batch, chunks, cap):
    logp, prox, behav, adv, mask = random_batch(**batch)
    full_logp = logp.clone().requires_grad_(True)
    full, _ = decoupled_ppo_loss(full_logp, prox, behav, adv, mask, PPOCoefficients(behav_weight_cap=cap))
    full.backward()

    normalizer = loss_normalizer(mask)
    micro_logp = logp.clone().requires_grad_(True)
    total = 0.0
    for rows in torch.arange(logp.shape[0]).tensor_split(chunks):
        used = mask[rows].bool().any(0).nonzero()
        width = int(used.max()) + 1 if len(used) else 1
        part = [
            x[rows, :width] for x in (micro_logp, prox, behav, adv, mask)
        ]  # trimmed padding, as in dynamic batching
        loss, _ = decoupled_ppo_loss(*part, PPOCoefficients(behav_weight_cap=cap), normalizer=normalizer)
        loss.backward()
        total += loss.item()
    assert total == pytest.approx(full.item(), rel=1e-12, abs=1e-12)
    torch.testing.assert_close(micro_logp.grad, full_logp.grad, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("eps_high", [None, 0.3])
def test_gradcheck_away_from_the_clip_kinks(eps_high):
    gen = torch.Generator().manual_seed(0)
    # log-ratios drawn from points well inside or well outside [log 0.8, log 1.2 or 1.3]
    points = torch.tensor([-0.6, -0.4, -0.1, 0.0, 0.1, 0.4, 0.7], dtype=torch.float64)
    log_ratio = points[torch.randint(0, len(points), (3, 6), generator=gen)]
    prox = -torch.rand(3, 6, generator=gen, dtype=torch.float64)
    behav = prox - 0.5 * torch.randn(3, 6, generator=gen, dtype=torch.float64)
    adv = torch.randn(3, 6, generator=gen, dtype=torch.float64)
    mask = torch.rand(3, 6, generator=gen) < 0.7
    logp = (prox + log_ratio).requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda lp: decoupled_ppo_loss(
            lp, prox, behav, adv, mask, PPOCoefficients(eps_clip_high=eps_high, behav_weight_cap=1.5)
        )[0],
        (logp,),
    )


def test_on_policy_limit_is_the_policy_gradient():
    """logp == prox == behav: loss = -mean(A) over valid tokens, gradient = -A * d logp / token count (REINFORCE)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 7).double()
    features = torch.randn(3, 5, 4, dtype=torch.float64)
    labels = torch.randint(0, 7, (3, 5))
    adv = torch.randn(3, 5, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)

    logp = token_logprobs(model(features), labels).double()
    loss, stats = decoupled_ppo_loss(logp, logp.detach(), logp.detach(), adv, mask)
    assert loss.item() == pytest.approx(-adv[mask].mean().item())
    assert stats["clip_fraction"].item() == 0 and stats["approx_kl"].item() == 0
    assert stats["importance_weight_mean"].item() == 1 and stats["behav_weight_max"].item() == 1
    got = torch.autograd.grad(loss, list(model.parameters()))

    logp = token_logprobs(model(features), labels).double()
    want = torch.autograd.grad(-(adv * logp)[mask].sum() / mask.sum(), list(model.parameters()))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("mask", [torch.zeros(2, 3, dtype=torch.bool), torch.ones(2, 3, dtype=torch.bool)])
def test_no_valid_tokens_gives_zero_loss_with_a_gradient_and_no_nan(mask):
    logp = torch.zeros(2, 3, requires_grad=True)
    behav = torch.full((2, 3), -50.0)  # every weight exp(50) is capped (and would overflow float32 unclamped)
    loss, stats = decoupled_ppo_loss(logp, torch.zeros(2, 3), behav, torch.ones(2, 3), mask)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logp.grad, torch.zeros(2, 3))
    assert all(torch.isfinite(v) for v in stats.values())
    assert stats["valid_tokens"].item() == 0


def test_extreme_and_infinite_log_ratios_stay_finite():
    logp = torch.tensor([[80.0, -80.0, float("-inf"), 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 1]], dtype=torch.bool)
    loss, stats = decoupled_ppo_loss(
        logp,
        torch.zeros(1, 4),
        torch.tensor([[0.0, 0.0, 0.0, 90.0]]),
        torch.tensor([[-1.0, 1.0, 1.0, 1.0]]),
        mask,
        PPOCoefficients(behav_weight_cap=None),
    )
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert all(torch.isfinite(v) for v in stats.values())


# ---------------------------------------------------------------------------------------------------------------
# Group advantages
# ---------------------------------------------------------------------------------------------------------------

groups = st.integers(1, 6).flatmap(
    lambda size: st.lists(
        st.one_of(
            st.lists(st.floats(-5, 5), min_size=size, max_size=size), st.floats(-5, 5).map(lambda v: [v] * size)
        ),  # some groups without spread
        min_size=1,
        max_size=5,
    )
)


@given(groups, st.booleans())
@settings(max_examples=200, deadline=None)
def test_group_advantages_are_centred_per_group_and_flag_groups_without_spread(rows, std_normalize):
    returns = torch.tensor(rows, dtype=torch.float64)
    advantages, keep = group_advantages(returns, std_normalize=std_normalize)
    assert advantages.shape == returns.shape and keep.shape == (returns.shape[0],) and keep.dtype == torch.bool
    torch.testing.assert_close(advantages.mean(1), torch.zeros(len(rows), dtype=advantages.dtype), atol=1e-5, rtol=0)
    spread = returns.amax(1) - returns.amin(1)
    assert torch.equal(keep, spread > 1e-6)
    assert torch.all(advantages[~keep] == 0), "a group without spread must carry exactly no signal"
    if not std_normalize:
        torch.testing.assert_close(advantages[keep], (returns - returns.mean(1, keepdim=True))[keep])
    for row, adv in zip(returns[spread > 1e-3], advantages[spread > 1e-3], strict=True):
        std = row.std(correction=0).item()
        assert adv.std(correction=0).item() == pytest.approx(std / (std + 1e-6) if std_normalize else std, rel=1e-4)


def test_group_advantages_by_hand():
    advantages, keep = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]]), std_normalize=True)
    torch.testing.assert_close(advantages, torch.tensor([[1.0, -1.0, -1.0, 1.0], [0.0] * 4]), atol=1e-5, rtol=0)
    assert keep.tolist() == [True, False]
    advantages, _ = group_advantages(torch.tensor([[0, 1], [1, 1]]))  # integer rewards work too
    assert advantages.tolist() == [[-0.5, 0.5], [0.0, 0.0]]


# ---------------------------------------------------------------------------------------------------------------
# Rewards: refinement and returns
# ---------------------------------------------------------------------------------------------------------------


def test_returns_to_go_by_hand():
    assert returns_to_go(1.0, [0.0, 0.0, 0.0]) == [1.0, 1.0, 1.0]
    assert returns_to_go(1.0, [0.5, -0.25, 0.0]) == [1.25, 0.75, 1.0]
    assert returns_to_go(0.3, [0.0]) == [0.3]


def test_refinement_by_hand():
    assert refine_process_rewards([0.5, 1.0, -0.2], mode="clip", threshold=0.6) == pytest.approx([-0.1, 0.0, -0.8])
    assert refine_process_rewards([0.5, 1.0, -0.2], mode="delta") == pytest.approx([-0.5, 1.2, -0.2])
    assert refine_process_rewards([0.5, 1.0], mode="none") == [0.5, 1.0]
    assert refine_process_rewards([], mode="delta") == []
    with pytest.raises(ValueError, match="unknown"):
        refine_process_rewards([1.0], mode="clamp")


step_rewards = st.lists(st.floats(-1, 1), max_size=5)


@given(
    prefix=step_rewards,
    suffix=step_rewards,
    reward=st.floats(0.01, 1),
    repeats=st.integers(2, 50),
    threshold=st.floats(0, 1),
    outcome=st.floats(0, 1),
)
@settings(max_examples=200, deadline=None)
def test_repeating_a_rewarded_search_cannot_raise_the_return(prefix, suffix, reward, repeats, threshold, outcome):
    """The hack refinement exists for: unrefined, N repeats of a rewarded search pay N times; refined, they never pay
    more."""
    once, many = prefix + [reward] + suffix, prefix + [reward] * repeats + suffix

    def ret(steps, mode):
        return returns_to_go(outcome, refine_process_rewards(steps, mode=mode, threshold=threshold))[0]

    assert ret(many, "clip") <= ret(once, "clip") + 1e-9
    assert ret(many, "delta") <= ret(once, "delta") + 1e-9
    assert ret(many, "none") == pytest.approx(ret(once, "none") + (repeats - 1) * reward)
    assert ret(many, "none") > ret(once, "none")


@given(step_rewards.filter(bool), st.floats(-1, 1), st.floats(0, 1))
def test_clip_bounds_and_delta_telescopes(steps, outcome, threshold):
    assert sum(refine_process_rewards(steps, mode="clip", threshold=threshold)) <= 0
    delta = refine_process_rewards(steps, mode="delta")
    assert sum(delta) == pytest.approx(steps[0])
    assert returns_to_go(outcome, delta) == pytest.approx([r + outcome for r in steps])  # G_t = r_t + outcome
    assert len(returns_to_go(outcome, delta)) == len(steps)


# ---------------------------------------------------------------------------------------------------------------
# Log-probabilities and entropy
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_logprobs_match_a_manual_log_softmax_gather(temperature, dtype):
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(2, 5, 11, generator=gen) * 4).to(dtype)
    labels = torch.randint(0, 11, (2, 5), generator=gen)
    got = token_logprobs(logits, labels, temperature)
    assert got.dtype == torch.float32 and got.shape == labels.shape
    scaled = logits.double() / temperature
    for i in range(2):
        for t in range(5):
            row = scaled[i, t]
            want = row[labels[i, t]] - math.log(sum(math.exp(x) for x in row.tolist()))
            assert got[i, t].item() == pytest.approx(want.item(), abs=1e-5)


def test_entropy_from_logits():
    assert entropy_from_logits(torch.zeros(3, 8)).tolist() == pytest.approx([math.log(8)] * 3)
    logits = torch.randn(4, 6, dtype=torch.bfloat16)
    probs = torch.softmax(logits.double() / 0.5, -1)
    got = entropy_from_logits(logits, 0.5)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), -(probs * probs.log()).sum(-1), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        token_logprobs(logits, torch.zeros(4, dtype=torch.long), 0.0)
