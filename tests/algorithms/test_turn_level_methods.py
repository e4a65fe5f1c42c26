"""RAGEN's bi-level GAE (``bilevel_gae``), Turn-PPO's turn-level GAE (``turn_mdp_gae``), its
turn-level loss (``turn_ppo``) and the ``turn-mean`` aggregation, against numbers computed by
hand (the arithmetic in the comments) and plain-loop references; then their configs."""

import copy
import dataclasses
import math
import random

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from tests.algorithms.test_credit_estimators import traj
from tests.helpers import learner_settings
from turnrl.algorithms import ADVANTAGES, AGGREGATIONS, POLICY_LOSSES, VALUE_TARGETS, Learner, collate, token_logprobs
from turnrl.algorithms.credit.gae import bilevel_gae, token_rewards, turn_level_gae, turn_mdp_gae
from turnrl.algorithms.losses.policy import TURN_RATIOS, policy_loss_settings, takes_turns, turn_ppo_loss
from turnrl.algorithms.losses.token_losses import ppo_clip_loss
from turnrl.algorithms.config import LossConfig, OptimConfig
from turnrl.conf.schema import register_configs
from turnrl.conf.validate import problems
from turnrl.envs import GuessNumberEnv
from turnrl.rollout.scripted import scripted_episode

register_configs()


def batch_of(rows):
    """A float64 batch of ``rows = [(turn rewards, turn lengths, values of the sampled tokens)]``
    (the prompt, template and observation tokens of ``traj`` between the turns)."""
    batch = collate([traj(r, ["s"] * len(r), 0, turn_lens=lens) for r, lens, _ in rows], pad_id=0)
    batch = dataclasses.replace(batch, loss_mask=batch.loss_mask.double(), turn_rewards=batch.turn_rewards.double(),
                                rewards=batch.rewards.double())
    values = torch.zeros_like(batch.loss_mask)
    for i, (_, _, vs) in enumerate(rows):
        values[i, batch.loss_mask[i].nonzero().flatten()] = torch.tensor(vs, dtype=torch.float64)
    return dataclasses.replace(batch, values=values)


def on_sampled(x, batch):
    """Each row's entries on its sampled tokens, in order (and 0 everywhere else)."""
    assert torch.all(x[batch.loss_mask == 0] == 0)
    return [x[i][batch.loss_mask[i].bool()].tolist() for i in range(len(batch))]


def flat(x) -> list[float]:
    """Nested (ragged) lists of numbers as one flat list."""
    return [v for item in x for v in flat(item)] if isinstance(x, (list, tuple)) else [float(x)]


def close(got, want):
    """Equal to float64 rounding (the hand-computed values are exact decimals)."""
    torch.testing.assert_close(torch.tensor(flat(got), dtype=torch.float64),
                               torch.tensor(flat(want), dtype=torch.float64), rtol=0, atol=1e-12)


# ---------------------------------------------------------------- bilevel_gae
# Row 0: turns of 2 and 3 sampled tokens, rewards 0.5 and 1; values [.2 .4 | .3 .6 .8].
# Row 1: turns of 1 and 2 sampled tokens, rewards 0 and 1; values [.5 | .1 .7].
TWO_ROWS = [([0.5, 1.0], [2, 3], [0.2, 0.4, 0.3, 0.6, 0.8]), ([0.0, 1.0], [1, 2], [0.5, 0.1, 0.7])]


def test_bilevel_gae_hand_computed():
    batch = batch_of(TWO_ROWS)
    # high_level_gamma .9, token_level_gamma .8, lam .5 (turn level: gamma lam = .45; tokens: .4)
    # row 0: the turn values are read at each turn's last token: V(e_0) = .4, V(e_1) = .8
    #   turn 1: delta = 1 + .9 * 0 - .8 = .2                 A^T_1 = .2                 G_1 = .2 + .8 = 1
    #   turn 0: delta = .5 + .9 * .8 - .4 = .82               A^T_0 = .82 + .45 * .2 = .91   G_0 = .91 + .4 = 1.31
    #   tokens of turn 1: last  1 - .8 = .2
    #                     .8 * .8 - .6 = .04;  .04 + .4 * .2 = .12
    #                     .8 * .6 - .3 = .18;  .18 + .4 * .12 = .228
    #   tokens of turn 0: last  1.31 - .4 = .91 (= A^T_0)
    #                     .8 * .4 - .2 = .12;  .12 + .4 * .91 = .484
    # row 1: V(e_0) = .5 (the turn's only token), V(e_1) = .7
    #   turn 1: delta = 1 - .7 = .3                           A^T_1 = .3                 G_1 = 1
    #   turn 0: delta = 0 + .9 * .7 - .5 = .13                A^T_0 = .13 + .45 * .3 = .265  G_0 = .765
    #   tokens of turn 1: last 1 - .7 = .3;  .8 * .7 - .1 = .46;  .46 + .4 * .3 = .58
    #   token of turn 0: .765 - .5 = .265
    adv = bilevel_gae(batch, batch.values, high_level_gamma=0.9, token_level_gamma=0.8, lam=0.5)
    expected = [[0.484, 0.91, 0.228, 0.12, 0.2], [0.265, 0.58, 0.3]]
    close(on_sampled(adv, batch), expected)
    kwargs = dict(high_level_gamma=0.9, token_level_gamma=0.8, lam=0.5, normalize=False)
    close(on_sampled(ADVANTAGES["bilevel_gae"](batch, **kwargs), batch), expected)
    # the critic's targets, RAGEN's returns: A + V at every token (G_k at the turn's last token)
    close(on_sampled(VALUE_TARGETS["bilevel_gae"](batch, **kwargs), batch),
          [[0.684, 1.31, 0.528, 0.72, 1.0], [0.765, 0.68, 1.0]])
    # whitened over the batch's sampled tokens, the targets untouched by it
    whitened = on_sampled(ADVANTAGES["bilevel_gae"](batch, **{**kwargs, "normalize": True}), batch)
    all_adv = torch.tensor(flat(expected), dtype=torch.float64)
    close(whitened, ((all_adv - all_adv.mean()) / (all_adv.std() + 1e-6)).tolist())


def test_bilevel_gae_reproduces_ragens_own_example():
    # RAGEN's core_algos.py runs rewards [0 0 0 0 1 0 0 0 0 1] over values .1 ... 1 with gamma =
    # lam = 1, high_level_gamma = .95: two turns of five tokens each ending on a reward of 1
    batch = batch_of([([1.0, 1.0], [5, 5], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])])
    # turn 1: A^T = 1 - 1 = 0, G_1 = 1; turn 0: A^T = 1 + .95 * 1 - .5 = 1.45, G_0 = 1.95;
    # gamma = lam = 1 inside a turn: A_j = G_k - V_j
    adv = bilevel_gae(batch, batch.values, 0.95, 1.0, 1.0)
    close(on_sampled(adv, batch), [[1.85, 1.75, 1.65, 1.55, 1.45, 0.4, 0.3, 0.2, 0.1, 0.0]])
    targets = VALUE_TARGETS["bilevel_gae"](batch, high_level_gamma=0.95, token_level_gamma=1.0, lam=1.0)
    close(on_sampled(targets, batch), [[1.95] * 5 + [1.0] * 5])


def ragen_loop(rewards, mask, values, gamma, lam, high_level_gamma):
    """RAGEN's two passes over one row, as plain loops: turn ends where a reward is nonzero, GAE
    over the turn ends (their rewards replaced by the turn returns), then GAE over the sampled
    tokens, restarted at each turn end from its return."""
    ends = [t for t, r in enumerate(rewards) if r != 0]
    reward = list(rewards)
    running = 0.0
    turn_adv = {}
    for i in range(len(ends) - 1, -1, -1):
        nxt = values[ends[i + 1]] if i + 1 < len(ends) else 0.0
        running = reward[ends[i]] + high_level_gamma * nxt - values[ends[i]] + high_level_gamma * lam * running
        turn_adv[ends[i]] = running
    for t in ends:
        reward[t] = turn_adv[t] + values[t]
    sampled = [t for t, m in enumerate(mask) if m]
    adv, running = [0.0] * len(rewards), 0.0
    for i in range(len(sampled) - 1, -1, -1):
        t = sampled[i]
        if t in ends:
            nxt, running = 0.0, 0.0
        else:
            nxt = values[sampled[i + 1]]
        running = reward[t] + gamma * nxt - values[t] + gamma * lam * running
        adv[t] = running
    return adv


def test_bilevel_gae_matches_ragens_loop_on_random_rows():
    rng = random.Random(0)
    for _ in range(40):
        k = rng.randint(1, 4)
        lens = [rng.randint(1, 4) for _ in range(k)]
        rewards = [rng.choice([0.5, 1.0, -1.0, 2.0]) for _ in range(k)]  # nonzero: RAGEN finds every turn's end
        batch = batch_of([(rewards, lens, [rng.uniform(-1, 1) for _ in range(sum(lens))])])
        gamma, lam, high = rng.uniform(0.5, 1), rng.uniform(0, 1), rng.uniform(0.5, 1)
        want = ragen_loop(token_rewards(batch)[0].tolist(), batch.loss_mask[0].tolist(), batch.values[0].tolist(),
                          gamma, lam, high)
        got = bilevel_gae(batch, batch.values, high, gamma, lam)[0].tolist()
        close(got, want)


def test_bilevel_gae_differs_from_turn_gae_where_the_turn_value_is_read():
    # two turns of two tokens, rewards 0 and 1, values [.5 .6 | .7 .8]; no discount, turn lambda 0
    batch = batch_of([([0.0, 1.0], [2, 2], [0.5, 0.6, 0.7, 0.8])])
    # turn_gae reads turn values at the turn's first token: V_0 = .5, V_1 = .7
    #   A^T_1 = 1 - .7 = .3, G_1 = 1;  A^T_0 = 0 + .7 - .5 = .2, G_0 = .7
    #   token_lam 0: [.6 - .5, G_0 - .6, .8 - .7, G_1 - .8] = [.1, .1, .1, .2]
    close(on_sampled(turn_level_gae(batch, batch.values, 1.0, 0.0, 0.0), batch), [[0.1, 0.1, 0.1, 0.2]])
    # bilevel_gae at the turn's last token: V(e_0) = .6, V(e_1) = .8
    #   A^T_1 = 1 - .8 = .2, G_1 = 1;  A^T_0 = 0 + .8 - .6 = .2, G_0 = .8
    #   lambda 0: [.6 - .5, G_0 - .6, .8 - .7, G_1 - .8] = [.1, .2, .1, .2]
    close(on_sampled(bilevel_gae(batch, batch.values, 1.0, 1.0, 0.0), batch), [[0.1, 0.2, 0.1, 0.2]])
    # the one difference is turn 0's last token, bootstrapped from V(start of turn 1) = .7 against
    # V(end of turn 1) = .8; with lambda 1 the value read cancels out and both give G - V_j = 1 - V_j
    for adv in (turn_level_gae(batch, batch.values, 1.0, 1.0, 1.0), bilevel_gae(batch, batch.values, 1.0, 1.0, 1.0)):
        close(on_sampled(adv, batch), [[0.5, 0.4, 0.3, 0.2]])


def test_bilevel_gae_is_turn_gae_when_each_turns_first_and_last_values_agree():
    rng = random.Random(1)
    for _ in range(20):
        rows = []
        for _ in range(rng.randint(1, 3)):
            k = rng.randint(1, 4)
            lens = [rng.randint(1, 4) for _ in range(k)]
            values = []
            for n in lens:
                turn = [rng.uniform(-1, 1) for _ in range(n)]
                turn[-1] = turn[0]
                values += turn
            rows.append(([rng.choice([0.0, 0.5, 1.0]) for _ in range(k)], lens, values))
        batch = batch_of(rows)
        gamma, lam = rng.uniform(0.5, 1), rng.uniform(0, 1)
        # RAGEN's with no token discount against turn_gae with token_lam = lam
        close(bilevel_gae(batch, batch.values, gamma, 1.0, lam).tolist(),
              turn_level_gae(batch, batch.values, gamma, lam, lam).tolist())


# ---------------------------------------------------------------- turn_mdp_gae (Turn-PPO's advantage)
def test_turn_mdp_gae_gives_each_turn_one_advantage_hand_computed():
    batch = batch_of(TWO_ROWS)
    # gamma .9, lam .5; turn values at each turn's first token
    # row 0: V_0 = .2, V_1 = .3
    #   A_1 = 1 - .3 = .7                                      G_1 = 1
    #   A_0 = (.5 + .9 * .3 - .2) + .45 * .7 = .57 + .315 = .885   G_0 = .885 + .2 = 1.085
    # row 1: V_0 = .5, V_1 = .1
    #   A_1 = 1 - .1 = .9                                      G_1 = 1
    #   A_0 = (0 + .9 * .1 - .5) + .45 * .9 = -.41 + .405 = -.005  G_0 = .495
    adv, returns = turn_mdp_gae(batch, batch.values, 0.9, 0.5)
    close(on_sampled(adv, batch), [[0.885] * 2 + [0.7] * 3, [-0.005, 0.9, 0.9]])
    close(on_sampled(returns, batch), [[1.085] * 2 + [1.0] * 3, [0.495, 1.0, 1.0]])
    kwargs = dict(gamma=0.9, lam=0.5)
    close(on_sampled(ADVANTAGES["turn_mdp_gae"](batch, **kwargs, normalize=False), batch), on_sampled(adv, batch))
    close(on_sampled(VALUE_TARGETS["turn_mdp_gae"](batch, **kwargs), batch), on_sampled(returns, batch))
    # whitened, every turn's tokens still share one advantage
    whitened = ADVANTAGES["turn_mdp_gae"](batch, **kwargs)
    for i, row in enumerate(on_sampled(whitened, batch)):
        turns = batch.turn_index[i][batch.loss_mask[i].bool()].tolist()
        assert len({(k, a) for k, a in zip(turns, row)}) == len(set(turns))
    # the first token of each turn is turn_gae's with token_lam 1 (G_k - V_first = A_k)
    tg = on_sampled(turn_level_gae(batch, batch.values, 0.9, 0.5, 1.0), batch)
    close([tg[0][0], tg[0][2], tg[1][0], tg[1][1]], [0.885, 0.7, -0.005, 0.9])


# ---------------------------------------------------------------- turn-mean aggregation
def test_turn_mean_weighs_every_turn_of_the_batch_once():
    # row 0: turn 0 of 3 tokens, an observation, turn 1 of 2; row 1: one turn of 1 token; 3 turns
    mask = torch.tensor([[1, 1, 1, 0, 1, 1, 0], [1, 0, 0, 0, 0, 0, 0]], dtype=torch.float64)
    turns = torch.tensor([[0, 0, 0, -1, 1, 1, -1], [0, -1, -1, -1, -1, -1, -1]])
    w = AGGREGATIONS["turn-mean"](mask, turns)
    close(w.tolist(), [[1 / 9] * 3 + [0] + [1 / 6] * 2 + [0], [1 / 3] + [0] * 6])
    per_turn = [float(w[0, :3].sum()), float(w[0, 4:6].sum()), float(w[1, 0])]
    close(per_turn, [1 / 3] * 3)
    with pytest.raises(ValueError, match="turn_index"):
        AGGREGATIONS["turn-mean"](mask)
    with pytest.raises(ValueError, match="turn_index -1"):
        AGGREGATIONS["turn-mean"](mask, torch.full_like(turns, -1))
    # the other modes take turn_index and ignore it
    for name in AGGREGATIONS.names():
        if name != "turn-mean":
            assert torch.equal(AGGREGATIONS[name](mask, turns), AGGREGATIONS[name](mask)), name


# ---------------------------------------------------------------- turn_ppo
# One row: turn 0 on columns 0-2, an observation token, turn 1 on columns 4-5, padding.
TP_TURNS = torch.tensor([[0, 0, 0, -1, 1, 1, -1]])
TP_MASK = (TP_TURNS >= 0).double()
TP_OLD = torch.tensor([[-1.0, -2.0, -0.5, 0.0, -1.5, -0.7, 0.0]], dtype=torch.float64)
TP_DELTA = torch.tensor([[0.1, 0.05, 0.15, 0.0, 0.05, -0.1, 0.0]], dtype=torch.float64)
TP_ADV = torch.tensor([[1.0, 1.0, 1.0, 0.0, -0.5, -0.5, 0.0]], dtype=torch.float64)


def turn_ppo_case(**settings):
    lp = (TP_OLD + TP_DELTA).requires_grad_(True)
    weights = AGGREGATIONS["turn-mean"](TP_MASK, TP_TURNS)  # 1/6 on turn 0's tokens, 1/4 on turn 1's
    loss, stats = turn_ppo_loss(lp, TP_OLD, TP_ADV, weights, turn_index=TP_TURNS, **settings)
    (grad,) = torch.autograd.grad(loss, lp)
    return float(loss.detach()), grad[0].tolist(), stats


def test_turn_ppo_one_ratio_and_one_clip_per_turn_hand_computed():
    loss, grad, stats = turn_ppo_case()
    r0, r1 = math.exp(0.3), math.exp(-0.05)
    # turn 0: log r = .1 + .05 + .15 = .3, r = e^.3 = 1.3499 > 1.2 with A = 1: the clipped term
    #   -min(1.3499 * 1, 1.2 * 1) = -1.2 is the loss, whose gradient is 0 on all 3 tokens
    # turn 1: log r = .05 - .1 = -.05, r = e^-.05 = .95123, inside [.8, 1.2]: L = -(-.5 * .95123) = .47562
    # turn-mean: each turn weighs 1/2 -> loss = (-1.2 + .47562) / 2 = -.36219
    assert loss == pytest.approx((-1.2 + 0.5 * r1) / 2, abs=1e-12)
    # d loss / d logprob_t for t in turn 1 = (sum of turn 1's weights) * -A * r_1 = (1/4 + 1/4) * .5 * .95123 = .23781
    # on both its tokens (the turn's ratio carries the gradient to each of them)
    close(grad, [0.0, 0.0, 0.0, 0.0, 0.5 * 0.5 * r1, 0.5 * 0.5 * r1, 0.0])
    assert float(stats["clipped"]) == 3  # the three tokens of turn 0
    assert float(stats["ratio"]) == pytest.approx(3 * r0 + 2 * r1, abs=1e-12)
    assert float(stats["ratio_max"]) == pytest.approx(r0) and float(stats["ratio_min"]) == pytest.approx(r1)
    assert float(stats["approx_kl"]) == pytest.approx(0.5 * sum(d * d for d in (0.1, 0.05, 0.15, 0.05, 0.1)))
    assert float(stats["dual_clipped"]) == 0
    # token-level PPO on the same tokens clips none of them (every token ratio is within e^.15 < 1.2)
    lp = (TP_OLD + TP_DELTA).requires_grad_(True)
    _, token_stats = ppo_clip_loss(lp, TP_OLD, TP_ADV, AGGREGATIONS["turn-mean"](TP_MASK, TP_TURNS))
    assert float(token_stats["clipped"]) == 0


def test_turn_ppo_geometric_ratio_hand_computed():
    loss, grad, _ = turn_ppo_case(turn_ratio="geometric")
    g0, g1 = math.exp(0.1), math.exp(-0.025)
    # turn 0: log r = .3 / 3 = .1, r = 1.10517, inside: L = -1.10517; turn 1: log r = -.05 / 2, r = .97531: L = .48766
    assert loss == pytest.approx((-g0 + 0.5 * g1) / 2, abs=1e-12)
    # d/dlogprob_t = (turn's weight) * -A * r / n: turn 0: (1/2) * -1 * 1.10517 / 3; turn 1: (1/2) * .5 * .97531 / 2
    close(grad, [-0.5 * g0 / 3] * 3 + [0.0] + [0.5 * 0.5 * g1 / 2] * 2 + [0.0])


def test_turn_ppo_on_policy_is_reinforce_weighted_per_turn():
    lp = TP_OLD.clone().requires_grad_(True)
    weights = AGGREGATIONS["turn-mean"](TP_MASK, TP_TURNS)
    loss, stats = turn_ppo_loss(lp, TP_OLD, TP_ADV, weights, turn_index=TP_TURNS)
    (grad,) = torch.autograd.grad(loss, lp)
    # ratio 1: each token of turn k gets -A_k W_k (W_k = 1/2), the turn's whole weight
    close(grad[0].tolist(), [-0.5] * 3 + [0.0] + [0.25] * 2 + [0.0])
    assert float(loss.detach()) == pytest.approx((-1.0 + 0.5) / 2) and float(stats["clipped"]) == 0


def turn_ppo_reference(lp, old, adv, weights, turns, clip, geometric):
    """Loss and gradient w.r.t. the logprobs, from the turn formula in plain floats: per (row,
    turn) the ratio ``r_k``, per token ``-min(r_k A_t, clip(r_k) A_t) w_t``; a token's gradient is
    ``-r_k sum_{t in k, unclipped} A_t w_t`` (over ``n_k`` with the geometric mean)."""
    loss, grad = 0.0, [[0.0] * len(row) for row in lp]
    for i in range(len(lp)):
        members = {}
        for t, k in enumerate(turns[i]):
            if weights[i][t] != 0:
                members.setdefault(k, []).append(t)
        for tokens in members.values():
            log_r = sum(lp[i][t] - old[i][t] for t in tokens)
            log_r = log_r / len(tokens) if geometric else log_r
            r = math.exp(log_r)
            r_clip = min(max(r, 1 - clip), 1 + clip)
            slope = 0.0
            for t in tokens:
                a, w = adv[i][t], weights[i][t]
                loss += max(-a * r, -a * r_clip) * w
                if -a * r >= -a * r_clip:  # the unclipped term is the loss's
                    slope += -a * w * r
            for t in tokens:
                grad[i][t] = slope / len(tokens) if geometric else slope
    return loss, grad


@pytest.mark.parametrize("turn_ratio", TURN_RATIOS)
def test_turn_ppo_matches_the_turn_formula_on_random_rows_and_splits_over_rows(turn_ratio):
    gen = torch.Generator().manual_seed(0)
    rng = random.Random(0)
    turns = torch.full((5, 12), -1)
    for i in range(5):  # 1-3 turns of 1-3 tokens, separated by an observation token
        col = 0
        for k in range(rng.randint(1, 3)):
            n = rng.randint(1, 3)
            turns[i, col:col + n] = k
            col += n + 1
    mask = (turns >= 0).double()
    old = -torch.rand(5, 12, generator=gen, dtype=torch.float64) * 3 * mask
    lp = (old + 0.2 * torch.randn(5, 12, generator=gen, dtype=torch.float64) * mask).requires_grad_(True)
    per_turn_adv = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    adv = per_turn_adv.gather(1, turns.clamp(min=0)) * mask
    weights = AGGREGATIONS["turn-mean"](mask, turns)
    loss, stats = turn_ppo_loss(lp, old, adv, weights, turn_index=turns, turn_ratio=turn_ratio)
    (grad,) = torch.autograd.grad(loss, lp)
    want_loss, want_grad = turn_ppo_reference(lp.tolist(), old.tolist(), adv.tolist(), weights.tolist(),
                                              turns.tolist(), 0.2, turn_ratio == "geometric")
    assert float(loss.detach()) == pytest.approx(want_loss, abs=1e-12)
    close(grad.tolist(), want_grad)
    assert 0 < float(stats["clipped"]) < float(mask.sum())  # the random ratios clip some turns, not all
    # micro-batches of whole rows sum to the batch's loss and gradient
    parts = [turn_ppo_loss(lp[rows], old[rows], adv[rows], weights[rows], turn_index=turns[rows],
                           turn_ratio=turn_ratio)[0] for rows in (slice(0, 2), slice(2, 5))]
    (split_grad,) = torch.autograd.grad(sum(parts), lp)
    assert float(sum(parts).detach()) == pytest.approx(float(loss.detach()), abs=1e-12)
    close(split_grad.tolist(), grad.tolist())


def test_turn_ppo_needs_turns_and_a_known_ratio():
    lp, weights = TP_OLD.clone(), AGGREGATIONS["turn-mean"](TP_MASK, TP_TURNS)
    with pytest.raises(ValueError, match="turn_index"):
        turn_ppo_loss(lp, TP_OLD, TP_ADV, weights)
    with pytest.raises(ValueError, match="turn_ratio"):
        turn_ppo_loss(lp, TP_OLD, TP_ADV, weights, turn_index=TP_TURNS, turn_ratio="arithmetic")
    with pytest.raises(ValueError, match="turn_index -1"):
        turn_ppo_loss(lp, TP_OLD, TP_ADV, weights, turn_index=torch.full_like(TP_TURNS, -1))


def test_turn_ppo_is_registered_with_config_settings():
    fn = POLICY_LOSSES["turn_ppo"]
    assert fn is turn_ppo_loss and takes_turns(fn) and not takes_turns(POLICY_LOSSES["ppo_clip"])
    assert policy_loss_settings(fn, LossConfig(clip_high=0.28, turn_ratio="geometric")) == {
        "clip_low": 0.2, "clip_high": 0.28, "turn_ratio": "geometric", "log_ratio_clip": 20.0}


def test_the_learner_refuses_an_unknown_turn_ratio(tiny_model):
    with pytest.raises(ValueError, match=r"turn_ratio must be one of \('product', 'geometric'\), got 'mean'"):
        Learner(tiny_model, LossConfig(policy_loss="turn_ppo", turn_ratio="mean"), OptimConfig())
    Learner(tiny_model, LossConfig(turn_ratio="mean"), OptimConfig())  # a loss without turns does not read it


@pytest.mark.slow
def test_the_learner_gives_turn_ppo_the_turns_on_policy_gradient_per_turn(tiny_model, tokenizer, renderer):
    """Through the learner (micro-batches of 2 rows, turn-mean weights of the whole batch), on
    policy: the gradient is that of ``-sum_k A_k / K * sum_{t in k} log pi(a_t)``, each turn's
    advantage on its whole log-probability, every turn weighing ``1 / K``."""
    env = GuessNumberEnv(n=32, max_turns=6)
    trajs = [scripted_episode(env, seed, renderer, player, rng=np.random.default_rng(seed))
             for seed, player in enumerate(("expert", "weak", "weak", "weak", "expert"))]
    batch = collate(trajs, tokenizer.pad_token_id)
    model = copy.deepcopy(tiny_model).double()
    learner = Learner(model, *learner_settings(policy_loss="turn_ppo", loss_agg="turn-mean", lr=0.0,
                                               micro_batch_size=2))
    batch = dataclasses.replace(batch, loss_mask=batch.loss_mask.double(), old_logprobs=learner.logprobs(batch))
    per_turn = torch.randn(len(batch), int(batch.num_turns.max()), generator=torch.Generator().manual_seed(0),
                           dtype=torch.float64)
    advantages = per_turn.gather(1, batch.turn_index.clamp(min=0)) * batch.loss_mask
    turns = int((batch.num_turns).sum())
    assert turns > len(batch) and len(set(batch.num_turns.tolist())) > 1
    lp, _, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, score_mask=batch.loss_mask)
    objective = (advantages / turns * lp * batch.loss_mask).sum()
    grads = torch.autograd.grad(objective, [p for p in model.parameters() if p.requires_grad])
    model.zero_grad(set_to_none=True)
    metrics = learner.update(batch, advantages)
    assert metrics["clip_frac"] == 0.0 and metrics["ratio"] == pytest.approx(1.0, abs=1e-9)
    assert metrics["grad_norm"] == pytest.approx(float(torch.cat([g.flatten() for g in grads]).norm()), rel=1e-9)


# ---------------------------------------------------------------- configs
def compose_algorithm(name, *overrides):
    with initialize_config_module(config_module="turnrl.conf", version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="config", overrides=[f"algorithm={name}", *overrides]))


@pytest.mark.slow
def test_the_configs_compose_and_validate():
    bilevel = compose_algorithm("bilevel_gae").algorithm
    assert bilevel.advantage == "bilevel_gae" and bilevel.advantage in VALUE_TARGETS
    assert bilevel.advantage_kwargs == {"high_level_gamma": 0.95, "token_level_gamma": 1.0, "lam": 1.0,
                                        "normalize": True}
    assert bilevel.policy_loss == "ppo_clip" and bilevel.critic == "separate"
    turn_ppo = compose_algorithm("turn_ppo").algorithm
    assert (turn_ppo.advantage, turn_ppo.policy_loss, turn_ppo.loss_agg) == ("turn_mdp_gae", "turn_ppo", "turn-mean")
    assert turn_ppo.advantage in VALUE_TARGETS and turn_ppo.turn_ratio == "product"
    for name in ("bilevel_gae", "turn_ppo", "turn_gae"):
        assert problems(compose_algorithm(name)) == [], name
    bad = compose_algorithm("turn_ppo", "algorithm.turn_ratio=mean")
    assert [p for p in problems(bad) if "algorithm.turn_ratio='mean'" in p]
