"""``PolicyServer``'s limits, on real in-process servers over the tiny model: every bad numeric or
text input is a 400 saying what is allowed (never a 5xx, whatever the body), a request over the
per-request budget is a 400 saying how to split it, and a large request does not hold back a
small one that arrives while it is being sampled."""

import copy
import inspect
import json
import math
import re
import threading
import time

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from turnrl.policies.server import MAX_TEMPERATURE, MIN_TEMPERATURE, PolicyServer

NAME = "tiny"
LIMITS = {"max_tokens_limit": 8, "max_n": 4, "max_request_rows": 8, "max_request_tokens": 24}
"""The ``server`` fixture's limits: small, so that valid random requests stay quick."""


@pytest.fixture(scope="module")
def model(tiny_model):
    return copy.deepcopy(tiny_model).eval()


@pytest.fixture(scope="module")
def server(model, tokenizer):
    with PolicyServer(model, tokenizer, model_name=NAME, batch_window_s=0, max_batch=4, **LIMITS) as srv:
        yield srv


@pytest.fixture(scope="module")
def prompt(tokenizer):
    return tokenizer("Guess a number between 1 and 32")["input_ids"]


def post(server, path, body, timeout=60):
    """POST ``body`` as JSON (NaN and Infinity written as Python's json writes them)."""
    return httpx.post(server.url + path, content=json.dumps(body).encode(), timeout=timeout,
                      headers={"Content-Type": "application/json"})


BAD_NUMBERS = [
    ({"temperature": 1e-300}, "temperature",
     r"must be a number >= 0, either 0 \(greedy\) or in \[0.01, 100\] .*send 0.*got 1e-300"),
    ({"temperature": 0.009}, "temperature", r"in \[0.01, 100\].*got 0.009"),
    ({"temperature": 5e-324}, "temperature", r"in \[0.01, 100\]"),
    ({"temperature": 100.5}, "temperature", r"in \[0.01, 100\]"),
    ({"temperature": 1e308}, "temperature", r"in \[0.01, 100\]"),
    ({"temperature": float("nan")}, "temperature", r"in \[0.01, 100\].*got NaN"),
    ({"temperature": float("inf")}, "temperature", r"in \[0.01, 100\].*got Infinity"),
    ({"temperature": -0.5}, "temperature", r"in \[0.01, 100\]"),
    ({"temperature": "0.7"}, "temperature", r"in \[0.01, 100\].*got \"0.7\""),
    ({"temperature": True}, "temperature", r"in \[0.01, 100\]"),
    ({"max_tokens": 0}, "max_tokens", r"'max_tokens' must be an integer in \[1, 8\], got 0 .*--max-tokens-limit"),
    ({"max_tokens": 9}, "max_tokens", r"'max_tokens' must be an integer in \[1, 8\]"),
    ({"max_tokens": 10**40}, "max_tokens", r"'max_tokens' must be an integer in \[1, 8\]"),
    ({"max_tokens": 2.0}, "max_tokens", r"should be a valid integer"),
    ({"max_tokens": float("inf")}, "max_tokens", r"should be a valid integer"),
    ({"n": 0}, "n", r"'n' must be an integer in \[1, 4\], got 0 .*--max-n"),
    ({"n": 5}, "n", r"'n' must be an integer in \[1, 4\]"),
    ({"n": -3}, "n", r"'n' must be an integer in \[1, 4\]"),
    ({"n": 1.5}, "n", r"should be a valid integer"),
    ({"logprobs": 2}, "logprobs", r"must be an integer in \[0, 1\] \(the server returns the sampled token's"),
    ({"logprobs": True}, "logprobs", r"must be an integer in \[0, 1\]"),
    ({"prompt": [1, -1]}, "prompt", r"outside the vocabulary \[0, \d+\): \[-1\]"),
    ({"prompt": [[1, 2], [10**30]]}, "prompt", r"prompt\[1\] holds token ids outside the vocabulary"),
    ({"prompt": [1, True]}, "prompt", r"must be a string, a non-empty list of token ids"),
    ({"prompt": [[1], []]}, "prompt", r"must be a string"),
    ({"prompt": [1.0, 2.0]}, "prompt", r"must be a string"),
    ({"prompt": "\ud800"}, "prompt", r"prompt holds '\\ud800' at character 0, a lone UTF-16 surrogate"),
    ({"prompt": ["ok", "a\udfffb"]}, "prompt", r"prompt\[1\] holds '\\udfff' at character 1"),
    ({"prompt": ["ok", ""]}, "prompt", r"prompt\[1\] is an empty string"),
    ({"stop_token_ids": [7]}, "stop_token_ids", r"stop_token_ids may only hold end-of-turn ids"),
    ({"stop_token_ids": [2.5]}, "stop_token_ids[0]", r"should be a valid integer"),
    ({"stop_token_ids": [[2]]}, "stop_token_ids[0]", r"should be a valid integer"),
    ({"top_p": float("nan")}, "top_p", r"must be a number in \(0, 1\].*got NaN"),
    ({"top_p": True}, "top_p", r"must be a number in \(0, 1\]"),
    ({"top_p": 0}, "top_p", r"must be a number in \(0, 1\]"),
    ({"seed": 1 << 64}, "seed", r"must be an integer in \[-9223372036854775808, 18446744073709551615\]"),
    ({"stop": ["a\udfff"]}, "stop", r"stop\[0\] holds '\\udfff' at character 1"),
    ({"echo": 0}, "echo", r"echo is not supported: send false or leave it out"),
    ({"model": 5}, "model", r"should be a valid string"),
    ({"return_token_ids": "yes"}, "return_token_ids", r"should be a valid boolean"),
    ({"stop": ["x" * 10_000] * 5}, "stop", r"must be a string or a list of at most 4 non-empty strings"),
    ({"stop": [""]}, "stop", r"must be a string or a list of at most 4 non-empty strings"),
]


@pytest.mark.slow
@pytest.mark.parametrize("fields,param,message", BAD_NUMBERS)
def test_bad_values_get_400_saying_what_is_allowed(server, prompt, fields, param, message):
    body = {"model": NAME, "prompt": prompt, "max_tokens": 2, **fields}
    reply = post(server, "/v1/completions", body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 400 and error["param"] == param
    assert re.search(message, error["message"]), error["message"]
    assert len(error["message"]) < 1000  # a huge refused value is quoted in part only


BAD_CHATS = [
    ({"temperature": 1e-300}, r"must be a number >= 0, either 0 \(greedy\) or in \[0.01, 100\]"),
    ({"max_completion_tokens": 9}, r"'max_completion_tokens' must be an integer in \[1, 8\]"),
    ({"n": 0}, r"'n' must be an integer in \[1, 4\]"),
    ({"messages": [{"role": "user", "content": "\ud83d"}]}, r"messages\[0\].content holds '\\ud83d'"),
    ({"messages": [{"role": "\udc00", "content": "hi"}]}, r"messages\[0\].role holds '\\udc00'"),
    ({"messages": [{"role": "user", "content": ["parts"]}]}, r"messages\[0\]\.content.*list of text parts.*part 0"),
    ({"messages": []}, r"messages.*at least 1 item"),
    ({"logprobs": 1}, r"logprobs'?: Input should be a valid boolean"),
    ({"logprobs": True, "top_logprobs": 21}, r"top_logprobs'?: must be an integer in \[0, 20\]"),
    ({"tool_choice": "required", "tools": [{"type": "function", "function": {"name": "f"}}]},
     r"tool_choice'?: 'required' and a named function are not supported"),
]


@pytest.mark.slow
@pytest.mark.parametrize("fields,message", BAD_CHATS)
def test_bad_chat_values_get_400(server, fields, message):
    body = {"messages": [{"role": "user", "content": "1 to 32"}], "max_tokens": 2, **fields}
    reply = post(server, "/v1/chat/completions", body)
    assert reply.status_code == 400, reply.text
    assert re.search(message, reply.json()["error"]["message"]), reply.json()["error"]["message"]


@pytest.mark.slow
def test_temperatures_at_the_bounds_sample_finite_logprobs(server, prompt):
    for temperature in (MIN_TEMPERATURE, MAX_TEMPERATURE, 0, 0.0, 1):
        body = {"prompt": prompt, "max_tokens": 4, "temperature": temperature, "logprobs": 1, "n": 2}
        reply = post(server, "/v1/completions", body)
        assert reply.status_code == 200, reply.text
        for choice in reply.json()["choices"]:
            assert all(math.isfinite(lp) and lp <= 0 for lp in choice["logprobs"]["token_logprobs"])


@pytest.mark.slow
def test_a_request_over_the_budget_gets_400_saying_how_to_split_it(server, prompt):
    rows = post(server, "/v1/completions", {"prompt": [prompt] * 5, "n": 2, "max_tokens": 2})
    assert rows.status_code == 400
    error = rows.json()["error"]
    assert error["param"] == "prompt"
    assert re.search(r"asks for 10 rows \(5 prompts x n=2\) .*at most 8 rows and 24 tokens .*--max-request-rows, "
                     r"--max-request-tokens\): split it into requests of at most 4 prompts each .*: 2 requests here",
                     error["message"]), error["message"]
    done = [post(server, "/v1/completions", {"prompt": [prompt] * k, "n": 2, "max_tokens": 2}) for k in (4, 1)]
    assert [r.status_code for r in done] == [200, 200] and len(done[0].json()["choices"]) == 8

    tokens = post(server, "/v1/completions", {"prompt": [prompt] * 2, "n": 2, "max_tokens": 8})
    assert tokens.status_code == 400  # 4 rows, 32 tokens
    assert re.search(r"32 tokens in all.*at most 1 prompt each", tokens.json()["error"]["message"])

    alone = post(server, "/v1/completions", {"prompt": prompt, "n": 4, "max_tokens": 8})  # 32 tokens in one prompt
    assert alone.status_code == 400 and alone.json()["error"]["param"] == "n"
    assert re.search(r"\(1 prompt x n=4\).*one prompt at n=4 and max_tokens=8 is already over: lower n to at most 3 "
                     r"\(or max_tokens to at most 6\) and ask for the other samples in further requests",
                     alone.json()["error"]["message"]), alone.json()["error"]["message"]
    chat = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 4,
                                                 "max_tokens": 8})
    assert chat.status_code == 400 and "one conversation at n=4" in chat.json()["error"]["message"]
    assert post(server, "/v1/completions", {"prompt": prompt, "n": 3, "max_tokens": 8}).status_code == 200


def test_the_command_line_limits_default_to_the_servers():
    from turnrl.cli import _parser

    parser = _parser()
    commands = next(a for a in parser._subparsers._group_actions if a.choices).choices
    policy = next(sub for name, sub in commands.items() if name.endswith("policy"))
    args = policy.parse_args(["--path", "x"])
    defaults = {name: p.default for name, p in inspect.signature(PolicyServer).parameters.items()}
    for name in ("max_tokens_limit", "max_n", "max_request_rows", "max_request_tokens", "max_batch", "tool_parser"):
        assert getattr(args, name) == defaults[name], name
    assert policy.parse_args(["--path", "x", "--max-request-rows", "7"]).max_request_rows == 7
    with pytest.raises(SystemExit):
        policy.parse_args(["--path", "x", "--max-request-tokens", "0"])
    with pytest.raises(ValueError, match="max_request_rows must be a positive int"):
        PolicyServer(None, None, max_request_rows=0)


class TimedServer(PolicyServer):
    """A ``PolicyServer`` that notes when each request is queued and each generate call runs."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.queued, self.calls = {}, []  # first prompt -> when queued; (start, end, prompts) per call
        generate = self.policy.generate

        def timed(prompts, params):
            start = time.monotonic()
            try:
                return generate(prompts, params)
            finally:
                self.calls.append((start, time.monotonic(), [tuple(p) for p in prompts]))

        self.policy.generate = timed

    def sample(self, prompts, params):
        self.queued[tuple(prompts[0])] = time.monotonic()
        return super().sample(prompts, params)


@pytest.mark.slow
@pytest.mark.parametrize("small_temperature", [1.0, 0], ids=["other-parameters", "same-parameters"])
def test_a_small_request_is_not_held_back_by_a_large_one(model, tokenizer, prompt, small_temperature):
    """A large request (64 rows: 32 generate calls of 2) and a small one sent from another thread
    while it runs: the small one's row is in one of the next two calls after it is queued (the one
    running then, and its own), and it is answered long before the large one. Times are compared
    with the calls' own durations in the same run, never with a fixed number of seconds."""
    other = prompt[:-1]  # tells the small request's row apart
    with TimedServer(model, tokenizer, model_name=NAME, batch_window_s=0, max_batch=2) as srv:
        big: dict = {}

        def send_big():
            sent = time.monotonic()
            big["reply"] = post(srv, "/v1/completions", {"prompt": prompt, "n": 64, "max_tokens": 16,
                                                         "temperature": 0, "return_token_ids": True}, timeout=600)
            big["latency"] = time.monotonic() - sent

        thread = threading.Thread(target=send_big)
        thread.start()
        while not srv.calls:  # the big request is being sampled
            time.sleep(0.005)
        sent = time.monotonic()
        reply = post(srv, "/v1/completions", {"prompt": other, "max_tokens": 16, "temperature": small_temperature})
        latency, calls_then = time.monotonic() - sent, len(srv.calls)
        thread.join()
        assert reply.status_code == 200 and big["reply"].status_code == 200

    queued = srv.queued[tuple(other)]
    after = [c for c in srv.calls if c[1] > queued]  # the call running when it was queued, and the later ones
    holding = next(i for i, (_, _, prompts) in enumerate(after) if tuple(other) in prompts)
    assert holding <= 1, (holding, len(srv.calls))
    assert len(srv.calls) >= 32 and len(srv.calls) - calls_then >= 8  # a quarter of the big one was still to run
    durations = [end - start for start, end, _ in srv.calls]
    assert after[holding][1] - queued <= 3 * max(durations)  # queued to sampled: two calls at most
    assert latency < big["latency"] / 2
    ids = [c["token_ids"] for c in big["reply"].json()["choices"]]  # greedy: 64 equal rows, in order
    assert len(ids) == 64 and ids == [ids[0]] * 64


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                 max_size=4),
                    max_leaves=12)
SURROGATES = st.sampled_from(["\ud800", "x\udfff", "\ud83d\ude00", "\udbff"])
TEXT = SURROGATES | st.text(max_size=20)
EDGES = st.sampled_from([0, -0.0, 1e-300, 5e-324, 1e-40, 0.0099, 0.01, 100, 100.01, 1e308, float("nan"),
                         float("inf"), -1, 10**50, True])
NUMBERS = EDGES | st.integers(-3, 12) | st.floats() | st.integers()
IDS = st.lists(st.integers(-5, 1200) | st.sampled_from([10**30, -(10**30)]), max_size=6)
FIELDS = {
    "model": st.just(NAME) | TEXT | JSON,
    "prompt": TEXT | IDS | st.lists(IDS, max_size=4) | st.lists(TEXT, max_size=4) | JSON,
    "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]) | TEXT,
                                                "content": TEXT}) | JSON, max_size=3) | JSON,
    "max_tokens": NUMBERS | JSON, "max_completion_tokens": NUMBERS | JSON, "n": NUMBERS | JSON,
    "temperature": NUMBERS | JSON, "logprobs": NUMBERS | st.booleans() | JSON, "top_logprobs": NUMBERS | JSON,
    "top_p": NUMBERS | JSON, "top_k": NUMBERS | JSON, "stop": TEXT | JSON, "seed": NUMBERS | JSON,
    "stop_token_ids": st.lists(NUMBERS, max_size=3) | JSON, "ignore_eos": st.booleans() | JSON,
    "add_special_tokens": st.booleans() | JSON, "skip_special_tokens": st.booleans() | JSON,
    "return_token_ids": st.booleans() | JSON, "return_tokens_as_token_ids": st.booleans() | JSON,
    "stream": st.booleans() | JSON, "logit_bias": JSON, "tools": JSON,
}
VALID = {"/v1/completions": {"model": NAME, "prompt": [5, 6, 7], "max_tokens": 2},
         "/v1/chat/completions": {"model": NAME, "messages": [{"role": "user", "content": "1 to 32"}], "max_tokens": 2}}
"""A well-formed body per endpoint, which the random fields replace (so each field is tried
where everything else passes, as deep as its own checks go)."""
READS = {"/v1/completions": ["model", "prompt", "max_tokens", "n", "temperature", "logprobs", "top_p", "top_k", "stop",
                              "seed", "stop_token_ids", "ignore_eos", "add_special_tokens", "skip_special_tokens",
                              "return_token_ids", "return_tokens_as_token_ids", "stream", "logit_bias", "tools"],
         "/v1/chat/completions": ["model", "messages", "max_tokens", "max_completion_tokens", "n", "temperature",
                                  "logprobs", "top_logprobs", "top_p", "stop", "seed", "stream", "tools"]}
"""The fields each endpoint reads."""


def changed(path):
    """``(path, body)``: the valid body with one to three of the fields ``path`` reads set at random."""
    keys = st.lists(st.sampled_from(READS[path]), min_size=1, max_size=3, unique=True)
    return keys.flatmap(lambda ks: st.fixed_dictionaries({k: FIELDS[k] for k in ks})).map(
        lambda fields: (path, {**VALID[path], **fields}))


RANDOM = st.tuples(st.sampled_from(sorted(VALID)), JSON | st.binary(max_size=40))
BODIES = st.integers(0, 9).flatmap(lambda i: RANDOM if i == 0 else changed(sorted(VALID)[i % 2]))


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(request=BODIES)
@example(request=("/v1/completions", {**VALID["/v1/completions"], "temperature": 1e-300}))
@example(request=("/v1/completions", {**VALID["/v1/completions"], "prompt": "\ud800"}))
@example(request=("/v1/chat/completions", {**VALID["/v1/chat/completions"], "messages": [{"role": "user",
                                                                                          "content": "\udfff"}]}))
@example(request=("/v1/completions", b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"))
def test_no_body_gets_a_5xx_and_the_server_keeps_serving(server, request):
    path, body = request
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    reply = httpx.post(server.url + path, content=content, timeout=60)
    assert reply.status_code in (200, 400, 404), (reply.status_code, reply.text)
    if reply.status_code != 200:
        error = reply.json()["error"]
        assert error["code"] == reply.status_code and error["message"]
    assert httpx.get(server.url + "/health", timeout=10).json() == {"status": "ok"}


OPENAI_KEYS = sorted({*READS["/v1/completions"], *READS["/v1/chat/completions"], "user", "suffix", "echo", "best_of",
                      "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "response_format",
                      "tool_choice", "parallel_tool_calls", "functions", "function_call", "stream_options", "metadata",
                      "store", "service_tier", "reasoning_effort", "modalities", "prediction", "include_stop_str_in_output"})
"""Keys of OpenAI's and vLLM's request bodies: those the server reads, refuses or ignores."""
ANY_VALUE = JSON | NUMBERS | TEXT | IDS | st.lists(IDS, max_size=3)
OBJECTS = st.tuples(st.sampled_from(sorted(VALID)), st.booleans(),
                    st.dictionaries(st.sampled_from(OPENAI_KEYS) | st.text(max_size=6), ANY_VALUE, max_size=6))


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(request=OBJECTS)
def test_random_openai_bodies_get_no_5xx_and_the_server_keeps_sampling(server, request):
    """Random JSON objects of OpenAI-ish keys and values, alone or over a valid body: each is
    answered (200, or a 4xx in the OpenAI error shape), and a valid request is served after it."""
    path, over_valid, fields = request
    body = {**VALID[path], **fields} if over_valid else fields
    reply = httpx.post(server.url + path, content=json.dumps(body).encode(), timeout=60)
    assert reply.status_code in (200, 400, 404), (reply.status_code, reply.text)
    if reply.status_code != 200:
        error = reply.json()["error"]
        assert error["code"] == reply.status_code and error["message"] and error["type"]
        assert error["param"] is None or isinstance(error["param"], str)
    assert post(server, "/v1/completions", VALID["/v1/completions"]).status_code == 200


@pytest.mark.slow
def test_weights_that_cannot_be_pushed_get_400_and_change_nothing(server, prompt, tmp_path):
    import torch
    from safetensors.torch import save_file

    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "return_token_ids": True}
    before = post(server, "/v1/completions", body).json()["choices"][0]["token_ids"]
    state = {k: v.clone() for k, v in server.model.state_dict().items()}
    state["model.norm.weight"][0] = float("nan")
    save_file(state, str(tmp_path / "model.safetensors"))
    for path, message in ((str(tmp_path), r"NaN or inf values: \['model.norm.weight'\]"),
                          ("bad\x00name", "cannot be listed|is not a folder"), ("\ud800", "lone UTF-16 surrogate")):
        reply = post(server, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": path}})
        assert reply.status_code == 400 and re.search(message, reply.json()["error"]["message"]), reply.text
    assert post(server, "/v1/completions", body).json()["choices"][0]["token_ids"] == before
    assert post(server, "/collective_rpc", {"method": {"x": [1] * 10_000}}).status_code == 400
    assert all(bool(torch.isfinite(t).all()) for t in server.model.state_dict().values())


@pytest.mark.parametrize("limits,count,n,max_tokens,message", [
    ({"max_request_rows": 4, "max_request_tokens": 100}, 1, 6, 2,
     r"lower n to at most 4 and ask for the other samples"),  # n alone over the rows
    ({"max_request_rows": 64, "max_request_tokens": 10}, 1, 1, 16, r"lower max_tokens to at most 10$"),
    ({"max_request_rows": 64, "max_request_tokens": 100}, 30, 1, 4, r"at most 25 prompts each .*: 2 requests here"),
])
def test_the_budget_message_names_a_split_that_fits(tiny_model, tokenizer, limits, count, n, max_tokens, message):
    from turnrl.policies.sampling import SamplingParams
    from turnrl.serving import APIError

    srv = PolicyServer(tiny_model, tokenizer, max_tokens_limit=64, max_n=64, **limits)  # never started
    with pytest.raises(APIError, match=message):
        srv._check_budget(count, n, SamplingParams(max_tokens), "prompts")
    srv._check_budget(1, 1, SamplingParams(min(max_tokens, limits["max_request_tokens"])), "prompts")


@pytest.mark.slow
def test_the_default_max_tokens_stays_within_the_limit(server, prompt):
    reply = post(server, "/v1/completions", {"prompt": prompt, "temperature": 0, "return_token_ids": True})
    assert reply.status_code == 200 and len(reply.json()["choices"][0]["token_ids"]) <= LIMITS["max_tokens_limit"]
