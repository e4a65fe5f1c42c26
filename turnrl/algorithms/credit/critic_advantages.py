"""Critic-based estimators (PPO's GAE, the bi-level turn GAEs, Turn-PPO's turn-level GAE) and
their value targets.

They read ``batch.values`` (set by the trainer from the critic before scoring) and raise a
clear error without it. ``VALUE_TARGETS`` holds, under the same name, the function giving
the critic's regression targets (the lambda-returns ``A + V`` before any normalisation);
it takes the estimator's keyword arguments.
"""

from __future__ import annotations

import torch

from turnrl.algorithms.credit.advantages import ADVANTAGES
from turnrl.algorithms.batch import TrainBatch
from turnrl.algorithms.credit.gae import bilevel_gae, token_gae, turn_level_gae, turn_mdp_gae
from turnrl.algorithms.credit.groups import whiten
from turnrl.registry import Registry

VALUE_TARGETS: Registry = Registry("value target")


def _values(batch: TrainBatch, name: str) -> torch.Tensor:
    if batch.values is None:
        raise ValueError(f"advantage {name!r} needs critic values in batch.values; the trainer sets them "
                         "when algorithm.advantage names a critic-based estimator")
    return batch.values


@ADVANTAGES.register("gae")
def gae(batch: TrainBatch, gamma: float = 1.0, lam: float = 0.95, normalize: bool = True) -> torch.Tensor:
    """PPO's token-level GAE (``gae.token_gae``) from the critic's values, whitened over the
    batch's sampled tokens when ``normalize``.

    Returns:
        ``[N, T]`` advantages.
    """
    adv = token_gae(batch, _values(batch, "gae"), gamma, lam)
    return whiten(adv, batch.loss_mask).to(adv.dtype) * batch.loss_mask if normalize else adv


@VALUE_TARGETS.register("gae")
def gae_targets(batch: TrainBatch, gamma: float = 1.0, lam: float = 0.95, normalize: bool = True) -> torch.Tensor:
    """Lambda-returns ``A + V`` of ``gae`` (``normalize`` is ignored)."""
    values = _values(batch, "gae")
    return (token_gae(batch, values, gamma, lam) + values) * batch.loss_mask


@ADVANTAGES.register("turn_gae")
def turn_gae(batch: TrainBatch, gamma: float = 1.0, lam: float = 0.95, token_lam: float = 1.0,
             normalize: bool = True) -> torch.Tensor:
    """Bi-level GAE with the turn value read at each turn's start (``gae.turn_level_gae``): GAE
    over turns with the value at each turn's first sampled token, then token-level inside each
    turn; whitened over sampled tokens when ``normalize``. RAGEN's published bi-level GAE reads
    the turn value at the turn's last sampled token instead: that is ``bilevel_gae``.

    Returns:
        ``[N, T]`` advantages.
    """
    adv = turn_level_gae(batch, _values(batch, "turn_gae"), gamma, lam, token_lam)
    return whiten(adv, batch.loss_mask).to(adv.dtype) * batch.loss_mask if normalize else adv


@VALUE_TARGETS.register("turn_gae")
def turn_gae_targets(batch: TrainBatch, gamma: float = 1.0, lam: float = 0.95, token_lam: float = 1.0,
                     normalize: bool = True) -> torch.Tensor:
    """``A + V`` of ``turn_gae`` (``normalize`` is ignored)."""
    values = _values(batch, "turn_gae")
    return (turn_level_gae(batch, values, gamma, lam, token_lam) + values) * batch.loss_mask


@ADVANTAGES.register("bilevel_gae")
def bilevel(batch: TrainBatch, high_level_gamma: float = 0.95, token_level_gamma: float = 1.0, lam: float = 1.0,
            normalize: bool = True) -> torch.Tensor:
    """RAGEN's bi-level GAE as published (``gae.bilevel_gae``): GAE over turns with the value at
    each turn's last sampled token (``high_level_gamma``, ``lam``), then token-level GAE inside
    each turn from the turn's return (``token_level_gamma``, ``lam``); whitened over sampled
    tokens when ``normalize`` (RAGEN whitens too). The defaults are RAGEN's.

    Returns:
        ``[N, T]`` advantages.
    """
    adv = bilevel_gae(batch, _values(batch, "bilevel_gae"), high_level_gamma, token_level_gamma, lam)
    return whiten(adv, batch.loss_mask).to(adv.dtype) * batch.loss_mask if normalize else adv


@VALUE_TARGETS.register("bilevel_gae")
def bilevel_targets(batch: TrainBatch, high_level_gamma: float = 0.95, token_level_gamma: float = 1.0,
                    lam: float = 1.0, normalize: bool = True) -> torch.Tensor:
    """RAGEN's returns: ``A + V`` at every sampled token with the advantages of ``bilevel_gae``
    before whitening (the turn's return ``G_k`` at its last token; ``normalize`` is ignored)."""
    values = _values(batch, "bilevel_gae")
    return (bilevel_gae(batch, values, high_level_gamma, token_level_gamma, lam) + values) * batch.loss_mask


@ADVANTAGES.register("turn_mdp_gae")
def turn_mdp(batch: TrainBatch, gamma: float = 1.0, lam: float = 0.95, normalize: bool = True) -> torch.Tensor:
    """Turn-PPO's advantage (``gae.turn_mdp_gae``): GAE of the turn-level MDP with the value at
    each turn's start, one advantage per turn on all its tokens; whitened over sampled tokens
    when ``normalize`` (every turn's tokens keep one value).

    Returns:
        ``[N, T]`` advantages.
    """
    adv, _ = turn_mdp_gae(batch, _values(batch, "turn_mdp_gae"), gamma, lam)
    return whiten(adv, batch.loss_mask).to(adv.dtype) * batch.loss_mask if normalize else adv


@VALUE_TARGETS.register("turn_mdp_gae")
def turn_mdp_targets(batch: TrainBatch, gamma: float = 1.0, lam: float = 0.95, normalize: bool = True) -> torch.Tensor:
    """The turn's lambda-return ``G_k = A_k + V_k`` (``V_k`` at the turn's first sampled token)
    on every token of turn ``k`` (``normalize`` is ignored)."""
    _, returns = turn_mdp_gae(batch, _values(batch, "turn_mdp_gae"), gamma, lam)
    return returns
