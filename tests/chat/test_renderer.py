"""ChatRenderer: ids stay exact; templates that rewrite rendered text go on in new segments."""

import pytest

from turnrl.chat.renderer import ChatRenderer, TemplateMismatchError
from turnrl.chat.formats import ChatFormat
from turnrl.chat.tokenizer import CHAT_TEMPLATE
from tests.helpers import STRIPPING, WINDOWED, with_template

OPENING = [{"role": "system", "content": "You are playing a guessing game."},
           {"role": "user", "content": "Guess my number between 1 and 32. Reply with a number."}]

def encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_renderer_keeps_ids_exact_over_turns(tokenizer, renderer):
    eos = tokenizer.eos_token_id
    conv = renderer.start(OPENING)
    assert conv.text == tokenizer.apply_chat_template(OPENING, tokenize=False, add_generation_prompt=True)
    # sampled ids are any ids: here a non-canonical split of " 16" (byte tokens) and a turn cut without eos
    turns = [encode(tokenizer, " ") + encode(tokenizer, "1") + encode(tokenizer, "6") + [eos],
             encode(tokenizer, "8 or so")]
    for k, ids in enumerate(turns):
        start = len(conv.token_ids)
        content = renderer.add_sampled(conv, ids, [-0.5] * len(ids))
        assert conv.token_ids[start:] == ids and conv.turn_spans[-1] == (start, start + len(ids))
        assert content == (" 16" if k == 0 else "8 or so")
        last = k == len(turns) - 1
        renderer.add_observation(conv, [] if last else [{"role": "user", "content": "higher"}],
                                 add_generation_prompt=not last)
        assert tokenizer.decode(conv.token_ids, skip_special_tokens=False) == conv.text
    assert conv.text == tokenizer.apply_chat_template(conv.messages, tokenize=False)
    sampled = {i for s, e in conv.turn_spans for i in range(s, e)}
    assert conv.loss_mask == [int(i in sampled) for i in range(len(conv.token_ids))]
    assert conv.logprobs == [-0.5 if i in sampled else 0.0 for i in range(len(conv.token_ids))]


@pytest.mark.parametrize("template", [STRIPPING, WINDOWED], ids=["strips_content", "drops_old_messages"])
def test_template_that_does_not_extend_its_prefix_raises_template_mismatch_when_asked(tokenizer, template):
    tok = with_template(tokenizer, template)
    renderer = ChatRenderer(tok, on_rewrite="error")
    conv = renderer.start(OPENING)
    ids = encode(tok, " 16 ") + [tok.eos_token_id]
    renderer.add_sampled(conv, ids, [0.0] * len(ids))
    with pytest.raises(TemplateMismatchError, match="does not extend"):
        renderer.add_observation(conv, [{"role": "user", "content": "higher"}], add_generation_prompt=True)


@pytest.mark.parametrize(("template", "segments"), [(STRIPPING, 2), (WINDOWED, 3)],
                         ids=["strips_content", "drops_old_messages"])
def test_template_that_rewrites_history_goes_on_in_a_new_segment(tokenizer, template, segments):
    """Stripping rewrites " 16 " (a new segment) but not "8"; the window drops a message at each
    turn. Closing the episode never starts a segment (no turn follows)."""
    tok = with_template(tokenizer, template)
    renderer = ChatRenderer(tok)
    conv = renderer.start(OPENING)
    turns = [encode(tok, " 16 ") + [tok.eos_token_id], encode(tok, "8") + [tok.eos_token_id],
             encode(tok, " 12\t") + [tok.eos_token_id]]
    spans = []
    for k, ids in enumerate(turns):
        prompt = list(conv.prompt_ids)
        assert tok.decode(prompt, skip_special_tokens=False) == tok.apply_chat_template(
            conv.messages, tokenize=False, add_generation_prompt=True)  # the sampler sees the template's render
        start = len(conv.token_ids)
        renderer.add_sampled(conv, ids, [-0.25] * len(ids))
        spans.append((start, start + len(ids)))
        assert conv.token_ids[conv.segment_starts[-1]:start] == prompt
        renderer.add_observation(conv, [{"role": "user", "content": "higher"}] if k < 2 else [],
                                 add_generation_prompt=k < 2)
    assert len(conv.segment_starts) == segments and conv.segment_starts[0] == 0  # a new one at each rewrite
    assert conv.turn_spans == spans and all(conv.token_ids[s:e] == ids for (s, e), ids in zip(spans, turns))
    sampled = {i for s, e in spans for i in range(s, e)}
    assert conv.loss_mask == [int(i in sampled) for i in range(len(conv.token_ids))]
    # each segment decodes to the template's render of the conversation when it was made
    bounds = [*conv.segment_starts, len(conv.token_ids)]
    last = tok.decode(conv.token_ids[bounds[-2]:], skip_special_tokens=False)
    assert last.startswith(tok.apply_chat_template(conv.messages[:-1], tokenize=False, add_generation_prompt=True))


def test_prefix_preserving_template_keeps_one_segment(tokenizer, renderer):
    conv = renderer.start(OPENING)
    for k in range(3):
        ids = encode(tokenizer, f" {k}") + [tokenizer.eos_token_id]
        renderer.add_sampled(conv, ids, [0.0] * len(ids))
        renderer.add_observation(conv, [{"role": "user", "content": "no"}], add_generation_prompt=True)
    assert conv.segment_starts == [0] and conv.prompt_ids == conv.token_ids


def test_tools_reach_a_template_that_renders_them_and_are_described_for_one_that_does_not(tokenizer):
    tools = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
                                               "parameters": {"type": "object", "properties": {
                                                   "expression": {"type": "string"}}, "required": ["expression"]}}}]
    native = with_template(tokenizer, "{%- if tools %}TOOLS{{ tools | tojson }}\n{%- endif %}" + CHAT_TEMPLATE)
    conv = ChatRenderer(native, chat_format=ChatFormat(
        name="t", markers=(), tool_parser="hermes", end_of_turn=("<|im_end|>",))).start(OPENING, tools=tools)
    assert conv.text.startswith("TOOLS[") and '"calculator"' in conv.text
    described = ChatRenderer(tokenizer, chat_format="chatml").start(OPENING, tools=tools)
    system = described.text.split("<|im_end|>")[0]
    assert 'Tool: {"type": "function"' in system and '<tool_call>\n{"name": "calculator"' in system


def test_renderer_requires_a_chat_template(tokenizer):
    with pytest.raises(ValueError, match="chat_template"):
        ChatRenderer(with_template(tokenizer, None))


def test_add_sampled_rejects_ids_and_logprobs_of_different_lengths(renderer):
    conv = renderer.start(OPENING)
    with pytest.raises(ValueError, match="logprobs"):
        renderer.add_sampled(conv, [1, 2, 3], [0.0, 0.0])


@pytest.mark.parametrize("family", ["qwen2_5", "qwen3", "llama3_1", "gemma3"])
def test_encode_gives_the_ids_of_the_tokenizers_own_call_and_follows_its_settings(family):
    from turnrl.models.tiny_checkpoints import template_tokenizer

    corpus = ["higher, between 17 and 1000", "<tool_call>{\"name\": \"calc\"}</tool_call> café naïve 😀"]
    tokenizer = template_tokenizer(family, corpus * 20, vocab_size=400)
    renderer = ChatRenderer(tokenizer)
    assert renderer._backend is not None  # the direct path is taken for a fast tokenizer
    special = sorted(tokenizer.all_special_tokens, key=len)[-1]
    texts = ["", " ", "higher, between 17 and 1000\n", f"{special}user\n{corpus[1]}{special}\n\n", "x" * 300]

    def own(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    assert [renderer.encode(t) for t in texts] == [own(t) for t in texts]
    # the backend left truncating, or splitting special tokens: the tokenizer's own call decides
    tokenizer._tokenizer.enable_truncation(max_length=4)
    assert renderer.encode(texts[4]) == own(texts[4]) and len(own(texts[4])) > 4
    tokenizer._tokenizer.no_truncation()
    whole = own(texts[3])
    tokenizer.split_special_tokens = True  # the backend still keeps them whole until the next own call
    assert renderer.encode(texts[3]) == own(texts[3]) != whole
    assert len(own(texts[3])) > len(whole)
