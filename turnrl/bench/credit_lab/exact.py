"""Exact values and the exact policy gradient of a tabular softmax policy.

The policy is ``pi(a | s) = softmax(theta[s])_a`` with ``theta [S, A]``, the same in every
turn. Backward induction over turns gives, for the turn ``t = 0..H-1`` an episode is in,

    Q_t(s, a) = sum_s' P(s' | s, a) (R(s, a, s') + [s' not terminal] V_{t+1}(s')),
    V_t(s) = sum_a pi(a | s) Q_t(s, a),    V_H = 0,

and the objective ``J(theta) = mean over tasks of V_0(start)`` (undiscounted expected return).
Its gradient is exact: ``torch.autograd`` differentiates the recursion (float64), which
equals the policy-gradient theorem's ``sum_t E[d_t(s) pi(a|s) (Q_t - V_t)]`` and the sum over
every trajectory (checked by tests on small MDPs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from turnrl.bench.credit_lab.mdp import TabularMDP

DTYPE = torch.float64


@dataclass(frozen=True)
class Exact:
    """Exact quantities of one policy on one MDP.

    Attributes:
        objective: ``J``, the mean over tasks of the expected return.
        gradient: ``[S, A]`` ``dJ / dtheta``.
        values: ``[H + 1, S]`` ``V_t(s)`` (0 at terminal states and at ``t = H``).
        q_values: ``[H, S, A]`` ``Q_t(s, a)``.
        success: the mean over tasks of the probability of ending in a success state.
    """

    objective: float
    gradient: torch.Tensor
    values: torch.Tensor
    q_values: torch.Tensor
    success: float


def backward_induction(mdp: TabularMDP, pi: torch.Tensor, reward: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(V [H + 1, S], Q [H, S, A])`` of policy ``pi [S, A]`` (differentiable in ``pi``);
    ``reward [S, A, S]`` replaces ``mdp.R`` (e.g. the success indicator)."""
    P = torch.as_tensor(mdp.P, dtype=pi.dtype)
    R = torch.as_tensor(mdp.R if reward is None else reward, dtype=pi.dtype)
    alive = torch.as_tensor(~mdp.terminal, dtype=pi.dtype)
    values = [torch.zeros(mdp.num_states, dtype=pi.dtype)]
    qs = []
    for _ in range(mdp.horizon):
        q = (P * (R + alive[None, None, :] * values[-1][None, None, :])).sum(dim=2)
        qs.append(q)
        values.append((pi * q).sum(dim=1) * alive)
    return torch.stack(values[::-1]), torch.stack(qs[::-1])


def exact(mdp: TabularMDP, theta: torch.Tensor) -> Exact:
    """Objective, gradient, values and success probability of ``softmax(theta)`` on ``mdp``."""
    theta = theta.detach().to(DTYPE).requires_grad_(True)
    pi = torch.softmax(theta, dim=1)
    values, q = backward_induction(mdp, pi)
    starts = list(mdp.starts)
    objective = values[0, starts].mean()
    (gradient,) = torch.autograd.grad(objective, theta)
    win = np.zeros_like(mdp.R)
    win[:, :, mdp.success] = 1.0
    with torch.no_grad():
        win_values, _ = backward_induction(mdp, pi.detach(), torch.as_tensor(win))
    return Exact(float(objective.detach()), gradient, values.detach(), q.detach(), float(win_values[0, starts].mean()))


def optimal_advantage(mdp: TabularMDP) -> np.ndarray:
    """``[S, A]`` ``Q*_0(s, a) - V*_0(s)`` of the optimal finite-horizon policy from turn 0."""
    v = np.zeros(mdp.num_states)
    q = np.zeros((mdp.num_states, mdp.num_actions))
    alive = ~mdp.terminal
    for _ in range(mdp.horizon):
        q = (mdp.P * (mdp.R + alive[None, None, :] * v[None, None, :])).sum(axis=2)
        v = q.max(axis=1) * alive
    return q - q.max(axis=1, keepdims=True)


def policy_point(mdp: TabularMDP, competence: float = 1.0, noise: float = 0.5, seed: int = 0) -> torch.Tensor:
    """``theta [S, A]`` at which gradients are measured: a policy part way through training.

    ``theta = competence * A* / max|A*| + noise * N(0, 1)``: ``competence = 0`` and ``noise = 0``
    is the uniform policy; larger ``competence`` leans towards the optimal actions.
    """
    adv = optimal_advantage(mdp)
    scale = np.abs(adv).max()
    base = adv / scale if scale > 0 else adv
    rng = np.random.default_rng(seed)
    return torch.as_tensor(competence * base + noise * rng.standard_normal(base.shape), dtype=DTYPE)
