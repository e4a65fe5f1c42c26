"""A byte-level BPE tokenizer built in code, with a Qwen-style chat template.

No hub is needed: the vocabulary is trained on a corpus the caller supplies (the envs'
prompts, tools blocks and scripted episodes) plus every integer in ``[0, max_number]``, so that each
such number is one token (with and without a leading space). Byte-level BPE encodes any
text, so no observation is ever lost to an unknown token.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD, BOS, IM_START, IM_END = "<|endoftext|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
SPECIAL_TOKENS = (PAD, IM_START, IM_END, *TOOL_TOKENS)

TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>"
)
"""The tools block of the system message (Qwen2.5's text): ``TOOLS_HEADER``, one JSON schema per
line, ``TOOLS_FOOTER``."""


def _jinja_str(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


# The text layout of Qwen2/Qwen2.5 instruct models: role header, content, end marker. With
# ``tools``, the system message (or a system message of its own) ends with the tools block;
# ``tool`` messages are user turns of ``<tool_response>`` blocks (consecutive ones share a turn).
# Assistant content is written verbatim. No default system message.
CHAT_TEMPLATE = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages and messages[0]['role'] == 'system' -%}{{- messages[0]['content'] + '\\n\\n' -}}{%- endif -%}"
    "{{- " + _jinja_str(TOOLS_HEADER) + " -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- " + _jinja_str(TOOLS_FOOTER + IM_END + "\n") + " -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if tools and loop.first and message['role'] == 'system' -%}"
    "{%- elif message['role'] == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def tools_block(schemas: Iterable[dict]) -> str:
    """The tools block ``CHAT_TEMPLATE`` writes for ``tools=schemas`` (for a tokenizer corpus)."""
    return TOOLS_HEADER + "".join("\n" + json.dumps(s, ensure_ascii=False) for s in schemas) + TOOLS_FOOTER


def build_tokenizer(
    corpus: Iterable[str], vocab_size: int = 3000, max_number: int = 999
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``corpus`` and wrap it for transformers.

    Args:
        corpus: texts the model will read and write (env prompts, expert episodes).
        vocab_size: upper bound on the vocabulary; the trainer stops early when the corpus
            has no more pairs to merge.
        max_number: every integer from 0 to this value becomes a single token.

    Returns:
        A ``PreTrainedTokenizerFast`` with ``eos_token = <|im_end|>`` (the end of an
        assistant turn), ``pad_token = <|endoftext|>`` and the chat template set. The same
        corpus gives the same vocabulary.
    """
    numbers = [str(i) for i in range(max_number + 1)]
    # Each number appears often enough, alone and after a space, to be merged whole.
    number_lines = [" " + " ".join(numbers), "\n".join(numbers)] * 3
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(number_lines + list(corpus), trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=IM_END,
        pad_token=PAD,
        bos_token=None,
        additional_special_tokens=[IM_START, *TOOL_TOKENS],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer
