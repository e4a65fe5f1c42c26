"""``turnrl.policies.hf.row_cache``: an episode's next turn runs in its row of the kept buffer, after its
history, without copying it; rows are rebuilt only when the call's prompts change (an episode
ended, a new one, two prompts extending one sequence), and what a rebuild moves out is still
found. Every call samples what a whole prefill samples."""

import copy

import pytest

from turnrl.policies.sampling import SamplingParams
from turnrl.policies.hf.policy import TransformersPolicy
from turnrl.policies.hf.prefix_cache import PrefixCache
from turnrl.policies.hf.row_cache import RowCache

from tests.tolerances import logprob_tol_for


def fed(generation):
    """The sampled ids a policy fed back (all but an end-of-turn id, which ends the turn)."""
    return generation.token_ids[:-1] if generation.finish_reason == "stop" else generation.token_ids


def _same(got, expected, tol):
    for a, b in zip(got, expected, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= tol


@pytest.mark.slow
@pytest.mark.parametrize("greedy", [True, False])
def test_turns_run_in_their_rows_and_sample_what_a_whole_prefill_does(policy_model, tokenizer, renderer, greedy,
                                                                      monkeypatch):
    params = SamplingParams(max_new_tokens=6, greedy=greedy, temperature=1.0)
    policy = TransformersPolicy(policy_model, tokenizer, seed=4)
    whole = TransformersPolicy(policy_model, tokenizer, seed=4, prefix_cache=False)
    cache = policy.cache
    assert isinstance(cache, RowCache)
    rebuilds = []
    rebuild = RowCache.rebuild
    monkeypatch.setattr(RowCache, "rebuild", lambda self, *a, **k: (rebuilds.append(len(a[0])), rebuild(self, *a, **k)))
    widths = []  # the input width of each prefill (a hook: decoded tokens run the model's forward too)
    hook = policy_model.register_forward_pre_hook(
        lambda m, a, kw: widths.append(kw["input_ids"].shape) if kw["input_ids"].shape[1] > 1 else None,
        with_kwargs=True)
    try:
        def turn(prompts):
            got = policy.generate(prompts, params)
            # rounding only (a row of the kept buffer vs a whole prefill): the model's logprob bound
            # at its logits' size over these sequences (tests/tolerances.py)
            tol = logprob_tol_for(policy_model, [p + g.token_ids for p, g in zip(prompts, got)], params.temperature)
            _same(got, whole.generate(prompts, params), tol)
            return got

        def reply(prompt, generation, text):
            return prompt + generation.token_ids + renderer.encode(text)

        prompts = [renderer.encode(f"Guess a number between 1 and {n}.") for n in (7, 1000, 30, 12)]
        first = turn(prompts)
        assert rebuilds == [4] and len(cache.ids) == 4
        # the next turn of every episode: in place, each row's observation only
        observations = ["Too low.", "Too high, try a smaller number.", "Wrong.", "Still too low!"]
        second_prompts = [reply(p, g, o) for p, g, o in zip(prompts, first, observations)]
        widths.clear()
        second = turn(second_prompts)
        assert rebuilds == [4]
        new = [len(p) - len(prompt) - len(g.token_ids) + (g.finish_reason == "stop")
               for p, prompt, g in zip(second_prompts, prompts, first)]
        assert widths[0] == (4, max(new))  # the history was not run again
        for ids, prompt, g in zip(cache.ids, second_prompts, second):
            assert ids == prompt + fed(g)
        # two episodes ended: rebuilt once with the other two; the ended ones move out
        third_prompts = [reply(second_prompts[i], second[i], "Go on.") for i in (0, 2)]
        third = turn(third_prompts)
        assert rebuilds == [4, 2] and len(cache.ids) == 2 and len(cache.evicted) == 2
        # a moved-out episode goes on, and two prompts extend one row (a fork): all found
        hits = cache.hits
        fourth_prompts = [reply(second_prompts[1], second[1], "Back again."),
                          reply(third_prompts[0], third[0], "Left."), reply(third_prompts[0], third[0], "Right?")]
        turn(fourth_prompts)
        assert rebuilds == [4, 2, 3] and cache.hits == hits + 3
        # the moved-out entry found is dropped; the other ages, and the row no prompt extended moves out
        kept = {ids for by_length in cache.evicted.entries.values() for ids in by_length}
        assert kept == {tuple(second_prompts[3] + fed(second[3])), tuple(third_prompts[1] + fed(third[1]))}
    finally:
        hook.remove()


def test_rows_need_sdpa_attention_else_the_prefix_cache_copies(policy_model, tokenizer):
    eager = copy.deepcopy(policy_model)
    eager.config._attn_implementation = "eager"  # takes no boolean 4D mask
    assert isinstance(TransformersPolicy(eager, tokenizer).cache, PrefixCache)
    assert TransformersPolicy(policy_model, tokenizer, prefix_cache=False).cache is None
    assert isinstance(TransformersPolicy(policy_model, tokenizer, kv_buffer=False).cache, PrefixCache)
