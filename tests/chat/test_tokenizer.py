"""The byte-level BPE tokenizer built in code."""

import random
import string

import pytest

from turnrl.chat.tokenizer import build_tokenizer
from turnrl.chat.tokenizer import CHAT_TEMPLATE, IM_END, IM_START, PAD


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


# ------------------------------------------------------------------ tools in the template
CONVERSATION = [
    {"role": "system", "content": "You solve arithmetic with the calculator tool."},
    {"role": "user", "content": "Compute 37 * 24 - 5."},
    {"role": "assistant", "content": ' <tool_call>\n{"name": "calculator", "arguments": {"expression": "37 * 24"}}'
                                     "\n</tool_call>\n"},
    {"role": "tool", "content": "888"},
    {"role": "tool", "content": "Error: 中文 😀\r\n"},
    {"role": "user", "content": "Call the calculator tool or reply."},
    {"role": "assistant", "content": "Answer: 883"},
    {"role": "tool", "content": "x"},
    {"role": "assistant", "content": ""},
]


def schemas():
    from turnrl.tools import calculator

    return [calculator.schema()]


def render(tok, messages, tools=None, add_generation_prompt=False):
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt)


def test_tools_render_as_qwen2_5_does(tokenizer):
    import json

    from turnrl.chat.tokenizer import tools_block

    text = render(tokenizer, CONVERSATION[:5], schemas())
    assert text == (
        "<|im_start|>system\nYou solve arithmetic with the calculator tool.\n\n# Tools\n\nYou may call one or more "
        "functions to assist with the user query.\n\nYou are provided with function signatures within "
        f"<tools></tools> XML tags:\n<tools>\n{json.dumps(schemas()[0])}\n</tools>\n\nFor each function call, "
        "return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nCompute 37 * 24 - 5.<|im_end|>\n"
        f"<|im_start|>assistant\n{CONVERSATION[2]['content']}<|im_end|>\n"  # assistant content verbatim
        "<|im_start|>user\n<tool_response>\n888\n</tool_response>\n<tool_response>\nError: 中文 😀\r\n\n"
        "</tool_response><|im_end|>\n"  # consecutive tool results share one user turn
    )
    assert tools_block(schemas()) in text
    # without a system message the tools block is a system message of its own; without tools, no block
    assert render(tokenizer, CONVERSATION[1:2], schemas()).startswith("<|im_start|>system\n# Tools\n\n")
    assert render(tokenizer, CONVERSATION[:2]) == render(tokenizer, CONVERSATION[:2], []) == (
        "<|im_start|>system\nYou solve arithmetic with the calculator tool.<|im_end|>\n"
        "<|im_start|>user\nCompute 37 * 24 - 5.<|im_end|>\n")


@pytest.mark.parametrize("tools", [None, "calculator"])
def test_the_template_is_prefix_preserving(tokenizer, tools):
    """The render of a conversation extends the render of each prefix the renderer renders: one
    that ends before an assistant turn (with the generation prompt or without), or after one. A
    cut between two tool results of one observation is not such a prefix (they share a turn)."""
    tools = schemas() if tools else None
    for messages in (CONVERSATION, CONVERSATION[1:]):
        for gen in (False, True):
            full = render(tokenizer, messages, tools, gen)
            for k in range(1, len(messages)):
                if messages[k - 1]["role"] == "tool" and messages[k]["role"] == "tool":
                    continue
                assert full.startswith(render(tokenizer, messages[:k], tools)), (k, gen)
                if messages[k]["role"] == "assistant":
                    assert full.startswith(render(tokenizer, messages[:k], tools, True)), (k, gen)


def test_tool_tokens_are_special_and_the_template_round_trips(tokenizer):
    for special in ("<tool_response>", "</tool_response>", "<tool_call>", "</tool_call>"):
        assert len(ids_of(tokenizer, special)) == 1
    text = render(tokenizer, CONVERSATION, schemas())
    assert tokenizer.decode(ids_of(tokenizer, text), skip_special_tokens=False) == text


def test_the_corpus_holds_the_tools_block_of_an_env_with_tools():
    from turnrl.rollout.scripted import corpus_texts
    from turnrl.chat.tokenizer import tools_block
    from turnrl.envs import CalcMathEnv, GuessNumberEnv

    texts = corpus_texts(CalcMathEnv(), range(2))
    assert texts.count(tools_block(schemas())) == 4  # one per reset: 2 seeds x 2 splits
    assert not any("# Tools" in t for t in corpus_texts(GuessNumberEnv(), range(2)))


def test_the_shared_tokenizer_learned_the_tools_block(tokenizer):
    """conftest's corpus holds CalcMath episodes, so the block is merged into few tokens."""
    from turnrl.chat.tokenizer import tools_block

    block = tools_block(schemas())
    assert len(ids_of(tokenizer, block)) < len(block) / 4
