from turnrl.tools import ToolCall, calculator, execute_call, tool, tool_map


@tool
def scale(value: float, times: int, flags: list[bool] | None = None) -> float:
    """Multiply a value.

    Args:
        value: The value.
        times: How many times.
        flags: Unused flags.
    """
    if times < 0:
        raise ValueError("times must be >= 0")
    return value * times


TOOLS = tool_map([calculator, scale])


def run(name, **arguments):
    return execute_call(ToolCall(name, arguments), TOOLS)


def test_success_is_str_of_return_value():
    r = run("scale", value=1.5, times=2)
    assert r.ok and r.error is None and r.content == "3.0"
    assert run("scale", value=2, times=3).content == "6"  # integer accepted for number
    assert run("calculator", expression="37 * 24").content == "888"


def test_unknown_tool_lists_available():
    r = run("calc", expression="1")
    assert not r.ok and r.error == "unknown_tool"
    assert r.content == "Error: unknown tool 'calc'. Available tools: calculator, scale."
    empty = execute_call(ToolCall("x", {}), {})
    assert "No tools are available" in empty.content


def test_bad_arguments_say_what_was_wrong():
    missing = run("scale", value=1.0)
    assert missing.error == "bad_arguments"
    assert missing.content == "Error: bad arguments for tool 'scale': missing required argument 'times' (integer)."

    unexpected = run("calculator", expression="1", precision=2)
    assert "unexpected argument 'precision'" in unexpected.content and "expression" in unexpected.content

    wrong = run("scale", value=1.0, times=True)
    assert "argument 'times' must be integer, got boolean (True)" in wrong.content

    wrong_float = run("scale", value=1.0, times=2.5)
    assert "must be integer, got number" in wrong_float.content

    wrong_str = run("calculator", expression=37)
    assert "argument 'expression' must be string, got integer (37)" in wrong_str.content

    wrong_item = run("scale", value=1.0, times=1, flags=[True, "no"])
    assert "argument 'flags[1]' must be boolean, got string" in wrong_item.content


def test_exception_becomes_error_text():
    r = run("scale", value=1.0, times=-1)
    assert r.error == "exception"
    assert r.content == "Error: tool 'scale' raised ValueError: times must be >= 0"
    r = run("calculator", expression="1/0")
    assert r.content == "Error: tool 'calculator' raised ValueError: division by zero in '1/0'"
