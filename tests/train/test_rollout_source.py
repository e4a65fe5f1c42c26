"""The rollout sources behind one interface: the synchronous loop and the asynchronous
pipeline, driven here exactly as ``turnrl.train.loop.train`` drives them (``next`` ->
an update of the learner's model -> ``after_update``; ``drain`` / ``state`` / ``restore``
around a checkpoint), with the real tiny model, env and collector."""

import copy

import pytest
import torch

from turnrl.policies.hf.policy import TransformersPolicy
from turnrl.policies.sampling import SamplingParams
from turnrl.envs import GuessNumberEnv
from turnrl.rollout.collector import RolloutCollector
from turnrl.train.rollout_source import AsyncSource, SyncRollouts, TaskStream

pytestmark = pytest.mark.slow  # real rollouts of several steps

STEPS = 4


def sampling(step):
    return SamplingParams(max_new_tokens=6, temperature=1.0 + 0.1 * step)


def update(model, step):
    """A deterministic stand-in for the learner's update ``step``: every weight moves."""
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.add_(0.01 * ((step + i) % 3 - 1))


def source(kind, learner_model, tokenizer, renderer, **kwargs):
    """A source over a copy of the learner's model (as the async pipeline samples)."""
    sampler = TransformersPolicy(copy.deepcopy(learner_model), tokenizer, seed=7)
    collector = RolloutCollector(GuessNumberEnv, sampler, renderer, max_context_tokens=512, env_workers=1)
    args = (collector, TaskStream(seed=3, tasks_per_step=2), 2, sampling, 0, 1)
    if kind == "sync":
        return SyncRollouts(*args, push_weights=True)
    return AsyncSource(*args, eval_policy=None, last=STEPS, **kwargs)


def drive(src, model, steps, checkpoint_at=None):
    """The train loop's calls; returns each step's (token ids, sampler logprobs) and, at
    ``checkpoint_at``, what a checkpoint saves."""
    seen, saved = [], None
    for step in steps:
        batch, _ = src.next(step)
        seen.append([(t.token_ids, t.logprobs) for t in batch.trajectories])
        update(model, step)
        src.after_update(step, model)
        if step == checkpoint_at:
            saved = src.drain(step), src.state(), copy.deepcopy(model)
    src.close()
    return seen, saved


def test_async_with_no_staleness_gives_the_synchronous_rollouts(fresh_model, tokenizer, renderer):
    sync, _ = drive(source("sync", fresh_model, tokenizer, renderer), copy.deepcopy(fresh_model), range(1, STEPS + 1))
    async_, _ = drive(source("async", fresh_model, tokenizer, renderer, max_staleness=0, checkpoint_every=0),
                      copy.deepcopy(fresh_model), range(1, STEPS + 1))
    assert async_ == sync
    assert sync[0] != sync[-1]  # the weights moved between steps, and the samples with them


@pytest.mark.parametrize("k", [0, 1, 2])
def test_a_checkpoint_between_steps_resumes_the_same_rollouts(fresh_model, tokenizer, renderer, k):
    """``drain`` at a checkpoint hands over the in-flight steps and holds the sampler at rest;
    a new source restored from what was saved goes on exactly as the uninterrupted one."""
    kwargs = dict(max_staleness=k, checkpoint_every=2)
    whole, saved = drive(source("async", fresh_model, tokenizer, renderer, **kwargs), copy.deepcopy(fresh_model),
                         range(1, STEPS + 1), checkpoint_at=2)
    pending, state, model_at_2 = saved
    assert [b.step for b in pending] == list(range(3, 3 + min(k, STEPS - 2)))

    resumed = source("async", model_at_2, tokenizer, renderer, **kwargs)
    resumed.restore(2, state, pending)
    rest, _ = drive(resumed, model_at_2, range(3, STEPS + 1))
    assert rest == whole[2:]


def test_a_synchronous_source_refuses_in_flight_rollouts(fresh_model, tokenizer, renderer):
    src = source("async", fresh_model, tokenizer, renderer, max_staleness=1, checkpoint_every=1)
    _, saved = drive(src, copy.deepcopy(fresh_model), range(1, 2), checkpoint_at=1)
    pending, state, _ = saved
    assert pending
    with pytest.raises(ValueError, match="in-flight rollouts of an asynchronous run"):
        source("sync", fresh_model, tokenizer, renderer).restore(1, state, pending)
