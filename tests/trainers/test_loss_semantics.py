"""AReaL 1.0.4's loss semantics (areal/utils/functional/functional.py, ppo_actor_loss_fn, tag v1.0.4 =
37d6c6400e99a05fa3409d6a067762a44df40d3b), each on a case small enough to compute by hand, and the learner's
aggregation of statistics over micro-batches and minibatches."""

import math

import pytest
import torch

from searchgym.trainers.algorithm.learner import aggregate_stats
from searchgym.trainers.algorithm.ppo import LOG_RATIO_CLAMP, PPOCoefficients, decoupled_ppo_loss, loss_normalizer
from searchgym.trainers.config import load_config


def run(logp, prox, behav, adv, mask=None, **coefficients):
    """Loss, d loss / d logp and statistics of a one-row batch given as Python lists (PPOCoefficients' fields)."""
    logp = torch.tensor([logp], dtype=torch.float64, requires_grad=True)
    tensors = [torch.tensor([x], dtype=torch.float64) for x in (prox, behav, adv)]
    mask = torch.ones_like(logp, dtype=torch.bool) if mask is None else torch.tensor([mask], dtype=torch.bool)
    loss, stats = decoupled_ppo_loss(logp, *tensors, mask, PPOCoefficients(**coefficients))
    loss.backward()
    return loss.item(), logp.grad[0].tolist(), {k: v.item() for k, v in stats.items()}


def test_a_capped_token_is_counted_in_the_normaliser():
    # weights w = 1, 2, 8 (prox - behav = log w); cap 5 drops the third token, but the loss still divides by 3
    loss, grad, stats = run(
        [0.0] * 3, [0.0] * 3, [0.0, -math.log(2), -math.log(8)], [1.0, 1.0, 1.0], behav_weight_cap=5.0
    )
    assert loss == pytest.approx(-(1 * 1 + 2 * 1) / 3)
    assert grad == pytest.approx([-1 / 3, -2 / 3, 0.0])
    assert stats["valid_tokens"] == 2 and stats["normalizer_tokens"] == 3
    assert stats["behav_capped_fraction"] == pytest.approx(1 / 3)
    assert loss_normalizer(torch.tensor([[1, 1, 0, 1]])).item() == 3


def test_a_null_cap_means_no_behaviour_weighting():
    # the same tokens without a cap: each counts once, whatever pi_prox / pi_behav is (8 is reported, not applied)
    loss, grad, stats = run(
        [0.0] * 3, [0.0] * 3, [0.0, -math.log(2), -math.log(8)], [1.0, 1.0, 1.0], behav_weight_cap=None
    )
    assert loss == pytest.approx(-1.0) and grad == pytest.approx([-1 / 3] * 3)
    assert stats["behav_weight_max"] == pytest.approx(8.0) and stats["valid_tokens"] == 3


@pytest.mark.parametrize(
    "prox, behav",
    [
        (float("-inf"), float("-inf")),  # -inf - -inf = NaN
        (-1.0, float("-inf")),  # +inf
        (-1.0, float("nan")),
    ],
)
def test_a_non_finite_behaviour_log_ratio_gives_weight_one(prox, behav):
    # AReaL sanitises log(pi_prox / pi_behav) to 0 when it is not finite: the token is weighted 1 and kept
    loss, grad, stats = run([-1.0, -1.0], [-1.0, prox], [-1.0, behav], [2.0, 2.0], behav_weight_cap=5.0)
    assert stats["valid_tokens"] == 2
    assert stats["behav_weight_max"] == 1.0
    assert math.isfinite(loss) and all(map(math.isfinite, grad))
    # token 1 is an ordinary on-policy token (-A / 2); token 2's gradient is -A r / 2 with weight 1, r = exp(-1 - prox)
    assert grad[0] == pytest.approx(-1.0)
    if math.isfinite(prox):
        assert grad[1] == pytest.approx(-1.0)


def test_an_overflowing_behaviour_weight_is_capped_not_multiplied():
    # prox - behav = 100: w = exp(100) overflows float32 to inf; the cap drops it and nothing becomes NaN
    logp = torch.zeros(1, 2, requires_grad=True)
    loss, stats = decoupled_ppo_loss(
        logp,
        torch.zeros(1, 2),
        torch.tensor([[0.0, -100.0]]),
        torch.ones(1, 2),
        torch.ones(1, 2),
        PPOCoefficients(behav_weight_cap=5.0),
    )
    loss.backward()
    assert loss.item() == pytest.approx(-0.5) and logp.grad.tolist() == [[-0.5, 0.0]]


@pytest.mark.parametrize(
    "ratio, advantage, want_loss, want_grad, dual",
    [
        (4.0, -1.0, 3.0, 0.0, 1.0),  # A < 0, r = 4: PPO's loss |A| * 4 is capped at c_clip * |A| = 3, no gradient
        (2.0, -1.0, 2.0, 2.0, 0.0),  # below the dual bound: ordinary PPO, d/dlogp (-A r) = r
        (4.0, 1.0, -1.2, 0.0, 0.0),  # A > 0: the dual clip never binds (PPO's clip does)
    ],
)
def test_dual_clip_bounds_the_loss_of_negative_advantages(ratio, advantage, want_loss, want_grad, dual):
    loss, grad, stats = run([math.log(ratio)], [0.0], [0.0], [advantage], c_clip=3.0)
    assert loss == pytest.approx(want_loss) and grad == pytest.approx([want_grad])
    assert stats["dual_clip_fraction"] == dual


def test_without_c_clip_the_dual_bound_is_off():
    loss, grad, _ = run([math.log(4.0)], [0.0], [0.0], [-1.0])
    assert loss == pytest.approx(4.0) and grad == pytest.approx([4.0])


@pytest.mark.parametrize("c_clip", [1.0, 0.5, -2.0])
def test_a_dual_clip_at_or_below_one_is_refused(c_clip, tmp_path):
    with pytest.raises(ValueError, match="c_clip"):
        run([0.0], [0.0], [0.0], [1.0], c_clip=c_clip)
    with pytest.raises(ValueError, match="learner.c_clip"):
        load_config(overrides=[f"learner.c_clip={c_clip}"])


def test_the_current_log_ratio_clamp_is_documented_and_stops_the_gradient():
    # log r = 25 > 20 with A < 0 (the unclipped branch): the loss uses exp(20) and the token has no gradient
    loss, grad, _ = run([25.0], [0.0], [0.0], [-1.0])
    assert LOG_RATIO_CLAMP == 20.0
    assert loss == pytest.approx(math.exp(20.0)) and grad == [0.0]
    assert "[-20, 20]" in decoupled_ppo_loss.__doc__


def test_micro_batch_statistics_aggregate_as_max_sum_and_token_weighted_mean():
    parts = [
        {
            "importance_weight_max": 1.5,
            "importance_weight_min": 0.9,
            "valid_tokens": 3.0,
            "normalizer_tokens": 4.0,
            "clip_fraction": 1.0,
            "behav_capped_fraction": 0.25,
            "loss": -0.1,
        },
        {
            "importance_weight_max": 1.1,
            "importance_weight_min": 0.7,
            "valid_tokens": 1.0,
            "normalizer_tokens": 1.0,
            "clip_fraction": 0.0,
            "behav_capped_fraction": 0.0,
            "loss": -0.2,
        },
    ]
    out = aggregate_stats(parts)
    assert out["importance_weight_max"] == 1.5 and out["importance_weight_min"] == 0.7
    assert out["valid_tokens"] == 4.0 and out["normalizer_tokens"] == 5.0
    assert out["clip_fraction"] == pytest.approx(3 / 4)  # over kept tokens: 3 clipped of 4
    assert out["behav_capped_fraction"] == pytest.approx(1 / 5)  # over trained tokens: 1 capped of 5
    assert out["loss"] == pytest.approx(-0.3)  # shared normaliser: micro-batch losses add up
    assert aggregate_stats(parts, summed=())["loss"] == pytest.approx((-0.1 * 4 - 0.2 * 1) / 5)
