"""The lab's exact gradient is the policy gradient: equal to a sum over every trajectory and
to finite differences of the objective."""

import itertools

import numpy as np
import pytest
import torch

from turnrl.bench.credit_lab.exact import backward_induction, exact, policy_point
from turnrl.bench.credit_lab.mdp import make_mdp


def enumerate_objective(mdp, theta):
    """``J(theta)`` and ``E[R grad log p(tau)]``, summed over every trajectory (float64)."""
    pi = torch.softmax(theta, dim=1)
    total = torch.zeros((), dtype=theta.dtype)
    score_sum = torch.zeros_like(theta)
    s, a = mdp.num_states, mdp.num_actions
    for start in mdp.starts:
        stack = [(start, 0, 1.0, 0.0, torch.zeros_like(theta))]
        while stack:
            state, t, prob, ret, score = stack.pop()
            if t == mdp.horizon or mdp.terminal[state]:
                total = total + prob * ret / len(mdp.starts)
                score_sum += prob * ret * score / len(mdp.starts)
                continue
            for action, nxt in itertools.product(range(a), range(s)):
                p = float(pi[state, action]) * mdp.P[state, action, nxt]
                if p == 0.0:
                    continue
                step_score = score.clone()
                step_score[state] -= pi[state]
                step_score[state, action] += 1.0
                stack.append((nxt, t + 1, prob * p, ret + mdp.R[state, action, nxt], step_score))
    return float(total), score_sum


@pytest.mark.parametrize("name, kwargs", [
    ("corridor", {"length": 2, "horizon": 4, "slip": 0.2, "stop_prob": 0.1, "shaped": True}),
    ("key_door", {"length": 2, "horizon": 5, "slip": 0.1}),
    ("key_door", {"length": 2, "horizon": 5, "slip": 0.1, "bare_door": 0.3, "stop_prob": 0.1}),
    ("bandit_chain", {"horizon": 3, "contexts": 2, "arms": 2, "stop_prob": 0.2}),
])
def test_gradient_equals_the_sum_over_every_trajectory(name, kwargs):
    mdp = make_mdp(name, **kwargs)
    theta = policy_point(mdp, competence=0.7, noise=0.6, seed=3)
    ex = exact(mdp, theta)
    objective, score_sum = enumerate_objective(mdp, theta.to(torch.float64))
    assert ex.objective == pytest.approx(objective, rel=1e-10, abs=1e-12)
    torch.testing.assert_close(ex.gradient, score_sum, rtol=1e-8, atol=1e-10)


def test_gradient_equals_finite_differences():
    mdp = make_mdp("key_door", length=3, horizon=10, slip=0.1, stop_prob=0.05)
    theta = policy_point(mdp, seed=1)
    grad = exact(mdp, theta).gradient
    h = 1e-6
    for s, a in [(0, 0), (1, 1), (4, 0), (6, 1)]:
        up, down = theta.clone(), theta.clone()
        up[s, a] += h
        down[s, a] -= h
        fd = (exact(mdp, up).objective - exact(mdp, down).objective) / (2 * h)
        assert float(grad[s, a]) == pytest.approx(fd, rel=1e-5, abs=1e-9)


def test_values_and_success():
    mdp = make_mdp("corridor", length=3, horizon=3, slip=0.0)
    always_right = torch.tensor([[-30.0, 30.0]] * mdp.num_states, dtype=torch.float64)
    ex = exact(mdp, always_right)
    # start 0 needs all 3 turns, start 1 two: both reach the goal
    assert ex.success == pytest.approx(1.0) and ex.objective == pytest.approx(1.0)
    assert float(ex.values[0, 0]) == pytest.approx(1.0) and float(ex.values[1, 0]) == pytest.approx(0.0, abs=1e-12)
    values, q = backward_induction(mdp, torch.softmax(always_right, dim=1))
    assert values.shape == (4, mdp.num_states) and q.shape == (3, mdp.num_states, 2)
    assert torch.all(values[-1] == 0)


def test_policy_point_and_mdp_checks():
    mdp = make_mdp("bandit_chain", horizon=4)
    assert torch.all(policy_point(mdp, competence=0.0, noise=0.0) == 0)
    leaning = torch.softmax(policy_point(mdp, competence=2.0, noise=0.0), dim=1)
    best = np.argmax(mdp.R[:, :, 0], axis=1)
    assert all(leaning[s, best[s]] > 0.5 for s in range(mdp.num_states))
    with pytest.raises(ValueError, match="stop_prob"):
        make_mdp("corridor", stop_prob=1.0)
    with pytest.raises(TypeError, match="takes"):
        make_mdp("corridor", size=3)
    with pytest.raises(KeyError, match="valid names"):
        make_mdp("maze")


def test_a_bare_door_grades_the_outcomes():
    """The door opened without the key ends the episode with the lesser reward, not a success;
    without ``bare_door`` the MDP is the binary one."""
    binary = make_mdp("key_door", length=3, horizon=8)
    graded = make_mdp("key_door", length=3, horizon=8, bare_door=0.3)
    assert graded.num_states == binary.num_states + 1 and graded.state_names[-1] == "forced"
    live = ~graded.terminal[:, None, None] & (graded.P > 0)  # transitions that happen
    ending = {round(float(r), 6) for r in graded.R[live & graded.terminal[None, None, :]]}
    assert ending == {0.3, 1.0} and not graded.success[-1] and graded.terminal[-1]
    def right(mdp):
        return torch.tensor([[-30.0, 30.0]] * mdp.num_states, dtype=torch.float64)

    # always right: the task without the key forces the door (0.3), the one with it opens it (1)
    assert exact(graded, right(graded)).objective == pytest.approx((0.3 + 1.0) / 2)
    assert exact(graded, right(graded)).success == pytest.approx(0.5)
    assert exact(binary, right(binary)).objective == pytest.approx(0.5)
