"""Property-based tests run over every registered tool-call parser (``PARSERS``)."""

import keyword
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnrl.tools import FORMATTERS, PARSERS, ToolCall, format_call
from turnrl.tools.family_parsers import WHOLE_TURN_FORMATS

SETTINGS = settings(max_examples=200, deadline=None, database=None)

NAMES = sorted(PARSERS)

FRAGMENTS = [
    "<tool_call>", "</tool_call>", "```", "```json\n", "```tool_call", "json", "\n```", "<tool>", "</tool>",
    "<args>", "</args>", "<tool", "{", "}", "[", "]", '"name"', '"arguments"', ":", ",", '"', "'", "\\",
    "calculator", "1", "null", "\n", " ", "`", "<", ">", "[" * 30,
    *(format_call(ToolCall("calculator", {"expression": "2 + 3"}), name) for name in sorted(FORMATTERS)),
]

call_like_text = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.characters()), max_size=40).map("".join)

scalars = st.one_of(st.text(max_size=20), st.integers(), st.booleans())
# Names and argument keys are identifiers (not Python keywords): what tool schemas use, and what
# every format can write (pythonic's calls are Python keyword arguments).
identifiers = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True).filter(lambda w: not keyword.iskeyword(w))
tool_calls = st.builds(
    ToolCall,
    name=identifiers,
    arguments=st.dictionaries(identifiers, st.one_of(scalars, st.lists(scalars, max_size=4)), max_size=4),
)
prose = st.text(alphabet=string.ascii_letters + string.digits + " .,!?", max_size=30)


def assert_well_formed(r):
    assert r.status in ("ok", "malformed", "absent")
    assert isinstance(r.calls, tuple) and isinstance(r.content, str)
    if r.status == "ok":
        assert r.calls and r.error is None
        for call in r.calls:
            assert isinstance(call.name, str) and call.name.strip()
            assert isinstance(call.arguments, dict)
    elif r.status == "absent":
        assert r.calls == () and r.error is None
    else:
        assert r.calls == () and isinstance(r.error, str) and r.error


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(text=st.text())
def test_any_text_gives_a_well_formed_result(name, text):
    assert_well_formed(PARSERS[name](text))


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(text=call_like_text)
def test_call_like_text_gives_a_well_formed_result(name, text):
    assert_well_formed(PARSERS[name](text))


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(calls=st.lists(tool_calls, min_size=1, max_size=3), before=prose, between=prose)
def test_format_then_parse_returns_the_same_calls(name, calls, before, between):
    assert name in FORMATTERS, f"parser {name!r} has no formatter; add one with @register_formatter({name!r})"
    if name in WHOLE_TURN_FORMATS:  # one call, the whole turn
        calls, before, between = calls[:1], "", ""
    text = before + "\n" + f"\n{between}\n".join(format_call(call, name) for call in calls)
    r = PARSERS[name](text)
    assert r.status == "ok", r.error
    assert r.calls == tuple(calls)
    assert r.content == "\n".join(p.strip() for p in [before] + [between] * (len(calls) - 1) if p.strip())
