"""The bias tests keep their stated false-alarm rate on the lab's own gradients, and reject
biased ones.

Estimators unbiased by construction (RLOO, the exact-value critic without whitening) give p-values
spread over (0, 1] across sampling seeds, none near 0, including the cell where Hotelling's test
once reported a certain bias (p = 0) for the exact critic: key-door at 32 turns, seed 2, 400
batches. A deliberately scaled or rotated copy of the same gradients, and GRPO on an MDP with
graded outcomes, are rejected.
"""

import pytest
import torch

from turnrl.bench.credit_lab.episodes import lab_batches
from turnrl.bench.credit_lab.estimate import gradients, lab_methods
from turnrl.bench.credit_lab.exact import exact, policy_point
from turnrl.bench.credit_lab.mdp import make_mdp
from turnrl.bench.credit_lab.stats import summarize

METHODS = {m.label: m for m in lab_methods()}
FLIPS = 999  # p-values on a grid of 1/1000: fine for a test at 1e-3 ... 1e-2, and quick


def lab_gradients(labels, mdp, group_size, batches, seed):
    theta = policy_point(mdp, seed=0)
    ex = exact(mdp, theta)
    pi = torch.softmax(theta, dim=1).numpy()
    out = {label: [] for label in labels}
    for lb in lab_batches(mdp, pi, group_size, batches, ex.values, seed):
        for label in labels:
            out[label].append(gradients(METHODS[label], lb, theta, "seq-mean-token-sum", per_batch=False))
    return {label: torch.cat(g).flatten(1) for label, g in out.items()}, ex.gradient.flatten()


@pytest.fixture(scope="module")
def seeds():
    """RLOO and the exact critic on a ragged sparse corridor, 10 seeds of 150 batches."""
    mdp = make_mdp("corridor", length=3, horizon=8, stop_prob=0.15)
    return [lab_gradients(("rloo", "ppo_raw"), mdp, 4, 150, seed) for seed in range(10)]


@pytest.mark.slow  # 10 seeds of sampling: about 8 s
@pytest.mark.parametrize("label", ["rloo", "ppo_raw"])
def test_unbiased_estimators_get_spread_p_values_over_seeds(seeds, label):
    figures = [summarize(grads[label], true, flips=FLIPS) for grads, true in seeds]
    for key in ("p_direction", "p_scale"):
        ps = sorted(f[key] for f in figures)
        assert ps[0] > 1e-3, (key, ps)  # 10 draws: one below 1e-3 has chance 1% (the seeds are fixed)
        assert sum(p > 0.3 for p in ps) >= 3, (key, ps)  # uniform: fewer than 3 of 10 above 0.3 has chance 0.2%


def test_scaled_and_rotated_copies_are_rejected():
    grads, true = lab_gradients(("rloo",), make_mdp("corridor", length=3, horizon=8, stop_prob=0.15), 4, 150, 0)
    g = grads["rloo"]
    scaled = summarize(1.5 * g, true, flips=FLIPS)
    assert scaled["p_scale"] < 1e-3 and scaled["p_direction"] > 1e-3  # a scale, no direction bias
    aside = torch.zeros_like(true)
    aside[torch.argmin(true.abs())] = 1.0
    aside -= (aside @ true) / (true @ true) * true
    rotated = summarize(g + 0.5 * true.norm() * aside / aside.norm(), true, flips=FLIPS)
    assert rotated["p_direction"] == 1 / (FLIPS + 1) and rotated["angle"] == pytest.approx(26.6, abs=5)


@pytest.mark.slow  # 400 batches of 32 turns: about 10 s
def test_the_exact_critic_at_key_door_h32_is_not_called_biased():
    mdp = make_mdp("key_door", length=10, horizon=32)
    grads, true = lab_gradients(("turn_gae_raw",), mdp, 8, 400, seed=2)
    figures = summarize(grads["turn_gae_raw"], true, flips=FLIPS)
    assert figures["p_direction"] > 1e-3 and figures["p_scale"] > 1e-3 and figures["p_unbiased"] > 1e-3


def test_grpo_with_graded_outcomes_is_biased_in_direction():
    """Rewards 0, 0.1 and 1: a group whose episodes differ by 0.1 is divided by a std of about
    0.05, so GRPO weighs "0.1 rather than 0" as much as "1 rather than 0" elsewhere."""
    mdp = make_mdp("key_door", length=4, horizon=8, bare_door=0.1)
    grads, true = lab_gradients(("grpo", "rloo"), mdp, 4, 200, seed=0)
    grpo = summarize(grads["grpo"], true, flips=FLIPS)
    rloo = summarize(grads["rloo"], true, flips=FLIPS)
    assert grpo["p_direction"] == 1 / (FLIPS + 1) and grpo["angle"] > 20 and grpo["nmse"] > 1.3 * rloo["nmse"]
    assert rloo["p_direction"] > 1e-3
