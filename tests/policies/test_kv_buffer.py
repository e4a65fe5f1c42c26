"""Keys and values written in place (``turnrl.policies.hf.kv_buffer``) and grouped-query attention
without per-head copies (``turnrl.policies.hf.gqa_attention``): the sampler's figures stay those of
transformers' own ``DynamicCache`` and ``sdpa`` attention."""

import pytest
import torch
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

from turnrl.policies.sampling import SamplingParams
from turnrl.policies.hf.policy import TransformersPolicy
from turnrl.policies.hf.gqa_attention import SDPA_GQA, gqa_attention
from turnrl.policies.hf.kv_buffer import BufferLayer, buffer_cache, plain_attention
from turnrl.envs import GuessNumberEnv
from turnrl.rollout import RolloutCollector, Task

from tests.tolerances import logprob_tol_for, max_abs, network_tol


def test_a_buffer_layer_returns_what_was_written_and_grows_when_full():
    layer = BufferLayer(capacity=4)
    chunks = [torch.randn(2, 3, n, 5) for n in (3, 1, 2, 1)]
    written = []
    for chunk in chunks:
        keys, values = layer.update(chunk, -chunk)
        written.append(chunk)
        assert torch.equal(keys, torch.cat(written, dim=2)) and torch.equal(values, -keys)
        assert layer.get_seq_length() == keys.shape[2]
    assert layer.capacity == 8  # 3 + 1 fit in 4; 6 doubled it to 8; 7 fit
    base = layer._keys.data_ptr()
    layer.update(torch.randn(2, 3, 1, 5), torch.randn(2, 3, 1, 5))
    assert layer._keys.data_ptr() == base and layer.get_seq_length() == 8  # written in place


def test_reserve_zeroes_the_cached_slots_for_the_caller_to_fill():
    layer = BufferLayer(capacity=6)
    layer.reserve(2, torch.randn(3, 1, 5), torch.randn(3, 1, 5), filled=4)
    assert layer.keys.shape == (2, 3, 4, 5) and not layer.keys.any() and not layer.values.any()
    layer.keys[0, :, 1:] = 1.0
    keys, _ = layer.update(torch.full((2, 3, 1, 5), 2.0), torch.zeros(2, 3, 1, 5))
    assert keys.shape[2] == 5 and keys[0, 0, :, 0].tolist() == [0, 1, 1, 1, 2]


def test_only_models_of_plain_attention_layers_get_buffers():
    plain = Qwen2Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                        intermediate_size=32, vocab_size=50)
    sliding = Qwen2Config(**{**plain.to_dict(), "use_sliding_window": True, "sliding_window": 4,
                             "max_window_layers": 1, "layer_types": None})
    assert plain_attention(plain) and not plain_attention(sliding)
    assert [type(layer) for layer in buffer_cache(2, 8).layers] == [BufferLayer, BufferLayer]
    assert isinstance(buffer_cache(2, 8), DynamicCache)


def test_gqa_attention_equals_sdpa_on_a_padded_batch_and_restores_the_model():
    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                         intermediate_size=32, vocab_size=50, attn_implementation="sdpa")
    model = Qwen2ForCausalLM(config).eval()
    ids = torch.randint(1, 50, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[0, :4] = 0
    mask[2, :7] = 0
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
        with gqa_attention(model):
            assert model.config._attn_implementation == SDPA_GQA
            got = model(input_ids=ids, attention_mask=mask).logits
    assert model.config._attn_implementation == "sdpa"
    keep = mask.bool()
    # rounding only (grouped heads attended without copies: other summation orders): the network's
    # bound over 9 keys at the logits' size (tests/tolerances.py)
    tol = network_tol(config, torch.float32, max_abs(expected[keep]), seq_len=ids.shape[1])
    torch.testing.assert_close(got[keep], expected[keep], rtol=0, atol=tol)
    with pytest.raises(RuntimeError, match="boom"), gqa_attention(model):
        raise RuntimeError("boom")
    assert model.config._attn_implementation == "sdpa"
    model.config._attn_implementation = "eager"
    with gqa_attention(model):  # another implementation is left alone
        assert model.config._attn_implementation == "eager"


@pytest.mark.slow
@pytest.mark.parametrize("greedy", [True, False])
def test_buffered_episodes_equal_the_dynamic_cache_ones(policy_model, tokenizer, renderer, greedy):
    """Multi-turn episodes (prefix cache on) with in-place buffers and GQA attention against
    transformers' concatenating cache: the same tokens, logprobs equal to float rounding."""
    assert policy_model.config.num_key_value_heads < policy_model.config.num_attention_heads  # grouped heads
    params = SamplingParams(max_new_tokens=8, greedy=greedy, temperature=1.0)
    runs = {}
    for buffered in (True, False):
        policy = TransformersPolicy(policy_model, tokenizer, seed=5, kv_buffer=buffered)
        assert bool(policy._buffer_layers) == buffered
        collector = RolloutCollector(lambda: GuessNumberEnv(max_turns=6), policy, renderer, max_context_tokens=2048)
        runs[buffered] = collector.collect([Task(0), Task(1), Task(2)], 3, params)
    assert max(t.num_turns for t in runs[True]) >= 3
    # rounding only: the model's logprob bound at its logits' size over these episodes
    tol = logprob_tol_for(policy_model, [t.token_ids for t in runs[False]], params.temperature)
    for a, b in zip(runs[True], runs[False]):
        assert a.token_ids == b.token_ids
        lp_a = [x for x, m in zip(a.logprobs, a.loss_mask) if m]
        lp_b = [x for x, m in zip(b.logprobs, b.loss_mask) if m]
        assert torch.allclose(torch.tensor(lp_a), torch.tensor(lp_b), rtol=0, atol=tol)
