"""The model families: each family's tokenizer (its special tokens, its end-of-turn eos, byte-level
round trips), its real TRL chat template rendering a tool conversation written as its
``ChatFormat`` says, and template detection picking the family."""

from __future__ import annotations

import importlib.util

import pytest

from turnrl.chat import formats as chat_format, families
from turnrl.chat.formats import detect, get_format
from turnrl.chat.families import FAMILIES, family_tokenizer, load_template

NAMES = sorted(FAMILIES)
TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "the expression"}},
                   "required": ["expression"]}}}]
# one call of calculator(expression="2+3") as each parser's format writes it
CALL_TEXT = {
    "hermes": '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=calculator>\n<parameter=expression>\n2+3\n</parameter>\n</function>\n</tool_call>",
    "llama3_json": '{"name": "calculator", "parameters": {"expression": "2+3"}}',
    "harmony": '<|channel|>commentary to=functions.calculator <|constrain|>json<|message|>{"expression": "2+3"}',
    "deepseek_v3": ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calculator\n```json\n"
                    '{"expression": "2+3"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'),
    "glm4": "<tool_call>calculator\n<arg_key>expression</arg_key>\n<arg_value>2+3</arg_value>\n</tool_call>",
    "gemma4": '<|tool_call>call:calculator{expression:<|"|>2+3<|"|>}<tool_call|>',
    "pythonic": '<|tool_call_start|>[calculator(expression="2+3")]<|tool_call_end|>',
}
UNICODE_TEXTS = [
    "", " ", "trailing spaces   ", "trailing newlines\n\n", "\t tabs\tand  spaces \r\n",
    "def f(x):\n    return {'a': [x, x ** 2]}  # comment\n",
    "Café naïve résumé Ångström façade", "中文字符和日本語のテキスト、한국어", "emoji 🙂👍🏽🚀 and ZWJ 👨‍👩‍👧",
    "math ∑∫√∞ ≠ ≤ and arrows → ⇒", "Ελληνικά Русский עברית العربية", "\x00\x01 control \x7f chars",
    "mixed 12 * (3 + 4) = 84.",
]


@pytest.fixture(scope="module")
def tokenizers():
    return {name: family_tokenizer(name) for name in NAMES}


def ids_of(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_every_family_has_a_registered_format_and_a_trl_template():
    assert len(FAMILIES) >= 12
    for name in NAMES:
        fmt = get_format(name)
        assert fmt.name == name
        assert load_template(name).strip()


@pytest.mark.parametrize("name", NAMES)
def test_unicode_text_round_trips(tokenizers, name):
    tok = tokenizers[name]
    specials = FAMILIES[name].all_special()
    texts = [*UNICODE_TEXTS, " ".join(specials) + " with text ", "".join(specials[:3]) + "é\n"]
    for text in texts:
        assert tok.decode(ids_of(tok, text), skip_special_tokens=False) == text


@pytest.mark.parametrize("name", NAMES)
def test_each_special_token_is_one_id(tokenizers, name):
    tok = tokenizers[name]
    vocab = tok.get_vocab()
    for special in FAMILIES[name].all_special():
        assert special in vocab, special
        assert ids_of(tok, special) == [vocab[special]], special
        assert ids_of(tok, f"a{special}b")[1:2] == [vocab[special]], special
    fmt = get_format(name)
    for marker in fmt.end_of_turn:
        assert marker in vocab, f"{name}: end-of-turn token {marker!r} is not a special token"


@pytest.mark.parametrize("name", NAMES)
def test_tokenizer_settings(tokenizers, name):
    tok, fam = tokenizers[name], FAMILIES[name]
    assert tok.eos_token == fam.eos and tok.eos_token in get_format(name).end_of_turn
    assert tok.pad_token == fam.pad and tok.pad_token_id is not None
    assert tok.padding_side == "left"
    assert tok.clean_up_tokenization_spaces is False
    assert tok.chat_template == load_template(name)
    uses_bos = "bos_token" in tok.chat_template
    assert (tok.bos_token is not None) == uses_bos, f"{name}: template uses bos_token: {uses_bos}"


def conversation(fmt) -> list[dict]:
    """A two-user-turn episode with one tool call, written as ``fmt`` says (tool role, merged
    roles, raw or structured history)."""
    call = CALL_TEXT[fmt.tool_parser]
    messages = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "What is 2+3? é 🙂"}]
    if fmt.history == "structured":
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "id": "call_0", "function": {"name": "calculator", "arguments": {"expression": "2+3"}}}]})
    else:
        messages.append({"role": "assistant", "content": f"Let me compute.\n{call}"})
    if fmt.tool_role == "user":
        messages.append({"role": "user", "content": "<tool_response>\nRESULT-5\n</tool_response>"})
    else:
        messages.append({"role": fmt.tool_role, "content": "RESULT-5", "tool_call_id": "call_0", "name": "calculator"})
    messages += [{"role": "user", "content": "Please also check the sign."},  # two user messages in a row
                 {"role": "assistant", "content": "The answer is 5."},
                 {"role": "user", "content": "Now 3*4?"}, {"role": "assistant", "content": "12."}]
    if fmt.merge_roles:
        merged: list[dict] = []
        for m in messages:
            if merged and merged[-1]["role"] == m["role"]:
                merged[-1] = {**merged[-1], "content": merged[-1]["content"] + "\n\n" + m["content"]}
            else:
                merged.append(dict(m))
        if merged[0]["role"] == "system":
            merged[1]["content"] = merged[0]["content"] + "\n\n" + merged[1]["content"]
            merged = merged[1:]
        messages = merged
    return messages


@pytest.mark.parametrize("name", NAMES)
def test_template_renders_a_tool_conversation(tokenizers, name):
    tok, fmt = tokenizers[name], get_format(name)
    messages = conversation(fmt)
    tools = TOOLS if fmt.native_tools else None
    for k in range(2, len(messages) + 1):
        tok.apply_chat_template(messages[:k], tools=tools, tokenize=False,
                                add_generation_prompt=messages[k - 1]["role"] != "assistant")
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False)
    assert "RESULT-5" in text, f"{name}: the tool result is not rendered"
    assert "calculator" in text and "12." in text and "3*4?" in text
    if fmt.native_tools:
        assert "Evaluate an arithmetic expression." in text, f"{name}: tools= is not rendered"
    assert decode_roundtrip(tok, text) == text


def decode_roundtrip(tok, text):
    return tok.decode(ids_of(tok, text), skip_special_tokens=False)


@pytest.mark.parametrize("name", NAMES)
def test_detection_picks_the_family(name):
    assert detect(load_template(name)).name == name


def test_detection_of_other_revisions_in_trl():
    for stem, name in {"qwen3_5_nothink": "qwen3_5", "gemma4": "gemma4", "gemma4_v2": "gemma4", "phi3": "phi3_5",
                       "qwen3_training": "qwen3", "gptoss_training": "gptoss", "nemotron_3_super": "nemotron_3_nano"
                       }.items():
        assert detect(load_template(stem)).name == name, stem


def test_chatml_stays_registered():
    assert get_format("chatml").markers == ("<|im_start|>", "<|im_end|>")
    assert chat_format.detect("<|im_start|>{{ m }}<|im_end|>").name == "chatml"


def test_family_tokenizer_accepts_a_template_name_and_extra_corpus():
    tok = family_tokenizer("gemma4_v5", corpus=["calculator calculator calculator"] * 5)
    assert tok.eos_token == "<turn|>"
    assert len(ids_of(tok, "calculator")) == 1


def test_unknown_family_and_template_raise_helpfully():
    with pytest.raises(KeyError, match="qwen3"):
        family_tokenizer("no_such_family")
    with pytest.raises(FileNotFoundError, match="known"):
        load_template("no_such_template")


def test_missing_trl_says_pip_install_trl(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trl" else real(name, *a))
    families.load_template.cache_clear()
    try:
        with pytest.raises(ModuleNotFoundError, match="pip install trl"):
            load_template("qwen3")
    finally:
        families.load_template.cache_clear()


def test_docs_table_matches_the_registry():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "templates.md").read_text()
    assert families.docs_table() in page, "regenerate docs/templates.md's table with turnrl.chat.families.docs_table()"
