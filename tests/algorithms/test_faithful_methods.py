"""MT-GRPO, REINFORCE++ and GiGPO's normalisation against the authors' formulations, on small
hand-computed batches: every expected advantage below is worked out by hand in the comments
(the std's eps = 1e-6 left out: at most ~5e-6 off here), not by calling the code under test."""

import dataclasses

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from turnrl.algorithms import ADVANTAGES, collate
from turnrl.algorithms.credit.assign import assign_credit
from turnrl.conf.schema import register_configs
from turnrl.conf.validate import validate
from turnrl.rollout import Trajectory
from turnrl.train.factories import advantage_fn

register_configs()

PROMPT, OBS = 2, 3
ATOL = 2e-5


def traj(rewards, group_id, turn_lens):
    """Prompt ids, then per turn ``turn_lens[k]`` sampled ids followed by ``OBS`` observation ids."""
    ids, mask, spans = [5] * PROMPT, [0] * PROMPT, []
    for length in turn_lens:
        spans.append((len(ids), len(ids) + length))
        ids += [6] * length + [7] * OBS
        mask += [1] * length + [0] * OBS
    return Trajectory(ids, mask, [0.0] * len(ids), spans, [float(r) for r in rewards], False, group_id,
                      f"task{group_id}", "terminated", state_keys=[f"s{k}" for k in range(len(rewards))])


def on_sampled(batch, rows, off=0.0):
    """``[N, T]`` with ``rows[i]`` written, in order, on row ``i``'s sampled tokens and ``off``
    everywhere else."""
    out = torch.full(batch.loss_mask.shape, off)
    for i, values in enumerate(rows):
        cols = batch.loss_mask[i].nonzero().squeeze(1)
        assert len(cols) == len(values)
        out[i, cols] = torch.tensor(values, dtype=out.dtype)
    return out


def check(adv, batch, expected):
    """``adv`` equals ``expected`` (per row, the advantage of each sampled token in order) on the
    sampled tokens, and 0 elsewhere."""
    torch.testing.assert_close(adv, on_sampled(batch, expected) * batch.loss_mask, rtol=0, atol=ATOL)


# ---------------------------------------------------------------- MT-GRPO
# Group 0, three samples, two turns at most; c answers in one turn:
#   a: r = [1, 1]  tokens 2 + 1     b: r = [0, 0]  tokens 1 + 2     c: r = [.5]  tokens 2
# Group 1, two samples:
#   d: r = [0, 1, 1]  tokens 1 + 1 + 1     e: r = [1, 0]  tokens 2 + 1
MT_GRPO = [traj([1, 1], 0, [2, 1]), traj([0, 0], 0, [1, 2]), traj([0.5], 0, [2]),
           traj([0, 1, 1], 1, [1, 1, 1]), traj([1, 0], 1, [2, 1])]


def test_mt_grpo_normalises_turn_rewards_over_the_whole_group_and_weights_the_turn_advantage():
    batch = collate(MT_GRPO, pad_id=0)
    # outcome = final turn's reward. group 0: a 1, b 0, c .5 -> mean .5, std sqrt((.25 + .25 + 0)/2) = .5
    #   -> A^O a 1, b -1, c 0.  group 1: d 1, e 0 -> mean .5, std .70711 -> A^O d .70711, e -.70711
    # turn 0, all three of group 0: a 1, b 0, c 0 (turn 0 is c's final turn: it counts with 0)
    #   -> mean 1/3, std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3) = .57735 -> A^T a 1.15470, b -.57735
    # group 1 turn 0: d 0, e 1 -> A^T d -.70711, e .70711; turn 1: d 1, e 0 (its final turn) -> d .70711
    # turn_coef = .5: a0 = 1 + .5 * 1.15470 = 1.57735, a1 = A^O = 1; b0 = -1 + .5 * -.57735 = -1.28868,
    #   b1 = -1; c0 = A^O = 0; d0 = .70711 - .35355 = .35355, d1 = .70711 + .35355 = 1.06066, d2 = .70711;
    #   e0 = -.70711 + .35355 = -.35355, e1 = -.70711
    expected = [[1.57735, 1.57735, 1], [-1.28868, -1, -1], [0, 0],
                [.35355, 1.06066, .70711], [-.35355, -.35355, -.70711]]
    check(ADVANTAGES["mt_grpo"](batch, turn_coef=0.5), batch, expected)
    # the default turn_coef = 1: a0 = 1 + 1.15470, b0 = -1 - .57735, d1 = .70711 + .70711, e0 = 0
    default = [[2.15470, 2.15470, 1], [-1.57735, -1, -1], [0, 0], [0, 1.41421, .70711], [0, 0, -.70711]]
    check(ADVANTAGES["mt_grpo"](batch), batch, default)


def test_mt_grpo_reached_keeps_the_former_numbers():
    batch = collate(MT_GRPO, pad_id=0)
    # A^O as above: a 1, b -1, c 0, d .70711, e -.70711.
    # turn 0 over the samples that have an intermediate reward there: group 0 a 1, b 0 (not c) -> mean .5,
    #   std .70711 -> a .70711, b -.70711; group 1 d 0, e 1 -> d -.70711, e .70711.
    # turn 1: only d has one in group 1 -> A^T = 0.
    # outcome_weight = .5 on A^O: a0 = .70711 + .5 = 1.20711, b0 = -1.20711, d0 = -.70711 + .35355 = -.35355,
    #   d1 = 0 + .35355, e0 = .70711 - .35355 = .35355; final turns A^O
    expected = [[1.20711, 1.20711, 1], [-1.20711, -1, -1], [0, 0],
                [-.35355, .35355, .70711], [.35355, .35355, -.70711]]
    check(ADVANTAGES["mt_grpo_reached"](batch, outcome_weight=0.5), batch, expected)


# ---------------------------------------------------------------- REINFORCE++
# Group 0: a two turns, r = [0, 1], 2 + 2 tokens; b one turn, r = [0], 2 tokens.
# Group 1: c and d one turn each, r = [1], 2 tokens.
# KL per sampled token (kl_coef .5 turns them into the penalties p):
#   a [.2, .4 | .6, .2] -> p [.1, .2 | .3, .1];  b [.4, .2] -> [.2, .1];  c [.2, .2] -> [.1, .1];  d 0
# Off the sampled tokens the KL is 9 (never counted).
REINFORCE = [traj([0, 1], 0, [2, 2]), traj([0], 0, [2]), traj([1], 1, [2]), traj([1], 1, [2])]
KL = [[.2, .4, .6, .2], [.4, .2], [.2, .2], [0, 0]]


def credit_with_kl(name, coef=0.5):
    batch = collate(REINFORCE, pad_id=0)
    kl = on_sampled(batch, KL, off=9.0)
    return batch, assign_credit(batch, ADVANTAGES.get(name), kl_coef=coef, reference_kl=lambda b: kl)


def test_reinforce_pp_puts_each_tokens_kl_on_the_token():
    batch, credited = credit_with_kl("reinforce_pp")
    # token returns-to-go G_t = rewards from t on - penalties from t on (gamma 1), across turns:
    #   a: t0 1 - (.1 + .2 + .3 + .1) = .3, t1 1 - (.2 + .3 + .1) = .4, t2 1 - .4 = .6, t3 1 - .1 = .9
    #   b: -(.2 + .1) = -.3, -.1;   c: 1 - .2 = .8, 1 - .1 = .9;   d: 1, 1
    # (a's t1 holds its own and the later KL, not its whole turn's: .4, where turn sums give .3)
    # whitened over the 10 tokens: sum 5.5, mean .55; deviations -.25 -.15 .05 .35 -.85 -.65 .25 .35 .45 .45,
    # squares sum 1.945, unbiased var 1.945 / 9 = .216111, std .464878 (1/std = 2.151102)
    expected = [[-.537776, -.322666, .107555, .752886], [-1.828439, -1.398218], [.537776, .752886],
                [.967997, .967997]]
    check(credited.advantages, batch, expected)
    # the turn-level sums the other estimators read: a's turns lose .3 and .4, its return .7
    torch.testing.assert_close(credited.batch.turn_rewards[0], torch.tensor([-.3, .6]), rtol=0, atol=1e-6)
    torch.testing.assert_close(credited.batch.rewards, torch.tensor([.3, -.3, .8, 1.]), rtol=0, atol=1e-6)
    assert credited.metrics["kl_reward_penalty"] == pytest.approx((.7 + .3 + .2 + 0) / 4)


def test_reinforce_pp_baseline_centres_the_outcome_before_the_kl():
    batch, credited = credit_with_kl("reinforce_pp_baseline")
    # group means of the env return (without the KL): group 0 (1 + 0)/2 -> a .5, b -.5; group 1 (1 + 1)/2 -> 0, 0
    # then the penalties from t on: a .5 - .7 = -.2, .5 - .6 = -.1, .5 - .4 = .1, .5 - .1 = .4;
    #   b -.5 - .3 = -.8, -.5 - .1 = -.6;  c -.2, -.1;  d 0, 0
    # whitened: sum -1.5, mean -.15; deviations -.05 .05 .25 .55 -.65 -.45 -.05 .05 .15 .15, squares sum 1.045,
    # var 1.045 / 9 = .116111, std .340751 (1/std = 2.934695)
    expected = [[-.146735, .146735, .733674, 1.614083], [-1.907552, -1.320613], [-.146735, .146735],
                [.440204, .440204]]
    check(credited.advantages, batch, expected)


@pytest.mark.parametrize("name", ["reinforce_pp", "reinforce_pp_baseline", "grpo", "turn_returns", "mt_grpo"])
def test_without_kl_in_the_reward_the_advantages_are_unchanged(name):
    batch = collate(REINFORCE, pad_id=0)
    plain = ADVANTAGES.get(name)(batch)
    assert batch.token_penalty is None
    assert torch.equal(assign_credit(batch, ADVANTAGES.get(name)).advantages, plain)
    _, zero = credit_with_kl(name, coef=0.0)  # KL measured, weight 0
    assert torch.equal(zero.advantages, plain)


def test_turn_discount_applies_to_later_turns_penalties():
    batch, credited = credit_with_kl("reinforce_pp")
    gamma = ADVANTAGES.get("reinforce_pp")(credited.batch, gamma=0.5)
    # a with gamma .5 (per turn): t0 (0 - .3) + .5 (1 - .4) = 0, t1 -.2 + .3 = .1, t2 .6, t3 .9;
    # b -.3, -.1; c .8, .9; d 1, 1. sum 4.9, mean .49; deviations -.49 -.39 .11 .41 -.79 -.59 .31 .41 .51 .51,
    # squares .2401 .1521 .0121 .1681 .6241 .3481 .0961 .1681 .2601 .2601 = 2.329, var .258778, std .508702
    expected = [[-.963236, -.766657, .216237, .805973], [-1.552972, -1.159814], [.609394, .805973],
                [1.002551, 1.002551]]
    check(gamma, batch, expected)


# ---------------------------------------------------------------- GiGPO's normalisation names
def test_gigpo_accepts_the_authors_normalisation_names():
    batch = collate(MT_GRPO, pad_id=0)
    gigpo = ADVANTAGES.get("gigpo")
    assert torch.equal(gigpo(batch, normalize="mean_norm"), gigpo(batch, normalize="mean"))
    assert torch.equal(gigpo(batch, normalize="mean_std_norm"), gigpo(batch, normalize="std"))
    assert torch.equal(gigpo(batch), gigpo(batch, normalize="std"))  # the default
    assert not torch.equal(gigpo(batch, normalize="mean"), gigpo(batch, normalize="std"))
    with pytest.raises(ValueError, match="mean_norm"):
        gigpo(batch, normalize="median")


# ---------------------------------------------------------------- the configs
def compose_config(*overrides):
    with initialize_config_module(config_module="turnrl.conf", version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="config", overrides=list(overrides)))


@pytest.mark.parametrize("overrides,advantage,kwargs", [
    (["algorithm=mt_grpo"], "mt_grpo", {"turn_coef": 1.0}),
    (["algorithm=mt_grpo_reached"], "mt_grpo_reached", {"outcome_weight": 1.0}),
    (["algorithm=gigpo", "algorithm.advantage_kwargs.normalize=mean_norm"], "gigpo",
     {"omega": 1.0, "gamma": 0.95, "normalize": "mean_norm"}),
    (["algorithm=reinforce_pp", "algorithm.kl_coef=0.01", "algorithm.kl_placement=reward"], "reinforce_pp",
     {"gamma": 1.0}),
    (["algorithm=reinforce_pp_baseline", "algorithm.kl_coef=0.01", "algorithm.kl_placement=reward"],
     "reinforce_pp_baseline", {}),
], ids=lambda v: v[0] if isinstance(v, list) else None)
def test_the_configs_compose_validate_and_bind_their_estimator(overrides, advantage, kwargs):
    cfg = compose_config(*overrides)
    validate(cfg)
    assert cfg.algorithm.advantage == advantage and dict(cfg.algorithm.advantage_kwargs) == kwargs
    batch = collate(MT_GRPO, pad_id=0)
    torch.testing.assert_close(advantage_fn(cfg)(batch), ADVANTAGES.get(advantage)(batch, **kwargs), rtol=0, atol=0)


def test_mt_grpo_no_longer_takes_outcome_weight():
    cfg = compose_config("algorithm=mt_grpo")
    bad = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, advantage_kwargs={"outcome_weight": 1.0}))
    with pytest.raises(ValueError, match="outcome_weight"):
        validate(bad)
