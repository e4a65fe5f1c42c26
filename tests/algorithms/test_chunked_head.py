"""The LM head scored a chunk of positions at a time: the plain path's logprobs, entropies and
gradients without an ``[M, V]`` tensor kept for the backward."""

import copy
import math
from types import SimpleNamespace

import pytest
import torch

from tests.helpers import learner_settings
from turnrl.algorithms import Learner, token_logprobs
from turnrl.algorithms.learner import scoring
from turnrl.algorithms.learner.chunked_head import chunked_logprobs

from tests.tolerances import (adam_first_step_tol, entropy_tol, eps, float_tol, grad_tol, logit_magnitude,
                              logprob_tol, max_abs)


def head_config(head):
    """The LM head alone as a network (no decoder layer) for ``tests/tolerances.py``'s bounds."""
    return SimpleNamespace(hidden_size=head.in_features, intermediate_size=0, num_hidden_layers=0,
                           vocab_size=head.out_features)


def plain(hidden, head, targets, temperature, autocast=False):
    """The plain path: ``[M, V]`` logits, their log-softmax, the picked entries and entropies."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = head(hidden)
        logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature, -1)
    return logp.gather(-1, targets[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


def grads(out, weights, hidden, head):
    return torch.autograd.grad((out * weights).sum(), [hidden, *head.parameters()])


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 8, 37, 100])
def test_chunked_logprobs_equal_the_plain_path_with_their_gradients(bias, temperature, chunk):
    torch.manual_seed(0)
    m, h, v = 37, 16, 101
    head = torch.nn.Linear(h, v, bias=bias).double()
    hidden = torch.randn(m, h, dtype=torch.float64, requires_grad=True)
    targets, weights = torch.randint(0, v, (m,)), torch.randn(m, dtype=torch.float64)
    want, want_entropy = plain(hidden, head, targets, temperature)
    got, entropy = chunked_logprobs(hidden, head, targets, temperature, with_entropy=True, chunk=chunk)
    assert got.dtype == torch.float64 and got.shape == (m,)
    # rounding only (the head's products and softmax a chunk of rows at a time), in float64: the
    # head's logprob/entropy bounds at its logits' size, the gradients' at theirs over m rows
    config, logits = head_config(head), max_abs(head(hidden)) / temperature
    torch.testing.assert_close(got, want, rtol=0, atol=logprob_tol(config, torch.float64, logits))
    torch.testing.assert_close(entropy, want_entropy.detach(), rtol=0, atol=entropy_tol(config, torch.float64, logits))
    assert not entropy.requires_grad  # a reported figure
    for mine, theirs in zip(grads(got, weights, hidden, head), grads(want, weights, hidden, head)):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=grad_tol(config, torch.float64, max_abs(theirs), m))
    assert chunked_logprobs(hidden, head, targets, temperature, chunk=chunk)[1] is None


def test_under_bf16_autocast_the_products_run_in_bf16_as_the_heads_own_forward():
    torch.manual_seed(1)
    m, h, v = 29, 32, 211
    head = torch.nn.Linear(h, v)
    hidden = torch.randn(m, h, requires_grad=True)
    targets, weights = torch.randint(0, v, (m,)), torch.randn(m)
    want, _ = plain(hidden, head, targets, 1.0, autocast=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, _ = chunked_logprobs(hidden, head, targets, chunk=8)
    assert got.dtype == torch.float32
    # the same bf16 logits, softmax in float32: a bf16 product summed in float32 in another order may
    # round to the neighbouring bf16 value (one ulp, eps * |z|: a logprob moves by twice that), and
    # the softmax rounds in float32 (tests/tolerances.py)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        z = max_abs(head(hidden).float())
    tol = 2 * eps(torch.bfloat16) * z + float_tol(torch.float32, v, z + math.log(v))
    torch.testing.assert_close(got, want, rtol=0, atol=tol)
    fp32, _ = plain(hidden, head, targets, 1.0)
    assert (got - fp32).abs().max() > 1e-4  # (so the bf16 products did run)
    mine, theirs = grads(got, weights, hidden, head), grads(want, weights, hidden, head)
    assert all(a.dtype == b.dtype == torch.float32 for a, b in zip(mine, theirs))
    # bf16 products summed per chunk: each chunk's product and the plain one round once to bf16
    # (half an ulp of a partial sum), and the float32 gradient of the logits each path casts to bf16
    # may round one ulp apart; a partial sum is at most the sum of its terms' sizes, from the
    # logits' gradient d = w (onehot - p) (as many roundings: chunks + 1 products, 2 halves for d)
    with torch.no_grad():
        p = torch.softmax(head(hidden).float(), -1)
        d = (weights[:, None] * (torch.nn.functional.one_hot(targets, v).float() - p)).abs()
        terms = [d @ head.weight.abs(), d.T @ hidden.abs(), d.sum(0)]  # for hidden, weight, bias
    roundings = -(-m // 8) + 1 + 2
    for a, b, size in zip(mine, theirs, terms):
        assert bool(((a - b).abs() <= roundings * eps(torch.bfloat16) / 2 * size).all())


def test_no_positions_by_vocabulary_tensor_is_kept_for_the_backward():
    torch.manual_seed(2)
    m, h, v = 64, 8, 97
    head = torch.nn.Linear(h, v, bias=False)
    hidden = torch.randn(m, h, requires_grad=True)
    targets = torch.randint(0, v, (m,))

    def saved_shapes(fn):
        shapes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t):
            fn()
        return shapes

    assert (m, v) in saved_shapes(lambda: plain(hidden, head, targets, 1.0))  # (the test can fail)
    kept = saved_shapes(lambda: chunked_logprobs(hidden, head, targets, with_entropy=True, chunk=16))
    assert sorted(kept) == sorted([(m, h), (v, h), (m,), (m,)])  # hidden, weight, targets, log-normalisers
    empty = chunked_logprobs(hidden[:0], head, targets[:0], with_entropy=True)
    assert empty[0].shape == empty[1].shape == (0,)


@pytest.fixture
def batch(tokenizer):
    """Four right-padded random rows, the second half of each scored."""
    g = torch.Generator().manual_seed(3)
    lengths = torch.tensor([30, 24, 17, 9])
    positions = torch.arange(30)[None]
    attention = (positions < lengths[:, None]).long()
    ids = torch.randint(5, len(tokenizer), (4, 30), generator=g) * attention
    return ids, attention, ((positions >= lengths[:, None] // 2) & (attention > 0)).float()


@pytest.mark.slow
def test_token_logprobs_chunk_the_head_past_the_threshold_with_the_same_gradients(
        tiny_model, batch, monkeypatch):
    ids, attention, score_mask = batch
    model = copy.deepcopy(tiny_model).double()

    def scored(threshold, entropy_grad=False):
        monkeypatch.setitem(scoring.CHUNKED_HEAD_MIN_ELEMENTS, "cpu", threshold)
        model.zero_grad()
        lp, ent, _ = token_logprobs(model, ids, attention, 0.8, with_entropy=True, score_mask=score_mask,
                                 entropy_grad=entropy_grad)
        (lp.sum() + (ent.sum() if ent.requires_grad else 0)).backward()
        return lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()], ent.requires_grad

    calls = []
    real = scoring.chunked_logprobs
    monkeypatch.setattr(scoring, "chunked_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
    plain_lp, plain_ent, plain_grads, _ = scored(1 << 62)
    assert calls == []
    chunked_lp, chunked_ent, chunked_grads, ent_grad = scored(1)
    assert calls == [1] and not ent_grad
    # rounding only, in float64: the model's logprob/entropy bounds at its logits' size (at 0.8),
    # and per parameter the gradient bound at its size over the batch's tokens (tests/tolerances.py)
    with torch.no_grad():
        logits = logit_magnitude(model, ids, attention, 0.8)
    config, width = model.config, ids.shape[1]
    torch.testing.assert_close(chunked_lp, plain_lp, rtol=0, atol=logprob_tol(config, torch.float64, logits, width))
    torch.testing.assert_close(chunked_ent, plain_ent, rtol=0, atol=entropy_tol(config, torch.float64, logits, width))
    assert float(chunked_lp.abs().sum()) > 0 and float(chunked_ent.abs().sum()) > 0
    for mine, theirs in zip(chunked_grads, plain_grads):
        tol = grad_tol(config, torch.float64, max_abs(theirs), int(attention.sum()))
        torch.testing.assert_close(mine, theirs, rtol=0, atol=tol)
    # an entropy bonus needs the entropy's gradient: the plain path, whatever the size
    *_, ent_grad = scored(1, entropy_grad=True)
    assert calls == [1] and ent_grad


@pytest.mark.slow
def test_a_head_with_hooks_is_scored_through_its_own_forward(tiny_model, batch, monkeypatch):
    ids, attention, score_mask = batch
    model = copy.deepcopy(tiny_model)
    monkeypatch.setitem(scoring.CHUNKED_HEAD_MIN_ELEMENTS, "cpu", 1)
    seen = []
    model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    token_logprobs(model, ids, attention, score_mask=score_mask)
    assert seen == [(int((score_mask[:, 1:] > 0).sum()), len(model.lm_head.weight))]


@pytest.mark.slow
def test_a_learner_update_is_the_same_with_the_head_chunked(tiny_model, batch, monkeypatch):
    ids, attention, score_mask = batch
    from turnrl.algorithms import TrainBatch

    n, t = ids.shape
    train = TrainBatch(input_ids=ids, attention_mask=attention, loss_mask=score_mask, old_logprobs=torch.zeros(n, t),
                       turn_index=torch.where(score_mask > 0, 0, -1), rewards=torch.zeros(n),
                       group_index=torch.arange(n), turn_rewards=torch.zeros(n, 1),
                       num_turns=torch.ones(n, dtype=torch.long), state_index=torch.full((n, 1), -1))
    base = copy.deepcopy(tiny_model).double()  # (Adam's first step is about lr x sign(gradient): in float32
    with torch.no_grad():                      # a near-zero gradient's rounding could flip it)
        train.old_logprobs, _, _ = token_logprobs(base, ids, attention, score_mask=score_mask)
    advantages = torch.tensor([1.0, -0.5, 0.25, -1.0])[:, None] * score_mask

    def updated(threshold):
        monkeypatch.setitem(scoring.CHUNKED_HEAD_MIN_ELEMENTS, "cpu", threshold)
        model = copy.deepcopy(base)
        metrics = Learner(model, *learner_settings(lr=1e-3, kl_coef=0.1)).update(train, advantages)
        return torch.cat([p.detach().flatten() for p in model.parameters()]), metrics

    plain_params, plain_metrics = updated(1 << 62)
    chunked_params, chunked_metrics = updated(1)
    assert not torch.equal(plain_params, torch.cat([p.detach().flatten() for p in base.parameters()]))
    # float64 gradients within rounding of each other (the bound at the gradient's norm, which no
    # entry exceeds), through Adam's first step at its most sensitive (a gradient at 0: lr x
    # rounding / eps); the entropy within the model's entropy bound plus its mean's sum
    config, tokens = base.config, int(attention.sum())
    step_tol = adam_first_step_tol(torch.zeros(()), grad_tol(config, torch.float64, plain_metrics["grad_norm"], tokens),
                                   lr=1e-3, param=plain_params)
    assert bool(((chunked_params - plain_params).abs() <= step_tol).all())
    with torch.no_grad():
        logits = logit_magnitude(base, ids, attention)
    entropy_tolerance = (entropy_tol(config, torch.float64, logits, t)
                         + float_tol(torch.float64, tokens, math.log(config.vocab_size)))
    assert chunked_metrics["entropy"] == pytest.approx(plain_metrics["entropy"], abs=entropy_tolerance)


def test_the_head_is_chunked_from_a_size_set_by_device_type():
    vocab = 151936
    for device, threshold in (("cpu", 1 << 31), ("meta", 1 << 28)):  # others: the cuda entry
        head = torch.nn.Linear(8, vocab, bias=False, device=device)
        below, at = -(-threshold // vocab) - 1, -(-threshold // vocab)
        assert (scoring._chunked_head(head, below), scoring._chunked_head(head, at)) == (False, True), device
