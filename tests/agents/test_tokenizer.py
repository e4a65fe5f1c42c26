"""The byte-level BPE tokenizer built in code."""

import random
import string

import pytest

from turnrl.agents import build_tokenizer
from turnrl.agents.tokenizer import CHAT_TEMPLATE, IM_END, IM_START, PAD


def ids_of(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_integers_up_to_max_number_are_single_tokens(tokenizer, max_number):
    for i in range(max_number + 1):
        ids = ids_of(tokenizer, str(i))
        assert len(ids) == 1, f"{i!r} -> {ids}"
        assert tokenizer.decode(ids) == str(i)


def test_integers_with_a_leading_space_are_single_tokens(tokenizer, max_number):
    for i in range(1, max_number + 1):
        ids = ids_of(tokenizer, f" {i}")
        assert len(ids) == 1, f"' {i}' -> {ids}"
        assert tokenizer.decode(ids) == f" {i}"


@pytest.mark.parametrize("which", ["shared", "empty_corpus"])
def test_zero_with_a_leading_space_is_a_single_token(tokenizer, which):
    tok = tokenizer if which == "shared" else build_tokenizer([], max_number=20)
    assert len(ids_of(tok, " 0")) == 1


def test_numbers_are_single_tokens_without_any_corpus():
    tok = build_tokenizer([], max_number=50)
    for i in range(51):
        assert len(ids_of(tok, str(i))) == 1
    for i in range(1, 51):
        assert len(ids_of(tok, f" {i}")) == 1


def test_arbitrary_ascii_text_round_trips(tokenizer):
    rng = random.Random(0)
    ascii_chars = [chr(c) for c in range(128)]
    texts = ["", " ", "  two leading", "trailing  ", "a\n\n b\t\tc", "\r\n", "0 00 007 -12 3.5e9",
             "Answer: 903", f"text with {IM_END} and {IM_START}tool\n inside", "<tool_call>\n{}\n</tool_call>",
             string.printable, "".join(ascii_chars)]
    texts += ["".join(rng.choice(ascii_chars) for _ in range(rng.randint(1, 80))) for _ in range(200)]
    texts += ["".join(rng.choice(string.printable) for _ in range(rng.randint(1, 80))) for _ in range(200)]
    for text in texts:
        assert tokenizer.decode(ids_of(tokenizer, text), skip_special_tokens=False) == text


def test_building_twice_from_the_same_corpus_gives_the_same_vocab(corpus, tokenizer, max_number):
    for _ in range(2):
        again = build_tokenizer(corpus, vocab_size=3000, max_number=max_number)
        assert again.get_vocab() == tokenizer.get_vocab()
        assert again.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()
        assert ids_of(again, " ".join(corpus[:20])) == ids_of(tokenizer, " ".join(corpus[:20]))


def test_special_tokens_and_chat_template(tokenizer):
    assert tokenizer.eos_token == IM_END and tokenizer.pad_token == PAD
    assert tokenizer.eos_token_id != tokenizer.pad_token_id
    assert tokenizer.chat_template == CHAT_TEMPLATE and tokenizer.padding_side == "left"
    for special in (PAD, IM_START, IM_END, "<tool_call>", "</tool_call>"):
        assert len(ids_of(tokenizer, special)) == 1
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    )
