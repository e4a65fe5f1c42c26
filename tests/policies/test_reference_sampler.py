"""``TransformersPolicy`` (the engine) against ``ReferencePolicy`` (the plain sampler of
``turnrl.policies.hf.reference``), on a real tiny Qwen2, for every setting of the engine's
switches that takes a different path, over two turns of a conversation (the second prompt
extends the first prompt, its reply and an observation, so the engine's cache serves it).

What must be equal, and why:

* greedy decoding: the same ids, and logprobs equal to float rounding;
* sampling, a batch: the engine draws one uniform per row per step across the batch, the
  reference one per token prompt after prompt, so their ids differ by construction; the logprob
  the engine reports for each id it sampled must be ``ReferencePolicy.score`` of that id (the
  same temperature-scaled distribution), to float rounding;
* sampling, one prompt, the same seed: both draw one uniform per token from a generator seeded
  alike, so the ids are the same (turn after turn: the generators stay in step). Rounding could
  part them only by moving a draw across a step of the cumulative distribution, which it shifts
  by ~1e-6 here: a chance of that order per token, and the seeds are fixed.

``SamplingParams`` has no top-p or top-k: the temperature is the only thing that shapes the
distribution, checked at 0.7 and 1.0 (where the engine skips the division).

The fast tier runs the engine's default path (and the plain one, greedy); the other settings of
the switches are marked slow (the whole module takes over ~3 s).

Float rounding is ``tests.tolerances.logprob_tol_for``: the engine and the reference compute the
same logits with sums in other orders (left padding, a cached prefix, in-place buffers, the
fused decoder, one forward over the whole sequence in ``score``), and that function bounds how
far rounding alone moves a token's logprob, from the model's widths, depth and the logits' size
at the temperature compared. A real bug (a wrong position, mask or temperature) moves logprobs
by far more. The model has an end-of-turn bias in its LM head's weights (not a forward hook,
which would turn ``fast_decode`` off), so turns end at varied lengths and both finish reasons
occur.
"""

import copy

import pytest
import torch

from turnrl.policies.hf.fast_decode import DecodeStep
from turnrl.policies.hf.policy import TransformersPolicy
from turnrl.policies.hf.reference import ReferencePolicy
from turnrl.policies.hf.row_cache import RowCache
from turnrl.policies.protocol import RolloutPolicy
from turnrl.policies.sampling import SamplingParams
from tests.helpers import assert_generation_contract, varied_prompts
from tests.tolerances import logprob_tol_for

EOS_BIAS = 3.0  # sampled turns: as conftest's policy_model, but in the LM head's bias
GREEDY_EOS_BIAS = 1.55  # greedy turns: some stop (from ~1.65 on, all at once), some reach the cap
OBSERVATIONS = ["higher", "lower", "Wrong format: reply with one number between 1 and 32."]

# each setting of the switches that takes another path through the engine
SWITCHES = {
    "rows": {},
    "rows-no-fast-decode": {"fast_decode": False},
    "prefix-cache": {"row_cache": False},
    "prefix-cache-no-fast-decode": {"row_cache": False, "fast_decode": False},
    "prefix-cache-no-kv-buffer": {"kv_buffer": False},
    "no-cache": {"prefix_cache": False},
    "no-cache-no-fast-decode": {"prefix_cache": False, "fast_decode": False},
    "plain": {"prefix_cache": False, "kv_buffer": False, "fast_decode": False},
}


def with_eos_bias(tiny_model, tokenizer, eos_bias: float):
    """A copy of the tiny model with ``eos_bias`` on the end-of-turn logit, as a bias of its LM
    head (the random-init model's logits are near flat: this makes turns end at varied lengths)."""
    model = copy.deepcopy(tiny_model).eval()
    bias = torch.zeros(model.lm_head.out_features)
    bias[tokenizer.eos_token_id] = eos_bias
    model.lm_head.bias = torch.nn.Parameter(bias)
    assert DecodeStep.for_model(model) is not None  # the fused decoder runs on it
    return model


@pytest.fixture(scope="module")
def model(tiny_model, tokenizer):
    return with_eos_bias(tiny_model, tokenizer, EOS_BIAS)


@pytest.fixture(scope="module")
def greedy_model(tiny_model, tokenizer):
    return with_eos_bias(tiny_model, tokenizer, GREEDY_EOS_BIAS)


def switch_params(fast: tuple[str, ...]) -> list:
    """``SWITCHES`` as parameters, all but those named in ``fast`` marked slow."""
    return [pytest.param(switches, id=name, marks=() if name in fast else pytest.mark.slow)
            for name, switches in SWITCHES.items()]


@pytest.fixture(scope="module")
def prompts(renderer, tokenizer):
    return varied_prompts(renderer, tokenizer)


def next_prompts(tokenizer, prompts, gens) -> list[list[int]]:
    """Each conversation's next prompt: its prompt, the reply (closed by the end-of-turn id),
    an observation and the generation prompt."""
    out = []
    for row, (prompt, gen) in enumerate(zip(prompts, gens)):
        closed = gen.token_ids + ([] if gen.finish_reason == "stop" else [tokenizer.eos_token_id])
        text = f"\n<|im_start|>user\n{OBSERVATIONS[row % len(OBSERVATIONS)]}<|im_end|>\n<|im_start|>assistant\n"
        out.append(prompt + closed + tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def two_turns(policy, tokenizer, prompts, params) -> list[tuple[list[int], object]]:
    """``(prompt, generation)`` of each row, turn one's then turn two's."""
    first = policy.generate(prompts, params)
    second_prompts = next_prompts(tokenizer, prompts, first)
    second = policy.generate(second_prompts, params)
    for gens in (first, second):
        assert_generation_contract(gens, tokenizer.eos_token_id, params.max_new_tokens)
    return list(zip(prompts, first)) + list(zip(second_prompts, second))


def assert_cache_served_turn_two(engine: TransformersPolicy, rows: int) -> None:
    if engine.cache is not None:
        assert engine.cache.hits >= rows and engine.cache.reused_tokens > 0


def test_the_reference_is_a_rollout_policy(model, tokenizer):
    reference = ReferencePolicy(model, tokenizer)
    assert isinstance(reference, RolloutPolicy) and reference.token_exact and not reference.needs_weight_push
    assert reference.generate([], SamplingParams()) == []


GREEDY = SamplingParams(max_new_tokens=12, greedy=True)


@pytest.fixture(scope="module")
def greedy_reference(greedy_model, tokenizer, prompts):
    """The reference's two greedy turns of a batch of prompts of different lengths (one twice),
    and the tolerance on their logprobs. Each id chosen leads the runner-up logit by more than
    that tolerance (which exceeds twice the rounding of a logit): rounding cannot change an
    argmax, so the engine must choose the same ids."""
    turns = two_turns(ReferencePolicy(greedy_model, tokenizer), tokenizer, prompts + prompts[:1], GREEDY)
    assert {gen.finish_reason for _, gen in turns} == {"stop", "length"}
    tol = logprob_tol_for(greedy_model, [prompt + gen.token_ids for prompt, gen in turns])
    with torch.no_grad():
        for prompt, gen in turns:
            logits = greedy_model(input_ids=torch.tensor([prompt + gen.token_ids])).logits[0, len(prompt) - 1:-1]
            top2 = logits.topk(2).values
            assert float((top2[:, 0] - top2[:, 1]).min()) > tol
    return turns, tol


@pytest.mark.parametrize("switches", switch_params(fast=("rows", "plain")))
def test_greedy_turns_are_the_reference_ones(greedy_model, tokenizer, greedy_reference, switches):
    engine = TransformersPolicy(greedy_model, tokenizer, **switches)
    assert isinstance(engine.cache, RowCache) == all(switches.get(k, True) for k in ("prefix_cache", "kv_buffer",
                                                                                     "row_cache"))
    expected, tol = greedy_reference
    batch = [prompt for prompt, _ in expected[:len(expected) // 2]]
    turns = two_turns(engine, tokenizer, batch, GREEDY)
    assert_cache_served_turn_two(engine, len(batch))
    for (prompt, gen), (ref_prompt, ref) in zip(turns, expected):
        assert prompt == ref_prompt and gen.token_ids == ref.token_ids and gen.finish_reason == ref.finish_reason
        assert max(abs(a - b) for a, b in zip(gen.logprobs, ref.logprobs)) <= tol


@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("switches", switch_params(fast=("rows",)))
def test_sampled_logprobs_are_the_reference_scores_of_the_sampled_ids(model, tokenizer, prompts, switches,
                                                                      temperature):
    engine = TransformersPolicy(model, tokenizer, seed=11, **switches)
    params = SamplingParams(max_new_tokens=12, temperature=temperature)
    batch = prompts * 2  # each prompt twice: the rows of a group share it
    turns = two_turns(engine, tokenizer, batch, params)
    assert_cache_served_turn_two(engine, len(batch))
    assert {gen.finish_reason for _, gen in turns} == {"stop", "length"}
    assert len({tuple(gen.token_ids) for _, gen in turns[:len(batch)]}) > len(prompts)  # a group's rows differ
    reference = ReferencePolicy(model, tokenizer)
    tol = logprob_tol_for(model, [prompt + gen.token_ids for prompt, gen in turns], temperature)
    for prompt, gen in turns:
        scored = reference.score(prompt, gen.token_ids, params)
        assert max(abs(a - b) for a, b in zip(gen.logprobs, scored)) <= tol


@pytest.mark.parametrize("switches, temperature", [
    pytest.param(SWITCHES["rows"], 0.7, id="rows-0.7"),
    pytest.param(SWITCHES["plain"], 1.0, id="plain-1.0", marks=pytest.mark.slow),
])
def test_one_prompt_samples_the_reference_ids_with_the_same_seed(model, tokenizer, prompts, switches, temperature):
    params = SamplingParams(max_new_tokens=12, temperature=temperature)
    for prompt in prompts:
        engine = TransformersPolicy(model, tokenizer, seed=5, **switches)
        reference = ReferencePolicy(model, tokenizer, seed=5)
        turns = two_turns(engine, tokenizer, [prompt], params)
        expected = two_turns(reference, tokenizer, [prompt], params)
        tol = logprob_tol_for(model, [p + g.token_ids for p, g in turns], temperature)
        for (prompt_, gen), (ref_prompt, ref) in zip(turns, expected):
            assert prompt_ == ref_prompt and gen.token_ids == ref.token_ids and gen.finish_reason == ref.finish_reason
            assert max(abs(a - b) for a, b in zip(gen.logprobs, ref.logprobs)) <= tol
    # another seed samples other ids: the ids compared depend on the seed
    assert ReferencePolicy(model, tokenizer, seed=6).generate([prompt], params)[0].token_ids != turns[0][1].token_ids


def test_the_reference_scores_its_own_samples_and_restores_its_generator(model, tokenizer, prompts):
    params = SamplingParams(max_new_tokens=12, temperature=0.7)
    reference = ReferencePolicy(model, tokenizer, seed=3)
    state = reference.rng_state()
    gens = reference.generate(prompts, params)
    tol = logprob_tol_for(model, [p + g.token_ids for p, g in zip(prompts, gens)], 0.7)
    for prompt, gen in zip(prompts, gens):
        assert max(abs(a - b) for a, b in zip(gen.logprobs, reference.score(prompt, gen.token_ids, params))) <= tol
    reference.set_rng_state(state)
    assert reference.generate(prompts, params) == gens
