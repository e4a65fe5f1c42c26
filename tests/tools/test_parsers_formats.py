"""Example-based tests for the "json_fenced" and "xml" tool-call formats, and for ``format_call``."""

import pytest

from turnrl.tools import FORMATTERS, PARSERS, ParseResult, ToolCall, format_call, get_parser
from turnrl.tools.family_parsers import WHOLE_TURN_FORMATS

fenced = get_parser("json_fenced")
xml = get_parser("xml")

CALC = ToolCall("calculator", {"expression": "2 + 3"})


def test_registries_hold_every_format_with_its_formatter():
    assert {"hermes", "json_fenced", "xml"} <= set(PARSERS)
    assert set(FORMATTERS) == set(PARSERS)
    with pytest.raises(KeyError, match="valid names: .*hermes"):
        format_call(CALC, "nope")


# ---- json_fenced ----------------------------------------------------------------------------


def test_fenced_one_call_with_surrounding_text():
    text = 'Let me add.\n```json\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n```\nDone.'
    assert fenced(text) == ParseResult("ok", (CALC,), "Let me add.\nDone.", None)


def test_fenced_two_blocks_tool_call_tag_uppercase_and_missing_arguments():
    text = '```JSON\n{"name": "a", "arguments": {"x": 1}}\n``` then ```tool_call {"name": "b"}```'
    r = fenced(text)
    assert r == ParseResult("ok", (ToolCall("a", {"x": 1}), ToolCall("b", {})), "then", None)


def test_fenced_list_block_gives_several_calls():
    text = '```json\n[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]\n```'
    assert fenced(text).calls == (ToolCall("a", {"x": 1}), ToolCall("b", {}))


def test_fenced_other_languages_are_content():
    text = "Here:\n```python\nprint(1)\n```\nand ```\nplain\n```"
    assert fenced(text) == ParseResult("absent", (), text, None)
    assert fenced("  no code at all \n") == ParseResult("absent", (), "no code at all", None)
    assert fenced("```python\nunclosed").status == "absent"


def test_fenced_other_blocks_stay_in_content_next_to_a_call():
    text = '```python\nx = "json"\n```\n```json\n{"name": "a"}\n```'
    r = fenced(text)
    assert r.calls == (ToolCall("a", {}),)
    assert r.content == '```python\nx = "json"\n```'


@pytest.mark.parametrize(
    "text, reason",
    [
        ('```json\n{"name": "a"}\n', "unclosed ```json block at character 0"),
        ('ok ```tool_call\n{"name": "a"}', "unclosed ```tool_call block at character 3"),
        ("```json\n{'name': 'a'}\n```",
         "json block 1 is not valid JSON (Expecting property name enclosed in double quotes at line 2 column 2)"),
        ("```json\n```", "json block 1 is not valid JSON (Expecting value"),
        ("```json\n[]\n```", "json block 1 is an empty list"),
        ('```json\n"calculator"\n```', "tool call 1 must be a JSON object"),
        ('```json\n[{"name": "a"}, ["b"]]\n```', "tool call 2 must be a JSON object"),
        ('```json\n{"arguments": {}}\n```', 'tool call 1 has no "name"'),
        ('```json\n{"name": ""}\n```', '"name" must be a non-empty string, got string'),
        ('```json\n{"name": "a", "arguments": "x=1"}\n```', '"arguments" must be a JSON object'),
    ],
)
def test_fenced_malformed_reasons(text, reason):
    r = fenced(text)
    assert r.status == "malformed" and r.calls == ()
    assert reason in r.error


def test_fenced_error_numbers_calls_across_blocks():
    r = fenced('hi ```json\n{"name": "a"}\n```\n```json\n[{"name": "b"}, {"name": 3}]\n```')
    assert r.status == "malformed" and "tool call 3" in r.error
    assert r.content == "hi"


# ---- xml ------------------------------------------------------------------------------------


def test_xml_one_call_with_surrounding_text():
    text = 'Let me add. <tool>calculator</tool><args>{"expression": "2 + 3"}</args> Done.'
    assert xml(text) == ParseResult("ok", (CALC,), "Let me add.\nDone.", None)


def test_xml_two_calls_whitespace_and_missing_args():
    text = '<tool> a </tool>\n  <args> {"x": 1} </args>\nmid\n<tool>b</tool>'
    assert xml(text) == ParseResult("ok", (ToolCall("a", {"x": 1}), ToolCall("b", {})), "mid", None)


def test_xml_absent():
    assert xml(" Answer: <b>42</b> <tool_call> \n") == ParseResult("absent", (), "Answer: <b>42</b> <tool_call>", None)


@pytest.mark.parametrize(
    "text, reason",
    [
        ("<tool>calculator", "unclosed <tool> at character 0"),
        ("<tool>a<tool>b</tool>", "unclosed <tool> at character 0"),
        ("<tool>a<args>{}</args>", "unclosed <tool>"),
        ('<tool>a</tool><args>{"x": 1}', "unclosed <args> at character 14"),
        ("<tool>a</tool><args>{}<tool>b</tool></args>", "unclosed <args>"),
        ("calculator</tool>", "stray </tool> at character 10"),
        ("<tool>a</tool></tool>", "stray </tool>"),
        ('<args>{"x": 1}</args>', "stray <args> at character 0: <args> must directly follow <tool>NAME</tool>"),
        ("<tool>a</tool> text <args>{}</args>", "stray <args>"),
        ("<tool>a</tool></args>", "stray </args>"),
        ("<tool> </tool>", "tool call 1 has an empty name"),
        ("<tool>a</tool><args>{x: 1}</args>",
         "tool call 1 (a): <args> is not valid JSON (Expecting property name enclosed in double quotes"),
        ("<tool>a</tool><args></args>", "<args> is not valid JSON (Expecting value"),
        ("<tool>a</tool><args>[1]</args>", "<args> must hold a JSON object like {\"x\": 1}, got array"),
        ("<tool>a</tool><tool>b</tool><args>1</args>", "tool call 2 (b): <args> must hold a JSON object"),
    ],
)
def test_xml_malformed_reasons(text, reason):
    r = xml(text)
    assert r.status == "malformed" and r.calls == ()
    assert reason in r.error


def test_xml_malformed_keeps_content_before_the_broken_call():
    r = xml("hi <tool>a</tool> there <tool>b")
    assert r.status == "malformed" and r.content == "hi\nthere\n<tool>b"


# ---- every parser ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_deep_nesting_is_malformed_not_an_exception(name):
    """Deep nesting where JSON (or a literal) is expected is malformed; formats that write values raw
    (qwen3_coder, glm4: no ``{}`` for no arguments) read an undecodable value as text, never raise."""
    call = format_call(ToolCall("a", {}), name)
    if "{}" in call:
        assert get_parser(name)(call.replace("{}", "[" * 100_000)).status == "malformed"
    deep = format_call(ToolCall("a", {"x": [1]}), name).replace("[1]", "[" * 100_000)
    assert get_parser(name)(deep).status in ("ok", "malformed")


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_non_text_is_malformed(name):
    r = get_parser(name)(None)
    assert r.status == "malformed" and "expected the turn as text" in r.error


# ---- format_call round trip -----------------------------------------------------------------

TRICKY = ToolCall("search", {"q": "</tool_call> ``` </args> <tool>", "n": 3, "ok": True, "tags": ["é", "\n"]})


@pytest.mark.parametrize("name", sorted(FORMATTERS))
@pytest.mark.parametrize("call", [CALC, ToolCall("noargs", {}), TRICKY])
def test_format_then_parse_is_the_same_call(name, call):
    assert get_parser(name)(format_call(call, name)) == ParseResult("ok", (call,), "", None)


@pytest.mark.parametrize("name", sorted(FORMATTERS))
def test_two_formatted_calls_with_prose_parse_to_both(name):
    if name in WHOLE_TURN_FORMATS:
        pytest.skip(f"a {name} call is the whole turn: one call, no text around it")
    text = f"First.\n{format_call(CALC, name)}\nThen.\n{format_call(TRICKY, name)}"
    assert get_parser(name)(text) == ParseResult("ok", (CALC, TRICKY), "First.\nThen.", None)


def test_exact_written_formats():
    assert format_call(CALC, "hermes") == (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call>')
    assert format_call(CALC, "json_fenced") == (
        '```json\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n```')
    assert format_call(CALC, "xml") == '<tool>calculator</tool><args>{"expression": "2 + 3"}</args>'


@pytest.mark.parametrize("bad", ["", " a", "a<b"])
def test_xml_formatter_rejects_names_it_cannot_write(bad):
    with pytest.raises(ValueError, match="cannot be written between <tool> tags"):
        format_call(ToolCall(bad, {}), "xml")
