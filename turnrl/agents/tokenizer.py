"""A byte-level BPE tokenizer built in code, with a Qwen-style chat template.

No hub is needed: the vocabulary is trained on a corpus the caller supplies (the envs'
prompts and scripted episodes) plus every integer in ``[0, max_number]``, so that each
such number is one token (with and without a leading space). Byte-level BPE encodes any
text, so no observation is ever lost to an unknown token.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD, BOS, IM_START, IM_END = "<|endoftext|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD, IM_START, IM_END, "<tool_call>", "</tool_call>")

# The same text layout as Qwen2/Qwen2.5 instruct models: role header, content, end marker.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)


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
        additional_special_tokens=[IM_START, "<tool_call>", "</tool_call>"],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer
