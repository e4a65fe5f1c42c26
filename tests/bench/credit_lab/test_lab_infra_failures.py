"""Episodes the infrastructure ends, in the credit lab: how they are injected (as the collector
writes them), and the bias of each ``trainer.infra_failures`` policy against the exact gradient.

The statistical test is the lab's test of ``E[g] = grad J`` (``stats.summarize``) at level 1e-3, as in
``test_unbiased.py``: with a random seed an unbiased method would fail it with probability
1e-3; the seed is fixed, so the outcome is too.
"""

import numpy as np
import pytest
import torch

from turnrl.bench.credit_lab.episodes import InfraFailures, lab_batches, sample_episodes, to_trajectories, with_failures
from turnrl.bench.credit_lab.estimate import batch_local, gradients, lab_methods
from turnrl.bench.credit_lab.exact import exact, policy_point
from turnrl.bench.credit_lab.mdp import make_mdp
from turnrl.bench.credit_lab.stats import summarize

ALPHA = 1e-3
METHODS = {m.label: m for m in lab_methods()}


def test_failed_episodes_are_written_as_the_collector_writes_them():
    mdp = make_mdp("corridor", length=3, horizon=8, stop_prob=0.1)
    theta = policy_point(mdp, seed=0)
    pi = torch.softmax(theta, dim=1).numpy()
    log_pi = np.log(pi)
    tasks = np.repeat(np.arange(len(mdp.starts)), 200)
    clean = sample_episodes(mdp, pi, tasks, np.random.default_rng(0))
    for model in ("reset", "step"):
        episodes, crash, attempts = with_failures(mdp, pi, clean, InfraFailures(0.1, model, "keep"),
                                                  np.random.default_rng(1))
        assert (attempts == 1).all() and (crash >= 0).any() and (crash < 0).any()
        trajectories = to_trajectories(mdp, episodes, log_pi, range(len(tasks)), crash, attempts)
        for e, traj in enumerate(trajectories):
            if crash[e] < 0:
                assert traj.termination in ("terminated", "truncated") and traj.num_turns == clean.lengths[e]
                continue
            assert traj.termination == "env_error" and not traj.success
            assert traj.num_turns == crash[e] == (0 if model == "reset" else traj.num_turns) <= clean.lengths[e]
            if traj.num_turns:  # the turns before the one whose step raised keep their rewards
                assert traj.turn_rewards[:-1] == clean.rewards[e, : traj.num_turns - 1].tolist()
                assert traj.turn_rewards[-1] == 0.0
    # refill: each failed episode sampled again once in its place; only a second failure stays
    episodes, crash, attempts = with_failures(mdp, pi, clean, InfraFailures(0.3, "reset", "refill"),
                                              np.random.default_rng(2))
    again = attempts == 2
    assert again.any() and (episodes.starts == clean.starts).all()
    assert (crash[~again] < 0).all() and 0 < (crash[again] >= 0).mean() < 1


def test_no_failures_draw_nothing_the_batches_are_the_usual_ones():
    mdp = make_mdp("bandit_chain", horizon=4)
    theta = policy_point(mdp, seed=0)
    ex = exact(mdp, theta)
    pi = torch.softmax(theta, dim=1).numpy()
    plain = next(lab_batches(mdp, pi, 4, 10, ex.values, seed=3))
    none = next(lab_batches(mdp, pi, 4, 10, ex.values, seed=3, infra=InfraFailures(0.0, "step", "keep")))
    assert torch.equal(plain.batch.input_ids, none.batch.input_ids) and none.failed == 0.0
    with pytest.raises(ValueError, match="a model in"):
        InfraFailures(0.1, "sometimes", "drop")


@pytest.mark.slow  # about 30 s of sampling on 2 quiet cores
def test_keep_is_biased_and_drop_and_refill_are_not():
    """A fixed-length bandit chain (8 turns, a reward every turn) whose env steps raise 2% of the
    time: 1 - 0.98^8 = 15% of the episodes fail. Kept with reward 0, a failure's turns count
    the returns of a truncated episode, so the expected gradient shrinks (to about 0.92 of the
    exact one) and the scale test rejects it; dropped (the episodes that did not fail are
    samples of the policy: failing does not depend on what the episode did, every episode being
    8 turns long) or sampled again, the gradient is unbiased."""
    mdp = make_mdp("bandit_chain", horizon=8)
    theta = policy_point(mdp, seed=0)
    ex = exact(mdp, theta)
    pi = torch.softmax(theta, dim=1).numpy()
    labels, batches, group_size = ("rloo", "turn_returns"), 2000, 4
    failing = 1 - 0.98 ** 8
    for policy in ("keep", "drop", "refill"):
        grads = {label: [] for label in labels}
        failed = []
        for lb in lab_batches(mdp, pi, group_size, batches, ex.values, seed=0,
                              infra=InfraFailures(0.02, "step", policy)):
            failed.append(lb.failed)
            for label in labels:
                grads[label].append(gradients(METHODS[label], lb, theta, "seq-mean-token-sum",
                                              per_batch=not batch_local(METHODS[label], lb)))
        episodes = batches * group_size * len(mdp.starts)
        expected = failing ** 2 if policy == "refill" else failing  # a refill fails again at the same rate
        assert abs(np.mean(failed) - expected) <= 4 * np.sqrt(expected * (1 - expected) / episodes)
        for label in labels:
            figures = summarize(torch.cat(grads[label]).flatten(1), ex.gradient.flatten())
            if policy == "keep":
                assert figures["p_unbiased"] < ALPHA and figures["scale"] < 1, (policy, label, figures)
            else:
                assert figures["p_unbiased"] > ALPHA, (policy, label, figures)
