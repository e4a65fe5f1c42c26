"""GRPO advantages and the estimator registry."""

import pytest
import torch

from turnrl.algorithms import ADVANTAGES, KL_ESTIMATORS, collate, grpo
from turnrl.algorithms.credit.groups import group_stats
from turnrl.rollout import Trajectory

from tests.tolerances import float_tol


def traj(reward, group_id, turns=2, prompt=3, turn_len=2):
    """Hand-made trajectory: ``prompt`` ids, then ``turns`` turns of ``turn_len`` sampled ids
    separated by 2 observation ids; the reward arrives on the last turn."""
    ids, mask, spans = [5] * prompt, [0] * prompt, []
    for k in range(turns):
        spans.append((len(ids), len(ids) + turn_len))
        ids += [6] * turn_len + [7, 7]
        mask += [1] * turn_len + [0, 0]
    rewards = [0.0] * (turns - 1) + [float(reward)]
    return Trajectory(ids, mask, [0.0] * len(ids), spans, rewards, False, group_id, f"task{group_id}", "terminated")


def batch_of(rewards, groups, **kw):
    return collate([traj(r, g, **kw) for r, g in zip(rewards, groups)], pad_id=0)


def per_row(adv, batch):
    """The single advantage value each row carries on its loss mask (checks it is constant)."""
    values = []
    for row in range(len(batch)):
        on = adv[row][batch.loss_mask[row].bool()]
        assert torch.allclose(on, on[0].expand_as(on))
        values.append(float(on[0]))
    return values


def test_grpo_without_std_centres_rewards_of_the_group():
    batch = batch_of([0, 1, 0], [0, 0, 0])
    adv = ADVANTAGES.get("grpo")(batch, normalize_std=False)
    # float32 rounding of a 3-member mean of rewards up to 1
    assert per_row(adv, batch) == pytest.approx([-1 / 3, 2 / 3, -1 / 3], abs=float_tol(torch.float32, 3, 1.0))


def test_grpo_with_std_divides_by_unbiased_std_plus_eps():
    rewards = torch.tensor([0.0, 1.0, 0.0])
    batch = batch_of(rewards.tolist(), [0, 0, 0])
    expected = (rewards - rewards.mean()) / (rewards.std(unbiased=True) + 1e-6)
    # float32 rounding of the 3-member mean and std, relative to the rewards' size over the std
    tol = float_tol(torch.float32, 3, float(rewards.abs().max() / rewards.std()))
    assert per_row(grpo(batch), batch) == pytest.approx(expected.tolist(), abs=tol)
    assert per_row(grpo(batch, eps=0.5), batch) == pytest.approx(
        ((rewards - rewards.mean()) / (rewards.std() + 0.5)).tolist(), abs=tol)


def test_grpo_normalises_each_group_independently():
    # interleaved, non-contiguous group ids
    rewards, groups = [0.0, 2.0, 1.0, 4.0, 0.0, 9.0], [7, 3, 7, 3, 7, 3]
    batch = batch_of(rewards, groups)
    got = per_row(grpo(batch), batch)
    for g in set(groups):
        rows = [i for i, x in enumerate(groups) if x == g]
        r = torch.tensor([rewards[i] for i in rows])
        expected = (r - r.mean()) / (r.std() + 1e-6)
        tol = float_tol(torch.float32, len(r), float(r.abs().max() / r.std()))  # as above, per group
        assert [got[i] for i in rows] == pytest.approx(expected.tolist(), abs=tol)


@pytest.mark.parametrize("normalize_std", [True, False])
def test_grpo_gives_zero_for_a_single_sample_group_and_an_all_equal_group(normalize_std):
    batch = batch_of([1.0, 0.5, 0.5, 0.5, 3.0, 0.0], [0, 1, 1, 1, 2, 2])
    adv = grpo(batch, normalize_std=normalize_std)
    assert torch.isfinite(adv).all()
    assert per_row(adv, batch)[:4] == [0.0, 0.0, 0.0, 0.0]
    assert per_row(adv, batch)[4] > 0 > per_row(adv, batch)[5]


def test_grpo_advantages_are_zero_off_the_loss_mask():
    # rows of different lengths: right padding is off the mask too
    batch = collate([traj(1.0, 0, turns=3), traj(0.0, 0, turns=1), traj(0.2, 0, turns=2, turn_len=4)], pad_id=0)
    for normalize_std in (True, False):
        adv = grpo(batch, normalize_std=normalize_std)
        assert adv.shape == batch.loss_mask.shape
        assert (adv[batch.loss_mask == 0] == 0).all()
        assert (adv[batch.loss_mask == 1] != 0).all()


def test_unknown_estimator_name_raises_key_error_listing_valid_names():
    with pytest.raises(KeyError) as err:
        ADVANTAGES.get("no-such-estimator")
    assert "no-such-estimator" in str(err.value) and "grpo" in str(err.value)
    assert "grpo" in ADVANTAGES.names()
    with pytest.raises(KeyError, match="k1.*k2.*k3"):
        KL_ESTIMATORS.get("k4")


def test_group_stats_matches_a_loop_reference():
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(60, generator=gen, dtype=torch.float64)
    groups = torch.randint(0, 15, (60,), generator=gen) * 3 + 100  # sparse ids, some groups of one
    groups[0] = 999  # a guaranteed singleton
    mean, centred, std, count = group_stats(scores, groups)
    for i in range(60):
        members = scores[groups == groups[i]]
        assert count[i] == len(members)
        tol = float_tol(torch.float64, len(members), float(members.abs().max()))  # float64 sums, other orders
        assert mean[i] == pytest.approx(float(members.mean()), abs=tol)
        assert centred[i] == pytest.approx(float(scores[i] - members.mean()), abs=tol)
        expected_std = float(members.std(unbiased=True)) if len(members) > 1 else 0.0
        assert std[i] == pytest.approx(expected_std, abs=tol)
    assert std[0] == 0 and count[0] == 1


def test_group_stats_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="must have one shape"):
        group_stats(torch.zeros(3), torch.zeros(4, dtype=torch.long))
