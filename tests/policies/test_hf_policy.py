"""TransformersPolicy: batched sampling with a KV cache and left padding."""

import copy

import pytest
import torch

from turnrl.policies.sampling import SamplingParams
from turnrl.policies.hf.policy import TransformersPolicy
from turnrl.policies.hf.policy import sample_categorical, top_p_logprobs
from turnrl.algorithms import token_logprobs
from tests.helpers import varied_prompts
from tests.tolerances import logprob_tol_for


@pytest.fixture(scope="module")
def prompts(renderer, tokenizer):
    return varied_prompts(renderer, tokenizer)


GREEDY = SamplingParams(max_new_tokens=10, greedy=True)


@pytest.mark.slow
def test_greedy_generation_is_deterministic(tiny_model, tokenizer, prompts):
    runs = [TransformersPolicy(tiny_model, tokenizer, seed=s).generate(prompts, GREEDY) for s in (0, 0, 7)]
    for other in runs[1:]:
        assert [g.token_ids for g in other] == [g.token_ids for g in runs[0]]
        assert [g.logprobs for g in other] == [g.logprobs for g in runs[0]]


@pytest.mark.slow
def test_sampling_with_the_same_seed_repeats_and_another_seed_differs(tiny_model, tokenizer, prompts):
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    a, b, c = (TransformersPolicy(tiny_model, tokenizer, seed=s).generate(prompts, params) for s in (5, 5, 6))
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.token_ids for g in a] != [g.token_ids for g in c]


@pytest.mark.slow
def test_left_padded_batch_equals_each_prompt_alone(tiny_model, tokenizer, prompts):
    policy = TransformersPolicy(tiny_model, tokenizer)
    params = SamplingParams(max_new_tokens=16, greedy=True)
    batched = policy.generate(prompts, params)
    # rounding only (padding changes the products' shapes): the model's logprob bound at its logits' size
    tol = logprob_tol_for(tiny_model, [p + g.token_ids for p, g in zip(prompts, batched)])
    for prompt, gen in zip(prompts, batched):
        (alone,) = policy.generate([prompt], params)
        assert gen.token_ids == alone.token_ids
        assert gen.finish_reason == alone.finish_reason
        assert max(abs(a - b) for a, b in zip(gen.logprobs, alone.logprobs)) <= tol
    # batching with a copy of itself and a longer prompt changes nothing either
    again = policy.generate([prompts[0], prompts[1], prompts[0]], params)
    assert again[0].token_ids == again[2].token_ids == batched[0].token_ids


@pytest.mark.slow
def test_greedy_logprobs_are_the_temperature_one_logprobs_of_the_learner(tiny_model, tokenizer, prompts):
    policy = TransformersPolicy(tiny_model, tokenizer)
    for prompt, gen in zip(prompts, policy.generate(prompts, GREEDY)):
        ids = torch.tensor([prompt + gen.token_ids])
        with torch.no_grad():
            logprobs, _, _ = token_logprobs(tiny_model, ids, torch.ones_like(ids), temperature=1.0)
        recomputed = logprobs[0, len(prompt):].tolist()
        # rounding only (KV-cached decode vs one forward): the model's logprob bound at its logits' size
        tol = logprob_tol_for(tiny_model, ids.tolist())
        assert max(abs(a - b) for a, b in zip(gen.logprobs, recomputed)) <= tol


@pytest.mark.slow
@pytest.mark.parametrize("params", [SamplingParams(max_new_tokens=5, greedy=True),
                                    SamplingParams(max_new_tokens=5, temperature=0.7)], ids=["greedy", "sampled"])
def test_max_new_tokens_cut_gives_finish_reason_length(tiny_model, tokenizer, prompts, params):
    eos = tokenizer.eos_token_id
    for gen in TransformersPolicy(tiny_model, tokenizer).generate(prompts, params):
        assert len(gen.token_ids) == len(gen.logprobs) <= 5
        if eos not in gen.token_ids:
            assert len(gen.token_ids) == 5 and gen.finish_reason == "length"
        else:
            assert gen.token_ids[-1] == eos and gen.finish_reason == "stop"
    # the plain random-init model practically never samples eos: the cut path is taken
    assert any(g.finish_reason == "length" for g in TransformersPolicy(tiny_model, tokenizer).generate(prompts, params))


@pytest.mark.slow
def test_rows_that_stop_early_end_with_eos_and_leave_the_other_rows_exact(policy_model, tokenizer, prompts):
    """With the eos-biased model rows of one batch stop at different steps; each row's ids
    and logprobs must still be those of that row alone (scored here by the learner)."""
    eos = tokenizer.eos_token_id
    policy = TransformersPolicy(policy_model, tokenizer, seed=0)
    batch = prompts * 6
    gens = policy.generate(batch, SamplingParams(max_new_tokens=24, temperature=1.0))
    stopped = [g for g in gens if g.finish_reason == "stop"]
    assert stopped and len({len(g.token_ids) for g in gens}) >= 2
    for g in stopped:
        assert g.token_ids[-1] == eos and eos not in g.token_ids[:-1]
    # rounding only (a padded, cached batch vs one row's forward): the model's logprob bound
    tol = logprob_tol_for(policy_model, [prompt + gen.token_ids for prompt, gen in zip(batch, gens)])
    for prompt, gen in zip(batch, gens):
        ids = torch.tensor([prompt + gen.token_ids])
        with torch.no_grad():
            logprobs, _, _ = token_logprobs(policy_model, ids, torch.ones_like(ids))
        recomputed = logprobs[0, len(prompt):].tolist()
        assert max(abs(a - b) for a, b in zip(gen.logprobs, recomputed)) <= tol


def test_generate_restores_training_mode_and_handles_no_prompts(fresh_model, tokenizer, prompts):
    fresh_model.train()
    policy = TransformersPolicy(fresh_model, tokenizer)
    assert policy.generate([], GREEDY) == []
    policy.generate(prompts[:1], GREEDY)
    assert fresh_model.training
    fresh_model.eval()
    policy.generate(prompts[:1], GREEDY)
    assert not fresh_model.training


def test_sampling_params_reject_bad_values():
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=0.0)


def test_copy_of_merges_lora_adapters_and_takes_the_learners_weights_by_sync_from(tiny_model, tokenizer, prompts):
    peft = pytest.importorskip("peft", reason="peft is not installed (the 'lora' extra)")
    from turnrl.train.agreement import logprob_agreement

    learner = copy.deepcopy(tiny_model)
    peft.inject_adapter_in_model(peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]),
                                 learner)

    def move_adapters(seed):  # zero-init B would make the adapters a no-op
        torch.manual_seed(seed)
        with torch.no_grad():
            for name, p in learner.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.3)

    move_adapters(3)
    policy = TransformersPolicy.copy_of(learner, tokenizer, seed=0)
    assert policy.needs_weight_push and not TransformersPolicy(learner, tokenizer).needs_weight_push
    assert set(policy.model.state_dict()) == set(tiny_model.state_dict())  # a plain model: adapters merged
    params = SamplingParams(max_new_tokens=8, temperature=1.0)

    def agree():  # max |sampler - learner| logprob, and the learner's logprob bound on those tokens
        agreement = logprob_agreement(policy, learner, prompts * 2, params)
        rows = [p + g.token_ids for p, g in zip(prompts * 2, agreement["generations"])]
        return agreement["max_abs"], logprob_tol_for(learner, rows, params.temperature)

    # rounding only (adapters merged into the copy's weights: other products): the logprob bound
    gap, tol = agree()
    assert gap <= tol
    move_adapters(4)  # the learner's update does not reach the copy ...
    assert agree()[0] > 1e-2
    policy.sync_from(learner)  # ... until it is pushed
    gap, tol = agree()
    assert gap <= tol
    with pytest.raises(ValueError, match="unknown.*LoRA adapter weights: push merged_state_dict"):
        policy.load_weights(learner.state_dict())  # unmerged adapter weights are refused, naming the fix
    with pytest.raises(ValueError, match="1 missing.*model.norm.weight"):
        policy.load_weights({n: t for n, t in policy.model.state_dict().items() if n != "model.norm.weight"})


@pytest.mark.parametrize(("forced", "stops"), [("<|call|>", True), ("<|return|>", True), ("<|end|>", False)])
def test_a_turn_ends_at_every_end_of_turn_token_of_the_family_and_no_other(forced, stops):
    """gpt-oss ends a call turn with <|call|> and an answer with <|return|>; <|end|> closes a
    channel inside a turn and must not stop it."""
    from turnrl.models.causal_lm import TinyModelConfig, build_tiny_model
    from turnrl.chat.families import family_tokenizer

    tok = family_tokenizer("gptoss")
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                             intermediate_size=64), tok, seed=0)
    target = tok.convert_tokens_to_ids(forced)
    model.lm_head.register_forward_hook(lambda module, inputs, logits: logits.index_fill(-1, torch.tensor([target]), 50.0))
    gen = TransformersPolicy(model, tok, seed=0).generate([tok("hi", add_special_tokens=False)["input_ids"]],
                                                          SamplingParams(max_new_tokens=4))[0]
    if stops:
        assert (gen.token_ids, gen.finish_reason) == ([target], "stop")
    else:
        assert (gen.token_ids, gen.finish_reason) == ([target] * 4, "length")


def test_sample_categorical_draws_each_id_at_its_probability_and_never_a_zero_weight_one():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 1e-30]]).repeat(20_000, 1)
    draws = sample_categorical(probs, torch.Generator().manual_seed(0)).view(20_000, 2)
    counts = torch.bincount(draws[:, 0], minlength=6).double() / 20_000
    # 4 standard errors of a proportion out of 20,000 draws: at most 0.015
    assert torch.allclose(counts, probs[0].double(), atol=0.015)
    assert counts[[0, 2, 5]].sum() == 0  # weight 0: never drawn
    assert (draws[:, 1] == 5).all()  # the only id with weight, however small the row's sum
    again = sample_categorical(probs, torch.Generator().manual_seed(0)).view(20_000, 2)
    assert torch.equal(draws, again)  # the same generator state, the same draws
    for bad in ([0.5, float("nan")], [0.5, float("inf")], [0.0, 0.0]):
        with pytest.raises(ValueError, match="NaN/inf"):
            sample_categorical(torch.tensor([[0.2, 0.8], bad]), torch.Generator())


@pytest.mark.slow
def test_a_model_trains_after_sampling_on_it_and_samples_again_after_the_step(tokenizer, prompts):
    """``generate`` runs under ``torch.inference_mode``: nothing it makes may end up where training
    needs a normal tensor. A Llama with dynamic rotary embeddings (whose forward recomputes its
    ``inv_freq`` buffer once a sequence passes ``max_position_embeddings``, here during sampling)
    samples, trains one AdamW step on its own samples, and samples again: the cache of the first
    calls is dropped (the weights changed) and the second samples equal a fresh policy's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                         intermediate_size=48, vocab_size=len(tokenizer), max_position_embeddings=16,
                         rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
                         attn_implementation="sdpa", pad_token_id=tokenizer.pad_token_id)
    model = LlamaForCausalLM(config)
    policy = TransformersPolicy(model, tokenizer, seed=0)
    batch = prompts[:3]
    assert max(len(p) for p in batch) > config.max_position_embeddings  # the rotary buffer is recomputed
    params = SamplingParams(max_new_tokens=6)
    first = policy.generate(batch, params)
    policy.generate([p + g.token_ids for p, g in zip(batch, first)], params)  # a second turn, on the cache
    assert len(policy.cache) > 0
    rotary = model.model.rotary_emb
    assert not any(b.is_inference() for b in model.buffers())
    assert rotary.inv_freq.data_ptr() != rotary.original_inv_freq.data_ptr()  # recomputed (for the long rows)
    rows = [p + g.token_ids for p, g in zip(batch, first)]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    logits = model(input_ids=ids, attention_mask=mask).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
    (loss * mask[:, 1:].flatten()).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
    optimizer.step()
    again = policy.generate(batch, GREEDY)
    assert len(policy.cache) == len(batch)  # the old rows were dropped, only this call's are kept
    fresh = TransformersPolicy(model, tokenizer, seed=0).generate(batch, GREEDY)
    assert [g.token_ids for g in again] == [g.token_ids for g in fresh]
    # rounding only (another batch's padding and cache): the model's logprob bound at its logits' size
    tol = logprob_tol_for(model, [p + g.token_ids for p, g in zip(batch, fresh)])
    torch.testing.assert_close(torch.tensor([lp for g in again for lp in g.logprobs]),
                               torch.tensor([lp for g in fresh for lp in g.logprobs]), rtol=0, atol=tol)


@pytest.mark.parametrize("top_p", [1e-300, 1e-45, 1e-6, 0.5])
def test_a_nucleus_below_float32s_smallest_number_keeps_the_most_likely_id(top_p):
    """``top_p`` of 1e-300 reads as 0 in float32: the most likely id stays (probability 1 once
    renormalised), never an all-excluded row (NaN), as a random request body once found."""
    logp = torch.log_softmax(torch.tensor([[2.0, 0.5, -1.0, 1.0], [0.0, 0.0, 0.0, 3.0]]), dim=-1)
    cut = top_p_logprobs(logp, top_p)
    assert torch.isfinite(cut.logsumexp(-1)).all() and torch.allclose(cut.exp().sum(-1), torch.ones(2))
    if top_p < 0.1:
        assert cut[0, 0] == 0 and cut[1, 3] == 0 and torch.isinf(cut[0, 1:]).all()
