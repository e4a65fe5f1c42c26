"""``PolicyServer`` as tool-using agents use it, through the official ``openai`` client: tools
rendered by the chat template, histories with ``tool_calls`` and ``tool`` messages, structured
``tool_calls`` in replies, streaming, chat logprobs, stop strings, per-request seeds and top_p.

Two in-process servers on loopback, both with a Qwen2.5 family tokenizer (its real TRL chat
template, which renders ``tools=`` and assistant ``tool_calls``):

* ``scripted``: a tiny Qwen2 built from a config and taught by teacher forcing (a few dozen Adam
  steps, seconds) the replies of one tool loop: a call of ``add`` per tool result so far, then an
  answer (``scripted_reply``), after the prompts the server renders for that loop. Requested
  greedily (``temperature=0``) it writes them exactly (the fixture checks), so the tool-call path
  runs on known text through the real model, sampler, batcher, server and parser.
* ``server``: a tiny random-init Qwen2 built from a config, for everything numeric (logprobs
  against the learner's, streaming against whole replies, seeds, top_p, stop strings), and a
  round trip of whatever it samples through the parser.
"""

import json
import random
import re
import threading
import time

import httpx
import openai
import pytest
import torch

from turnrl.chat.families import family_tokenizer
from turnrl.models.tiny_checkpoints import build_model
from turnrl.policies.hf.policy import TransformersPolicy
from turnrl.policies.openai_chat import ChoiceText, ToolParam, template_messages, template_tools
from turnrl.policies.sampling import SamplingParams
from turnrl.policies.server import ChatMessage, PolicyServer
from turnrl.tools import get_parser

pytestmark = pytest.mark.slow

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]
USER = {"role": "user", "content": "What is 1 + 2 + 3 + 3?"}
CALLS = 3  # the scripted model calls add this many times, then answers


def scripted_reply(results: int) -> str:
    """The scripted model's reply after ``results`` tool results."""
    if results >= CALLS:
        return "The sum is 9."
    arguments = json.dumps({"a": results + 1, "b": 2})
    return f'Step {results + 1}.\n<tool_call>\n{{"name": "add", "arguments": {arguments}}}\n</tool_call>'


@pytest.fixture(scope="module")
def tok():
    """A Qwen2.5 family tokenizer (TRL's qwen2_5 template) trained on tool conversations."""
    base = family_tokenizer("qwen2_5", vocab_size=400)
    calls = [{"role": "assistant", "content": "Step 1.", "tool_calls": [
        {"type": "function", "id": "call_0", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
             {"role": "tool", "tool_call_id": "call_0", "content": "3"}]
    texts = [base.apply_chat_template([USER, *calls], tools=TOOLS, tokenize=False, add_generation_prompt=True),
             *(scripted_reply(k) for k in range(CALLS + 1))]
    return family_tokenizer("qwen2_5", texts, vocab_size=700)


def loop_history(results: int, call_ids: list[str]) -> list[dict]:
    """The conversation the tool loop sends after ``results`` tool results: ``USER``, then per
    round the assistant message as the server returns it (content ``Step k.``, one ``add`` call
    with JSON-text arguments, id ``call_ids[k - 1]``) and the tool's result ``k + 2``."""
    messages = [USER]
    for k in range(1, results + 1):
        call = {"id": call_ids[k - 1], "type": "function",
                "function": {"name": "add", "arguments": json.dumps({"a": k, "b": 2})}}
        messages += [{"role": "assistant", "content": f"Step {k}.", "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"], "content": str(k + 2)}]
    return messages


def served_prompt(tok, messages: list[dict]) -> list[int]:
    """The prompt ids ``PolicyServer`` renders for ``messages`` with ``TOOLS``: the same
    ``template_messages``/``template_tools``, chat template and encoding."""
    tools = template_tools([ToolParam.model_validate(t) for t in TOOLS])
    text = tok.apply_chat_template(template_messages([ChatMessage.model_validate(m) for m in messages]), tools=tools,
                                   tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def script_prompts(tok) -> list[list[int]]:
    """The prompt of each round of the tool loop (``k`` = 0..CALLS tool results so far). The server
    draws each call's id (``call_<random>``), but the chat template does not render ids: every
    set of ids renders the same prompt (checked here on three random sets)."""
    rng = random.Random(0)
    prompts = []
    for k in range(CALLS + 1):
        renders = {tuple(served_prompt(tok, loop_history(k, [f"call_{rng.getrandbits(64):016x}" for _ in range(k)])))
                   for _ in range(3)}
        assert len(renders) == 1, "the chat template renders tool_call ids: train on the ids the loop will send"
        prompts.append(list(renders.pop()))
    return prompts


def teach_script(tok, prompts: list[list[int]], lr: float = 3e-3, max_steps: int = 600, margin: float = 2.0):
    """A tiny Qwen2 (built from a config, seed 0) taught by teacher forcing to reply
    ``scripted_reply(k)`` and the end-of-turn id after ``prompts[k]``, with Adam until each reply
    token is the argmax by ``margin`` logits (so greedy decoding writes every reply). The rounds
    nest (each round's prompt and reply begin the next round's prompt), so it trains on one
    sequence, the last round's, with the loss on every reply's tokens. Returns the model (eval
    mode) and the steps taken."""
    replies = [tok(scripted_reply(k), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
               for k in range(len(prompts))]
    ids = prompts[-1] + replies[-1]
    targets = [-100] * len(ids)
    for prompt, reply in zip(prompts, replies):
        assert ids[:len(prompt) + len(reply)] == prompt + reply, "a round's prompt and reply do not begin the next's"
        targets[len(prompt):len(prompt) + len(reply)] = reply
    ids, targets = torch.tensor([ids]), torch.tensor(targets[1:])  # position t predicts token t + 1
    scored = targets != -100
    model = build_model("qwen2", tok, hidden=64, layers=2, heads=2, kv_heads=1, max_positions=1024, seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for step in range(max_steps + 1):
        logits = model(input_ids=ids).logits[0, :-1][scored]
        with torch.no_grad():
            right = logits.gather(-1, targets[scored, None]).squeeze(-1)
            others = logits.scatter(-1, targets[scored, None], float("-inf")).amax(-1)
        if bool((right - others > margin).all()) or step == max_steps:
            break
        loss = torch.nn.functional.cross_entropy(logits, targets[scored])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model.eval(), step


@pytest.fixture(scope="module")
def scripted(tok):
    """A server of a tiny Qwen2 taught the tool loop's replies (``teach_script``), checked to
    write each of them greedily through the policy the server samples with."""
    prompts = script_prompts(tok)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 64-wide model: one thread beats threads contending on a loaded machine
    try:
        start = time.monotonic()
        model, steps = teach_script(tok, prompts)
        seconds = time.monotonic() - start
        gens = TransformersPolicy(model, tok, seed=0).generate(prompts, SamplingParams(max_new_tokens=64, greedy=True))
    finally:
        torch.set_num_threads(threads)
    written = [tok.decode(g.token_ids, skip_special_tokens=False) for g in gens]
    expected = [scripted_reply(k) + tok.eos_token for k in range(CALLS + 1)]
    assert written == expected, f"after {steps} steps ({seconds:.1f} s) the taught model writes {written}, not {expected}"
    with PolicyServer(model, tok, model_name="scripted", batch_window_s=0) as srv:
        yield srv


@pytest.fixture(scope="module")
def model(tok):
    return build_model("qwen2", tok, max_positions=1024).eval()


@pytest.fixture(scope="module")
def server(model, tok):
    with PolicyServer(model, tok, model_name="tiny", batch_window_s=0.002, max_batch=8) as srv:
        yield srv


def client_of(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def post(server, path, body):
    """POST ``body`` as JSON (lone surrogates as ``\\ud800`` escapes)."""
    return httpx.post(server.url + path, content=json.dumps(body).encode(), timeout=60,
                      headers={"Content-Type": "application/json"})


def learner_logprobs(model, prompt, ids, temperature):
    """The learner's logprobs of ``ids`` after ``prompt`` at ``temperature``."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(ids)[:, None]).squeeze(-1).tolist()


# ------------------------------------------------------------------- tools
def test_an_openai_tool_calling_loop_runs_three_rounds(scripted):
    client = client_of(scripted)
    messages = [USER]
    for round_ in range(1, CALLS + 1):
        reply = client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS, tool_choice="auto",
                                               temperature=0)
        choice = reply.choices[0]
        message = choice.message
        assert choice.finish_reason == "tool_calls" and message.content == f"Step {round_}."
        (call,) = message.tool_calls
        assert call.type == "function" and call.id.startswith("call_") and call.function.name == "add"
        assert json.loads(call.function.arguments) == {"a": round_, "b": 2}
        messages.append(message)  # as agents append it: the client's own message object
        messages.append({"role": "tool", "tool_call_id": call.id, "content": str(round_ + 2)})
    final = client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS, temperature=0)
    assert final.choices[0].finish_reason == "stop" and final.choices[0].message.content == "The sum is 9."
    assert final.choices[0].message.tool_calls is None
    none = client.chat.completions.create(model="scripted", messages=[USER], tools=TOOLS, tool_choice="none",
                                          temperature=0)
    text = scripted_reply(0).replace("<tool_call>", "").replace("</tool_call>", "")  # special tokens skipped
    assert none.choices[0].message.content == text and none.choices[0].message.tool_calls is None
    assert none.choices[0].finish_reason == "stop"


def test_the_rendered_prompt_is_the_template_of_the_history_with_parsed_arguments(scripted, tok):
    history = [
        {"role": "system", "content": [{"type": "text", "text": "You add."}, {"type": "text", "text": "Briefly."}]},
        USER,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}},
            {"id": "call_b", "type": "function", "function": {"name": "add", "arguments": '{"a": 3, "b": 3}'}}]},
        {"role": "tool", "tool_call_id": "call_a", "name": "add", "content": "3"},
        {"role": "tool", "tool_call_id": "call_b", "name": "add", "content": [{"type": "text", "text": "6"}]},
    ]
    reply = post(scripted, "/v1/chat/completions", {"messages": history, "tools": TOOLS, "return_token_ids": True,
                                                     "max_tokens": 4}).json()
    expected = json.loads(json.dumps(history))
    expected[0]["content"] = "You add.\nBriefly."
    expected[4]["content"] = "6"
    for call in expected[2]["tool_calls"]:
        call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    text = tok.apply_chat_template(expected, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert '{"name": "add", "arguments": {"a": 3, "b": 3}}' in text
    assert reply["prompt_token_ids"] == tok(text, add_special_tokens=False)["input_ids"]
    assert reply["usage"]["prompt_tokens"] == len(reply["prompt_token_ids"])
    rendered = template_messages([ChatMessage.model_validate(m) for m in history])
    assert rendered[2]["tool_calls"][1]["function"]["arguments"] == {"a": 3, "b": 3}
    assert rendered[2]["content"] == "" and rendered[3]["name"] == "add" and rendered[3]["tool_call_id"] == "call_a"


def test_a_streamed_tool_call_is_the_whole_reply(scripted):
    client = client_of(scripted)
    whole = client.chat.completions.create(model="scripted", messages=[USER], tools=TOOLS, temperature=0)
    chunks = list(client.chat.completions.create(model="scripted", messages=[USER], tools=TOOLS, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    (call,) = calls
    (expected,) = whole.choices[0].message.tool_calls
    assert call.index == 0 and call.id.startswith("call_") and call.type == "function"
    assert (call.function.name, call.function.arguments) == (expected.function.name, expected.function.arguments)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()


def test_sampled_replies_read_as_the_parser_reads_their_tokens(server, tok):
    """Whatever the random model samples with tools: the message is the hermes parser's reading
    of the reply's own tokens, and /v1/completions samples the same tokens from the same seed."""
    body = {"messages": [USER], "tools": TOOLS, "n": 4, "max_tokens": 24, "seed": 11, "return_token_ids": True}
    reply = post(server, "/v1/chat/completions", body).json()
    parse = get_parser("hermes")
    for choice in reply["choices"]:
        ids = choice["token_ids"]
        body_ids = ids[:-1] if choice["finish_reason"] != "length" and ids[-1] == tok.eos_token_id else ids
        read = parse(tok.decode(body_ids, skip_special_tokens=False))
        message = choice["message"]
        if read.status == "ok":
            assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] \
                == [(c.name, c.arguments) for c in read.calls]
            assert message["content"] == (read.content or None) and choice["finish_reason"] == "tool_calls"
        else:
            assert message["content"] == tok.decode(body_ids, skip_special_tokens=False)
            assert "tool_calls" not in message
    completions = post(server, "/v1/completions", {"prompt": reply["prompt_token_ids"], "n": 4, "max_tokens": 24,
                                                   "seed": 11, "return_token_ids": True}).json()
    assert [c["token_ids"] for c in completions["choices"]] == [c["token_ids"] for c in reply["choices"]]


# --------------------------------------------------------------- streaming
@pytest.fixture(scope="module")
def long_reply(server) -> tuple[int, dict]:
    """A seed whose reply runs to max_tokens=150 (the random model rarely ends a turn), and that reply."""
    for seed in range(20):
        body = {"messages": [USER], "max_tokens": 150, "seed": seed, "logprobs": True}
        reply = post(server, "/v1/chat/completions", body).json()
        if reply["choices"][0]["finish_reason"] == "length":
            return seed, reply
    raise AssertionError("every seed ended its turn early")


def test_a_stream_is_the_whole_reply_and_arrives_as_it_is_sampled(server, long_reply):
    seed, whole = long_reply
    client = client_of(server)
    start = time.monotonic()
    stream = client.chat.completions.create(model="tiny", messages=[USER], max_tokens=150, seed=seed, stream=True,
                                            logprobs=True)
    arrivals, chunks = [], []
    for chunk in stream:
        arrivals.append(time.monotonic() - start)
        chunks.append(chunk)
    total = arrivals[-1]
    first_text = next(t for t, c in zip(arrivals, chunks) if c.choices and c.choices[0].delta.content)
    assert first_text < total / 3, (first_text, total)  # the first tokens came long before the last
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole["choices"][0]["message"]["content"]
    streamed = [e.model_dump() for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e["token"], e["logprob"]) for e in streamed] == \
        [(e["token"], e["logprob"]) for e in whole["choices"][0]["logprobs"]["content"]]
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]


def test_a_streamed_completion_is_the_whole_completion(server):
    body = {"prompt": "Step 1. add", "max_tokens": 30, "seed": 3, "n": 2, "return_token_ids": True, "logprobs": 1}
    whole = post(server, "/v1/completions", body).json()
    chunks = list(client_of(server).completions.create(model="tiny", stream=True,
                                                       extra_body={"return_token_ids": True}, **{
                                                           k: v for k, v in body.items() if k != "return_token_ids"}))
    for index, choice in enumerate(whole["choices"]):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]
        assert "".join(c.text for c in mine) == choice["text"]
        assert [i for c in mine for i in c.model_extra.get("token_ids") or []] == choice["token_ids"]
        assert [lp for c in mine if c.logprobs for lp in c.logprobs.token_logprobs] == \
            choice["logprobs"]["token_logprobs"]
        assert [c.finish_reason for c in mine if c.finish_reason] == [choice["finish_reason"]]


# ---------------------------------------------------------------- sampling
def test_chat_logprobs_are_the_learners_with_sorted_alternatives(server, model):
    reply = post(server, "/v1/chat/completions", {"messages": [USER], "max_tokens": 20, "temperature": 0.7,
                                                  "seed": 5, "logprobs": True, "top_logprobs": 3,
                                                  "return_token_ids": True}).json()
    (choice,) = reply["choices"]
    content = choice["logprobs"]["content"]
    ids = choice["token_ids"]
    assert len(content) == len(ids) == reply["usage"]["completion_tokens"]
    expected = learner_logprobs(model, reply["prompt_token_ids"], ids, 0.7)
    assert [e["logprob"] for e in content] == pytest.approx(expected, abs=1e-5)
    for entry, token_id in zip(content, ids):
        top = entry["top_logprobs"]
        assert 1 <= len(top) <= 3 and [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert entry["logprob"] <= top[0]["logprob"] + 1e-6
        assert entry["bytes"] == list(entry["token"].encode("utf-8"))


def test_stop_strings_end_the_reply_before_them(server, long_reply):
    seed, whole = long_reply
    text = whole["choices"][0]["message"]["content"]
    at = next(i for i in range(10, len(text) - 2) if text[i:i + 2].isprintable() and "\ufffd" not in text[i:i + 2])
    stop = text[at:at + 2]
    cut = text[:text.find(stop)]
    body = {"messages": [USER], "max_tokens": 150, "seed": seed, "stop": ["never-written-zz", stop]}
    reply = post(server, "/v1/chat/completions", body).json()
    (choice,) = reply["choices"]
    assert choice["message"]["content"] == cut and choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    assert reply["usage"]["completion_tokens"] < whole["usage"]["completion_tokens"]  # it stopped sampling there
    streamed = client_of(server).chat.completions.create(model="tiny", messages=[USER], max_tokens=150, seed=seed,
                                                         stop=stop, stream=True)
    chunks = list(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_seeded_request_samples_the_same_whatever_runs_beside_it(server):
    body = {"messages": [USER], "max_tokens": 24, "seed": 1234, "n": 2, "logprobs": True, "return_token_ids": True}
    alone = post(server, "/v1/chat/completions", body).json()
    others, replies = [], {}

    def other(i):
        others.append(post(server, "/v1/chat/completions", {"messages": [USER, {"role": "assistant", "content": "x"},
                                                                          {"role": "user", "content": str(i)}],
                                                             "max_tokens": 24, "n": 2}).status_code)

    def seeded():
        replies["again"] = post(server, "/v1/chat/completions", body).json()

    threads = [threading.Thread(target=other, args=(i,)) for i in range(4)] + [threading.Thread(target=seeded)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert others == [200] * 4
    again = replies["again"]
    for a, b in zip(alone["choices"], again["choices"]):
        assert a["token_ids"] == b["token_ids"] and a["message"] == b["message"]
        assert [e["logprob"] for e in a["logprobs"]["content"]] == [e["logprob"] for e in b["logprobs"]["content"]]
    other_seed = post(server, "/v1/chat/completions", {**body, "seed": 4321}).json()
    assert [c["token_ids"] for c in other_seed["choices"]] != [c["token_ids"] for c in alone["choices"]]


def test_top_p_one_is_no_top_p_and_a_tiny_top_p_is_greedy(server, model):
    body = {"messages": [USER], "max_tokens": 16, "seed": 9, "logprobs": True, "return_token_ids": True}
    plain = post(server, "/v1/chat/completions", body).json()["choices"][0]
    one = post(server, "/v1/chat/completions", {**body, "top_p": 1}).json()["choices"][0]
    assert one["token_ids"] == plain["token_ids"] and one["logprobs"] == plain["logprobs"]
    tiny = post(server, "/v1/chat/completions", {**body, "top_p": 1e-6}).json()["choices"][0]
    greedy = post(server, "/v1/chat/completions", {**body, "temperature": 0}).json()["choices"][0]
    assert tiny["token_ids"] == greedy["token_ids"] and all(e["logprob"] == 0 for e in tiny["logprobs"]["content"])
    nucleus = post(server, "/v1/chat/completions", {**body, "top_p": 0.5}).json()
    ids = nucleus["choices"][0]["token_ids"]
    full = learner_logprobs(model, nucleus["prompt_token_ids"], ids, 1.0)
    renormalised = [e["logprob"] for e in nucleus["choices"][0]["logprobs"]["content"]]
    assert all(r >= f - 1e-5 for r, f in zip(renormalised, full)) and renormalised != pytest.approx(full, abs=1e-3)


def test_the_policy_calls_on_token_as_it_samples_and_stops_where_told(model, tok):
    prompts = [[5, 6, 7], [8, 9]]
    params = SamplingParams(max_new_tokens=12)
    seen: list[tuple[int, int, float]] = []

    def note(row, token_id, logprob, top):
        seen.append((row, token_id, logprob))
        return False

    plain = TransformersPolicy(model, tok, seed=3).generate(prompts, params)
    gens = TransformersPolicy(model, tok, seed=3).generate(prompts, params, on_token=note)
    assert [g.token_ids for g in gens] == [g.token_ids for g in plain]
    assert [g.logprobs for g in gens] == [g.logprobs for g in plain]
    assert [[(t, lp) for r, t, lp in seen if r == row] for row in (0, 1)] == \
        [list(zip(g.token_ids, g.logprobs)) for g in plain]
    stopped = TransformersPolicy(model, tok, seed=3).generate(prompts, params,
                                                              on_token=lambda row, t, lp, top: row == 0)
    assert stopped[0].token_ids == plain[0].token_ids[:1] and stopped[0].finish_reason == "stop"
    assert stopped[1].token_ids == plain[1].token_ids
    text = ChoiceText(tok, skip_special=True, end_ids=[tok.eos_token_id], stop=["c d"])
    ids = tok("ab c d e f", add_special_tokens=False)["input_ids"]
    ended = next(k for k, i in enumerate(ids) if text.add(i))
    assert text.text == "ab " and text.stopped and tok.decode(ids[:ended + 1]).endswith("c d")


# ---------------------------------------------------------------- refusals
TOOL_CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]}
BAD = [
    ({"messages": [USER, {**TOOL_CALL, "tool_calls": [{**TOOL_CALL["tool_calls"][0], "function": {
        "name": "add", "arguments": '{"a": 1,'}}]}]}, "messages[1].tool_calls[0].function.arguments", "is not JSON"),
    ({"messages": [USER, {**TOOL_CALL, "tool_calls": [{**TOOL_CALL["tool_calls"][0], "function": {
        "name": "add", "arguments": "[1, 2]"}}]}]}, "messages[1].tool_calls[0].function.arguments",
     "JSON text of an object"),
    ({"messages": [USER, {**TOOL_CALL, "tool_calls": [{"id": "c", "type": "function"}]}]},
     "messages[1].tool_calls[0].function", "Field required"),
    ({"messages": [USER, {**TOOL_CALL, "tool_calls": [{"id": "c", "function": {"name": ""}}]}]},
     "messages[1].tool_calls[0].function.name", "non-empty"),
    ({"messages": [{**USER, "tool_calls": TOOL_CALL["tool_calls"]}]}, "messages[0].tool_calls",
     "only assistant messages"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content", "needs content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content", "only text parts"),
    ({"tool_choice": "required"}, "tool_choice", "not supported"),
    ({"tool_choice": {"type": "function", "function": {"name": "add"}}}, "tool_choice", "not supported"),
    ({"tool_choice": "sometimes", "tools": TOOLS}, "tool_choice", 'must be "auto" or "none"'),
    ({"tool_choice": "auto", "tools": None}, "tool_choice", "needs tools"),
    ({"tools": [{"type": "function"}]}, "tools[0].function", "Field required"),
    ({"tools": [{"type": "retrieval", "function": TOOLS[0]["function"]}]}, "tools[0].type", "function"),
    ({"tools": [{"type": "function", "function": {"name": "add", "description": "\ud800"}}]},
     "tools[0].function.description", "lone UTF-16 surrogate"),
    ({"top_logprobs": 21, "logprobs": True}, "top_logprobs", r"\[0, 20\]"),
    ({"top_logprobs": 2}, "top_logprobs", "needs logprobs: true"),
    ({"top_p": 0}, "top_p", r"\(0, 1\]"),
    ({"top_p": 1.5}, "top_p", r"\(0, 1\]"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
    ({"stop": [""]}, "stop", "non-empty"),
    ({"seed": "7"}, "seed", "integer"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "stream: true"),
]


@pytest.mark.parametrize("fields,param,message", BAD)
def test_malformed_agent_requests_get_400_naming_the_field(scripted, fields, param, message):
    body = {"messages": [USER], "tools": TOOLS, "max_tokens": 2, **fields}
    reply = post(scripted, "/v1/chat/completions", {k: v for k, v in body.items() if v is not None})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param, error
    assert re.search(message, error["message"]), error["message"]


def test_the_openai_client_gets_the_400_as_a_bad_request(scripted):
    with pytest.raises(openai.BadRequestError) as refused:
        client_of(scripted).chat.completions.create(model="scripted", messages=BAD[0][0]["messages"], tools=TOOLS)
    assert refused.value.body["param"] == "messages[1].tool_calls[0].function.arguments"
