"""Model families: their real chat templates (from TRL) and a tiny tokenizer that carries
each family's special tokens.

``load_template(name)`` reads ``trl/chat_templates/<name>.jinja`` from the installed TRL
package (located without importing TRL). ``family_tokenizer(family)`` builds, in code, a
byte-level BPE tokenizer whose special tokens are that family's own (its end-of-turn token,
its role headers, its tool-call and reasoning markers), with the family's template set: a
stand-in for the real model's tokenizer that renders exactly what the real one renders and
encodes every marker as one id, so the renderer and the parsers can be tested against every
family without downloading a model.

The per-family data lives in one table, ``FAMILIES`` (family name -> ``Family``); the
family's ``ChatFormat`` (``turnrl.chat.formats``) is registered under the same name.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from turnrl.chat.formats import get_format


@dataclass(frozen=True)
class Family:
    """One model family's tokenizer facts.

    Attributes:
        template: the TRL template file's stem (``trl/chat_templates/<template>.jinja``).
        special_tokens: every special marker the family's template emits or its model writes
            (each becomes one id); ``eos``, ``bos`` and ``pad`` are added when missing.
        eos: the token that ends an assistant turn (``eos_token``).
        pad: the padding token (an existing special token of the family where it has one).
        bos: ``bos_token`` for templates that write it, else None.
    """

    template: str
    special_tokens: tuple[str, ...]
    eos: str
    pad: str
    bos: str | None = None

    def all_special(self) -> list[str]:
        """``special_tokens`` plus eos, bos and pad, in order, without repeats."""
        out: list[str] = []
        for t in (*self.special_tokens, self.eos, self.bos, self.pad):
            if t is not None and t not in out:
                out.append(t)
        return out


_QWEN = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>")
_QWEN3 = (*_QWEN, "<tool_response>", "</tool_response>", "<think>", "</think>")
_QWEN_VISION = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
_LLAMA3 = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
           "<|eot_id|>", "<|eom_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>")
_DEEPSEEK = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜User｜>", "<｜Assistant｜>",
             "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
             "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
             "<｜tool▁output▁end｜>", "<think>", "</think>")
_GEMMA4 = ("<pad>", "<eos>", "<bos>", "<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|think|>",
           "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>",
           '<|"|>', "<|image|>", "<|audio|>", "<|video|>")

FAMILIES: dict[str, Family] = {
    "qwen2_5": Family("qwen2_5", _QWEN, eos="<|im_end|>", pad="<|endoftext|>"),
    "qwen3": Family("qwen3", _QWEN3, eos="<|im_end|>", pad="<|endoftext|>"),
    "qwen3_5": Family("qwen3_5_think", (*_QWEN3, *_QWEN_VISION), eos="<|im_end|>", pad="<|endoftext|>"),
    "qwen3_6": Family("qwen3_6", (*_QWEN3, *_QWEN_VISION), eos="<|im_end|>", pad="<|endoftext|>"),
    "llama3": Family("llama3", _LLAMA3, eos="<|eot_id|>", pad="<|finetune_right_pad_id|>", bos="<|begin_of_text|>"),
    "llama3_1": Family("llama3_1", _LLAMA3, eos="<|eot_id|>", pad="<|finetune_right_pad_id|>",
                       bos="<|begin_of_text|>"),
    "llama3_2": Family("llama3_2", _LLAMA3, eos="<|eot_id|>", pad="<|finetune_right_pad_id|>",
                       bos="<|begin_of_text|>"),
    "gptoss": Family("gptoss", ("<|startoftext|>", "<|endoftext|>", "<|start|>", "<|end|>", "<|message|>",
                                "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"),
                     eos="<|return|>", pad="<|endoftext|>"),
    "deepseekv3": Family("deepseekv3", _DEEPSEEK, eos="<｜end▁of▁sentence｜>", pad="<｜▁pad▁｜>",
                         bos="<｜begin▁of▁sentence｜>"),
    "deepseek_r1_distill": Family("deepseek_r1_distill", _DEEPSEEK, eos="<｜end▁of▁sentence｜>",
                                  pad="<｜▁pad▁｜>", bos="<｜begin▁of▁sentence｜>"),
    "gemma3": Family("gemma3", ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>",
                                "<start_of_image>", "<end_of_image>"),
                     eos="<end_of_turn>", pad="<pad>", bos="<bos>"),
    "gemma4": Family("gemma4_v5", _GEMMA4, eos="<turn|>", pad="<pad>", bos="<bos>"),
    "phi3_5": Family("phi3_5", ("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"),
                     eos="<|end|>", pad="<|endoftext|>"),
    "glm4moe": Family("glm4moe", ("<|endoftext|>", "[gMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
                                  "<|assistant|>", "<|observation|>", "<think>", "</think>", "<tool_call>",
                                  "</tool_call>", "<tool_response>", "</tool_response>", "<arg_key>",
                                  "</arg_key>", "<arg_value>", "</arg_value>", "/nothink"),
                      eos="<|user|>", pad="<|endoftext|>"),
    "nemotron_3_nano": Family("nemotron_3_nano", ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>",
                                                  "<think>", "</think>", "<tool_call>", "</tool_call>",
                                                  "<tool_response>", "</tool_response>"),
                              eos="<|im_end|>", pad="<unk>"),
    "lfm2_2_5": Family("lfm2_2_5", ("<|pad|>", "<|startoftext|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>",
                                    "<|tool_list_start|>", "<|tool_list_end|>", "<|tool_call_start|>",
                                    "<|tool_call_end|>", "<|tool_response_start|>", "<|tool_response_end|>",
                                    "<think>", "</think>"),
                       eos="<|im_end|>", pad="<|pad|>", bos="<|startoftext|>"),
}
"""Family name -> its tokenizer facts; each name is also a registered ``ChatFormat``."""


def family_of(name: str) -> Family:
    """The family ``name`` (a ``FAMILIES`` key, or the template stem a family uses).

    Raises:
        KeyError: unknown name (the message lists the families).
    """
    if name in FAMILIES:
        return FAMILIES[name]
    for fam in FAMILIES.values():
        if fam.template == name:
            return fam
    raise KeyError(f"unknown model family {name!r}; known: {sorted(FAMILIES)}")


def templates_dir() -> Path:
    """The installed TRL package's ``chat_templates`` folder (TRL is not imported)."""
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the model families' chat templates come from TRL: pip install trl")
    return Path(next(iter(spec.submodule_search_locations))) / "chat_templates"


@lru_cache(maxsize=None)
def load_template(name: str) -> str:
    """The text of ``trl/chat_templates/<name>.jinja`` (``name`` is a template file stem, or a
    family name of ``FAMILIES``).

    Raises:
        ModuleNotFoundError: TRL is not installed (``pip install trl``).
        FileNotFoundError: no such template in this TRL version (the message lists them).
    """
    name = FAMILIES[name].template if name in FAMILIES else name
    folder = templates_dir()
    path = folder / f"{name}.jinja"
    if not path.is_file():
        known = sorted(p.stem for p in folder.glob("*.jinja"))
        raise FileNotFoundError(f"TRL has no chat template {name!r} at {path}; known: {known}")
    return path.read_text()


# text that makes the BPE merge the usual pieces of chat text (a tokenizer trained on nothing
# still encodes any text, byte by byte)
_BASE_CORPUS = (
    "You are a helpful assistant. The user asks a question; think, call a tool, then answer.\n",
    '{"name": "calculator", "arguments": {"expression": "12 * (3 + 4)"}}\n',
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "system user assistant tool function parameter arguments result answer reasoning",
)


def family_tokenizer(family: str, corpus: Iterable[str] = (), vocab_size: int = 1024
                     ) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with ``family``'s special tokens and chat template.

    Args:
        family: a name of ``FAMILIES`` (e.g. ``"qwen3"``, ``"llama3_1"``, ``"gptoss"``), or the
            TRL template stem one of them uses (``"qwen3_5_think"``, ``"gemma4_v5"``).
        corpus: extra texts to train the merges on (any text encodes without them).
        vocab_size: upper bound on the vocabulary (the special tokens included).

    Returns:
        A ``PreTrainedTokenizerFast`` where each of the family's special tokens is one id,
        ``eos_token`` is the family's end-of-assistant-turn token, ``bos_token`` is set when
        the template writes it, ``pad_token`` is set, ``padding_side="left"``, the family's
        TRL chat template is set, and ``decode(encode(text)) == text`` for any text.
    """
    fam = family_of(family)
    specials = fam.all_special()
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=max(vocab_size, len(specials) + 257), special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator([*_BASE_CORPUS, *corpus], trainer)
    extra = [t for t in specials if t not in (fam.eos, fam.bos, fam.pad)]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token=fam.eos, pad_token=fam.pad, bos_token=fam.bos,
        additional_special_tokens=extra, clean_up_tokenization_spaces=False)
    tokenizer.chat_template = load_template(fam.template)
    tokenizer.padding_side = "left"
    return tokenizer


def docs_table() -> str:
    """The markdown table of ``docs/templates.md``: each family, its TRL template, tool-call
    parser, mode (one segment or segments) and why (its ``ChatFormat.notes``)."""

    rows = ["| family | TRL template | tool parser | mode | why |", "|---|---|---|---|---|"]
    for name in sorted(FAMILIES):
        fmt = get_format(name)
        mode = "one segment" if fmt.notes.startswith("ONE segment") else "segments"
        why = fmt.notes.replace("|", "\\|")
        rows.append(f"| {name} | {FAMILIES[name].template}.jinja | {fmt.tool_parser} | {mode} | {why} |")
    return "\n".join(rows) + "\n"
