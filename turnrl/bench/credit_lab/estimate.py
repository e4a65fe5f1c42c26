"""What one method's update does to the policy's parameters, on one lab batch.

A method is an advantage estimator (a name in ``turnrl.algorithms.ADVANTAGES``, or in
``LAB_ESTIMATORS`` below: references that are not training methods), its keyword arguments,
the loss aggregation and the policy loss (``POLICY_LOSSES``, with its config's settings). Its
gradient estimate on a batch is computed the way the learner computes it: the estimator's
``[N, T]`` advantages, the aggregation's weights, the policy loss of the current policy's
logprobs against the sampler's (``batch.old_logprobs``: every ratio is 1 for fresh samples,
not for stale ones), and ``g = -dloss/dtheta`` (the ascent direction) for the tabular softmax
policy's ``theta [S, A]``.

The chain rule through the tabular policy is done by hand: ``dlogpi(a|s)/dtheta[s] =
onehot(a) - pi(s)``, so ``g[s] = sum_t c_t (onehot(a_t) - pi(s))`` over the batch's tokens in
state ``s`` with ``c_t = -dloss/dlogp_t`` (autograd through the real loss); a test checks it
equals full autograd.

``LAB_ESTIMATORS`` has the same signature as ``ADVANTAGES``:

* ``reinforce``: each turn's return-to-go, no baseline (unbiased, the reference).
* ``turn_mean_incl_self``: return-to-go minus the mean at the same turn index over the group's
  samples that reached it, the sample itself included: biased (the factor ``1 - 1/n_k`` it
  puts on turn ``k`` depends on how many samples reached it, and a turn only it reached gets 0).
* ``turn_loo_padded``: minus the mean over the *other* samples, counting 0 for those that did
  not reach the turn: unbiased (the baseline does not depend on the sample), only noisier.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import OmegaConf

from turnrl.algorithms.credit.advantages import ADVANTAGES
from turnrl.algorithms.losses.aggregation import AGGREGATIONS
from turnrl.algorithms.batch import TrainBatch
from turnrl.algorithms.config import LossConfig
from turnrl.algorithms.credit.critic_advantages import VALUE_TARGETS
from turnrl.algorithms.credit.groups import STAT_DTYPE, group_normalize, leave_one_out_centred
from turnrl.algorithms.losses.policy import POLICY_LOSSES, policy_loss_settings, takes_turns
from turnrl.algorithms.credit.turns import discounted_turn_returns, turn_valid, turns_to_tokens
from turnrl.bench.credit_lab.episodes import LabBatch
from turnrl.registry import Registry
from turnrl.conf.schema import AlgorithmConfig

LAB_ESTIMATORS: Registry = Registry("credit-lab reference estimator")
ALGORITHM_CONFIGS = Path(__file__).resolve().parents[2] / "conf" / "algorithm"


def _returns(batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    k_max = batch.turn_rewards.shape[1]
    returns = discounted_turn_returns(batch.turn_rewards.to(STAT_DTYPE), batch.num_turns, 1.0)
    keys = batch.group_index[:, None] * k_max + torch.arange(k_max)[None, :]
    return returns, keys, turn_valid(batch.num_turns, k_max)


@LAB_ESTIMATORS.register("reinforce")
def reinforce(batch: TrainBatch) -> torch.Tensor:
    """Return-to-go of each turn, no baseline."""
    returns, _, valid = _returns(batch)
    return turns_to_tokens((returns * valid).to(batch.turn_rewards.dtype), batch.turn_index, batch.loss_mask)


@LAB_ESTIMATORS.register("turn_mean_incl_self")
def turn_mean_incl_self(batch: TrainBatch) -> torch.Tensor:
    """Return-to-go minus the group's mean at that turn index, the sample included (biased)."""
    returns, keys, valid = _returns(batch)
    per_turn = group_normalize(returns, keys, valid, eps=None)
    return turns_to_tokens(per_turn.to(batch.turn_rewards.dtype), batch.turn_index, batch.loss_mask)


@LAB_ESTIMATORS.register("turn_loo_padded")
def turn_loo_padded(batch: TrainBatch) -> torch.Tensor:
    """Return-to-go minus the other samples' mean at that turn index, 0 for samples that ended
    before it (unbiased)."""
    returns, keys, valid = _returns(batch)
    centred, _ = leave_one_out_centred(returns, keys)  # every sample counts, padded ones with 0
    return turns_to_tokens((centred * valid).to(batch.turn_rewards.dtype), batch.turn_index, batch.loss_mask)


@dataclass(frozen=True)
class Method:
    """One credit method as the lab runs it.

    Attributes:
        label: the table's name for it.
        advantage: a name in ``ADVANTAGES`` or ``LAB_ESTIMATORS``.
        kwargs: the estimator's keyword arguments.
        loss: the loss settings its config ships with (``loss.loss_agg``, the aggregation;
            ``loss.policy_loss`` and its settings, the policy loss).
    """

    label: str
    advantage: str
    kwargs: dict = field(default_factory=dict)
    loss: LossConfig = field(default_factory=LossConfig)

    @property
    def critic(self) -> bool:
        """Reads ``batch.values`` (the lab gives it the exact values)."""
        return self.advantage in VALUE_TARGETS

    def estimator(self):
        return LAB_ESTIMATORS.get(self.advantage) if self.advantage in LAB_ESTIMATORS else ADVANTAGES.get(
            self.advantage)


def shipped_methods() -> list[Method]:
    """One ``Method`` per algorithm config in ``turnrl/conf/algorithm``: its advantage and
    kwargs, loss aggregation, policy loss and that loss's settings (the schema's defaults for
    what it does not set)."""

    methods = []
    for path in sorted(ALGORITHM_CONFIGS.glob("*.yaml")):
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(AlgorithmConfig), OmegaConf.load(path)))
        loss = LossConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(LossConfig)})
        methods.append(Method(path.stem, cfg.advantage, dict(cfg.advantage_kwargs), loss))
    return methods


def lab_methods() -> list[Method]:
    """The methods of the lab's tables: the shipped configs, the critic-based estimators also
    without whitening (``gae_raw``, ``turn_gae_raw``: exact values make them unbiased), and the
    reference estimators."""
    shipped = shipped_methods()
    extra = [dataclasses.replace(m, label=f"{m.label}_raw", kwargs={**m.kwargs, "normalize": False})
             for m in shipped if m.critic]
    refs = [Method(name, name, {}, LossConfig(loss_agg="seq-mean-token-sum")) for name in LAB_ESTIMATORS.names()]
    return shipped + extra + refs


def token_logprobs(theta: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
    """``[N, T]`` ``log softmax(theta)[s, a]`` at each action token (0 elsewhere): the state is
    the token before it, the action its id minus ``S``."""
    num_states = theta.shape[0]
    prev = torch.cat([torch.zeros_like(batch.input_ids[:, :1]), batch.input_ids[:, :-1]], dim=1)
    mask = batch.loss_mask.bool()
    state = torch.where(mask, prev, 0).clamp(0, num_states - 1)
    action = torch.where(mask, batch.input_ids - num_states, 0).clamp(0, theta.shape[1] - 1)
    return torch.log_softmax(theta, dim=1)[state, action] * batch.loss_mask.to(theta.dtype)


def advantages(method: Method, lab_batch: LabBatch, per_batch: bool) -> torch.Tensor:
    """``[M * N, T]`` the method's advantages: one call on all ``M`` batches at once, or
    (``per_batch``) one call per batch, for estimators whose statistics span the whole batch
    (whitening) and so must not see the other batches (``batch_local`` tells which)."""
    batch = lab_batch.batch
    if method.critic:
        batch = dataclasses.replace(batch, values=lab_batch.values)
    fn = method.estimator()
    if not per_batch:
        return fn(batch, **method.kwargs)
    return torch.cat([fn(batch.rows(rows), **method.kwargs) for rows in lab_batch.slices])


def batch_local(method: Method, lab_batch: LabBatch) -> bool:
    """Whether the method's advantages of a batch are the same computed with the other batches
    beside it (group statistics only) as alone (checked on ``lab_batch``)."""
    return torch.allclose(advantages(method, lab_batch, False), advantages(method, lab_batch, True),
                          rtol=1e-5, atol=1e-6)


def gradients(method: Method, lab_batch: LabBatch, theta: torch.Tensor, aggregation: str | None = None,
              per_batch: bool = True) -> torch.Tensor:
    """``[M, S, A]`` the method's ascent direction ``-dloss/dtheta`` on each of the ``M`` batches.

    Args:
        aggregation: a name in ``AGGREGATIONS`` (None: the method's own); its weights are those
            of each batch.
        per_batch: compute advantages batch by batch (always right; False is faster and right
            when ``batch_local``).
    """
    batch = lab_batch.batch
    adv = advantages(method, lab_batch, per_batch)
    aggregate = AGGREGATIONS.get(aggregation or method.loss.loss_agg)
    weights = torch.cat([aggregate(batch.loss_mask[rows], batch.turn_index[rows]) for rows in lab_batch.slices])
    logp = token_logprobs(theta.detach(), batch).requires_grad_(True)
    loss_fn = POLICY_LOSSES.get(method.loss.policy_loss)
    turns = {"turn_index": batch.turn_index} if takes_turns(loss_fn) else {}
    loss, _ = loss_fn(logp, batch.old_logprobs.to(logp.dtype), adv, weights, **turns,
                      **policy_loss_settings(loss_fn, method.loss))
    (dlogp,) = torch.autograd.grad(loss, logp)
    which = torch.cat([torch.full((r.stop - r.start,), b) for b, r in enumerate(lab_batch.slices)])
    return score_contraction(-dlogp, theta, batch, which, len(lab_batch.slices))


def score_contraction(coef: torch.Tensor, theta: torch.Tensor, batch: TrainBatch, which: torch.Tensor,
                      num_batches: int) -> torch.Tensor:
    """``[M, S, A]``: per batch ``m``, ``sum_t coef_t * dlog pi(a_t|s_t)/dtheta`` over the action
    tokens of its rows (``which [N]`` the batch of each row), ``coef [N, T]``."""
    num_states, num_actions = theta.shape
    prev = torch.cat([torch.zeros_like(batch.input_ids[:, :1]), batch.input_ids[:, :-1]], dim=1)
    mask = batch.loss_mask.bool()
    m = which[:, None].expand_as(mask)[mask]
    state, action, c = prev[mask], batch.input_ids[mask] - num_states, coef[mask].to(theta.dtype)
    out = torch.zeros(num_batches, num_states, num_actions, dtype=theta.dtype)
    out.index_put_((m, state, action), c, accumulate=True)
    per_state = torch.zeros(num_batches, num_states, dtype=theta.dtype).index_put_((m, state), c, accumulate=True)
    return out - per_state[:, :, None] * torch.softmax(theta.detach(), dim=1)[None]
