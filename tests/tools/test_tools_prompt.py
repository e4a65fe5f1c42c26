"""``tools_prompt``: the one place that writes "which tools, and how to call them" for a parser;
``other_formats``: which other formats read calls the chosen parser finds none in."""

import json

import pytest

from turnrl.tools import PARSERS, ToolCall, calculator, example_call, format_call, get_parser, other_formats, tool
from turnrl.tools import tools_prompt


@tool
def lookup(key: str, k: int, mode: str = "exact") -> str:
    """Look a key up.

    Args:
        key: The key.
        k: How many results.
        mode: How to match.
    """
    return key


@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_the_prompt_shows_each_schema_and_a_call_the_parser_reads(parser):
    example = ToolCall("calculator", {"expression": "37 * 24"})
    text = tools_prompt((calculator, lookup), parser, example)
    assert f"Tool: {json.dumps(calculator.schema())}" in text and f"Tool: {json.dumps(lookup.schema())}" in text
    assert text.endswith(format_call(example, parser))
    parse = get_parser(parser)(text)
    assert parse.status == "ok" and parse.calls == (example,)
    assert other_formats(text, parser, {"calculator"}) == []  # no other format reads a call in it


@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_without_an_example_the_first_tool_is_called_with_placeholders(parser):
    assert example_call(lookup) == ToolCall("lookup", {"key": "...", "k": 1})  # required arguments only
    parse = get_parser(parser)(tools_prompt((lookup,), parser))
    assert parse.status == "ok" and parse.calls == (ToolCall("lookup", {"key": "...", "k": 1}),)


def test_no_tools_or_an_unknown_parser_is_refused():
    with pytest.raises(ValueError, match="needs at least one tool"):
        tools_prompt((), "hermes")
    with pytest.raises(KeyError, match=r"unknown tool-call format 'yaml'; valid names: \[.*'hermes'"):
        tools_prompt((calculator,), "yaml")


@pytest.mark.parametrize("written", sorted(PARSERS))
@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_other_formats_names_the_format_a_call_is_written_in(written, parser):
    text = "Let me compute.\n" + format_call(ToolCall("calculator", {"expression": "2 + 3"}), written)
    expected = [] if written == parser else [written]
    assert other_formats(text, parser, {"calculator"}) == expected
    assert other_formats(text, parser, {"search"}) == []  # only calls of the env's own tools count
    assert other_formats("Answer: 5", parser, {"calculator"}) == []
