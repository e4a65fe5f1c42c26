"""The transformers backend keeps an episode's keys and values across its turns
(``turnrl.policies.hf.prefix_cache``): the same episodes as a whole prefill each turn, for a turn's
new tokens only."""

import copy

import pytest
import torch

from turnrl.policies.sampling import SamplingParams
from turnrl.policies.hf.policy import TransformersPolicy
from turnrl.policies.hf.prefix_cache import CachedPrefix, PrefixCache
from turnrl.algorithms import collate, token_logprobs
from turnrl.envs import GuessNumberEnv
from turnrl.rollout import RolloutCollector, Task

from tests.tolerances import logprob_tol_for


def entry(ids):
    return CachedPrefix(tuple(ids), [])


def test_lookup_finds_the_longest_strict_prefix_and_store_drops_used_and_old_entries():
    cache = PrefixCache(max_age=2)
    cache.store([entry([1, 2]), entry([1, 2, 3, 4]), entry([9])])
    assert cache.lookup([1, 2, 3, 4, 5]).ids == (1, 2, 3, 4)
    assert cache.lookup([1, 2, 3, 4]).ids == (1, 2)  # strict: one token must be left to run
    assert cache.lookup([1, 2, 3, 4, 5]).ids == (1, 2, 3, 4)  # still there until the next store
    assert cache.lookup([7, 1, 2]) is None and (cache.hits, cache.misses, cache.reused_tokens) == (3, 1, 10)
    cache.store([entry([1, 2, 3, 4, 5, 6])])  # the two used entries go, [9] ages
    assert sorted(e for n in cache.entries.values() for e in n) == [(1, 2, 3, 4, 5, 6), (9,)]
    cache.store([])
    cache.store([])
    assert len(cache) == 1  # [9] was left unused for max_age calls (a finished episode's entry)
    cache.store([])
    assert len(cache) == 0
    cache.store([entry([5, 5, 5])])
    assert cache.tokens == 3
    cache.clear()
    assert cache.lookup([5, 5, 5, 5]) is None


def collect(model, tokenizer, renderer, prefix_cache, params, seed=3):
    policy = TransformersPolicy(model, tokenizer, seed=seed, prefix_cache=prefix_cache)
    collector = RolloutCollector(lambda: GuessNumberEnv(max_turns=6), policy, renderer, max_context_tokens=2048)
    return collector.collect([Task(0), Task(1), Task(2)], 3, params), policy


@pytest.mark.slow
@pytest.mark.parametrize("greedy", [True, False])
def test_cached_turns_sample_the_episodes_of_a_whole_prefill(policy_model, tokenizer, renderer, greedy):
    params = SamplingParams(max_new_tokens=8, greedy=greedy, temperature=1.0)
    with_cache, policy = collect(policy_model, tokenizer, renderer, True, params)
    without, plain = collect(policy_model, tokenizer, renderer, False, params)
    assert plain.cache is None
    assert max(t.num_turns for t in with_cache) >= 3  # later turns continued from the cache
    # every prompt but the first turn's found its episode's history
    first_turns = 9
    turns = sum(t.num_turns for t in with_cache)
    assert policy.cache.hits >= turns - first_turns and policy.cache.reused_tokens > 0
    # rounding only (cached turns, a whole prefill, the learner's forward): the model's logprob bound
    tol = logprob_tol_for(policy_model, [t.token_ids for t in without], params.temperature)
    for a, b in zip(with_cache, without):
        assert a.token_ids == b.token_ids  # the same episodes (float rounding flips no token here)
        assert a.loss_mask == b.loss_mask
        assert (torch.tensor(a.logprobs) - torch.tensor(b.logprobs)).abs().max() <= tol
    # token-exact: the logprobs the sampler recorded are the learner's
    batch = collate(with_cache, tokenizer.pad_token_id)
    learner, _, _ = token_logprobs(policy_model, batch.input_ids, batch.attention_mask, score_mask=batch.loss_mask)
    assert ((learner - batch.old_logprobs).abs() * batch.loss_mask).max() <= tol


@pytest.mark.slow
def test_a_weight_change_drops_the_cache(policy_model, tokenizer, renderer):
    model = copy.deepcopy(policy_model)
    policy = TransformersPolicy(model, tokenizer, seed=0)
    prompt = renderer.encode("Guess a number between 1 and 10.")
    first = policy.generate([prompt], SamplingParams(max_new_tokens=4, greedy=True))[0]
    follow_up = prompt + first.token_ids + prompt
    assert len(policy.cache) == 1
    with torch.no_grad():  # an in-place update, as an optimizer step is
        model.model.embed_tokens.weight.mul_(1.5)
    again = policy.generate([follow_up], SamplingParams(max_new_tokens=4, greedy=True))[0]
    assert policy.cache.hits == 0  # the old weights' keys and values were not used
    fresh = TransformersPolicy(model, tokenizer, seed=0, prefix_cache=False)
    assert again.token_ids == fresh.generate([follow_up], SamplingParams(max_new_tokens=4, greedy=True))[0].token_ids


def generate_recording_calls(model, tokenizer, prompts, params, seed, prefix_cache=False):
    """Generations of a new ``TransformersPolicy`` (with a prefix cache: its rows,
    ``turnrl.policies.hf.row_cache``) and the ``input_ids`` shape of each model call it made (a hook
    turns ``DecodeStep`` off: decoded tokens are calls too)."""
    shapes = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: shapes.append(tuple(kw["input_ids"].shape)),
                                           with_kwargs=True)
    try:
        policy = TransformersPolicy(model, tokenizer, seed=seed, prefix_cache=prefix_cache)
        return policy.generate(prompts, params), shapes
    finally:
        hook.remove()


def assert_same_as_one_prefill(generations, model, tokenizer, prompts, params, seed):
    one_call = TransformersPolicy(model, tokenizer, seed=seed, prefix_cache=False, kv_buffer=False)
    # rounding only (a shared prompt run once, rows vs separate prefills): the model's logprob bound
    tol = logprob_tol_for(model, [p + g.token_ids for p, g in zip(prompts, generations)], params.temperature)
    for a, b in zip(generations, one_call.generate(prompts, params)):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= tol


@pytest.mark.parametrize("rows", [False, True], ids=["call", "rows"])
@pytest.mark.parametrize("greedy", [True, False])
def test_a_prompt_several_rows_share_runs_once_and_samples_what_separate_prefills_do(policy_model, tokenizer,
                                                                                       renderer, greedy, rows):
    params = SamplingParams(max_new_tokens=6, greedy=greedy, temperature=1.0)
    p = renderer.encode("Guess a number between 1 and 10.")
    q = renderer.encode("Guess a number between 1 and 100, please.")
    prompts = [p, q, p, p, q, p[:-2]]
    shared, shapes = generate_recording_calls(policy_model, tokenizer, prompts, params, seed=5, prefix_cache=rows)
    # p and q once each (all but their last token), then every row's rest: 1 token, p[:-2] whole
    assert shapes[0] == (2, len(q) - 1) and shapes[1] == (6, len(p) - 2)
    assert_same_as_one_prefill(shared, policy_model, tokenizer, prompts, params, seed=5)


@pytest.mark.parametrize("rows", [False, True], ids=["call", "rows"])
@pytest.mark.parametrize("greedy", [True, False])
def test_a_row_far_longer_than_the_others_runs_its_extra_tokens_apart(policy_model, tokenizer, renderer, greedy,
                                                                      rows):
    params = SamplingParams(max_new_tokens=5, greedy=greedy, temperature=1.0)
    short = [renderer.encode(f"Guess a number between 1 and {n}.") for n in (7, 12, 30, 99, 5)]
    long = renderer.encode(" ".join(f"Too low, {n}." for n in range(40)))
    prompts = [*short[:3], long, *short[3:]]
    width = max(len(p) for p in short)
    assert len(long) - width > 64  # the other 5 rows would pad to it: > 256 columns
    evened, shapes = generate_recording_calls(policy_model, tokenizer, prompts, params, seed=2, prefix_cache=rows)
    # the long row's first len(long) - width tokens alone, then every row's last `width` at most
    assert shapes[0] == (1, len(long) - width) and shapes[1] == (6, width)
    assert_same_as_one_prefill(evened, policy_model, tokenizer, prompts, params, seed=2)
    # a few rows a little longer than the rest are left as they are (one call)
    _, shapes = generate_recording_calls(policy_model, tokenizer, short, params, seed=2, prefix_cache=rows)
    assert shapes[0] == (5, width)
