"""Dual-clip, log-ratio clamping, k2, truncated importance sampling, KL in the reward, the
adaptive KL controller and coefficient schedules: hand-computed values."""

import math

import pytest
import torch

from turnrl.algorithms import AGGREGATIONS, KL_ESTIMATORS, collate, ppo_clip_loss
from turnrl.algorithms.losses.importance import logprob_mismatch, truncated_is_weights
from turnrl.algorithms.kl_control import KLController, kl_penalized
from turnrl.algorithms.schedules import SCHEDULES
from tests.algorithms.test_credit_estimators import traj

ONE = torch.ones(1, 1)


def loss_of(ratio, adv, **kw):
    lp = torch.tensor([[math.log(ratio)]])
    return float(ppo_clip_loss(lp, torch.zeros(1, 1), torch.tensor([[adv]]), ONE, **kw)[0])


def test_dual_clip_caps_negative_advantage_losses_only():
    # A = -1, r = 5: max(-A r, -A clip(r)) = max(5, 1.2) = 5; dual-clip c = 3 caps it at -A c = 3
    assert loss_of(5.0, -1.0) == pytest.approx(5.0)
    assert loss_of(5.0, -1.0, dual_clip=3.0) == pytest.approx(3.0)
    # A = +1, r = 5: max(-5, -1.2) = -1.2, dual-clip does not apply
    assert loss_of(5.0, 1.0, dual_clip=3.0) == pytest.approx(-1.2)
    # A = -1, r = 2: 2 < 3, untouched
    assert loss_of(2.0, -1.0, dual_clip=3.0) == pytest.approx(2.0)
    lp = torch.tensor([[math.log(5.0), 0.0]])
    _, stats = ppo_clip_loss(lp, torch.zeros(1, 2), torch.tensor([[-1.0, -1.0]]), torch.ones(1, 2) / 2, dual_clip=3.0)
    assert float(stats["dual_clipped"]) == 1 and float(stats["ratio_max"]) == pytest.approx(5.0)
    assert float(stats["ratio_min"]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="dual_clip"):
        loss_of(1.0, 1.0, dual_clip=0.5)


def test_log_ratio_is_clamped():
    lp = torch.tensor([[50.0]])
    _, stats = ppo_clip_loss(lp, torch.zeros(1, 1), ONE, ONE, log_ratio_clip=1.0)
    assert float(stats["ratio"]) == pytest.approx(math.e)


def test_k2_is_half_the_squared_log_ratio():
    lp, ref = torch.tensor([0.0, -1.0]), torch.tensor([-2.0, -1.0])
    assert KL_ESTIMATORS["k2"](lp, ref).tolist() == pytest.approx([2.0, 0.0])


def test_truncated_importance_weights_token_and_sequence():
    learner = torch.tensor([[math.log(0.5), math.log(3.0), 0.0]])
    sampler = torch.zeros(1, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    # token: ratios 0.5 and 3 -> cap 2 -> [0.5, 2]; sequence: 0.5 * 3 = 1.5 on both tokens
    assert truncated_is_weights(learner, sampler, mask, "token", 2.0)[0].tolist() == pytest.approx([0.5, 2.0, 0.0])
    assert truncated_is_weights(learner, sampler, mask, "sequence", 2.0)[0].tolist() == pytest.approx([1.5, 1.5, 0.0])
    assert truncated_is_weights(learner, sampler, mask, "none").tolist() == [[1.0, 1.0, 0.0]]
    with pytest.raises(ValueError, match="must be one of"):
        truncated_is_weights(learner, sampler, mask, "tokens")
    stats = logprob_mismatch(learner, sampler, mask)
    assert float(stats["mismatch_abs"]) == pytest.approx(math.log(2) + math.log(3))
    assert float(stats["mismatch_max"]) == pytest.approx(math.log(3))


def test_is_weights_scale_the_token_losses():
    lp, adv = torch.zeros(1, 2), torch.tensor([[1.0, 1.0]])
    w = AGGREGATIONS["token-mean"](torch.ones(1, 2))
    loss, _ = ppo_clip_loss(lp, lp, adv, w, is_weights=torch.tensor([[0.5, 2.0]]))
    assert float(loss) == pytest.approx(-(0.5 + 2.0) / 2)


def test_kl_in_the_reward_lowers_each_turns_reward_by_its_tokens_kl():
    batch = collate([traj([0, 1], ["a", "b"], 0), traj([1], ["a"], 0)], pad_id=0)  # 2 tokens per turn
    kl = torch.ones_like(batch.loss_mask) * 0.5  # 0.5 per token, also on masked tokens (ignored)
    new, penalty = kl_penalized(batch, kl, coef=0.1)
    # per turn: 2 tokens * 0.5 * 0.1 = 0.1
    assert new.turn_rewards.flatten().tolist() == pytest.approx([-0.1, 0.9, 0.9, 0.0])
    assert new.rewards.tolist() == pytest.approx([0.8, 0.9]) and penalty.tolist() == pytest.approx([0.2, 0.1])
    assert batch.rewards.tolist() == [1.0, 1.0]  # the input is not modified


def test_adaptive_kl_controller():
    fixed = KLController(0.1)
    assert fixed.update(kl=5.0, n=100) == 0.1
    ctl = KLController(0.1, target=0.05, horizon=1000)
    # kl 0.1 is 100% over target -> error clipped to 0.2 -> beta *= 1 + 0.2 * 100 / 1000
    assert ctl.update(kl=0.1, n=100) == pytest.approx(0.102)
    # kl 0.04: error (0.04 - 0.05) / 0.05 = -0.2 -> beta *= 1 - 0.02
    assert ctl.update(kl=0.04, n=100) == pytest.approx(0.102 * 0.98)
    with pytest.raises(ValueError, match="kl_target"):
        KLController(0.0, target=0.05)


def test_schedules():
    assert SCHEDULES["constant"](1.0, 0.0, 5, 10) == 1.0
    assert SCHEDULES["linear"](1.0, 0.0, 5, 10) == pytest.approx(0.5)
    assert SCHEDULES["linear"](1.0, 0.0, 20, 10) == pytest.approx(0.0)
    assert SCHEDULES["cosine"](1.0, 0.0, 0, 10) == pytest.approx(1.0)
    assert SCHEDULES["cosine"](1.0, 0.0, 5, 10) == pytest.approx(0.5)
    assert SCHEDULES["cosine"](1.0, 0.2, 10, 10) == pytest.approx(0.2)
