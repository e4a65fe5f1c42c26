"""The lab's path from episodes to gradients: trajectories as the collector writes them, the
hand-done chain rule equal to autograd, batches kept apart when collated together."""

import dataclasses

import numpy as np
import pytest
import torch

from turnrl.algorithms.losses.aggregation import AGGREGATIONS
from turnrl.algorithms.config import LossConfig
from turnrl.bench.credit_lab.episodes import LabBatch, lab_batches, sample_episodes, to_trajectories
from turnrl.bench.credit_lab.estimate import (Method, batch_local, gradients, lab_methods, shipped_methods,
                                        token_logprobs)
from turnrl.bench.credit_lab.exact import exact, policy_point
from turnrl.bench.credit_lab.mdp import make_mdp
from turnrl.envs.base import MultiTurnEnv  # noqa: F401  (the package imports cleanly beside the envs)

from tests.tolerances import float_tol, max_abs

MDP = make_mdp("corridor", length=3, horizon=6, slip=0.1, stop_prob=0.1)
THETA = policy_point(MDP, seed=0)
EXACT = exact(MDP, THETA)
PI = torch.softmax(THETA, dim=1).numpy()


def one_chunk(batches=6, group_size=4, seed=0):
    return next(lab_batches(MDP, PI, group_size, batches, EXACT.values, seed, chunk=batches))


def test_trajectories_are_token_exact():
    rng = np.random.default_rng(0)
    episodes = sample_episodes(MDP, PI, np.array([0, 1, 0]), rng)
    log_pi = np.log(PI)
    for e, traj in enumerate(to_trajectories(MDP, episodes, log_pi, range(3))):
        k = episodes.lengths[e]
        assert traj.num_turns == k and len(traj.token_ids) == 2 * k
        assert traj.token_ids[0] == MDP.starts[episodes.starts[e]]
        for j, (start, end) in enumerate(traj.turn_spans):
            state, action = traj.token_ids[start - 1], traj.token_ids[start] - MDP.num_states
            assert end == start + 1 and traj.loss_mask[start] == 1 and traj.loss_mask[start - 1] == 0
            assert traj.logprobs[start] == pytest.approx(float(np.log(PI[state, action])))
            assert traj.state_keys[j] == MDP.state_names[state]
        assert traj.reward == pytest.approx(episodes.rewards[e].sum())
        assert (traj.termination == "terminated") == bool(episodes.ended[e])


def test_exact_values_sit_on_each_turns_action_token():
    lb = one_chunk()
    batch = lb.batch
    rows, cols = torch.nonzero(batch.loss_mask, as_tuple=True)
    for r, c in zip(rows.tolist()[:40], cols.tolist()[:40]):
        turn, state = int(batch.turn_index[r, c]), int(batch.input_ids[r, c - 1])
        exact_value = float(EXACT.values[turn, state])  # float64, stored in float32: one rounding
        assert float(lb.values[r, c]) == pytest.approx(exact_value, abs=float_tol(torch.float32, 1, abs(exact_value)))
    assert torch.all(lb.values[batch.loss_mask == 0] == 0)


@pytest.mark.parametrize("label", ["rloo", "ppo", "gspo", "cispo", "turn_returns"])
def test_hand_chain_rule_equals_autograd(label):
    method = next(m for m in lab_methods() if m.label == label)
    lb = one_chunk(batches=1)
    got = gradients(method, lb, THETA)[0]
    theta = THETA.clone().requires_grad_(True)
    batch = lb.batch if not method.critic else dataclasses.replace(lb.batch, values=lb.values)
    adv = method.estimator()(batch, **method.kwargs)
    from turnrl.algorithms.losses.policy import POLICY_LOSSES, policy_loss_settings

    loss_fn = POLICY_LOSSES.get(method.loss.policy_loss)
    loss, _ = loss_fn(token_logprobs(theta, batch), batch.old_logprobs.double(), adv,
                      AGGREGATIONS.get(method.loss.loss_agg)(batch.loss_mask), **policy_loss_settings(loss_fn, method.loss))
    (want,) = torch.autograd.grad(-loss, theta)
    # the same float32 advantages, float64 sums over the tokens in another order
    tol = float_tol(torch.float64, int(batch.loss_mask.sum()), max_abs(want))
    torch.testing.assert_close(got, want, rtol=0, atol=tol)


def test_reinforce_gradient_by_hand():
    lb = one_chunk(batches=1)
    batch = lb.batch
    got = gradients(Method("reinforce", "reinforce", loss=LossConfig(loss_agg="seq-mean-token-sum")), lb, THETA)[0]
    want = torch.zeros_like(THETA)
    pi = torch.softmax(THETA, dim=1)
    for i in range(len(batch)):
        for t in torch.nonzero(batch.loss_mask[i]).flatten().tolist():
            state, action = int(batch.input_ids[i, t - 1]), int(batch.input_ids[i, t]) - MDP.num_states
            k = int(batch.turn_index[i, t])
            return_to_go = float(batch.turn_rewards[i, k:].sum())
            want[state] -= return_to_go * pi[state] / len(batch)
            want[state, action] += return_to_go / len(batch)
    # the returns to go summed here in float32 (the lab's in float64): float32's rounding over the tokens
    tol = float_tol(torch.float32, int(batch.loss_mask.sum()), max_abs(want))
    torch.testing.assert_close(got, want, rtol=0, atol=tol)


def test_batches_collated_together_stay_apart():
    lb = one_chunk(batches=5)
    for method in lab_methods():
        together = gradients(method, lb, THETA, per_batch=False)
        apart = gradients(method, lb, THETA, per_batch=True)
        local = batch_local(method, lb)
        if local:
            # float32 advantages from float64 statistics summed in another order may round one float32
            # ulp apart: float32's rounding over the tokens, at the gradient's size
            tol = float_tol(torch.float32, int(lb.batch.loss_mask.sum()), max_abs(apart))
            torch.testing.assert_close(together, apart, rtol=0, atol=tol)
        # whitening over the whole batch is what makes an estimator batch-global
        whitens = method.advantage in ("reinforce_pp", "reinforce_pp_baseline") or method.kwargs.get("normalize") is True
        assert local == (not whitens), method.label
    # the default (batch by batch) equals each batch on its own
    ppo = next(m for m in lab_methods() if m.label == "ppo")
    alone = torch.cat([gradients(ppo, LabBatch(lb.batch.rows(rows), lb.values[rows], (slice(0, rows.stop - rows.start),)),
                                 THETA) for rows in lb.slices])
    tol = float_tol(torch.float32, int(lb.batch.loss_mask.sum()), max_abs(alone))  # as above
    torch.testing.assert_close(gradients(ppo, lb, THETA), alone, rtol=0, atol=tol)
    assert not torch.allclose(gradients(ppo, lb, THETA, per_batch=False), alone)


def test_every_algorithm_config_is_a_lab_method():
    labels = {m.label for m in shipped_methods()}
    assert {"grpo", "rloo", "gigpo", "mt_grpo", "turn_returns", "ppo", "turn_gae", "bilevel_gae", "turn_ppo", "gspo",
            "cispo"} <= labels
    assert {m.loss.policy_loss for m in shipped_methods()} == {"ppo_clip", "gspo", "cispo", "turn_ppo"}
