"""The policy learner: a policy loss over masked tokens (PPO-clip by default, or another of
``POLICY_LOSSES``), optional KL to a frozen reference and an entropy bonus. Plain torch on one
process, or data-parallel under ``accelerate launch`` (pass an ``Accelerator``): each process
trains on its shard of the rows, the loss is normalised by global counts, and the update equals
the single-process one (``turnrl.algorithms.distributed``).

Rows a batch marks ``excluded`` (infrastructure failures, ``turnrl.algorithms.batch.collate``)
are in no minibatch: the update is the one of the batch without them. An optimizer step whose
loss or gradient is not finite (NaN or inf on any process) is not taken: the weights and the
optimizer state stay as they were, the gradient is zeroed, and it is counted
(``nonfinite_updates``) and logged as a warning."""

from __future__ import annotations

import contextlib
import copy
import logging
import math
from dataclasses import dataclass, field, replace

import torch

from turnrl.algorithms import distributed
from turnrl.algorithms.losses.aggregation import AGGREGATIONS
from turnrl.algorithms.batch import TrainBatch
from turnrl.algorithms.config import LossConfig, OptimConfig
from turnrl.algorithms.losses.importance import check_correction, truncated_is_weights
from turnrl.algorithms.kl_control import PLACEMENTS
from turnrl.algorithms.losses.token_losses import KL_ESTIMATORS
from turnrl.algorithms.losses.policy import POLICY_LOSSES, TURN_RATIOS, policy_loss_settings, takes_turns
from turnrl.algorithms.learner.scoring import token_logprobs
from turnrl.algorithms.shapes import same_shape
from turnrl.algorithms.learner.tally import Tally

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepCoefs:
    """The coefficients of one training step, which schedules and controllers move between
    steps (the configs' ``entropy_coef`` and ``kl_coef`` are their values at the first step).

    Attributes:
        temperature: the temperature the step's rollouts were sampled at; logits are scaled
            by it wherever the learner scores tokens, so its logprobs are the sampler's.
        entropy_coef: weight of the entropy bonus (subtracted from the loss).
        kl_coef: weight of the KL to the reference in the loss (``kl_placement="loss"``;
            used only by a learner with a reference model, i.e. ``LossConfig.kl_coef > 0``).
    """

    temperature: float = 1.0
    entropy_coef: float = 0.0
    kl_coef: float = 0.0

    @classmethod
    def initial(cls, loss: LossConfig, temperature: float = 1.0) -> "StepCoefs":
        """The first step's coefficients: ``loss.entropy_coef`` and ``loss.kl_coef`` at ``temperature``."""
        return cls(temperature=temperature, entropy_coef=loss.entropy_coef, kl_coef=loss.kl_coef)


@dataclass
class _Counts:
    """The optimizer steps of one update: norms of the finite gradients, steps skipped (zero or
    non-finite gradient) and the non-finite ones among them."""

    grad_norms: list[float] = field(default_factory=list)
    skipped: int = 0
    nonfinite: int = 0


MIXED_PRECISION = ("no", "bf16")


@dataclass
class TokenView:
    """Per-token figures of one update, as its loss first saw each token (the first pass over the
    batch: with one minibatch and one epoch, the policy before the update), for the rollouts a
    run keeps (``turnrl.runs``). ``Learner.update(..., view=TokenView.empty(batch))`` fills it;
    nothing is computed for it that the update does not compute anyway.

    Attributes:
        learner_logprobs: ``[N, T]`` the learner's logprob of each sampled token (at the step's
            temperature); 0 off the loss mask and on rows no minibatch trained (``excluded``).
        entropy: ``[N, T]`` the entropy of the learner's next-token distribution at each sampled
            token; 0 where ``learner_logprobs`` is.
        importance_weights: ``[N, T]`` the truncated importance weights of ``algorithm.tis``
            (learner over sampler), or None without TIS.
    """

    learner_logprobs: torch.Tensor
    entropy: torch.Tensor
    importance_weights: torch.Tensor | None = None

    @classmethod
    def empty(cls, batch: TrainBatch) -> "TokenView":
        """Zeros of ``batch``'s shape, on the CPU, to be filled by ``Learner.update``."""
        return cls(torch.zeros(batch.loss_mask.shape), torch.zeros(batch.loss_mask.shape))

    def keep(self, rows: torch.Tensor, mask: torch.Tensor, logprobs: torch.Tensor, entropy: torch.Tensor | None) -> None:
        """Store a micro-batch's ``[m, T]`` figures at its ``rows`` (indices into the batch)."""
        rows = rows.cpu()
        self.learner_logprobs[rows] = (logprobs.detach().float() * mask).cpu()
        if entropy is not None:
            self.entropy[rows] = (entropy.detach().float() * mask).cpu()


class PolicyForward(torch.nn.Module):
    """The training forward as one module (what DDP wraps): the policy's logprobs and
    entropies of the scored tokens and, with a shared value head, their values.

    ``forward(input_ids, attention_mask, score_mask, temperature, with_entropy, segments,
    entropy_grad)`` returns ``(logprobs [N, T], entropy [N, T] or None, values [N, T] or None)``,
    0 off ``score_mask``; the entropy has a gradient only with ``entropy_grad`` (an entropy bonus).
    """

    def __init__(self, model, value_head: torch.nn.Module | None = None):
        super().__init__()
        self.model = model
        self.value_head = value_head

    def forward(self, input_ids, attention_mask, score_mask, temperature: float = 1.0, with_entropy: bool = True,
                segments=None, entropy_grad: bool = True):
        scored = token_logprobs(self.model, input_ids, attention_mask, temperature, with_entropy=with_entropy,
                                score_mask=score_mask, return_hidden=self.value_head is not None, segments=segments,
                                entropy_grad=entropy_grad)
        values = None
        if self.value_head is not None:
            hidden, rows, cols = scored.hidden
            values = torch.zeros_like(score_mask).index_put((rows, cols), self.value_head(hidden).squeeze(-1).float())
        return scored.logprobs, scored.entropy, values


class Learner:
    """Updates a causal LM from a ``TrainBatch`` and per-token advantages.

    Args:
        model: the policy (trained in place).
        loss: the loss settings (``cfg.algorithm`` of a run); read, never changed.
            ``loss.kl_coef > 0`` gives the learner a frozen reference model (a copy of
            ``model`` now); each step's KL and entropy weights come with ``update``.
        optim: the optimizer settings (``cfg.trainer`` of a run); read, never changed.
        value_head: a value head sharing the policy's backbone (``value_head(hidden [M, H]) ->
            [M, 1]``), trained in the same forward and backward with ``vf_coef`` times the
            clipped value loss; None for no shared critic (a separate critic model has its
            own ``CriticLearner``).
        accelerator: an ``accelerate.Accelerator`` (under ``accelerate launch``): the model,
            value head and optimizer are ``prepare``d (DDP with several processes), and
            ``update`` takes this process's shard of the rows (``turnrl.algorithms.distributed.shard_rows``
            or per-rank rollouts; at least one row per process). Its
            ``gradient_accumulation_steps`` must be 1: the learner accumulates micro-batches
            itself, all-reducing gradients once per optimizer step. None: plain torch.

    Raises:
        ValueError: On a ``kl_placement``, ``tis``, ``mixed_precision`` or (for ``turn_ppo``)
            ``turn_ratio`` that is not one of the allowed names, a ``dual_clip`` with a policy
            loss that has none, or an accelerator that accumulates gradients itself.
        KeyError: On an unknown ``kl_estimator``, ``loss_agg`` or ``policy_loss`` (listing the
            valid names).
    """

    def __init__(self, model, loss: LossConfig, optim: OptimConfig, value_head: torch.nn.Module | None = None,
                 accelerator=None):
        if loss.kl_placement not in PLACEMENTS:
            raise ValueError(f"kl_placement must be one of {PLACEMENTS}, got {loss.kl_placement!r}")
        check_correction(loss.tis, loss.tis_cap, loss.tis_floor, loss.tis_band)
        if optim.mixed_precision not in MIXED_PRECISION:
            raise ValueError(f"mixed_precision must be one of {MIXED_PRECISION}, got {optim.mixed_precision!r}")
        policy_loss = POLICY_LOSSES.get(loss.policy_loss)
        # the selected loss's own settings (keywords named after LossConfig fields)
        self.policy_loss_kwargs = policy_loss_settings(policy_loss, loss)
        if self.policy_loss_kwargs.get("turn_ratio", TURN_RATIOS[0]) not in TURN_RATIOS:
            raise ValueError(f"turn_ratio must be one of {TURN_RATIOS}, got {loss.turn_ratio!r}")
        if loss.dual_clip is not None and "dual_clip" not in self.policy_loss_kwargs:
            raise ValueError(f"dual_clip={loss.dual_clip} is set but policy_loss={loss.policy_loss!r} has no dual "
                             "clip; set dual_clip=None, or policy_loss='ppo_clip'")
        if accelerator is not None and accelerator.gradient_accumulation_steps != 1:
            raise ValueError("build the Accelerator with gradient_accumulation_steps=1: the learner accumulates "
                             "micro-batches itself (OptimConfig.micro_batch_size)")
        self.model = model
        self.loss_cfg, self.optim_cfg = loss, optim
        self.value_head = value_head
        self.accelerator = accelerator
        if optim.gradient_checkpointing:
            if not hasattr(model, "gradient_checkpointing_enable"):
                raise TypeError(f"gradient_checkpointing needs a transformers model, got {type(model).__name__}")
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.ref_model = None
        if loss.kl_coef > 0:
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        if optim.lora_rank > 0:
            _add_lora(model, optim)
        self.forward_module = PolicyForward(model, value_head)
        params = [p for p in self.forward_module.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=optim.lr, weight_decay=optim.weight_decay)
        self._forward = self.forward_module
        if accelerator is not None:
            self._forward, self.optimizer = accelerator.prepare(self.forward_module, self.optimizer)
            if self.ref_model is not None:
                self.ref_model.to(accelerator.device)
        self.kl_fn = KL_ESTIMATORS.get(loss.kl_estimator)
        self.aggregate = AGGREGATIONS.get(loss.loss_agg)
        self.policy_loss = policy_loss
        self._loss_takes_turns = takes_turns(policy_loss)  # a turn-level loss (turn_ppo) gets each token's turn

    @property
    def num_processes(self) -> int:
        """Processes sharing each update (1 without an accelerator)."""
        return 1 if self.accelerator is None else self.accelerator.num_processes

    def _autocast(self, device: torch.device):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                              enabled=self.optim_cfg.mixed_precision == "bf16")

    def update(self, batch: TrainBatch, advantages: torch.Tensor, returns: torch.Tensor | None = None, *,
               coefs: StepCoefs | None = None, view: TokenView | None = None) -> dict[str, float]:
        """Run ``ppo_epochs x num_minibatches`` optimizer steps on the batch.

        Args:
            batch: ``N`` collated trajectories (with an accelerator: this process's shard).
            advantages: ``[N, T]`` per-token advantages (0 off the loss mask).
            returns: ``[N, T]`` value targets, with a shared value head (whose old values are
                ``batch.values``).
            coefs: this step's temperature (the sampler's), entropy and KL weights; None:
                ``StepCoefs.initial(self.loss_cfg)`` (the first step's weights, temperature 1).
            view: filled with the per-token figures of the first pass (``TokenView``), or None.

        Returns:
            Of the last pass: ``pg_loss`` (mean over minibatches of the aggregated loss) and
            means over sampled tokens of ``entropy``, ``kl``, ``clip_frac``, ``approx_kl``,
            ``ratio``; ``grad_norm`` (mean over the optimizer steps whose gradient was finite),
            ``skipped_updates`` (steps not taken: a zero gradient, ``OptimConfig.skip_zero_grad``,
            or a non-finite one) and ``nonfinite_updates`` (of those, the steps whose loss or
            gradient held a NaN or inf: their minibatches add nothing to the other figures). With
            several processes every figure is of the global batch (the same on every process).
        """
        same_shape("Learner.update", loss_mask=batch.loss_mask, advantages=advantages, returns=returns)
        if self.value_head is not None and (returns is None or batch.values is None):
            raise ValueError("a learner with a shared value head needs returns and batch.values (old values)")
        coefs = StepCoefs.initial(self.loss_cfg) if coefs is None else coefs
        if self.num_processes > 1 and len(batch) == 0:
            raise ValueError("every process needs at least one row of the batch; shard it with "
                             "turnrl.algorithms.distributed.shard_rows (or give each rank at least one rollout)")
        device = next(self.model.parameters()).device
        batch, advantages = batch.to(device), advantages.to(device)
        returns = None if returns is None else returns.to(device)
        self.model.train()
        tally, counts = Tally(), _Counts()
        batch, is_weights = self._importance_prepass(batch, coefs, tally)
        if view is not None and is_weights is not None:
            view.importance_weights = is_weights.detach().float().cpu()
        minibatches = self._minibatches(batch)
        for epoch in range(self.loss_cfg.ppo_epochs):
            tally = tally.next_pass()  # the metrics are the last pass's
            for m, rows in enumerate(minibatches):
                part = Tally()  # this minibatch's figures, merged into the pass's if finite
                measure = epoch == 0 and m == 0 and is_weights is None  # the mismatch, on the first forward
                finite, grad_norm = self._minibatch_gradient(batch, rows, advantages, returns, is_weights, coefs,
                                                             part, measure, view if epoch == 0 else None)
                if finite is None:  # an empty minibatch on the only process: no step
                    counts.skipped += 1
                    continue
                self._apply(finite, grad_norm, part, tally, counts, m, epoch)
        return self._metrics(batch, tally, counts, is_weights)

    # ------------------------------------------------------------ the steps of update
    def _reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """``t`` summed (or max / min) over processes; itself on one process (a process group
        may exist for other reasons: collectives only with several processes)."""
        return distributed.all_reduce(t, op) if self.num_processes > 1 else t

    def _minibatches(self, batch: TrainBatch) -> list[torch.Tensor]:
        """This process's rows of each minibatch (excluded rows, the infrastructure's failures,
        are in none): ``loss.num_minibatches`` of them, fewer when the global batch has fewer rows."""
        device = batch.loss_mask.device
        trained = batch.trained_rows(torch.arange(len(batch), device=device))
        total_rows = int(self._reduce(torch.tensor(float(len(trained)), device=device)))
        splits = distributed.minibatch_splits(len(trained), max(1, min(self.loss_cfg.num_minibatches, total_rows)))
        return [trained[r.to(device)] for r in splits]

    def _importance_prepass(self, batch: TrainBatch, coefs: StepCoefs,
                            tally: Tally) -> tuple[TrainBatch, torch.Tensor | None]:
        """With TIS (``loss.tis``): the learner's own logprobs before any step, from a no-grad
        pass, become the batch's "old" logprobs; returns the truncated importance weights to the
        sampler's, and the mismatch is measured there. Without: the batch as it is, no weights."""
        cfg = self.loss_cfg
        if cfg.tis == "none":
            return batch, None
        learner_old = self.logprobs(batch, coefs.temperature)
        tally.add_mismatch(learner_old, batch.old_logprobs, batch.loss_mask)
        is_weights = truncated_is_weights(learner_old, batch.old_logprobs, batch.loss_mask, cfg.tis, cfg.tis_cap,
                                          cfg.tis_floor, cfg.tis_band)
        return replace(batch, old_logprobs=learner_old), is_weights

    def _minibatch_gradient(self, batch: TrainBatch, rows: torch.Tensor, advantages: torch.Tensor,
                            returns: torch.Tensor | None, is_weights: torch.Tensor | None, coefs: StepCoefs,
                            part: Tally, measure: bool, view: TokenView | None = None) -> tuple[bool | None, float]:
        """Forward and backward over one minibatch's micro-batches, its figures into ``part``.

        Returns ``(finite, grad_norm)``: the norm of the global gradient (clipped after), and
        whether the loss and gradient were finite, as every process agrees; ``(None, 0.0)`` for
        an empty minibatch on the only process. Each row's loss weight is of the global
        minibatch (its token and row counts summed over processes). A process whose share of
        the minibatch is empty still joins the gradient all-reduce, with a zero-weight stand-in
        row (given one attended token, so that its forward is finite even where every episode
        failed before a token)."""
        world, device = self.num_processes, batch.loss_mask.device
        weigh = distributed.global_weights if world > 1 else (lambda aggregate, mask, turns: aggregate(mask, turns))
        weights = torch.zeros_like(batch.loss_mask)
        weights[rows] = weigh(self.aggregate, batch.loss_mask[rows], batch.turn_index[rows])
        value_weights = batch.loss_mask / self._reduce(batch.loss_mask[rows].sum()).clamp(min=1.0)
        micros = batch.micro_batches(rows, self.optim_cfg.micro_batch_size, self.optim_cfg.micro_batch_tokens)
        stand_in = None
        if not micros:
            if world == 1:
                return None, 0.0
            micros = [torch.zeros(1, dtype=torch.long, device=device)]
            weights, value_weights = torch.zeros_like(weights), torch.zeros_like(value_weights)
            stand_in = batch.rows(micros[0])
            attended = stand_in.attention_mask.clone()
            attended[:, 0] = 1
            stand_in = replace(stand_in, attention_mask=attended)
        finite = True
        for i, micro in enumerate(micros):
            isw = None if is_weights is None else is_weights[micro]
            value_args = None if returns is None else (returns[micro], value_weights[micro])
            sync = i == len(micros) - 1 or self.accelerator is None
            mb = batch.rows(micro) if stand_in is None else stand_in
            with contextlib.nullcontext() if sync else self.accelerator.no_sync(self._forward):
                finite &= self._backward(mb, advantages[micro], weights[micro], coefs, part, isw, measure, value_args,
                                         record=len(rows) > 0, view=None if stand_in is not None else view,
                                         view_rows=micro)
        grad_norm = float(self._clip_grad_norm())
        finite &= math.isfinite(grad_norm)
        if world > 1:  # a NaN loss on one process alone: every process must skip the step
            finite = not bool(self._reduce(torch.tensor(float(not finite), device=device), "max"))
        return finite, grad_norm

    def _apply(self, finite: bool, grad_norm: float, part: Tally, tally: Tally, counts: _Counts, m: int,
               epoch: int) -> None:
        """Take the optimizer step of a finite gradient (its minibatch's figures join the
        pass's), or skip a non-finite one (counted and warned) or a zero one (with
        ``skip_zero_grad``); then zero the gradient. The norm is of the global gradient and the
        verdict is shared, so every process skips the same steps."""
        if not finite:
            counts.skipped, counts.nonfinite = counts.skipped + 1, counts.nonfinite + 1
            log.warning("non-finite loss or gradient (grad_norm=%s) in minibatch %d of pass %d: the optimizer step "
                        "is skipped, weights and optimizer state unchanged", grad_norm, m, epoch)
        else:
            counts.grad_norms.append(grad_norm)
            tally.merge(part)
            if grad_norm == 0.0 and self.optim_cfg.skip_zero_grad:
                counts.skipped += 1
            else:
                self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _metrics(self, batch: TrainBatch, tally: Tally, counts: _Counts,
                 is_weights: torch.Tensor | None) -> dict[str, float]:
        """The update's metrics (``update`` lists them), of the global batch."""
        if self.num_processes > 1:
            tally = tally.reduced(self._reduce, batch.loss_mask.device)
        metrics = tally.metrics()
        sampled = float(self._reduce(batch.loss_mask.sum()))
        if self.value_head is not None:  # of the last pass: mean over minibatches, clip fraction per token
            metrics.update(tally.value_metrics())
            value_sum = float(self._reduce((batch.values * batch.loss_mask).sum()))
            metrics["value_mean"] = value_sum / sampled if sampled else 0.0
        metrics["grad_norm"] = sum(counts.grad_norms) / max(len(counts.grad_norms), 1)
        metrics["skipped_updates"] = float(counts.skipped)
        metrics["nonfinite_updates"] = float(counts.nonfinite)
        if is_weights is not None:  # the mean weight, and the share of sampled tokens a masking correction dropped
            metrics["tis_weight"] = float(self._reduce(is_weights.sum())) / max(sampled, 1.0)
            dropped = ((is_weights == 0) & (batch.loss_mask > 0)).sum()
            metrics["tis_masked"] = float(self._reduce(dropped.to(is_weights.dtype))) / max(sampled, 1.0)
        return metrics

    def _clip_grad_norm(self) -> torch.Tensor:
        if self.accelerator is not None:
            return self.accelerator.clip_grad_norm_(self._params(), self.optim_cfg.max_grad_norm)
        return torch.nn.utils.clip_grad_norm_(self._params(), self.optim_cfg.max_grad_norm)

    def _params(self):
        return list(self.forward_module.parameters())

    @torch.no_grad()
    def values(self, batch: TrainBatch) -> torch.Tensor:
        """``[N, T]`` values of the shared value head (no gradient); 0 off the loss mask (and on
        excluded rows).

        They are read from hidden states, before the logits, so no step coefficient (not the
        temperature either) changes them."""
        if self.value_head is None:
            raise RuntimeError("this learner has no shared value head")
        device = next(self.model.parameters()).device
        out = torch.zeros_like(batch.loss_mask)
        for micro in batch.micro_batches(batch.trained_rows(), self.optim_cfg.micro_batch_size,
                                         self.optim_cfg.micro_batch_tokens):
            mb = batch.rows(micro).to(device)
            with self._autocast(device):
                _, _, v = self.forward_module(mb.input_ids, mb.attention_mask, mb.loss_mask, with_entropy=False,
                                              segments=mb.segment_index)
            out[micro] = v.to(out.device)
        return out

    @torch.no_grad()
    def logprobs(self, batch: TrainBatch, temperature: float = 1.0, model=None) -> torch.Tensor:
        """``[N, T]`` logprobs of the sampled tokens under ``softmax(logits / temperature)`` of
        ``model`` (default: the policy), no gradient, in micro-batches; 0 off the loss mask.
        Float32, or float64 for a float64 model."""
        model = self.model if model is None else model  # (excluded rows are not scored: 0 there too)
        dtype = torch.promote_types(batch.loss_mask.dtype, next(model.parameters()).dtype)
        out = torch.zeros_like(batch.loss_mask, dtype=dtype)
        rows = batch.trained_rows(torch.arange(len(batch), device=batch.loss_mask.device))
        for micro in batch.micro_batches(rows, self.optim_cfg.micro_batch_size, self.optim_cfg.micro_batch_tokens):
            mb = batch.rows(micro)
            with self._autocast(mb.loss_mask.device):
                lp, _, _ = token_logprobs(model, mb.input_ids, mb.attention_mask, temperature,
                                       score_mask=mb.loss_mask, segments=mb.segment_index)
            out[micro] = lp * mb.loss_mask
        return out

    def reference_kl(self, batch: TrainBatch, temperature: float = 1.0) -> torch.Tensor:
        """``[N, T]`` per-token KL estimates (``loss.kl_estimator``) of the policy to the frozen
        reference, both at ``temperature`` (the step's sampling temperature), for KL in the
        reward; 0 off the loss mask.

        Raises:
            RuntimeError: If the learner has no reference model (``kl_coef == 0``).
        """
        if self.ref_model is None:
            raise RuntimeError("no reference model: set kl_coef > 0 to use KL to the reference")
        device = next(self.model.parameters()).device
        batch = batch.to(device)
        return self.kl_fn(self.logprobs(batch, temperature),
                          self.logprobs(batch, temperature, self.ref_model)) * batch.loss_mask

    def _backward(self, mb: TrainBatch, adv: torch.Tensor, weights: torch.Tensor, coefs: StepCoefs, part: Tally,
                  is_weights: torch.Tensor | None, measure: bool,
                  value_args: tuple[torch.Tensor, torch.Tensor] | None = None, record: bool = True,
                  view: TokenView | None = None, view_rows: torch.Tensor | None = None) -> bool:
        """Forward and backward of one micro-batch, its figures (and with ``measure`` the
        sampler/learner mismatch) added to ``part`` and its per-token figures to ``view`` (at
        ``view_rows``); ``record=False`` (a zero-weight stand-in row that only joins the gradient
        all-reduce) leaves them alone. Returns whether the loss was finite."""
        cfg = self.loss_cfg
        mask = mb.loss_mask
        with self._autocast(mask.device):
            logprobs, entropy, values = self._forward(mb.input_ids, mb.attention_mask, mask, coefs.temperature,
                                                      segments=mb.segment_index,
                                                      entropy_grad=bool(coefs.entropy_coef))
        if measure and record:
            part.add_mismatch(logprobs.detach(), mb.old_logprobs, mask)
        if view is not None and record:
            view.keep(view_rows, mask, logprobs, entropy)
        turns = {"turn_index": mb.turn_index} if self._loss_takes_turns else {}
        pg_loss, stats = self.policy_loss(logprobs, mb.old_logprobs, adv, weights, is_weights=is_weights, **turns,
                                          **self.policy_loss_kwargs)
        ratio_max, ratio_min = float(stats.pop("ratio_max")), float(stats.pop("ratio_min"))
        loss = pg_loss
        if coefs.entropy_coef:
            loss = loss - coefs.entropy_coef * (entropy * weights).sum()
        kl_sum = 0.0
        if self.ref_model is not None and cfg.kl_placement == "loss":
            with torch.no_grad(), self._autocast(mask.device):
                ref_logprobs, _, _ = token_logprobs(
                    self.ref_model, mb.input_ids, mb.attention_mask, coefs.temperature, score_mask=mask,
                    segments=mb.segment_index)
            kl = self.kl_fn(logprobs, ref_logprobs)
            kl_sum = float((kl.detach() * mask).sum())
            loss = loss + coefs.kl_coef * (kl * weights).sum()
        value_loss = value_clipped = 0.0
        if value_args is not None:  # the shared value head, on the same forward's hidden states
            returns, value_weights = value_args
            err = (values - returns) ** 2
            if cfg.value_clip is not None:
                v_clip = mb.values + (values - mb.values).clamp(-cfg.value_clip, cfg.value_clip)
                err_clip = (v_clip - returns) ** 2
                value_clipped = float(((err_clip > err).float() * mask).sum())
                err = torch.maximum(err, err_clip)
            value_loss = 0.5 * (err * value_weights).sum()
            loss = loss + cfg.vf_coef * value_loss
            value_loss = value_loss.item()
        if self.accelerator is None:
            loss.backward()
        else:  # DDP averages gradients over processes; the global loss is their sum
            self.accelerator.backward(loss * self.num_processes)
        finite = bool(torch.isfinite(loss.detach()))
        if not record:
            return finite
        part.value_loss += value_loss
        part.value_clipped += value_clipped
        part.pg_loss += pg_loss.item()
        part.entropy += float((entropy.detach() * mask).sum())
        part.kl += float(kl_sum)
        part.tokens += float(mask.sum())
        part.add_stats(stats, ratio_max, ratio_min)
        return finite


def _add_lora(model, optim: OptimConfig) -> None:
    """Inject LoRA adapters into ``model`` in place (it keeps its class, so sampling uses them)
    and freeze every other weight. The adapters start at zero: the policy is unchanged."""
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError as e:
        raise ImportError("trainer.lora_rank > 0 (OptimConfig.lora_rank) needs peft: pip install 'turnrl[lora]'"
                          ) from e
    inject_adapter_in_model(LoraConfig(r=optim.lora_rank, lora_alpha=optim.lora_alpha, lora_dropout=0.0,
                                       target_modules=list(optim.lora_target_modules)), model)
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
