"""GAE over sampled tokens (token level) and over turns (bi-level): hand-computed values,
observation tokens that never cut a recursion, and a plain-loop reference."""

import random

import pytest
import torch

import tests.algorithms.test_credit_estimators as credit
from turnrl.algorithms import collate
from turnrl.algorithms.credit.gae import pack, token_gae, token_rewards, turn_level_gae
from tests.algorithms.test_credit_estimators import traj
from tests.tolerances import float_tol


def values_on(batch, per_token):
    """``[N, T]`` values: ``per_token[i]`` spread over row i's sampled tokens in order."""
    values = torch.zeros_like(batch.loss_mask)
    for i, vs in enumerate(per_token):
        cols = batch.loss_mask[i].nonzero().flatten()
        values[i, cols] = torch.tensor(vs)
    return values


def sampled(adv, batch, i=0):
    return adv[i][batch.loss_mask[i].bool()].tolist()


@pytest.fixture
def one():
    # two turns of two sampled tokens each, observation tokens between; rewards [0, 1]
    batch = collate([traj([0, 1], ["a", "b"], 0)], pad_id=0)
    return batch, values_on(batch, [[0.5, 0.6, 0.7, 0.8]])


def test_rewards_sit_on_each_turns_last_sampled_token(one):
    batch, _ = one
    assert sampled(token_rewards(batch), batch) == [0, 0, 0, 1]


def test_token_gae_hand_computed(one):
    batch, values = one
    # gamma = lam = 1: A_j = G - V_j = 1 - V_j
    assert sampled(token_gae(batch, values, 1.0, 1.0), batch) == pytest.approx([0.5, 0.4, 0.3, 0.2])
    # gamma .9, lam .5: delta3 = 1 - .8 = .2;            A3 = .2
    #                   delta2 = .9 * .8 - .7 = .02;     A2 = .02 + .45 * .2 = .11
    #                   delta1 = .9 * .7 - .6 = .03;     A1 = .03 + .45 * .11 = .0795
    #                   delta0 = .9 * .6 - .5 = .04;     A0 = .04 + .45 * .0795 = .075775
    assert sampled(token_gae(batch, values, 0.9, 0.5), batch) == pytest.approx([0.075775, 0.0795, 0.11, 0.2])


def test_turn_level_gae_hand_computed(one):
    batch, values = one
    # turn values V_0 = .5, V_1 = .7 (each turn's first token). gamma = lam = 1:
    # A^T_1 = 1 - .7 = .3, A^T_0 = (0 + .7 - .5) + .3 = .5 -> G_0 = G_1 = 1 -> tokens 1 - V_j
    assert sampled(turn_level_gae(batch, values, 1.0, 1.0), batch) == pytest.approx([0.5, 0.4, 0.3, 0.2])
    # gamma .9, turn lam 0: G_1 = .3 + .7 = 1, A^T_0 = .9 * .7 - .5 = .13 -> G_0 = .63
    # token_lam 1: G_k - V_j = [.13, .03, .3, .2]
    assert sampled(turn_level_gae(batch, values, 0.9, 0.0, 1.0), batch) == pytest.approx([0.13, 0.03, 0.3, 0.2])
    # token_lam 0: inside a turn V_{j+1} - V_j, the last token G_k - V_last: [.1, .03, .1, .2]
    assert sampled(turn_level_gae(batch, values, 0.9, 0.0, 0.0), batch) == pytest.approx([0.1, 0.03, 0.1, 0.2])


def test_observation_tokens_never_cut_the_recursion(one):
    batch, values = one
    saved, credit.OBS_LEN = credit.OBS_LEN, 25
    try:
        long = collate([traj([0, 1], ["a", "b"], 0)], pad_id=0)
    finally:
        credit.OBS_LEN = saved
    long_values = values_on(long, [[0.5, 0.6, 0.7, 0.8]])
    for fn in (token_gae, turn_level_gae):
        assert sampled(fn(batch, values, 0.9, 0.7), batch) == pytest.approx(sampled(fn(long, long_values, 0.9, 0.7), long))
    assert token_gae(batch, values, 0.9, 0.7)[batch.loss_mask == 0].abs().sum() == 0


def loop_token_gae(rewards_by_turn, turn_lens, values, gamma, lam):
    # a zero-length turn passes its reward to the previous token
    flat = []
    for r, n in zip(rewards_by_turn, turn_lens):
        if n == 0:
            if flat:
                flat[-1] += r
            continue
        flat += [0.0] * (n - 1) + [r]
    adv, running = [0.0] * len(flat), 0.0
    for j in range(len(flat) - 1, -1, -1):
        nxt = values[j + 1] if j + 1 < len(flat) else 0.0
        running = flat[j] + gamma * nxt - values[j] + gamma * lam * running
        adv[j] = running
    return adv


def test_token_gae_matches_a_loop_on_random_rows():
    rng = random.Random(0)
    for _ in range(40):
        k = rng.randint(1, 4)
        rewards = [rng.choice([0, 0, 1, -0.5]) for _ in range(k)]
        lens = [rng.choice([1, 2, 3]) for _ in range(k)]
        batch = collate([traj(rewards, ["s"] * k, 0, turn_lens=lens)], pad_id=0)
        vals = [rng.uniform(-1, 1) for _ in range(sum(lens))]
        gamma, lam = rng.uniform(0.5, 1), rng.uniform(0, 1)
        got = sampled(token_gae(batch, values_on(batch, [vals]), gamma, lam), batch)
        want = loop_token_gae(rewards, lens, vals, gamma, lam)
        # float32 against float64: the recursion's rounding over the row's tokens, relative to the
        # largest term it adds (advantage, value or reward)
        tol = float_tol(torch.float32, len(want), max(map(abs, want + vals + rewards)))
        assert got == pytest.approx(want, abs=tol)


def test_pack_lists_sampled_columns_in_order():
    mask = torch.tensor([[0, 1, 0, 1, 1], [1, 0, 0, 0, 0]]).float()
    cols, valid = pack(mask)
    assert cols[0].tolist() == [1, 3, 4] and cols[1, :1].tolist() == [0]
    assert valid.tolist() == [[True, True, True], [True, False, False]]
