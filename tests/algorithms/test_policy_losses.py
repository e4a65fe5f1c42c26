"""The policy-loss registry and its GSPO and CISPO losses, each against its paper's formula
written out in plain float math (values and autograd gradients w.r.t. the logprobs), then
through the learner on the tiny model. (Turn-PPO's loss: tests/algorithms/test_turn_level_methods.py.)"""

import copy
import dataclasses
import inspect
import math
from dataclasses import replace

import pytest
import torch

from tests.helpers import learner_settings
from turnrl.algorithms import AGGREGATIONS, POLICY_LOSSES, Learner, LossConfig, OptimConfig, collate, ppo_clip_loss
from turnrl.algorithms.losses.policy import TENSORS, cispo_loss, gspo_loss, policy_loss_settings, takes_turns
from turnrl.algorithms.learner.scoring import token_logprobs

from tests.tolerances import adam_first_step_tol, grad_tol, max_abs

GSPO_LOW, GSPO_HIGH = 3e-4, 4e-4  # the paper's clip range, LossConfig's defaults
CISPO_HIGH = 0.28


def tensors(logprobs, old_logprobs, advantages, mask):
    """float64 ``[N, T]`` tensors of nested lists; the logprobs require gradient."""
    lp = torch.tensor(logprobs, dtype=torch.float64, requires_grad=True)
    as64 = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    return lp, as64(old_logprobs), as64(advantages), as64(mask)


def flat(x) -> list[float]:
    """Nested lists and tuples of numbers as one flat list (``pytest.approx`` takes no nesting)."""
    return [v for item in x for v in flat(item)] if isinstance(x, (list, tuple)) else [float(x)]


def close(expected):
    return pytest.approx(flat(expected), abs=1e-12)


def loss_and_grad(fn, lp, old, adv, weights, **kw):
    loss, stats = fn(lp, old, adv, weights, **kw)
    (grad,) = torch.autograd.grad(loss, lp)
    return float(loss.detach()), grad.tolist(), stats


# ---------------------------------------------------------------- the registry
def test_ppo_clip_is_registered_and_the_default():
    assert POLICY_LOSSES.names() == ["cispo", "gspo", "ppo_clip", "turn_ppo"]
    assert POLICY_LOSSES["ppo_clip"] is ppo_clip_loss and LossConfig().policy_loss == "ppo_clip"
    with pytest.raises(KeyError, match=r"unknown policy loss 'ppo'; valid names: \['cispo', 'gspo', 'ppo_clip', 'turn_ppo'\]"):
        POLICY_LOSSES.get("ppo")


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_every_loss_takes_the_tensors_then_settings_named_after_config_fields_with_their_defaults(name):
    fn = POLICY_LOSSES[name]
    params = inspect.signature(fn).parameters
    assert list(params)[:4] == ["logprobs", "old_logprobs", "advantages", "weights"] and "is_weights" in params
    settings = policy_loss_settings(fn, LossConfig())
    assert settings and set(settings) == set(params) - set(TENSORS)
    assert all(params[k].default == v for k, v in settings.items()), "a loss's default differs from LossConfig's"


def test_settings_that_are_no_config_field_fail_naming_them():
    def loss(logprobs, old_logprobs, advantages, weights, *, clip_low=0.2, eps=0.1, is_weights=None):
        return logprobs.sum(), {}

    with pytest.raises(TypeError, match=r"policy loss loss has settings \['eps'\] that are no LossConfig fields"):
        policy_loss_settings(loss, LossConfig())


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_every_loss_returns_ppo_clips_statistics_and_splits_over_rows(name):
    """Same stats keys (the learner's logging is unchanged); micro-batches of whole rows sum to
    the full batch's loss and gradient (GSPO's sequence ratio needs each row whole)."""
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(6, 7, generator=gen, dtype=torch.float64) * 3
    lp = (old + 1e-3 * torch.randn(6, 7, generator=gen, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(6, 7, generator=gen, dtype=torch.float64)
    mask = (torch.rand(6, 7, generator=gen) > 0.3).double()
    weights = AGGREGATIONS["seq-mean-token-mean"](mask)
    turn_index = torch.where(mask > 0, torch.arange(7) // 3, -1)  # turns of up to 3 tokens (turn_ppo's)
    fn = POLICY_LOSSES[name]

    def loss(rows):
        turns = {"turn_index": turn_index[rows]} if takes_turns(fn) else {}
        return fn(lp[rows], old[rows], adv[rows], weights[rows], **turns)

    full, stats = loss(slice(None))
    assert set(stats) == set(ppo_clip_loss(lp, old, adv, weights)[1])
    (grad,) = torch.autograd.grad(full, lp)
    parts = [loss(rows)[0] for rows in (slice(0, 2), slice(2, 6))]
    (split_grad,) = torch.autograd.grad(sum(parts), lp)
    assert float(sum(parts).detach()) == pytest.approx(float(full.detach()), abs=1e-12)
    assert torch.allclose(split_grad, grad, atol=1e-12)


# ---------------------------------------------------------------- GSPO
# Two trajectories of 3 and 2 sampled tokens in rows of 4; the padding holds junk logprobs and
# advantages that must change nothing. seq-mean-token-mean weights: 1/(2*3) and 1/(2*2).
MASK = [[1, 1, 1, 0], [1, 1, 0, 0]]
W = [[1 / 6] * 3 + [0], [1 / 4] * 2 + [0] * 2]
OLD = [[-0.5, -1.0, -2.0, 4.0], [-0.3, -0.7, 3.0, -9.0]]
PAD_LP = {(0, 3): -6.0, (1, 2): 1.5, (1, 3): -1.0}


def gspo_case(deltas, advantages):
    """``logprobs = old + deltas`` on the sampled tokens, junk on the padding."""
    lp = [[o + d for o, d in zip(orow, drow)] for orow, drow in zip(OLD, deltas)]
    for (i, t), v in PAD_LP.items():
        lp[i][t] = v
    adv = [list(row) + [7.0] * (4 - len(row)) for row in advantages]
    lp, old, adv, mask = tensors(lp, OLD, adv, MASK)
    return lp, old, adv, AGGREGATIONS["seq-mean-token-mean"](mask)


def gspo_expected(deltas, advantages):
    """The paper's GSPO-token written out: ``s_i = exp(mean_t delta_t)`` over the sampled tokens;
    token loss ``-min(s A_t, clip(s) A_t)``; gradient ``-s A_t w_t`` unless the clipped branch is
    the min (then 0). Returns (loss, grad rows, clipped token count)."""
    loss, grads, clipped = 0.0, [], 0
    for i, (drow, arow) in enumerate(zip(deltas, advantages)):
        n = len(arow)
        s = math.exp(sum(drow[:n]) / n)
        s_clip = min(max(s, 1 - GSPO_LOW), 1 + GSPO_HIGH)
        grow = []
        for t, a in enumerate(arow):
            w = W[i][t]
            takes_clip = s_clip * a < s * a
            loss += -min(s * a, s_clip * a) * w
            grow.append(0.0 if takes_clip else -s * a * w)
            clipped += takes_clip
        grads.append(grow + [0.0] * (4 - n))
    return loss, grads, clipped


def test_gspo_on_policy_is_reinforce_weighted_per_sequence():
    deltas, advantages = [[0.0] * 4, [0.0] * 4], [[1.0] * 3, [-0.5] * 2]
    loss, grad, stats = loss_and_grad(gspo_loss, *gspo_case(deltas, advantages))
    assert loss == pytest.approx((-1.0 + 0.5) / 2, abs=1e-12)  # the mean over sequences of -A_i
    # d/d logprob_t = -A_t / (G |y_i|): REINFORCE, each sequence weighing 1/G
    assert flat(grad) == close([[-1 / 6] * 3 + [0.0], [0.5 / 4] * 2 + [0.0] * 2])
    assert float(stats["clipped"]) == 0 and float(stats["ratio"]) == pytest.approx(5.0)


def test_gspo_inside_the_clip_range_is_the_papers_sequence_objective():
    """A constant advantage per sequence: the loss is ``mean_i -A_i s_i`` (the paper's eq. 5)
    and, with ``ds_i/dlogprob_t = s_i / |y_i|``, the gradient ``-A_i s_i / (G |y_i|)``."""
    deltas = [[1e-4, -2e-4, 4e-4, 0.0], [2e-4, 2e-4, 0.0, 0.0]]  # log s = 1e-4 and 2e-4: inside
    advantages = [[1.5] * 3, [-0.5] * 2]
    loss, grad, stats = loss_and_grad(gspo_loss, *gspo_case(deltas, advantages))
    s0, s1 = math.exp(1e-4), math.exp(2e-4)
    assert loss == pytest.approx((-1.5 * s0 + 0.5 * s1) / 2, abs=1e-12)
    assert flat(grad) == close([[-1.5 * s0 / 6] * 3 + [0.0], [0.5 * s1 / 4] * 2 + [0.0] * 2])
    assert flat((loss, grad, float(stats["clipped"]))) == close(gspo_expected(deltas, advantages))
    assert float(stats["ratio"]) == pytest.approx(3 * s0 + 2 * s1, abs=1e-12)  # the sequence ratio on each token
    assert float(stats["ratio_max"]) == pytest.approx(s1) and float(stats["ratio_min"]) == pytest.approx(s0)


@pytest.mark.parametrize("log_s, adv, clipped", [
    (0.01, 1.0, True),  # s above 1 + 4e-4, A > 0: capped, no gradient
    (0.01, -1.0, False),  # above, A < 0: the pessimistic unclipped term, full gradient
    (-0.01, -2.0, True),  # below 1 - 3e-4, A < 0: capped, no gradient
    (-0.01, 0.5, False),  # below, A > 0: unclipped
])
def test_gspo_clips_the_sequence_ratio_by_the_sign_of_the_advantage(log_s, adv, clipped):
    # row 0's token log-ratios differ (one even has the other sign), only their mean counts
    deltas = [[log_s - 0.02, log_s + 0.05, log_s - 0.03, 0.0], [0.0] * 4]
    advantages = [[adv] * 3, [1.0] * 2]
    loss, grad, stats = loss_and_grad(gspo_loss, *gspo_case(deltas, advantages))
    s = math.exp(log_s)
    bound = 1 + GSPO_HIGH if log_s > 0 else 1 - GSPO_LOW
    row0 = -adv * (bound if clipped else s) / 2
    assert loss == pytest.approx(row0 - 1.0 / 2, abs=1e-12)
    assert grad[0] == pytest.approx([0.0 if clipped else -adv * s / 6] * 3 + [0.0], abs=1e-12)
    assert grad[1] == pytest.approx([-1 / 4] * 2 + [0.0] * 2, abs=1e-12)
    assert float(stats["clipped"]) == (3 if clipped else 0)  # every token of the clipped sequence
    assert flat((loss, grad, float(stats["clipped"]))) == close(gspo_expected(deltas, advantages))


def test_gspo_token_with_turn_level_advantages_clips_each_token_by_its_own_sign():
    """Turn-level credit: row 0's turns have advantages 1 (two tokens) and -2 (one token), row 1's
    0.5 and -0.5. Every token carries its sequence's ratio ``s_i`` and is clipped by its own
    advantage's sign (the paper's GSPO-token)."""
    deltas = [[0.004, 0.010, 0.016, 0.0], [-0.002, -0.004, 0.0, 0.0]]  # log s = 0.01 and -0.003
    advantages = [[1.0, 1.0, -2.0], [0.5, -0.5]]
    loss, grad, stats = loss_and_grad(gspo_loss, *gspo_case(deltas, advantages))
    s0, s1 = math.exp(0.01), math.exp(-0.003)
    # row 0: the A=1 tokens take the cap 1 + 4e-4 (no gradient), the A=-2 token s0 (gradient 2 s0 w)
    # row 1: s1 < 1 - 3e-4: the A=0.5 token is unclipped, the A=-0.5 token capped at 1 - 3e-4
    expected_loss = (-2 * (1 + GSPO_HIGH) + 2 * s0) / 6 + (-0.5 * s1 + 0.5 * (1 - GSPO_LOW)) / 4
    assert loss == pytest.approx(expected_loss, abs=1e-12)
    assert flat(grad) == close([[0.0, 0.0, 2 * s0 / 6, 0.0], [-0.5 * s1 / 4, 0.0, 0.0, 0.0]])
    assert float(stats["clipped"]) == 3
    assert flat((loss, grad, float(stats["clipped"]))) == close(gspo_expected(deltas, advantages))


def test_gspo_masked_padding_changes_nothing():
    deltas, advantages = [[0.01, -0.002, 0.003, 0.0], [1e-4, 0.0, 0.0, 0.0]], [[1.0] * 3, [-1.0] * 2]
    lp, old, adv, weights = gspo_case(deltas, advantages)
    loss, grad, _ = loss_and_grad(gspo_loss, lp, old, adv, weights)
    # other padding logprobs, old logprobs and advantages: the same loss and gradient
    junk = weights == 0
    lp2 = torch.where(junk, lp.detach() + 3.0, lp.detach()).requires_grad_(True)
    old2, adv2 = torch.where(junk, old - 5.0, old), torch.where(junk, -adv, adv)
    loss2, grad2, _ = loss_and_grad(gspo_loss, lp2, old2, adv2, weights)
    assert loss2 == pytest.approx(loss, abs=1e-12) and flat(grad2) == close(grad)
    assert flat((loss, grad)) == close(gspo_expected(deltas, advantages)[:2])


def test_gspo_is_weights_multiply_each_tokens_loss():
    deltas, advantages = [[1e-4] * 3 + [0.0], [-1e-4] * 2 + [0.0] * 2], [[1.0] * 3, [-0.5] * 2]
    lp, old, adv, weights = gspo_case(deltas, advantages)
    isw = torch.tensor([[0.5, 1.0, 2.0, 9.0], [1.5, 0.25, 9.0, 9.0]], dtype=torch.float64)
    loss, grad, _ = loss_and_grad(gspo_loss, lp, old, adv, weights, is_weights=isw)
    s0, s1 = math.exp(1e-4), math.exp(-1e-4)
    assert loss == pytest.approx(-s0 * 3.5 / 6 + 0.5 * s1 * 1.75 / 4, abs=1e-12)
    assert flat(grad) == close([[-s0 * 0.5 / 6, -s0 / 6, -s0 * 2 / 6, 0.0],
                                [0.5 * s1 * 1.5 / 4, 0.5 * s1 * 0.25 / 4, 0.0, 0.0]])


# ---------------------------------------------------------------- CISPO
# One row of five sampled tokens (advantages of both signs) and one padding token; token-mean.
C_OLD = [[-0.5, -1.0, -2.0, -0.3, -0.7, 2.0]]
C_ADV = [[1.0, -0.5, 2.0, -1.0, 1.5, 9.0]]
C_MASK = [[1, 1, 1, 1, 1, 0]]


def cispo_case(deltas):
    lp = [[o + d for o, d in zip(C_OLD[0], deltas)]]
    lp[0][-1] = -4.0  # junk padding
    lp, old, adv, mask = tensors(lp, C_OLD, C_ADV, C_MASK)
    return lp, old, adv, AGGREGATIONS["token-mean"](mask)


def cispo_expected(deltas, low=1.0, high=CISPO_HIGH):
    """MiniMax-M1 eq. 4 written out: ``-sum_t w sg(clip(r_t, 1 - low, 1 + high)) A_t logprob_t``,
    gradient ``-w clip(r_t) A_t`` on every sampled token."""
    w = 1 / 5
    loss, grad, clipped = 0.0, [], 0
    for d, o, a in zip(deltas[:5], C_OLD[0], C_ADV[0]):
        r = math.exp(d)
        r_hat = min(max(r, 1 - low), 1 + high)
        loss += -w * r_hat * a * (o + d)
        grad.append(-w * r_hat * a)
        clipped += r_hat != r
    return loss, [grad + [0.0]], clipped


def test_cispo_on_policy_is_reinforce():
    deltas = [0.0] * 6
    loss, grad, stats = loss_and_grad(cispo_loss, *cispo_case(deltas))
    lps, advs = C_OLD[0][:5], C_ADV[0][:5]
    assert loss == pytest.approx(-sum(a * lp for a, lp in zip(advs, lps)) / 5, abs=1e-12)
    assert flat(grad) == close([[-a / 5 for a in advs] + [0.0]])  # -A_t / N
    assert float(stats["clipped"]) == 0 and float(stats["ratio"]) == pytest.approx(5.0)


def test_cispo_clips_the_detached_weight_and_keeps_every_tokens_gradient():
    # r = e^0.1 inside; e^0.5 above 1.28 (A > 0); e^-0.5, e^-3 far below 1 (no lower bound by
    # default); e^0.6 above with A > 0
    deltas = [0.1, -0.5, 0.5, -3.0, 0.6, 0.0]
    loss, grad, stats = loss_and_grad(cispo_loss, *cispo_case(deltas))
    w = 1 / 5
    r_hat = [math.exp(0.1), math.exp(-0.5), 1.28, math.exp(-3.0), 1.28]
    lps = [o + d for o, d in zip(C_OLD[0], deltas)]
    assert loss == pytest.approx(-w * sum(r * a * lp for r, a, lp in zip(r_hat, C_ADV[0], lps)), abs=1e-12)
    assert flat(grad) == close([[-w * r * a for r, a in zip(r_hat, C_ADV[0])] + [0.0]])
    assert flat((loss, grad, float(stats["clipped"]))) == close(cispo_expected(deltas))
    assert float(stats["clipped"]) == 2
    # where PPO's clip drops the two A > 0 tokens above 1 + eps, CISPO keeps them (capped at 1.28)
    assert grad[0][2] != 0.0 and grad[0][4] != 0.0
    lp, old, adv, weights = cispo_case(deltas)
    (ppo_grad,) = torch.autograd.grad(ppo_clip_loss(lp, old, adv, weights, clip_high=CISPO_HIGH)[0], lp)
    assert ppo_grad[0, 2] == 0.0 and ppo_grad[0, 4] == 0.0


def test_cispo_lower_bound_when_set():
    deltas = [0.1, -0.5, 0.5, -3.0, 0.6, 0.0]
    loss, grad, stats = loss_and_grad(cispo_loss, *cispo_case(deltas), cispo_clip_low=0.2, cispo_clip_high=0.3)
    assert flat((loss, grad, float(stats["clipped"]))) == close(cispo_expected(deltas, 0.2, 0.3))
    assert float(stats["clipped"]) == 4  # e^-0.5 and e^-3 raised to 0.8, e^0.5 and e^0.6 capped at 1.3
    assert grad[0][3] == pytest.approx(-0.8 * -1.0 / 5, abs=1e-12)


def test_cispo_masked_padding_and_is_weights():
    deltas = [0.1, -0.5, 0.5, -3.0, 0.6, 0.0]
    lp, old, adv, weights = cispo_case(deltas)
    isw = torch.tensor([[0.5, 1.0, 2.0, 1.5, 0.25, 100.0]], dtype=torch.float64)
    loss, grad, _ = loss_and_grad(cispo_loss, lp, old, adv, weights, is_weights=isw)
    base_loss, base_grad, _ = cispo_expected(deltas)
    r_hat = [math.exp(0.1), math.exp(-0.5), 1.28, math.exp(-3.0), 1.28]
    lps = [o + d for o, d in zip(C_OLD[0], deltas)]
    expected = -sum(i * r * a * lp for i, r, a, lp in zip(isw[0].tolist(), r_hat, C_ADV[0], lps)) / 5
    assert loss == pytest.approx(expected, abs=1e-12)
    assert flat(grad) == close([[g * i for g, i in zip(base_grad[0], isw[0].tolist())]])
    assert grad[0][5] == 0.0  # the padding token: no gradient, whatever its weight, logprob or advantage


# ---------------------------------------------------------------- through the learner
ADAM_EPS, LR = 1e-8, 1e-5  # as tests/algorithms/test_learner.py: Adam's first step, first order


@pytest.fixture(scope="module")
def sampled_batch(rollouts, tokenizer):
    """4 GuessNumber episodes sampled by ``policy_model``; advantages of both signs, and turn
    by turn in row 2 (a turn-level estimator's)."""
    trajectories, _ = rollouts("guess_number", 1.0)
    batch = collate(trajectories, tokenizer.pad_token_id)
    advantages = torch.tensor([1.0, -1.0, 0.5, -2.0])[:, None] * batch.loss_mask
    turn = batch.loss_mask[2].cumsum(0) > batch.loss_mask[2].sum() / 2
    advantages[2] = torch.where(turn, -advantages[2], advantages[2])
    return batch, advantages


@pytest.mark.slow
@pytest.mark.parametrize("policy_loss, loss_agg", [("gspo", "seq-mean-token-mean"), ("cispo", "token-mean")])
def test_one_update_with_each_loss_is_adams_first_step_along_the_policy_gradient(
        policy_model, sampled_batch, policy_loss, loss_agg):
    """On policy both losses' gradients are REINFORCE's, ``J = sum_t w_t A_t log pi(a_t)``: the
    update is Adam's first step along dJ, every parameter moves, J rises and GSPO's own loss
    falls."""
    batch, advantages = sampled_batch
    model = copy.deepcopy(policy_model).double()
    before = copy.deepcopy(model)
    learner = Learner(model, *learner_settings(lr=LR, loss_agg=loss_agg, policy_loss=policy_loss))
    assert learner.policy_loss is POLICY_LOSSES[policy_loss]
    batch = replace(batch, old_logprobs=learner.logprobs(batch))
    weights = AGGREGATIONS[loss_agg](batch.loss_mask).double()

    def surrogate(m):
        lp, _, _ = token_logprobs(m, batch.input_ids, batch.attention_mask, score_mask=batch.loss_mask)
        return (weights * advantages * lp).sum(), lp

    j_before, lp_before = surrogate(before)
    grads = torch.autograd.grad(j_before, list(before.parameters()))
    metrics = learner.update(batch, advantages)
    assert metrics["clip_frac"] == 0.0 and metrics["ratio"] == pytest.approx(1.0, abs=1e-9)
    norm = float(torch.cat([g.flatten() for g in grads]).norm())
    assert metrics["grad_norm"] == pytest.approx(norm, rel=1e-9)
    clip = min(1.0, OptimConfig().max_grad_norm / (norm + 1e-6))
    with torch.no_grad():
        for (name, p0), p1, g in zip(before.named_parameters(), model.parameters(), grads):
            assert not torch.equal(p1, p0), f"{name} did not move"
            # the learner's gradient is g to float64 rounding, through Adam's step (tests/tolerances.py)
            rounding = grad_tol(model.config, torch.float64, clip * max_abs(g), int(batch.attention_mask.sum()))
            tol = adam_first_step_tol(clip * g, rounding, LR, p0, adam_eps=ADAM_EPS)
            assert bool(((p1 - p0 - LR * clip * g / (clip * g.abs() + ADAM_EPS)).abs() <= tol).all()), name
        j_after, lp_after = surrogate(model)
        assert float(j_after) > float(j_before)
        if policy_loss == "gspo":
            old = batch.old_logprobs.double()
            assert float(gspo_loss(lp_after, old, advantages, weights)[0]) < float(
                gspo_loss(lp_before.detach(), old, advantages, weights)[0])


def test_the_learner_rejects_an_unknown_loss_and_a_dual_clip_it_cannot_apply(tiny_model):
    with pytest.raises(KeyError, match=r"unknown policy loss 'gpso'; valid names: \['cispo', 'gspo', 'ppo_clip', "
                                       r"'turn_ppo'\]"):
        Learner(tiny_model, LossConfig(policy_loss="gpso"), OptimConfig())
    with pytest.raises(ValueError, match=r"dual_clip=3.0 is set but policy_loss='cispo' has no dual clip"):
        Learner(tiny_model, LossConfig(policy_loss="cispo", dual_clip=3.0), OptimConfig())
    learner = Learner(tiny_model, dataclasses.replace(LossConfig(policy_loss="gspo"), gspo_clip_high=1e-3),
                      OptimConfig())
    assert learner.policy_loss_kwargs == {"gspo_clip_low": 3e-4, "gspo_clip_high": 1e-3, "log_ratio_clip": 20.0}
