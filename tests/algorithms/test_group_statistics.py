"""Group statistics are exact where they must be: a group whose returns are all equal gets an
advantage of exactly 0 from every estimator, in every dtype and at every magnitude (a float32
mean one rounding step off, divided by a std of ~6e-8, used to give +0.06), and an estimator
gives the same advantages from float32 rewards as from the same rewards in float64."""

import dataclasses
import random

import pytest
import torch

from turnrl.algorithms import ADVANTAGES, collate
from turnrl.algorithms.credit.groups import group_stats, leave_one_out_centred, whiten
from turnrl.rollout import Trajectory

from tests.tolerances import float_tol

VALUES = (0.7, -12.7, 123.4, 0.1, -0.3, 1e-3, 2.5e3)  # 3 * 2.5e3 still fits in float16
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
GROUP_SIZES = (3, 8)
# every member of the group plays 3 turns; a layout fixes their rewards and anchor states
LAYOUTS = {
    "outcome": (lambda v: [0.0, 0.0, v], ["s0", "s1", "s2"]),
    "every_turn": (lambda v: [v, v, v], ["s0", "s1", "s2"]),
    # every turn of an episode starts from one state: with gamma = 1 all its turns share a return
    "revisit": (lambda v: [0.0, 0.0, v], ["s", "s", "s"]),
}
ALL = tuple(LAYOUTS)
GAE = {"gamma": 1.0, "lam": 1.0}  # with values 0 every sampled token's GAE is the return
# (estimator, kwargs, layouts in which each group has equal returns, groups in the batch):
# group-relative estimators get two groups of different values; those that normalise over the
# whole batch (reinforce_pp, GAE's whitening) one
CASES = [
    ("grpo", {}, ALL, 2), ("dr_grpo", {}, ALL, 2), ("rloo", {}, ALL, 2),
    ("reinforce_pp", {}, ("outcome", "revisit"), 1), ("reinforce_pp_baseline", {}, ALL, 2),
    ("turn_returns", {}, ALL, 2), ("mt_grpo", {}, ALL, 2), ("mt_grpo_reached", {}, ALL, 2),
    ("gigpo", {}, ("outcome", "every_turn"), 2), ("gigpo", {"gamma": 1.0}, ALL, 2),
    ("gigpo", {"gamma": 1.0, "normalize": "mean"}, ALL, 2),
    ("gae", GAE, ("outcome", "revisit"), 1), ("turn_gae", {**GAE, "token_lam": 1.0}, ("outcome", "revisit"), 1),
    ("bilevel_gae", {"high_level_gamma": 1.0, "token_level_gamma": 1.0, "lam": 1.0}, ("outcome", "revisit"), 1),
    ("turn_mdp_gae", GAE, ("outcome", "revisit"), 1),
]


def traj(rewards, states, group_id=0, turn_len=2):
    ids, mask, spans = [5, 5], [0, 0], []
    for _ in rewards:
        spans.append((len(ids), len(ids) + turn_len))
        ids += [6] * turn_len + [7, 7]
        mask += [1] * turn_len + [0, 0]
    return Trajectory(ids, mask, [0.0] * len(ids), spans, [float(r) for r in rewards], False, group_id,
                      f"task{group_id}", "terminated", state_keys=list(states))


def equal_groups(layout: str, values: list[float], size: int, dtype: torch.dtype):
    """A batch of one group per value, each of ``size`` identical episodes; rewards in ``dtype``."""
    rewards_of, states = LAYOUTS[layout]
    rewards = [rewards_of(v) for v in values for _ in range(size)]
    batch = collate([traj(r, states, i // size) for i, r in enumerate(rewards)], pad_id=0)
    return dataclasses.replace(
        batch, rewards=torch.tensor([sum(r) for r in rewards], dtype=dtype),
        turn_rewards=torch.tensor(rewards, dtype=dtype), values=torch.zeros_like(batch.loss_mask))


def test_the_cases_cover_every_registered_estimator():
    assert {case[0] for case in CASES} == set(ADVANTAGES.names())


@pytest.mark.slow
@pytest.mark.parametrize("name, kwargs, layouts, groups", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_group_of_equal_returns_gets_exactly_zero_in_every_dtype(name, kwargs, layouts, groups):
    wrong = []
    for layout in layouts:
        for dtype in DTYPES:
            for value in VALUES:
                for size in GROUP_SIZES:
                    batch = equal_groups(layout, [value, -value / 3][:groups], size, dtype)
                    adv = ADVANTAGES[name](batch, **kwargs)
                    if not torch.all(adv == 0):
                        wrong.append((layout, str(dtype), value, size, float(adv.abs().max())))
    assert not wrong, f"{name} gave nonzero advantages to equal groups (layout, dtype, value, size, max |A|): {wrong}"


def test_group_stats_of_equal_values_are_exact_and_others_match_a_float64_loop():
    keys = torch.tensor([4, 4, 4, 9, 9, 9, 9, 9, 9, 9, 9, 2])
    for dtype in DTYPES:
        for value in VALUES:
            values = torch.full((12,), value, dtype=dtype)
            stats = group_stats(values, keys)
            assert torch.equal(stats.mean, values.double()) and torch.all(stats.centred == 0)
            assert torch.all(stats.std == 0) and stats.count.tolist() == [3] * 3 + [8] * 8 + [1]
            assert torch.all(leave_one_out_centred(values, keys)[0] == 0)
            assert torch.all(whiten(values[None], torch.ones(1, 12)) == 0)
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(60, generator=gen) * 50 + 100
    keys = torch.randint(0, 7, (60,), generator=gen)
    valid = torch.rand(60, generator=gen) > 0.2
    stats = group_stats(values, keys, valid)
    for i in range(60):
        if not valid[i]:
            assert stats.mean[i] == stats.centred[i] == stats.std[i] == stats.count[i] == 0
            continue
        members = values[(keys == keys[i]) & valid].double()
        assert stats.count[i] == len(members)
        tol = float_tol(torch.float64, len(members), float(members.abs().max()))  # float64 sums, other orders
        assert stats.centred[i] == pytest.approx(float(values[i].double() - members.mean()), abs=tol)
        assert stats.std[i] == pytest.approx(float(members.std()) if len(members) > 1 else 0.0, abs=tol)


def random_episodes(rng: random.Random) -> list[Trajectory]:
    """Groups of episodes whose turns revisit a few states, rewards from a small set (so groups
    and anchor states with equal returns are common, as in a converged policy's batches)."""
    trajs = []
    for group in range(rng.randint(2, 5)):
        for _ in range(rng.randint(2, 8)):
            turns = rng.randint(1, 5)
            outcome = rng.choice([0.0, 0.7, 1.0, -12.7, 123.4])
            rewards = [rng.choice([0.0, 0.0, 0.1]) for _ in range(turns - 1)] + [outcome]
            trajs.append(traj(rewards, [rng.choice("ab") for _ in range(turns)], group))
    return trajs


@pytest.mark.parametrize("kwargs", [{}, {"gamma": 1.0}, {"gamma": 1.0, "normalize": "mean"}])
def test_gigpo_in_float32_agrees_with_float64_on_random_batches(kwargs):
    rng = random.Random(0)
    worst = 0.0
    for _ in range(40):
        batch32 = collate(random_episodes(rng), pad_id=0)
        batch64 = dataclasses.replace(batch32, rewards=batch32.rewards.double(),
                                      turn_rewards=batch32.turn_rewards.double())
        adv32, adv64 = ADVANTAGES["gigpo"](batch32, **kwargs), ADVANTAGES["gigpo"](batch64, **kwargs)
        assert adv32.dtype == torch.float32
        # the same inputs, so the only difference left is the final rounding to float32
        worst = max(worst, float(((adv32.double() - adv64).abs() / (adv64.abs() + 1e-9)).max()))
    assert worst <= 2**-23, f"float32 gigpo is {worst:.3g} (relative) away from float64"
