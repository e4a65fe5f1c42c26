"""Learner.update on the tiny model with real collected trajectories."""

import copy
import math
from dataclasses import FrozenInstanceError, replace

import pytest
import torch

from tests.helpers import learner_settings
from turnrl.policies.sampling import SamplingParams
from turnrl.policies.hf.policy import TransformersPolicy
from turnrl.algorithms import AGGREGATIONS, Learner, OptimConfig, StepCoefs, collate, token_logprobs
from turnrl.envs import GuessNumberEnv
from turnrl.rollout import RolloutCollector, Task

from tests.tolerances import (adam_first_step_tol, entropy_tol_for, float_tol, grad_tol, logprob_tol_for, max_abs,
                              rows_of)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rl_batch(tiny_model, tokenizer, renderer):
    """Five GuessNumber trajectories sampled from ``tiny_model`` and fixed, nonzero advantages."""
    policy = TransformersPolicy(tiny_model, tokenizer, seed=3)
    collector = RolloutCollector(lambda: GuessNumberEnv(max_turns=3), policy, renderer)
    trajectories = collector.collect([Task(0), Task(1)], 2, SamplingParams(max_new_tokens=6))
    trajectories += collector.collect([Task(2)], 1, SamplingParams(max_new_tokens=6))
    batch = collate(trajectories, tokenizer.pad_token_id)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.25, 2.0])[:, None] * batch.loss_mask
    return batch, advantages


def updated(model, batch, advantages, **cfg):
    learner = Learner(model, *learner_settings(lr=1e-4, num_minibatches=1, **cfg))
    metrics = learner.update(batch, advantages)
    return learner, metrics


@pytest.fixture(scope="module")
def updates(tiny_model, rl_batch):
    """Fresh copies of the tiny model, each after one update with the given micro-batch size
    (rows), or with 64 rows and a token budget ("tokens N"), with the update's metrics and its
    (clipped) gradient per parameter (AdamW's first moment after one step is ``(1 - beta1) g``)."""
    batch, advantages = rl_batch
    out = {}
    lengths = sorted(batch.attention_mask.sum(-1).tolist(), reverse=True)
    for micro in (2, 64, "tokens 1", "tokens mid"):
        model = copy.deepcopy(tiny_model)
        rows, tokens = (micro, None) if isinstance(micro, int) else (64, 1 if micro == "tokens 1" else 2 * lengths[1])
        learner, metrics = updated(model, batch, advantages, micro_batch_size=rows, micro_batch_tokens=tokens)
        beta1 = learner.optimizer.param_groups[0]["betas"][0]
        out[micro] = (model, metrics, {name: learner.optimizer.state[p]["exp_avg"] / (1 - beta1)
                                       for name, p in model.named_parameters()})
    return out


def test_one_update_changes_every_trainable_parameter(tiny_model, rl_batch, updates):
    model, metrics, _ = updates[64]
    named = dict(model.named_parameters())
    # tied embeddings are one parameter: the output head is the input embedding
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert "lm_head.weight" not in named
    assert len(list(model.parameters())) == len(named) == len(list(tiny_model.parameters()))
    before = dict(tiny_model.named_parameters())
    unchanged = [name for name, p in named.items() if p.requires_grad and torch.equal(p, before[name])]
    assert unchanged == []
    # on policy: the ratio is 1 but for the sampler's and learner's rounding of the logprobs
    tol = logprob_tol_for(tiny_model, rows_of(rl_batch[0]))
    assert metrics["grad_norm"] > 0 and metrics["ratio"] == pytest.approx(1.0, abs=tol)
    assert metrics["clip_frac"] == 0.0  # a single pass starts at ratio 1


@pytest.mark.parametrize("micro", [2, "tokens 1", "tokens mid"])
def test_micro_batch_size_does_not_change_the_update(tiny_model, rl_batch, updates, micro):
    """Rows split 2 at a time, each row alone (a token budget below every row), or sorted by
    length and packed into budgets: the same update as one micro-batch of every row."""
    (small, m_small, _), (large, m_large, grads) = updates[micro], updates[64]
    batch, advantages = rl_batch
    config, tokens, rows = tiny_model.config, int(batch.attention_mask.sum()), rows_of(batch)
    # the gradients differ by rounding (summed over the tokens in other micro-batches): Adam's first
    # step moves each weight by ~lr, exactly so only where the gradient stands above its rounding
    for (name, p), q in zip(small.named_parameters(), large.parameters()):
        tol = adam_first_step_tol(grads[name], grad_tol(config, torch.float32, max_abs(grads[name]), tokens),
                                  lr=1e-4, param=q)
        assert bool(((p - q).abs() <= tol).all()), name
    # the figures: the logprobs' (ratio), entropies' and gradient's rounding, then the means' sums
    lp_tol, top = logprob_tol_for(tiny_model, rows), float(advantages.abs().max())
    tols = {"pg_loss": top * lp_tol + float_tol(torch.float32, tokens, top),  # -sum w A ratio, sum w = 1
            "entropy": (entropy_tol_for(tiny_model, rows)  # mean entropy: sums of values up to log(vocab)
                        + float_tol(torch.float32, tokens, math.log(config.vocab_size))),
            "ratio": lp_tol + float_tol(torch.float32, tokens, 1.0),
            "grad_norm": grad_tol(config, torch.float32, m_large["grad_norm"], tokens)}
    for key, tol in tols.items():
        assert m_small[key] == pytest.approx(m_large[key], abs=tol), key


@pytest.mark.parametrize("skip", [True, False])
def test_a_step_without_signal_leaves_the_weights_unless_told_to_step(tiny_model, rl_batch, skip):
    """After one update with a signal, a batch whose advantages are all 0 has a zero gradient:
    skipped by default, while AdamW's momentum alone would move every trained weight."""
    batch, advantages = rl_batch
    model = copy.deepcopy(tiny_model)
    learner = Learner(model, *learner_settings(lr=1e-4, num_minibatches=1, skip_zero_grad=skip))
    assert learner.update(batch, advantages)["skipped_updates"] == 0.0
    before = copy.deepcopy(model)
    metrics = learner.update(batch, torch.zeros_like(advantages))
    assert metrics["grad_norm"] == 0.0 and metrics["skipped_updates"] == (1.0 if skip else 0.0)
    moved = [n for (n, p), q in zip(model.named_parameters(), before.parameters()) if not torch.equal(p, q)]
    if skip:
        assert moved == []
    else:  # the momentum step: every weight the first update moved moves again
        assert len(moved) == len(list(model.parameters()))


def test_kl_coef_creates_a_frozen_reference_and_kl_is_zero_on_the_first_update(fresh_model, rl_batch):
    batch, advantages = rl_batch
    start = {name: p.detach().clone() for name, p in fresh_model.named_parameters()}
    learner, metrics = updated(fresh_model, batch, advantages, kl_coef=0.1, micro_batch_size=3)
    assert learner.ref_model is not None and learner.ref_model is not learner.model
    assert all(not p.requires_grad for p in learner.ref_model.parameters())
    # the policy equals the reference: k3 = expm1(d) - d ~ d^2 / 2 of a logprob gap d within rounding
    lp_tol = logprob_tol_for(learner.ref_model, rows_of(batch))
    assert metrics["kl"] == pytest.approx(0.0, abs=lp_tol ** 2 / 2 + float_tol(torch.float32, 1, lp_tol))
    for name, p in learner.ref_model.named_parameters():
        assert torch.equal(p, start[name]), name  # the reference did not move with the policy
    assert not torch.equal(fresh_model.model.embed_tokens.weight, start["model.embed_tokens.weight"])
    # a second update now sees a positive KL from the moved policy
    assert learner.update(batch, advantages)["kl"] > 0
    assert Learner(copy.deepcopy(fresh_model), *learner_settings()).ref_model is None


def test_update_rejects_advantages_of_the_wrong_shape(fresh_model, rl_batch):
    batch, advantages = rl_batch
    with pytest.raises(ValueError, match="advantages"):
        Learner(fresh_model, *learner_settings()).update(batch, advantages[:, :-1])


def test_step_coefs_reach_the_update_and_no_config_is_changed(tiny_model, rl_batch):
    batch, advantages = rl_batch
    loss, optim = learner_settings(lr=1e-3, kl_coef=0.1)
    saved = (copy.deepcopy(loss), copy.deepcopy(optim))

    def after_two_updates(coefs):
        model = copy.deepcopy(tiny_model)
        learner = Learner(model, loss, optim)
        for _ in range(2):  # the second update sees the KL to the reference (0 on the first)
            learner.update(batch, advantages, coefs=coefs)
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    base = after_two_updates(StepCoefs(temperature=1.0, entropy_coef=0.0, kl_coef=0.1))
    assert torch.equal(base, after_two_updates(None))  # None: the config's first-step coefficients
    for other in (StepCoefs(1.0, 0.5, 0.1), StepCoefs(1.0, 0.0, 5.0), StepCoefs(2.0, 0.0, 0.1)):
        assert not torch.equal(base, after_two_updates(other)), other
    assert (loss, optim) == saved  # read, never changed
    with pytest.raises(FrozenInstanceError):
        StepCoefs().temperature = 2.0


def test_the_entropy_has_a_gradient_only_where_the_loss_weighs_it(tiny_model, rl_batch):
    """Without an entropy bonus the entropy is a reported figure: computed without autograd
    (whose graph would hold [tokens, vocab] tensors through the backward), the same values."""
    batch, _ = rl_batch
    for score_mask in (batch.loss_mask, None):  # the LM head on scored positions, and on all
        _, weighed, _ = token_logprobs(tiny_model, batch.input_ids, batch.attention_mask, with_entropy=True,
                                    score_mask=score_mask)
        _, reported, _ = token_logprobs(tiny_model, batch.input_ids, batch.attention_mask, with_entropy=True,
                                     score_mask=score_mask, entropy_grad=False)
        assert weighed.requires_grad and not reported.requires_grad
        assert torch.equal(weighed.detach(), reported) and float(reported.abs().sum()) > 0


def test_the_temperature_scales_scoring_the_update_and_reference_kl(tiny_model, rl_batch):
    batch, advantages = rl_batch
    learner = Learner(copy.deepcopy(tiny_model), *learner_settings(lr=1e-3, kl_coef=0.1))
    hot = learner.logprobs(batch, 2.0)
    expected, _, _ = token_logprobs(tiny_model, batch.input_ids, batch.attention_mask, 2.0, score_mask=batch.loss_mask)
    tol = logprob_tol_for(tiny_model, rows_of(batch), temperature=2.0)  # rounding only (micro-batches)
    assert torch.allclose(hot, expected * batch.loss_mask, rtol=0, atol=tol)
    assert not torch.allclose(hot, learner.logprobs(batch), atol=1e-3)
    # rollouts sampled at temperature 2: the update's ratio is 1 at the step's temperature only
    sampled = replace(batch, old_logprobs=hot)
    assert learner.update(sampled, advantages, coefs=StepCoefs(temperature=2.0, kl_coef=0.1))["ratio"] == \
        pytest.approx(1.0, abs=tol + float_tol(torch.float32, int(batch.loss_mask.sum()), 1.0))
    ratio_cold = Learner(copy.deepcopy(tiny_model), *learner_settings()).update(sampled, advantages)["ratio"]
    assert abs(ratio_cold - 1.0) > 1e-3
    # KL to the reference, both scored at the given temperature
    for temperature in (1.0, 2.0):
        kl = learner.reference_kl(batch, temperature)
        assert torch.allclose(kl, learner.kl_fn(learner.logprobs(batch, temperature),
                                                learner.logprobs(batch, temperature, learner.ref_model))
                              * batch.loss_mask)
    assert not torch.allclose(learner.reference_kl(batch, 1.0), learner.reference_kl(batch, 2.0))


def test_a_float64_model_is_scored_in_float64(tiny_model, rl_batch):
    # precision checks (the 2-process update against the 1-process one) run in float64: the
    # logits must not be rounded to float32 on the way to the softmax
    batch, _ = rl_batch
    model = copy.deepcopy(tiny_model).double()
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
        expected = torch.log_softmax(logits, dim=-1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
        for score_mask in (batch.loss_mask, None):  # the sampled-tokens-only path and the full one
            logprobs, entropy, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, with_entropy=True,
                                               score_mask=score_mask)
            assert logprobs.dtype == entropy.dtype == torch.float64
            mask = batch.loss_mask[:, 1:] if score_mask is not None else torch.ones_like(expected)
            assert (logprobs[:, 1:] - expected * mask).abs().max() <= 1e-12


# ---------------------------------------------------------------- what one update learns
# On a fixed batch at ratio 1 the PPO loss's gradient is minus that of the policy-gradient
# surrogate ``J = sum_t w_t A_t log pi(a_t)`` (``w`` the loss aggregation's weights), and the
# first AdamW step moves each parameter by ``lr * c g / (c |g| + 1e-8)`` (``g = dJ/dtheta``,
# ``c`` the gradient clipping factor), which raises ``J`` by ``g . step`` to first order. In
# float64 these hold to rounding on every machine (steps within Adam's bound for float64 gradient
# rounding, tests/tolerances.py; ``J``'s change within 0.1% of ``g . step`` at lr = 1e-5), so they
# are asserted tightly, where a reward curve over 40 sampled steps was a coin flip across CPUs.
ADAM_EPS = 1e-8  # torch.optim.AdamW's default eps, which the learner keeps
LR = 1e-5  # small enough for the first-order prediction, large enough to stand far above rounding


@pytest.fixture(scope="module")
def sampled_batch(rollouts, tokenizer):
    """4 GuessNumber episodes sampled by ``policy_model`` (turns of varied lengths) and fixed
    advantages of both signs."""
    trajectories, _ = rollouts("guess_number", 1.0)
    batch = collate(trajectories, tokenizer.pad_token_id)
    return batch, torch.tensor([1.0, -1.0, 0.5, -2.0])[:, None] * batch.loss_mask


def surrogate(model, batch, advantages, weights):
    """``J = sum_t w_t A_t log pi(a_t)`` over the sampled tokens."""
    logprobs, _, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, score_mask=batch.loss_mask)
    return (weights * advantages * logprobs).sum()


def one_update(policy_model, batch, advantages, loss_agg="token-mean"):
    """One learner update of a float64 copy of ``policy_model``, on policy (old logprobs are the
    model's own). Returns the model before and after, the surrogate's exact gradient before
    the update, the aggregation weights, the update's metrics and the batch as scored."""
    model = copy.deepcopy(policy_model).double()
    before = copy.deepcopy(model)
    learner = Learner(model, *learner_settings(lr=LR, loss_agg=loss_agg))
    batch = replace(batch, old_logprobs=learner.logprobs(batch))
    weights = AGGREGATIONS.get(loss_agg)(batch.loss_mask)
    grads = torch.autograd.grad(surrogate(before, batch, advantages, weights), list(before.parameters()))
    metrics = learner.update(batch, advantages)
    return before, model, grads, weights, metrics, batch


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean"])
def test_one_update_is_adams_first_step_along_the_exact_policy_gradient(policy_model, sampled_batch, loss_agg):
    batch, advantages = sampled_batch
    before, after, grads, weights, metrics, _ = one_update(policy_model, batch, advantages, loss_agg)
    norm = float(torch.cat([g.flatten() for g in grads]).norm())
    assert metrics["grad_norm"] == pytest.approx(norm, rel=1e-9)  # the norm before clipping
    assert metrics["pg_loss"] == pytest.approx(-float((weights.double() * advantages).sum()), rel=1e-9)  # ratio 1
    clip = min(1.0, OptimConfig().max_grad_norm / (norm + 1e-6))  # as torch.nn.utils.clip_grad_norm_
    with torch.no_grad():
        for (name, p0), p1, g in zip(before.named_parameters(), after.parameters(), grads):
            assert not torch.equal(p1, p0), f"{name} did not move"
            predicted = LR * clip * g / (clip * g.abs() + ADAM_EPS)
            # the learner's gradient is this one to float64 rounding (the gradient bound at its size
            # over the batch's tokens), through Adam's step: tests/tolerances.py
            rounding = grad_tol(before.config, torch.float64, clip * max_abs(g), int(batch.attention_mask.sum()))
            tol = adam_first_step_tol(clip * g, rounding, LR, p0, adam_eps=ADAM_EPS)
            assert bool(((p1 - p0 - predicted).abs() <= tol).all()), name


def test_one_update_raises_the_likelihood_of_positive_advantage_tokens_and_lowers_negative_ones(
        policy_model, sampled_batch):
    batch, _ = sampled_batch
    for row in range(len(batch)):
        for sign in (1.0, -1.0):  # this episode's sampled tokens alone carry an advantage
            advantages = torch.zeros_like(batch.loss_mask)
            advantages[row] = sign * batch.loss_mask[row]
            before, after, grads, weights, _, scored = one_update(policy_model, batch, advantages)
            with torch.no_grad():
                # sign * the change of the mean log-probability of the episode's sampled tokens
                change = float(surrogate(after, scored, advantages, weights)
                               - surrogate(before, scored, advantages, weights))
                first_order = float(sum((g * (p1 - p0)).sum()
                                        for g, p0, p1 in zip(grads, before.parameters(), after.parameters())))
            assert first_order > 0 and change > 0, (row, sign, first_order, change)
            assert change == pytest.approx(first_order, rel=0.05), (row, sign)
