"""Learner.update on the tiny model with real collected trajectories."""

import copy

import pytest
import torch

from turnrl.agents import SamplingParams, TransformersPolicy
from turnrl.algorithms import Learner, LearnerConfig, collate
from turnrl.envs import GuessNumberEnv
from turnrl.rollout import RolloutCollector, Task


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
    learner = Learner(model, LearnerConfig(lr=1e-4, num_minibatches=1, **cfg))
    metrics = learner.update(batch, advantages)
    return learner, metrics


@pytest.fixture(scope="module")
def updates(tiny_model, rl_batch):
    """Fresh copies of the tiny model, each after one update with the given micro-batch size."""
    batch, advantages = rl_batch
    out = {}
    for micro in (2, 64):
        model = copy.deepcopy(tiny_model)
        _, metrics = updated(model, batch, advantages, micro_batch_size=micro)
        out[micro] = (model, metrics)
    return out


def test_one_update_changes_every_trainable_parameter(tiny_model, updates):
    model, metrics = updates[64]
    named = dict(model.named_parameters())
    # tied embeddings are one parameter: the output head is the input embedding
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert "lm_head.weight" not in named
    assert len(list(model.parameters())) == len(named) == len(list(tiny_model.parameters()))
    before = dict(tiny_model.named_parameters())
    unchanged = [name for name, p in named.items() if p.requires_grad and torch.equal(p, before[name])]
    assert unchanged == []
    assert metrics["grad_norm"] > 0 and metrics["ratio"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["clip_frac"] == 0.0  # a single pass starts at ratio 1


def test_micro_batch_size_does_not_change_the_update(updates):
    (small, m_small), (large, m_large) = updates[2], updates[64]
    for (name, p), q in zip(small.named_parameters(), large.parameters()):
        assert (p - q).abs().max() <= 1e-5, name
    for key in ("pg_loss", "entropy", "ratio", "grad_norm"):
        assert m_small[key] == pytest.approx(m_large[key], abs=1e-5)


def test_kl_coef_creates_a_frozen_reference_and_kl_is_zero_on_the_first_update(fresh_model, rl_batch):
    batch, advantages = rl_batch
    start = {name: p.detach().clone() for name, p in fresh_model.named_parameters()}
    learner, metrics = updated(fresh_model, batch, advantages, kl_coef=0.1, micro_batch_size=3)
    assert learner.ref_model is not None and learner.ref_model is not learner.model
    assert all(not p.requires_grad for p in learner.ref_model.parameters())
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-7)  # the policy equals the reference
    for name, p in learner.ref_model.named_parameters():
        assert torch.equal(p, start[name]), name  # the reference did not move with the policy
    assert not torch.equal(fresh_model.model.embed_tokens.weight, start["model.embed_tokens.weight"])
    # a second update now sees a positive KL from the moved policy
    assert learner.update(batch, advantages)["kl"] > 0
    assert Learner(copy.deepcopy(fresh_model), LearnerConfig()).ref_model is None


def test_update_rejects_advantages_of_the_wrong_shape(fresh_model, rl_batch):
    batch, advantages = rl_batch
    with pytest.raises(ValueError, match="advantages"):
        Learner(fresh_model, LearnerConfig()).update(batch, advantages[:, :-1])
