"""Causal LMs: a small Qwen2 built from a config, or any Hugging Face checkpoint by path."""

from __future__ import annotations

from dataclasses import dataclass

import json
from pathlib import Path

import torch
from transformers import (AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerFast,
                          Qwen2Config, Qwen2ForCausalLM)

# Tokenizers saved from a plain ``tokenizers`` object (like the one built in code) carry one of
# these classes; AutoTokenizer would instead rebuild the architecture's own tokenizer class
# from config.json (Qwen2Tokenizer splits digits), changing the ids of numbers.
_GENERIC_TOKENIZER_CLASSES = {"TokenizersBackend", "PreTrainedTokenizerFast"}


@dataclass
class TinyModelConfig:
    """Size of the small default model, a Qwen2 architecture with random init (under
    ``agent.model.`` in Hydra).

    Declared once: the Hydra schema's ``ModelConfig`` (``turnrl.conf.schema``) inherits these
    fields, so ``agent.model.hidden_size`` on the command line sets exactly this field and the
    run hands ``cfg.agent.model`` to ``build_tiny_model`` as it is.
    """

    # width of the residual stream of the tiny Qwen2 model
    hidden_size: int = 128
    # number of transformer blocks
    num_layers: int = 2
    # attention heads (hidden_size must be divisible by it; head dim = hidden_size / num_heads)
    num_heads: int = 4
    # key/value heads (grouped-query attention, as in Qwen2)
    num_kv_heads: int = 2
    # width of the MLP
    intermediate_size: int = 512
    # longest context the model is set up for (the rotary embedding's max_position_embeddings)
    max_positions: int = 1024


def build_tiny_model(cfg: TinyModelConfig, tokenizer, seed: int = 0) -> Qwen2ForCausalLM:
    """Build a randomly initialised Qwen2 causal LM sized by ``cfg`` (a ``TinyModelConfig`` or
    the schema's ``cfg.agent.model``) for ``tokenizer``.

    The initialisation depends only on ``seed`` (the global torch RNG is restored after).
    """
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.float()


# the dtypes a checkpoint may be loaded in (agent.dtype)
DTYPES = ("float32", "bfloat16", "float16", "float64")


def load_pretrained(path: str, dtype: str = "float32") -> tuple[PreTrainedModel, object]:
    """Load any Hugging Face causal LM and its tokenizer from a local path or hub id.

    The tiny model saved with ``save_pretrained`` goes through exactly this code path.
    """
    tokenizer = load_tokenizer(path)
    if tokenizer.chat_template is None:
        raise ValueError(
            f"tokenizer at {path!r} has no chat template; multi-turn rollouts render "
            "conversations with it. Use an instruct/chat checkpoint or set tokenizer.chat_template."
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    return model, tokenizer


def load_tokenizer(path: str):
    """The tokenizer of the checkpoint folder ``path`` (with its chat template), as ``load_pretrained``
    loads it, without the model."""
    config = Path(path) / "tokenizer_config.json"
    if config.is_file() and (Path(path) / "tokenizer.json").is_file():
        if json.loads(config.read_text()).get("tokenizer_class") in _GENERIC_TOKENIZER_CLASSES:
            return PreTrainedTokenizerFast.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path)
