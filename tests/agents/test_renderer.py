"""ChatRenderer: ids stay exact; templates that rewrite rendered text are refused."""

import copy

import pytest

from turnrl.agents import ChatRenderer, TemplateMismatchError
from turnrl.agents.tokenizer import CHAT_TEMPLATE

OPENING = [{"role": "system", "content": "You are playing a guessing game."},
           {"role": "user", "content": "Guess my number between 1 and 32. Reply with a number."}]

STRIPPING = CHAT_TEMPLATE.replace("message['content']", "(message['content'] | trim)")
# keeps only the latest three messages: earlier content disappears as the chat grows
WINDOWED = CHAT_TEMPLATE.replace("for message in messages", "for message in messages[-3:]")


def with_template(tokenizer, template):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = template
    return tok


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
def test_template_that_does_not_extend_its_prefix_raises_template_mismatch(tokenizer, template):
    tok = with_template(tokenizer, template)
    renderer = ChatRenderer(tok)
    conv = renderer.start(OPENING)
    ids = encode(tok, " 16 ") + [tok.eos_token_id]
    renderer.add_sampled(conv, ids, [0.0] * len(ids))
    with pytest.raises(TemplateMismatchError, match="does not extend"):
        renderer.add_observation(conv, [{"role": "user", "content": "higher"}], add_generation_prompt=True)


def test_renderer_requires_a_chat_template(tokenizer):
    with pytest.raises(ValueError, match="chat_template"):
        ChatRenderer(with_template(tokenizer, None))


def test_add_sampled_rejects_ids_and_logprobs_of_different_lengths(renderer):
    conv = renderer.start(OPENING)
    with pytest.raises(ValueError, match="logprobs"):
        renderer.add_sampled(conv, [1, 2, 3], [0.0, 0.0])
