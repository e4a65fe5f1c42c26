"""RAGEN's bi-level GAE (``bilevel_gae``) and the ``turn-mean`` aggregation, against numbers
computed by hand (the arithmetic in the comments) and plain-loop references; then the config."""

import dataclasses
import random

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from tests.algorithms.test_credit_estimators import traj
from turnrl.algorithms import ADVANTAGES, AGGREGATIONS, VALUE_TARGETS, collate
from turnrl.algorithms.credit.gae import bilevel_gae, token_rewards, turn_level_gae
from turnrl.conf.schema import register_configs
from turnrl.conf.validate import problems

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


# ---------------------------------------------------------------- configs
def compose_algorithm(name, *overrides):
    with initialize_config_module(config_module="turnrl.conf", version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="config", overrides=[f"algorithm={name}", *overrides]))


@pytest.mark.slow
def test_the_config_composes_and_validates():
    bilevel = compose_algorithm("bilevel_gae").algorithm
    assert bilevel.advantage == "bilevel_gae" and bilevel.advantage in VALUE_TARGETS
    assert bilevel.advantage_kwargs == {"high_level_gamma": 0.95, "token_level_gamma": 1.0, "lam": 1.0,
                                        "normalize": True}
    assert bilevel.policy_loss == "ppo_clip" and bilevel.critic == "separate"
    for name in ("bilevel_gae", "turn_gae"):
        assert problems(compose_algorithm(name)) == [], name
