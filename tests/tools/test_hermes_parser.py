import random

import pytest

from turnrl.tools import PARSERS, ParseResult, ToolCall, get_parser, register_parser

parse = get_parser("hermes")


def test_registry_lookup_and_unknown_name():
    assert "hermes" in PARSERS
    with pytest.raises(KeyError, match="hermes"):
        get_parser("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_parser("hermes")(parse)


def test_one_call_with_surrounding_text():
    text = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "37 * 24"}}\n</tool_call>'
    r = parse(text)
    assert r == ParseResult("ok", (ToolCall("calculator", {"expression": "37 * 24"}),), "Let me compute.", None)


def test_two_calls_no_whitespace_and_missing_arguments():
    text = '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> mid <tool_call> {"name": "b"} </tool_call>end'
    r = parse(text)
    assert r.status == "ok" and r.error is None
    assert r.calls == (ToolCall("a", {"x": 1}), ToolCall("b", {}))
    assert r.content == "mid\nend"


def test_absent():
    r = parse("  Answer: 42 \n")
    assert r == ParseResult("absent", (), "Answer: 42", None)


@pytest.mark.parametrize(
    "text, reason",
    [
        ('<tool_call>{"name": "a"}', "unclosed <tool_call>"),
        ('<tool_call>{"name": "a"} <tool_call>{"name": "b"}</tool_call>', "unclosed <tool_call>"),
        ('{"name": "a"}</tool_call>', "stray </tool_call>"),
        ('<tool_call>{"name": "a"}</tool_call></tool_call>', "stray </tool_call>"),
        ("<tool_call>{'name': 'a'}</tool_call>",
         "not valid JSON (Expecting property name enclosed in double quotes at line 1 column 2)"),
        ("<tool_call></tool_call>", "not valid JSON (Expecting value at line 1 column 1)"),
        ('<tool_call>["a"]</tool_call>', "must be a JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'has no "name"'),
        ('<tool_call>{"name": 3}</tool_call>', '"name" must be a non-empty string, got integer'),
        ('<tool_call>{"name": "a", "arguments": "x=1"}</tool_call>', '"arguments" must be a JSON object'),
        ('<tool_call>{"name": "a", "arguments": [1]}</tool_call>', "got array"),
    ],
)
def test_malformed_reasons(text, reason):
    r = parse(text)
    assert r.status == "malformed"
    assert r.calls == ()
    assert reason in r.error


def test_malformed_second_call_names_its_index_and_keeps_content():
    r = parse('hi <tool_call>{"name": "a"}</tool_call><tool_call>{"name": }</tool_call>')
    assert r.status == "malformed" and "tool call 2" in r.error
    assert r.content == "hi"


def test_never_raises_on_random_strings():
    fragments = ["<tool_call>", "</tool_call>", "<tool_call", "{", "}", "[", "]", '"name"', '"arguments"',
                 ":", ",", '"', "\\", "calculator", "1", "null", "\n", " ", "[" * 50, "\x00", "é"]
    rng = random.Random(1234)
    for _ in range(2000):
        parts = [rng.choice(fragments) if rng.random() < 0.7 else chr(rng.randrange(0, 0x2FF))
                 for _ in range(rng.randrange(0, 30))]
        r = parse("".join(parts))
        assert r.status in ("ok", "malformed", "absent")
        assert (r.error is not None) == (r.status == "malformed")
    deep = "<tool_call>" + "[" * 100_000 + "</tool_call>"
    assert parse(deep).status == "malformed"
