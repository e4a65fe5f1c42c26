"""PPO-clip loss, its aggregation over tokens (token-mean over the global count), and the
KL estimators."""

import math

import pytest
import torch

from turnrl.algorithms import AGGREGATIONS, KL_ESTIMATORS, ppo_clip_loss

from tests.tolerances import float_tol

token_mean = AGGREGATIONS.get("token-mean")

# per token: (advantage, ratio) -> hand-computed max(-A r, -A clip(r, 0.8, 1.2)) and whether clipping is active
CASES = [
    (+1.0, 1.1, -1.1, False),  # inside the range
    (+1.0, 1.5, -1.2, True),  # A > 0, ratio above 1 + clip: capped
    (-1.0, 1.5, +1.5, False),  # A < 0, ratio above: not capped (pessimistic bound)
    (-2.0, 0.5, +1.6, True),  # A < 0, ratio below 1 - clip: capped at 0.8
    (+1.0, 0.5, -0.5, False),  # A > 0, ratio below: not capped
    (+0.5, 0.9, -0.45, False),  # inside
]


def case_tensors():
    adv = torch.tensor([[a for a, _, _, _ in CASES] + [100.0]])  # + one masked-out token
    ratio = torch.tensor([[r for _, r, _, _ in CASES] + [5.0]], dtype=torch.float64)
    old = torch.full_like(ratio, -1.3)
    new = (old + ratio.log()).requires_grad_(True)
    mask = torch.tensor([[1.0] * len(CASES) + [0.0]])
    return new, old, adv.double(), mask.double()


def test_ppo_clip_loss_matches_hand_computed_values():
    new, old, adv, mask = case_tensors()
    weights = token_mean(mask)
    assert weights.tolist() == [[1 / len(CASES)] * len(CASES) + [0.0]]
    loss, stats = ppo_clip_loss(new, old, adv, weights)
    expected = sum(v for _, _, v, _ in CASES) / len(CASES)
    assert loss.item() == pytest.approx(expected, abs=1e-9)
    assert float(stats["clipped"]) == sum(c for *_, c in CASES)  # clip fraction numerator
    assert float(stats["ratio"]) == pytest.approx(sum(r for _, r, _, _ in CASES), abs=1e-9)
    assert float(stats["approx_kl"]) == pytest.approx(sum(0.5 * math.log(r) ** 2 for _, r, _, _ in CASES), abs=1e-9)
    # gradient: -A r / N where the unclipped term is active, 0 where clipping is, 0 off the mask
    loss.backward()
    expected_grad = [0.0 if c else -a * r / len(CASES) for a, r, _, c in CASES] + [0.0]
    assert new.grad[0].tolist() == pytest.approx(expected_grad, abs=1e-9)


def test_ppo_clip_loss_uses_asymmetric_clip_bounds():
    ratio = torch.tensor([[1.25, 1.35, 0.75]], dtype=torch.float64)
    old = torch.zeros_like(ratio)
    adv = torch.tensor([[1.0, 1.0, -1.0]], dtype=torch.float64)
    loss, stats = ppo_clip_loss(ratio.log(), old, adv, token_mean(torch.ones_like(ratio)), clip_low=0.1, clip_high=0.28)
    # 1.25 inside (1 + 0.28); 1.35 capped at 1.28; 0.75 below 0.9 with A < 0: -(-1) * 0.9
    assert float(loss) == pytest.approx((-1.25 - 1.28 + 0.9) / 3, abs=1e-9)
    assert float(stats["clipped"]) == 2


def test_ppo_clip_loss_at_ratio_one_is_minus_mean_advantage():
    gen = torch.Generator().manual_seed(1)
    lp = torch.randn(3, 5, generator=gen)
    adv = torch.randn(3, 5, generator=gen)
    mask = (torch.rand(3, 5, generator=gen) > 0.3).float()
    loss, stats = ppo_clip_loss(lp, lp, adv, token_mean(mask))
    # float32 sums of the 15 weighted advantages in two orders, relative to the largest advantage
    tol = float_tol(torch.float32, mask.numel(), float(adv.abs().max()))
    assert float(loss) == pytest.approx(float(-(adv * mask).sum() / mask.sum()), abs=tol)
    assert float(stats["clipped"]) == 0 and float(stats["ratio"]) == pytest.approx(float(mask.sum()))


def test_micro_batches_with_the_global_token_count_sum_to_the_full_batch_loss_and_grads():
    gen = torch.Generator().manual_seed(0)
    n, t = 4, 9
    old = -torch.rand(n, t, generator=gen, dtype=torch.float64) * 3
    base = old + 0.4 * torch.randn(n, t, generator=gen, dtype=torch.float64)  # ratios in and out of the clip range
    adv = torch.randn(n, t, generator=gen, dtype=torch.float64)
    mask = (torch.rand(n, t, generator=gen) > 0.4).double()
    mask[0, :6] = 1  # rows with very different token counts
    mask[3] = 0
    mask[3, 0] = 1
    weights = token_mean(mask)  # computed once, on the whole batch
    assert torch.allclose(weights, mask / mask.sum())

    full_lp = base.clone().requires_grad_(True)
    full, full_stats = ppo_clip_loss(full_lp, old, adv, weights)
    full.backward()
    per_token = torch.maximum(-adv * (base - old).exp(), -adv * (base - old).exp().clamp(0.8, 1.2))
    assert full.item() == pytest.approx(float((per_token * mask).sum() / mask.sum()), abs=1e-12)

    micro_lp = base.clone().requires_grad_(True)
    parts, clipped = [], 0.0
    for rows in (slice(0, 2), slice(2, 4)):
        part, stats = ppo_clip_loss(micro_lp[rows], old[rows], adv[rows], weights[rows])
        part.backward()  # gradients accumulate as in the learner
        parts.append(part.item())
        clipped += float(stats["clipped"])
    assert sum(parts) == pytest.approx(full.item(), abs=1e-12)
    assert torch.allclose(micro_lp.grad, full_lp.grad, atol=1e-12)
    assert clipped == float(full_stats["clipped"]) > 0
    # per-micro-batch token means would weight tokens differently (what the global count avoids)
    per_micro_mean = sum(float(ppo_clip_loss(base[r], old[r], adv[r], token_mean(mask[r]))[0]) / 2
                         for r in (slice(0, 2), slice(2, 4)))
    assert abs(per_micro_mean - full.item()) > 1e-3


def test_loss_aggregations_weigh_tokens_or_trajectories_equally():
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert torch.allclose(token_mean(mask), mask / 5)
    seq = AGGREGATIONS.get("seq-mean-token-mean")(mask)
    assert seq.sum(dim=1).tolist() == pytest.approx([0.5, 0.5, 0.0])  # rows with tokens weigh the same
    assert (seq[mask == 0] == 0).all()
    assert (token_mean(torch.zeros(2, 3)) == 0).all()  # no tokens: no division by zero


def test_kl_k3_is_nonnegative_and_zero_when_logprobs_are_equal():
    k3 = KL_ESTIMATORS.get("k3")
    gen = torch.Generator().manual_seed(0)
    lp = -torch.rand(50, 20, generator=gen) * 5
    ref = -torch.rand(50, 20, generator=gen) * 5
    assert (k3(lp, ref) >= 0).all()
    assert (k3(lp, lp) == 0).all()
    d = float(ref[0, 0] - lp[0, 0])
    # float32 against float64: exp(d) - d - 1 cancels, so its rounding is relative to its terms' size
    assert float(k3(lp, ref)[0, 0]) == pytest.approx(math.exp(d) - d - 1,
                                                      abs=float_tol(torch.float32, 3, math.exp(d) + abs(d) + 1))
    # extreme differences stay finite (the log-ratio is clamped)
    assert torch.isfinite(k3(torch.tensor([0.0]), torch.tensor([-1e4]))).all()
    assert torch.isfinite(k3(torch.tensor([-1e4]), torch.tensor([0.0]))).all()


def test_kl_k1_is_logprob_minus_reference_logprob():
    k1 = KL_ESTIMATORS.get("k1")
    lp, ref = torch.tensor([-1.0, -2.0, -3.0]), torch.tensor([-2.0, -2.0, -1.0])
    assert k1(lp, ref).tolist() == [1.0, 0.0, -2.0]  # positive where the policy is more likely


def test_kl_k3_is_nonnegative_for_nearly_equal_float32_logprobs():
    gen = torch.Generator().manual_seed(0)
    lp = -torch.rand(10_000, generator=gen) * 5
    ref = lp + 1e-4 * torch.randn(10_000, generator=gen)
    assert (KL_ESTIMATORS.get("k3")(lp, ref) >= 0).all()


def test_sum_aggregations_hand_computed():
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    # two rows with tokens: each token weighs 1/2; Dr.GRPO: 1 / (2 rows * 4 longest)
    assert torch.allclose(AGGREGATIONS["seq-mean-token-sum"](mask), mask / 2)
    assert torch.allclose(AGGREGATIONS["seq-mean-token-sum-norm"](mask), mask / 8)


@pytest.mark.parametrize("mode", AGGREGATIONS.names())
def test_every_aggregation_gives_the_same_gradient_for_1_and_4_micro_batches(mode):
    gen = torch.Generator().manual_seed(3)
    n, t = 8, 7
    old = -torch.rand(n, t, generator=gen, dtype=torch.float64) * 2
    base = old + 0.3 * torch.randn(n, t, generator=gen, dtype=torch.float64)
    adv = torch.randn(n, t, generator=gen, dtype=torch.float64)
    mask = (torch.rand(n, t, generator=gen) > 0.5).double()
    mask[1] = 0  # a row without tokens
    turn_index = torch.where(mask > 0, torch.arange(t) // 3, -1)  # turns of up to 3 tokens (turn-mean's)
    weights = AGGREGATIONS[mode](mask, turn_index)  # once, on the whole batch
    full_lp = base.clone().requires_grad_(True)
    ppo_clip_loss(full_lp, old, adv, weights)[0].backward()
    micro_lp = base.clone().requires_grad_(True)
    for start in range(0, n, 2):
        rows = slice(start, start + 2)
        ppo_clip_loss(micro_lp[rows], old[rows], adv[rows], weights[rows])[0].backward()
    assert torch.allclose(micro_lp.grad, full_lp.grad, atol=1e-12)
    assert full_lp.grad.abs().sum() > 0
