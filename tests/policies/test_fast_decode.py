"""``turnrl.policies.hf.fast_decode.DecodeStep``: a decoded token through plain torch calls gives the
model's own forward's logits and keys/values, on each architecture it takes; everything else
is refused (the policy then uses the forward)."""

import pytest
import torch
from transformers import (GemmaConfig, GemmaForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

from turnrl.policies.sampling import SamplingParams
from turnrl.policies.hf.policy import TransformersPolicy
from turnrl.policies.hf import fast_decode
from turnrl.policies.hf.fast_decode import DecodeStep
from turnrl.policies.hf.gqa_attention import gqa_attention
from turnrl.policies.hf.kv_buffer import buffer_cache
from turnrl.envs import GuessNumberEnv
from turnrl.rollout import RolloutCollector, Task

from tests.tolerances import logit_magnitude, logprob_tol, max_abs, network_tol

SIZES = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
             intermediate_size=48, vocab_size=61, attn_implementation="sdpa")


def _random_model(cls, config, seed=0):
    """A model whose every weight (norms and biases included) is random, so a skipped or
    misplaced operation changes the logits."""
    torch.manual_seed(seed)
    model = cls(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    return model


ARCHS = {
    "qwen2": lambda: _random_model(Qwen2ForCausalLM, Qwen2Config(**SIZES)),
    "qwen3": lambda: _random_model(Qwen3ForCausalLM, Qwen3Config(**SIZES, head_dim=8)),
    "llama": lambda: _random_model(LlamaForCausalLM, LlamaConfig(**SIZES, attention_bias=True, mlp_bias=True)),
    "llama_mha": lambda: _random_model(LlamaForCausalLM, LlamaConfig(**{**SIZES, "num_key_value_heads": 4})),
    # a rotary type whose frequencies depend on the call's positions: computed each step, no table
    "llama_dynamic_rope": lambda: _random_model(LlamaForCausalLM, LlamaConfig(**SIZES, max_position_embeddings=8, rope_parameters={
        "rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})),
}


@pytest.mark.parametrize("attend", ["sdpa", "bmm"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_decoded_tokens_equal_the_models_forward_on_a_padded_batch(arch, fused, attend, monkeypatch):
    """Both weight layouts (query/key/value and gate/up concatenated on small models, the
    modules' own weights on large ones) and both attentions (SDPA; two matrix products over a
    long history), past the rotary table's first size."""
    monkeypatch.setattr(fast_decode, "FUSE_MAX_PARAMETERS", 10**9 if fused else 0)
    monkeypatch.setattr(fast_decode, "BMM_MIN_KEYS", 10**9 if attend == "sdpa" else 0)
    products = []
    attend_by_products = fast_decode._attend
    monkeypatch.setattr(fast_decode, "_attend", lambda *args: products.append(1) or attend_by_products(*args))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # (the matrix products run on one thread only)
    try:
        _decode_and_compare(arch, fused)
    finally:
        torch.set_num_threads(threads)
    assert bool(products) == (attend == "bmm")


def _decode_and_compare(arch, fused):
    model = ARCHS[arch]()
    step = DecodeStep.for_model(model)
    assert step is not None
    assert all((layer.qkv is not None) == fused for layer in step.layers)
    assert step._static_rope == (arch != "llama_dynamic_rope")
    ids = torch.randint(1, 61, (3, 7))
    attention = torch.ones(3, 7, dtype=torch.long)
    attention[0, :3] = 0  # left padding, as the policy batches prompts
    attention[2, :5] = 0
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    caches = [buffer_cache(2, 16), buffer_cache(2, 16)]
    with torch.no_grad(), gqa_attention(model):
        for cache in caches:
            model(input_ids=ids, attention_mask=attention, position_ids=positions, past_key_values=cache, use_cache=True)
        next_position = positions[:, -1] + 1
        for turn in range(14):  # positions 7..20: the table made at 7 holds 0..15, then grows
            tokens = torch.randint(1, 61, (3,))
            alive = torch.tensor([1, int(turn < 2), 1])  # row 1 finished: its new slots are padding
            attention = torch.cat([attention, alive[:, None]], dim=1)
            got = step(tokens, next_position, attention, caches[0])
            expected = model(input_ids=tokens[:, None], attention_mask=attention, position_ids=next_position[:, None],
                             past_key_values=caches[1], use_cache=True).logits[:, -1].float()
            # rounding only: the fused/unfused products and SDPA/bmm attention sum in other orders
            # than the forward (widest sum, 2 layers + head, relative to the logits' size)
            tol = network_tol(model.config, torch.float32, max_abs(expected), seq_len=attention.shape[1])
            torch.testing.assert_close(got, expected, rtol=0, atol=tol)
            assert got.shape == (3, 61) and got.dtype == torch.float32
            next_position = next_position + 1
    for mine, theirs in zip(caches[0].layers, caches[1].layers):
        assert mine.keys.shape == theirs.keys.shape == (3, model.config.num_key_value_heads, 21, 8)
        for got, expected in ((mine.keys, theirs.keys), (mine.values, theirs.values)):
            # as the logits' bound above, relative to the keys'/values' own size
            tol = network_tol(model.config, torch.float32, max_abs(expected), seq_len=attention.shape[1])
            torch.testing.assert_close(got, expected, rtol=0, atol=tol)


@pytest.mark.slow  # importing peft takes most of half a second
def test_models_it_does_not_reproduce_exactly_are_refused():
    assert DecodeStep.for_model(_random_model(GemmaForCausalLM, GemmaConfig(**SIZES, head_dim=8))) is None
    eager = ARCHS["qwen2"]()
    eager.config._attn_implementation = "eager"
    assert DecodeStep.for_model(eager) is None
    hooked = ARCHS["qwen2"]()
    handle = hooked.model.layers[1].mlp.register_forward_hook(lambda module, args, out: out * 2)
    assert DecodeStep.for_model(hooked) is None  # the hook would not run
    handle.remove()
    assert DecodeStep.for_model(hooked) is not None
    sliding = _random_model(Qwen2ForCausalLM, Qwen2Config(**SIZES, use_sliding_window=True, sliding_window=4,
                                                          max_window_layers=0))
    assert DecodeStep.for_model(sliding) is None
    peft = pytest.importorskip("peft", reason="peft is a dev dependency")
    lora = peft.get_peft_model(ARCHS["qwen2"](), peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert DecodeStep.for_model(lora.base_model.model) is None  # LoRA layers are not nn.Linear


def test_the_policy_samples_the_same_episodes_with_and_without_it(tokenizer, renderer):
    """Multi-turn episodes (prefix cache and buffers on) on a random Qwen2 for this tokenizer:
    the same tokens and logprobs as through the model's forward."""
    config = Qwen2Config(**{**SIZES, "vocab_size": len(tokenizer)})
    model = _random_model(Qwen2ForCausalLM, config, seed=1)
    runs = {}
    for fast in (True, False):
        policy = TransformersPolicy(model, tokenizer, seed=3, fast_decode=fast)
        collector = RolloutCollector(lambda: GuessNumberEnv(max_turns=3), policy, renderer, max_context_tokens=2048)
        runs[fast] = collector.collect([Task(0), Task(1)], 2, SamplingParams(max_new_tokens=6))
    assert sum(t.num_turns for t in runs[True]) >= 4
    # rounding only (fused products, another summation order): the logprob bound for this model
    # at its largest logits over the longest episode
    longest = max(runs[False], key=lambda t: len(t.token_ids))
    ids = torch.tensor([longest.token_ids])
    tol = logprob_tol(config, torch.float32, logit_magnitude(model, ids), seq_len=ids.shape[1])
    for a, b in zip(runs[True], runs[False]):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=tol)
