"""Episodes of a tabular MDP as the project's trajectories, collated into ``TrainBatch``es.

Each turn is two tokens: the observation (the state's token, id ``s``) and the action the
policy samples (id ``S + a``, on the loss mask, with the sampler's logprob ``log pi(a | s)``).
The trajectories carry the env's turn rewards, success, termination and a ``state_key`` per
turn (the state's name, GiGPO's anchor), exactly as the rollout collector would write them,
and go through ``turnrl.algorithms.batch.collate``, so every estimator sees the batch an LLM
run would give it.

Episodes can also be ended by the infrastructure (``InfraFailures``): as the rollout collector
writes them (``termination="env_error"``), then collated under ``trainer.infra_failures``' policy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch

from turnrl.algorithms.batch import TrainBatch, collate
from turnrl.bench.credit_lab.mdp import TabularMDP
from turnrl.rollout.trajectory import Trajectory
from turnrl.rollout.termination import INFRA_FAILURE_POLICIES


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


INFRA_MODELS = ("reset", "step")


@dataclass(frozen=True)
class InfraFailures:
    """Episodes the infrastructure ends, and what the run does with them.

    Attributes:
        rate: the chance of a failure: per episode (``"reset"``) or per env step (``"step"``).
        model: ``"reset"``: the episode fails before its first turn, whatever the policy would
            have done (a sandbox that did not start, an env server down): no turns, reward 0.
            ``"step"``: each env step raises with chance ``rate`` (a flaky server or tool): the
            episode keeps its turns up to the one whose step raised, that turn's reward 0, so a
            longer episode fails more often.
        policy: ``trainer.infra_failures``: ``"drop"``, ``"keep"`` or ``"refill"`` (a failed
            episode is sampled again once, same task; one that fails again is dropped).
    """

    rate: float = 0.0
    model: str = "step"
    policy: str = "drop"

    def __post_init__(self):
        if self.model not in INFRA_MODELS or self.policy not in INFRA_FAILURE_POLICIES or not 0 <= self.rate < 1:
            raise ValueError(f"InfraFailures needs a rate in [0, 1), a model in {INFRA_MODELS} and a policy in "
                             f"{INFRA_FAILURE_POLICIES}; got {self.rate!r}, {self.model!r}, {self.policy!r}")


def crashes(episodes: Episodes, infra: InfraFailures, rng: np.random.Generator) -> np.ndarray:
    """``[E]`` the turns each episode kept before the infrastructure ended it (0 for a failed
    reset; ``j`` when the step of turn ``j`` raised), -1 for an episode that did not fail."""
    n = len(episodes.lengths)
    if infra.model == "reset":
        return np.where(rng.random(n) < infra.rate, 0, -1)
    width = episodes.states.shape[1]
    raised = (rng.random((n, width)) < infra.rate) & (np.arange(width)[None, :] < episodes.lengths[:, None])
    return np.where(raised.any(axis=1), raised.argmax(axis=1) + 1, -1)


def with_failures(mdp: TabularMDP, pi: np.ndarray, episodes: Episodes, infra: InfraFailures,
                  rng: np.random.Generator) -> tuple[Episodes, np.ndarray, np.ndarray]:
    """``(episodes, crash [E], attempts [E])``: which episodes the infrastructure ended
    (``crashes``); under ``refill`` each failed one sampled again once in its place (same
    task), which may fail again."""
    crash = crashes(episodes, infra, rng)
    attempts = np.ones(len(crash), dtype=int)
    again = np.flatnonzero(crash >= 0)
    if infra.policy == "refill" and len(again):
        redo = sample_episodes(mdp, pi, episodes.starts[again], rng)
        fields = {}
        for name in ("states", "actions", "rewards", "lengths", "ended", "succeeded"):
            value = getattr(episodes, name).copy()
            value[again] = getattr(redo, name)
            fields[name] = value
        episodes = replace(episodes, **fields)
        crash[again] = crashes(redo, infra, rng)
        attempts[again] = 2
    return episodes, crash, attempts


def to_trajectories(mdp: TabularMDP, episodes: Episodes, log_pi: np.ndarray, rows: range,
                    crash: np.ndarray | None = None, attempts: np.ndarray | None = None) -> list[Trajectory]:
    """The trajectories of episodes ``rows`` (group id = task index); with ``crash``
    (``with_failures``), those the infrastructure ended cut to their kept turns, the last of
    them (whose step raised) rewarded 0, ``termination="env_error"``."""
    num_states = mdp.num_states
    out = []
    for e in rows:
        failed = crash is not None and crash[e] >= 0
        k = int(crash[e]) if failed else int(episodes.lengths[e])
        s, a = episodes.states[e, :k], episodes.actions[e, :k]
        tokens = np.empty(2 * k, dtype=int)
        tokens[0::2], tokens[1::2] = s, num_states + a
        mask = [0, 1] * k
        logprobs = np.zeros(2 * k)
        logprobs[1::2] = log_pi[s, a]
        task = int(episodes.starts[e])
        rewards = episodes.rewards[e, :k].tolist()
        if failed and k:
            rewards[-1] = 0.0  # the step raised: no reward for its turn
        out.append(Trajectory(
            token_ids=tokens.tolist(), loss_mask=mask, logprobs=logprobs.tolist(),
            turn_spans=[(2 * j + 1, 2 * j + 2) for j in range(k)], turn_rewards=rewards,
            success=bool(episodes.succeeded[e]) and not failed, group_id=task, task_id=f"start{mdp.starts[task]}",
            termination="env_error" if failed else "terminated" if episodes.ended[e] else "truncated",
            state_keys=[mdp.state_names[x] for x in s], error="injected" if failed else None,
            attempts=1 if attempts is None else int(attempts[e])))
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
        failed: the fraction of the episodes the infrastructure ended (after any refill).
    """

    batch: TrainBatch
    values: torch.Tensor
    slices: tuple[slice, ...]
    failed: float = 0.0


def exact_token_values(batch: TrainBatch, num_states: int, values: torch.Tensor) -> torch.Tensor:
    """``[N, T]``: ``V_k(s)`` at the action token of turn ``k`` taken in state ``s`` (the
    token before it), 0 elsewhere; ``values [H + 1, S]`` from ``exact.backward_induction``."""
    prev = torch.cat([torch.zeros_like(batch.input_ids[:, :1]), batch.input_ids[:, :-1]], dim=1)
    state = prev.clamp(max=num_states - 1)
    turn = batch.turn_index.clamp(min=0)
    return values.to(torch.float32)[turn, state] * batch.loss_mask


def lab_batches(mdp: TabularMDP, pi: np.ndarray, group_size: int, num_batches: int, values: torch.Tensor,
                seed: int, chunk: int = 100, infra: InfraFailures | None = None) -> Iterator[LabBatch]:
    """``num_batches`` independent batches, each holding every task ``group_size`` times,
    yielded ``chunk`` at a time as one ``LabBatch``; with ``infra`` (a positive rate), episodes
    the infrastructure ends (``with_failures``), collated under ``infra.policy``."""
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
        crash = attempts = None
        if infra is not None and infra.rate > 0:  # (no draws otherwise: the same batches as before)
            episodes, crash, attempts = with_failures(mdp, pi, episodes, infra, rng)
        trajectories = to_trajectories(mdp, episodes, log_pi, range(m * per_batch), crash, attempts)
        for row, traj in enumerate(trajectories):  # groups of different batches stay apart
            traj.group_id += (row // per_batch) * tasks_per_batch
        batch = collate(trajectories, pad_id=0, infra_failures="drop" if infra is None else infra.policy)
        slices = tuple(slice(b * per_batch, (b + 1) * per_batch) for b in range(m))
        failed = 0.0 if crash is None else float((crash >= 0).mean())
        yield LabBatch(batch, exact_token_values(batch, mdp.num_states, values), slices, failed)
