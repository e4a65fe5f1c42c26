"""Facts the credit lab must reproduce, as statistical tests with a fixed seed.

Each "unbiased" assertion is the lab's test of ``E[g] = c * grad J`` (``stats.summarize``: a t
test of the scale, a sign-flip test of the direction) at level 1e-3: were the sampling seed
random, an unbiased estimator would fail it with probability about 1e-3 (about 0.6% for the six
below together); the seed is fixed, so the outcome is too. Every estimator runs
through the real path: trajectories, ``collate``, the registered estimator, the aggregation,
the policy loss.
"""

import pytest

import torch

from turnrl.bench.credit_lab.episodes import lab_batches
from turnrl.bench.credit_lab.estimate import batch_local, gradients, lab_methods
from turnrl.bench.credit_lab.exact import exact, policy_point
from turnrl.bench.credit_lab.mdp import make_mdp
from turnrl.bench.credit_lab.stats import summarize, t_test_p

pytestmark = pytest.mark.slow  # about 30 s of sampling on 2 quiet cores

ALPHA = 1e-3
METHODS = {m.label: m for m in lab_methods()}


def lab_gradients(labels, mdp, group_size, batches, aggregation="seq-mean-token-sum", seed=0):
    theta = policy_point(mdp, seed=0)
    ex = exact(mdp, theta)
    pi = torch.softmax(theta, dim=1).numpy()
    out = {label: [] for label in labels}
    for i, lb in enumerate(lab_batches(mdp, pi, group_size, batches, ex.values, seed)):
        for label in labels:
            assert i or batch_local(METHODS[label], lb)  # so all batches of a chunk go through at once
            out[label].append(gradients(METHODS[label], lb, theta, aggregation, per_batch=False))
    return {label: torch.cat(g).flatten(1) for label, g in out.items()}, ex.gradient.flatten()


@pytest.fixture(scope="module")
def ragged():
    """Sparse outcome reward, episodes of 1 to 8 turns (goal or a 15% stop each turn), 2 tasks."""
    mdp = make_mdp("corridor", length=3, horizon=8, stop_prob=0.15)
    labels = ["reinforce", "rloo", "turn_returns", "turn_loo_padded", "ppo_raw", "turn_gae_raw", "dr_grpo"]
    return lab_gradients(labels, mdp, group_size=4, batches=3000)


@pytest.mark.parametrize("label", ["reinforce", "rloo", "turn_returns", "turn_loo_padded", "ppo_raw",
                                   "turn_gae_raw"])
def test_unbiased_estimators_stay_unbiased(ragged, label):
    grads, true = ragged
    p = summarize(grads[label], true)["p_unbiased"]
    assert p > ALPHA, f"{label}: E[g] != grad J rejected, p = {p:.2e}"


def test_group_mean_baseline_scales_the_gradient_by_one_minus_one_over_g(ragged):
    grads, true = ragged
    # R_i - mean over the group including i = (1 - 1/G) * (R_i - mean over the others)
    along = grads["dr_grpo"] @ true / true.norm()
    assert t_test_p(along, 0.75 * float(true.norm())) > ALPHA
    figures = summarize(grads["dr_grpo"], true)
    assert figures["p_scale"] < 1e-10 and figures["p_direction"] > ALPHA


def test_turn_baseline_including_the_sample_itself_is_detected():
    mdp = make_mdp("corridor", length=3, horizon=10, stop_prob=0.2, shaped=True)
    grads, true = lab_gradients(["turn_mean_incl_self", "turn_loo_padded"], mdp, group_size=3, batches=3000)
    biased = summarize(grads["turn_mean_incl_self"], true)
    assert biased["p_unbiased"] < 1e-10  # the mean is off ...
    assert biased["p_direction"] < ALPHA  # ... and not only in scale: turns are reweighted
    fair = summarize(grads["turn_loo_padded"], true)
    assert fair["p_unbiased"] > ALPHA and fair["p_direction"] > ALPHA
