"""Models: the tiny Qwen2 built from a config, and loading any checkpoint by path."""

import copy

import pytest
import torch
from transformers import Qwen2ForCausalLM

from turnrl.models.causal_lm import build_tiny_model, load_pretrained

from tests.tolerances import max_abs, network_tol

MESSAGES = [{"role": "system", "content": "You are playing a guessing game."},
            {"role": "user", "content": "Guess my number between 1 and 32."},
            {"role": "assistant", "content": "16"}, {"role": "tool", "content": "higher"}]


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_model, tokenizer):
    path = tmp_path_factory.mktemp("tiny_checkpoint")
    tiny_model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_build_tiny_model_depends_only_on_seed(tokenizer, tiny_config, tiny_model):
    state = torch.random.get_rng_state()
    again = build_tiny_model(tiny_config, tokenizer, seed=0)
    other = build_tiny_model(tiny_config, tokenizer, seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is left alone
    for (name, p), q, r in zip(tiny_model.named_parameters(), again.parameters(), other.parameters()):
        assert torch.equal(p, q), name
    assert not torch.equal(tiny_model.model.embed_tokens.weight, other.model.embed_tokens.weight)
    assert tiny_model.config.vocab_size == len(tokenizer)
    assert tiny_model.lm_head.weight is tiny_model.model.embed_tokens.weight
    assert all(p.dtype == torch.float32 for p in tiny_model.parameters())


def test_load_pretrained_gives_the_same_logits(saved, tiny_model, tokenizer):
    model, _ = load_pretrained(str(saved))
    assert isinstance(model, Qwen2ForCausalLM)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False)
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    tiny_model.eval()
    with torch.no_grad():
        expected = tiny_model(input_ids=ids).logits
        got = model(input_ids=ids).logits
    # the same weights and computation; a GEMM may still round otherwise on other memory alignment:
    # the network's rounding bound at the logits' size (tests/tolerances.py)
    tol = network_tol(model.config, torch.float32, max_abs(expected), seq_len=ids.shape[1])
    assert torch.allclose(got, expected, atol=tol, rtol=0)


def test_load_pretrained_gives_the_same_tokenizer(saved, tokenizer):
    _, loaded = load_pretrained(str(saved))
    assert loaded.chat_template == tokenizer.chat_template
    assert loaded.get_vocab() == tokenizer.get_vocab()
    assert (loaded.eos_token_id, loaded.pad_token_id) == (tokenizer.eos_token_id, tokenizer.pad_token_id)
    assert loaded.padding_side == "left"
    text = loaded.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text == tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert loaded.decode(ids, skip_special_tokens=False) == text


def test_load_pretrained_tokenizer_encodes_to_the_same_ids(saved, tokenizer):
    _, loaded = load_pretrained(str(saved))
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    sample = text + "<tool_call>\n{\"name\": \"calculator\"}\n</tool_call> 0 17 255 Answer: -3"
    assert loaded(sample, add_special_tokens=False)["input_ids"] == tokenizer(sample, add_special_tokens=False)["input_ids"]


def test_load_pretrained_without_chat_template_fails_clearly(tmp_path, tiny_model, tokenizer):
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    tiny_model.save_pretrained(tmp_path)
    plain.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no chat template"):
        load_pretrained(str(tmp_path))
