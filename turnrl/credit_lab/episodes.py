"""Episodes of a tabular MDP as the project's trajectories, collated into ``TrainBatch``es.

Each turn is two tokens: the observation (the state's token, id ``s``) and the action the
policy samples (id ``S + a``, on the loss mask, with the sampler's logprob ``log pi(a | s)``).
The trajectories carry the env's turn rewards, success, termination and a ``state_key`` per
turn (the state's name, GiGPO's anchor), exactly as the rollout collector would write them,
and go through ``turnrl.algorithms.batch.collate``, so every estimator sees the batch an LLM
run would give it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from turnrl.algorithms.batch import TrainBatch, collate
from turnrl.credit_lab.mdp import TabularMDP
from turnrl.rollout.trajectory import Trajectory


@dataclass(frozen=True)
class Episodes:
    """``E`` sampled episodes, padded to the horizon ``H``.

    Attributes:
        states: ``[E, H]`` state at the start of each turn (-1 past the end).
        actions: ``[E, H]`` (-1 past the end).
        rewards: ``[E, H]`` (0 past the end).
        lengths: ``[E]`` turns played.
        ended: ``[E]`` bool, entered a terminal state (else truncated at the horizon).
        succeeded: ``[E]`` bool, ended in a success state.
        starts: ``[E]`` the task (index into ``mdp.starts``) of each episode.
    """

    states: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    lengths: np.ndarray
    ended: np.ndarray
    succeeded: np.ndarray
    starts: np.ndarray


def _draw(cdf: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One index per row of ``cdf [E, n]`` (cumulative probabilities)."""
    u = rng.random(cdf.shape[0])[:, None]
    return np.minimum((u > cdf).sum(axis=1), cdf.shape[1] - 1)


def sample_episodes(mdp: TabularMDP, pi: np.ndarray, tasks: np.ndarray, rng: np.random.Generator) -> Episodes:
    """Play ``len(tasks)`` episodes of policy ``pi [S, A]`` at once (task ``tasks[e]`` starts
    from ``mdp.starts[tasks[e]]``)."""
    n, h = len(tasks), mdp.horizon
    states = np.full((n, h), -1)
    actions = np.full((n, h), -1)
    rewards = np.zeros((n, h))
    lengths = np.zeros(n, dtype=int)
    ended = np.zeros(n, bool)
    state = np.asarray(mdp.starts)[tasks]
    pi_cdf, p_cdf = np.cumsum(pi, axis=1), np.cumsum(mdp.P, axis=2)
    for t in range(h):
        live = np.flatnonzero(~ended)
        if not len(live):
            break
        s = state[live]
        a = _draw(pi_cdf[s], rng)
        s2 = _draw(p_cdf[s, a], rng)
        states[live, t], actions[live, t] = s, a
        rewards[live, t] = mdp.R[s, a, s2]
        lengths[live] = t + 1
        ended[live] = mdp.terminal[s2]
        state[live] = s2
    succeeded = ended & mdp.success[state]
    return Episodes(states, actions, rewards, lengths, ended, succeeded, np.asarray(tasks))


def to_trajectories(mdp: TabularMDP, episodes: Episodes, log_pi: np.ndarray, rows: range) -> list[Trajectory]:
    """The trajectories of episodes ``rows`` (group id = task index)."""
    num_states = mdp.num_states
    out = []
    for e in rows:
        k = int(episodes.lengths[e])
        s, a = episodes.states[e, :k], episodes.actions[e, :k]
        tokens = np.empty(2 * k, dtype=int)
        tokens[0::2], tokens[1::2] = s, num_states + a
        mask = [0, 1] * k
        logprobs = np.zeros(2 * k)
        logprobs[1::2] = log_pi[s, a]
        task = int(episodes.starts[e])
        out.append(Trajectory(
            token_ids=tokens.tolist(), loss_mask=mask, logprobs=logprobs.tolist(),
            turn_spans=[(2 * j + 1, 2 * j + 2) for j in range(k)], turn_rewards=episodes.rewards[e, :k].tolist(),
            success=bool(episodes.succeeded[e]), group_id=task, task_id=f"start{mdp.starts[task]}",
            termination="terminated" if episodes.ended[e] else "truncated",
            state_keys=[mdp.state_names[x] for x in s]))
    return out


@dataclass(frozen=True)
class LabBatch:
    """``M`` independent batches collated as one (their groups numbered apart), and what the
    lab knows beyond the tokens.

    Attributes:
        batch: the ``TrainBatch`` of all ``M * N`` rows (``N`` = tasks x group size per batch;
            batch ``b`` is rows ``slices[b]``, its task ``j`` is group ``b * tasks + j``).
        values: ``[M * N, T]`` the exact ``V_k(s_k)`` at each turn's action token (0 elsewhere),
            for the critic-based estimators.
        slices: the rows of each batch.
    """

    batch: TrainBatch
    values: torch.Tensor
    slices: tuple[slice, ...]


def exact_token_values(batch: TrainBatch, num_states: int, values: torch.Tensor) -> torch.Tensor:
    """``[N, T]``: ``V_k(s)`` at the action token of turn ``k`` taken in state ``s`` (the
    token before it), 0 elsewhere; ``values [H + 1, S]`` from ``exact.backward_induction``."""
    prev = torch.cat([torch.zeros_like(batch.input_ids[:, :1]), batch.input_ids[:, :-1]], dim=1)
    state = prev.clamp(max=num_states - 1)
    turn = batch.turn_index.clamp(min=0)
    return values.to(torch.float32)[turn, state] * batch.loss_mask


def lab_batches(mdp: TabularMDP, pi: np.ndarray, group_size: int, num_batches: int, values: torch.Tensor,
                seed: int, chunk: int = 100) -> Iterator[LabBatch]:
    """``num_batches`` independent batches, each holding every task ``group_size`` times,
    yielded ``chunk`` at a time as one ``LabBatch``."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    rng = np.random.default_rng(seed)
    tasks_per_batch = len(mdp.starts)
    per_batch = tasks_per_batch * group_size
    log_pi = np.log(np.maximum(pi, 1e-300))
    for first in range(0, num_batches, chunk):
        m = min(chunk, num_batches - first)
        tasks = np.tile(np.repeat(np.arange(tasks_per_batch), group_size), m)
        episodes = sample_episodes(mdp, pi, tasks, rng)
        trajectories = to_trajectories(mdp, episodes, log_pi, range(m * per_batch))
        for row, traj in enumerate(trajectories):  # groups of different batches stay apart
            traj.group_id += (row // per_batch) * tasks_per_batch
        batch = collate(trajectories, pad_id=0)
        slices = tuple(slice(b * per_batch, (b + 1) * per_batch) for b in range(m))
        yield LabBatch(batch, exact_token_values(batch, mdp.num_states, values), slices)
