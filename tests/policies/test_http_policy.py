"""``OpenAIPolicy`` against a real ``turnrl serve-policy`` subprocess (and a real flaky proxy in
front of it for retries, refusals and timeouts)."""

import copy
import json
import math
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import torch

from turnrl.policies.sampling import SamplingParams
from turnrl.policies.hf.policy import TransformersPolicy
from turnrl.models.causal_lm import load_pretrained
from turnrl.rollout.trajectory import assert_trainable  # noqa: E402
from turnrl.policies.http import (OpenAIPolicy, PolicyRequestError, PolicyUnavailableError, parse_chatml)
from turnrl.policies.server import spawn_policy_server
from turnrl.algorithms import collate, token_logprobs
from turnrl.envs import GuessNumberEnv
from turnrl.rollout import RolloutCollector, Task
from turnrl.train.warm_start import warm_start

from tests.tolerances import logprob_tol_for

NAME = "tiny"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_model, tokenizer, renderer):
    """The tiny model, briefly warm-started so that it ends turns (both "stop" and "length" occur)."""
    model = copy.deepcopy(tiny_model)
    warm_start(model, renderer, GuessNumberEnv(n=32, max_turns=6), steps=8, batch_size=4, lr=3e-3, progress=False)
    path = tmp_path_factory.mktemp("served_policy")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def server(checkpoint):
    with spawn_policy_server(checkpoint, ["--threads", "1", "--served-model-name", NAME]) as srv:
        yield srv


@pytest.fixture(scope="module")
def served_model(checkpoint):
    model, _ = load_pretrained(str(checkpoint))
    return model.eval()


def prompts_of(renderer, seeds):
    env = GuessNumberEnv(n=32, max_turns=6)
    return [renderer.start(list(env.reset(seed=s)[0])).token_ids for s in seeds]


@pytest.mark.slow
@pytest.mark.e2e
def test_collector_episode_over_http_is_token_exact(server, served_model, tokenizer, renderer):
    policy = OpenAIPolicy(server.url, NAME, tokenizer=tokenizer)
    collector = RolloutCollector(lambda: GuessNumberEnv(n=32, max_turns=6), policy, renderer, env_workers=1)
    trajectories = collector.collect([Task(0), Task(1)], group_size=2, params=SamplingParams(max_new_tokens=6))
    assert len(trajectories) == 4 and max(t.num_turns for t in trajectories) >= 2
    assert_trainable(trajectories)
    finishes = set()
    for traj in trajectories:
        # the ids are what the renderer produces from the first observation and the sampled turns
        env = GuessNumberEnv(n=32, max_turns=6)
        obs, _ = env.reset(seed=int(traj.group_id))
        conv = renderer.start(list(obs))
        for k, (start, end) in enumerate(traj.turn_spans):
            ids = traj.token_ids[start:end]
            finishes.add("stop" if ids[-1] == tokenizer.eos_token_id else "length")
            obs, _, terminated, truncated, _ = env.step(renderer.add_sampled(conv, ids, traj.logprobs[start:end]))
            done = terminated or truncated
            renderer.add_observation(conv, [] if done else list(obs), add_generation_prompt=not done)
        assert conv.token_ids == traj.token_ids and conv.loss_mask == traj.loss_mask
        assert tokenizer.decode(traj.token_ids, skip_special_tokens=False) == \
            tokenizer.apply_chat_template(traj.messages, tools=traj.tools or None, tokenize=False)
    assert finishes == {"stop", "length"}
    batch = collate(trajectories, tokenizer.pad_token_id)
    with torch.no_grad():
        learner, _, _ = token_logprobs(served_model, batch.input_ids, batch.attention_mask, temperature=1.0)
    mask = batch.loss_mask.bool()
    assert torch.isfinite(batch.old_logprobs[mask]).all()
    # rounding only (the server's cached decode vs the learner's forward): the model's logprob bound
    tol = logprob_tol_for(served_model, [t.token_ids for t in trajectories])
    assert float((learner - batch.old_logprobs).abs()[mask].max()) <= tol


@pytest.mark.slow
@pytest.mark.e2e
def test_greedy_over_http_equals_in_process_greedy(server, served_model, tokenizer, renderer):
    prompts = prompts_of(renderer, [3, 4, 5])
    prompts[1] = prompts[1][:-9] + prompts[1][-3:]  # a shorter prompt in the same batch
    params = SamplingParams(max_new_tokens=5, greedy=True)
    local = TransformersPolicy(served_model, tokenizer).generate(prompts, params)
    remote = OpenAIPolicy(server.url + "/v1", NAME, tokenizer=tokenizer).generate(prompts, params)
    # rounding only (another process and thread count): the model's logprob bound at its logits' size
    tol = logprob_tol_for(served_model, [p + g.token_ids for p, g in zip(prompts, local)])
    for a, b in zip(remote, local):
        assert (a.token_ids, a.finish_reason, a.exact) == (b.token_ids, b.finish_reason, True)
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= tol


@pytest.mark.slow
@pytest.mark.e2e
def test_text_mode_is_marked_eval_only_and_refused_for_training(server, served_model, tokenizer, renderer):
    prompts = prompts_of(renderer, [6, 7])
    params = SamplingParams(max_new_tokens=5, greedy=True)
    local = TransformersPolicy(served_model, tokenizer).generate(prompts, params)
    policy = OpenAIPolicy(server.url, NAME, mode="text", tokenizer=tokenizer)
    for gen, ref in zip(policy.generate(prompts, params), local):
        assert gen.exact is False and all(math.isnan(lp) for lp in gen.logprobs)
        assert tokenizer.decode(gen.token_ids) == tokenizer.decode(ref.token_ids)
        assert gen.finish_reason == ref.finish_reason
    collector = RolloutCollector(lambda: GuessNumberEnv(n=32, max_turns=6), policy, renderer, env_workers=1)
    trajectories = collector.collect([Task(0)], group_size=1, params=SamplingParams(max_new_tokens=6))
    with pytest.raises(ValueError, match="not token-exact"):
        assert_trainable(trajectories)


def test_parse_chatml_inverts_the_template(tokenizer):
    messages = [{"role": "system", "content": "be brief\nplease"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "16"}, {"role": "tool", "content": "higher"},
                {"role": "tool", "content": "a\nb"}, {"role": "user", "content": "go on"},
                {"role": "assistant", "content": "8"}, {"role": "tool", "content": ""}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert parse_chatml(text) == messages
    with pytest.raises(ValueError, match="not ChatML"):
        parse_chatml("[INST] hello [/INST]")


def test_bad_arguments_are_refused(tokenizer):
    with pytest.raises(ValueError, match="base_url"):
        OpenAIPolicy("localhost:8000", NAME)
    with pytest.raises(ValueError, match="tokenizer"):
        OpenAIPolicy("http://127.0.0.1:1", NAME, mode="text")
    with pytest.raises(ValueError, match="mode"):
        OpenAIPolicy("http://127.0.0.1:1", NAME, mode="chat")
    with pytest.raises(ValueError, match="retries"):
        OpenAIPolicy("http://127.0.0.1:1", NAME, retries=-1)


# ----------------------------------------------------------- a real flaky proxy
class Proxy:
    """A real HTTP server in front of the policy server: answers ``status`` to the first
    ``fail_first`` requests, sleeps ``delay_s`` before forwarding, and records every request."""

    def __init__(self, upstream, fail_first=0, status=503, delay_s=0.0):
        self.upstream, self.fail_first, self.status, self.delay_s = upstream, fail_first, status, delay_s
        self.hits, self.headers = 0, []
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with proxy.lock:
                    proxy.hits += 1
                    hit = proxy.hits
                    proxy.headers.append(dict(self.headers))
                if hit <= proxy.fail_first:
                    status, data = proxy.status, json.dumps({"error": {"message": "busy, try later"}}).encode()
                else:
                    time.sleep(proxy.delay_s)
                    reply = httpx.post(proxy.upstream + self.path, content=body, timeout=30,
                                       headers={"Content-Type": "application/json"})
                    status, data = reply.status_code, reply.content
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (a timeout test)
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def proxy(server):
    made = []

    def make(**kwargs):
        made.append(Proxy(server.url, **kwargs))
        return made[-1]

    yield make
    for p in made:
        p.close()


GREEDY = SamplingParams(max_new_tokens=3, greedy=True)


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("status", [503, 500, 429])
def test_retries_after_server_errors_then_succeeds(proxy, server, tokenizer, renderer, status):
    prompt = prompts_of(renderer, [8])
    flaky = proxy(fail_first=2, status=status)
    got = OpenAIPolicy(flaky.url, NAME, tokenizer=tokenizer, retries=3, backoff_s=0.01).generate(prompt, GREEDY)
    direct = OpenAIPolicy(server.url, NAME, tokenizer=tokenizer).generate(prompt, GREEDY)
    assert flaky.hits == 3
    assert got[0].token_ids == direct[0].token_ids


@pytest.mark.slow
@pytest.mark.e2e
def test_gives_up_after_the_last_retry(proxy, tokenizer, renderer):
    flaky = proxy(fail_first=100, status=503)
    policy = OpenAIPolicy(flaky.url, NAME, tokenizer=tokenizer, retries=2, backoff_s=0.01)
    with pytest.raises(PolicyUnavailableError, match=r"3 tries.*HTTP 503: busy, try later") as info:
        policy.generate(prompts_of(renderer, [8]), GREEDY)
    assert flaky.hits == 3 and info.value.status == 503 and isinstance(info.value, ConnectionError)


@pytest.mark.slow
@pytest.mark.e2e
def test_client_errors_are_not_retried_and_name_url_status_and_message(proxy, tokenizer, renderer):
    relay = proxy()
    policy = OpenAIPolicy(relay.url, "no-such-model", tokenizer=tokenizer, retries=3, backoff_s=0.01)
    with pytest.raises(PolicyRequestError) as info:
        policy.generate(prompts_of(renderer, [8]), GREEDY)
    message = str(info.value)
    assert relay.hits == 1 and info.value.status == 404
    assert f"{relay.url}/v1/completions" in message and "HTTP 404" in message and "'no-such-model'" in message
    too_long = OpenAIPolicy(relay.url, NAME, tokenizer=tokenizer, retries=3, backoff_s=0.01)
    with pytest.raises(PolicyRequestError, match="HTTP 400: .*exceeds the model's context"):
        too_long.generate(prompts_of(renderer, [8]), SamplingParams(max_new_tokens=4000))
    assert relay.hits == 2


@pytest.mark.slow
@pytest.mark.e2e
def test_each_try_is_bounded_by_timeout(proxy, tokenizer, renderer):
    slow = proxy(delay_s=1.5)
    policy = OpenAIPolicy(slow.url, NAME, tokenizer=tokenizer, timeout_s=0.3, retries=1, backoff_s=0.01)
    start = time.monotonic()
    with pytest.raises(PolicyUnavailableError, match="timeout_s=0.3"):
        policy.generate(prompts_of(renderer, [8]), GREEDY)
    assert time.monotonic() - start < 1.4 and slow.hits == 2


def test_connection_refused_is_unavailable(tokenizer, renderer):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    policy = OpenAIPolicy(f"http://127.0.0.1:{port}", NAME, tokenizer=tokenizer, retries=1, backoff_s=0.01)
    with pytest.raises(PolicyUnavailableError, match="2 tries.*ConnectError"):
        policy.generate(prompts_of(renderer, [8]), GREEDY)


@pytest.mark.slow
@pytest.mark.e2e
def test_api_key_comes_from_the_named_environment_variable(proxy, tokenizer, renderer, monkeypatch):
    relay = proxy()
    monkeypatch.setenv("TURNRL_TEST_KEY", "sk-test-123")
    OpenAIPolicy(relay.url, NAME, tokenizer=tokenizer, api_key_env="TURNRL_TEST_KEY").generate(
        prompts_of(renderer, [8]), GREEDY)
    monkeypatch.delenv("TURNRL_TEST_KEY")
    OpenAIPolicy(relay.url, NAME, tokenizer=tokenizer, api_key_env="TURNRL_TEST_KEY").generate(
        prompts_of(renderer, [8]), GREEDY)
    assert relay.headers[0].get("Authorization") == "Bearer sk-test-123"
    assert "Authorization" not in relay.headers[1]


@pytest.mark.slow
@pytest.mark.e2e
def test_sampler_logprobs_follow_the_temperature(server, served_model, tokenizer, renderer):
    """Guards the token-exact test: samples at 0.7 score equal at 0.7 and differ at 1.0."""
    policy = OpenAIPolicy(server.url, NAME, tokenizer=tokenizer)
    collector = RolloutCollector(lambda: GuessNumberEnv(n=32, max_turns=6), policy, renderer, env_workers=1)
    trajectories = collector.collect([Task(2)], group_size=2, params=SamplingParams(max_new_tokens=6, temperature=0.7))
    batch = collate(trajectories, tokenizer.pad_token_id)
    mask = batch.loss_mask.bool()
    with torch.no_grad():
        at_07, _, _ = token_logprobs(served_model, batch.input_ids, batch.attention_mask, temperature=0.7)
        at_10, _, _ = token_logprobs(served_model, batch.input_ids, batch.attention_mask, temperature=1.0)
    # rounding only at the right temperature: the model's logprob bound at its logits' size / 0.7
    tol = logprob_tol_for(served_model, [t.token_ids for t in trajectories], temperature=0.7)
    assert float((at_07 - batch.old_logprobs).abs()[mask].max()) <= tol
    assert float((at_10 - batch.old_logprobs).abs()[mask].max()) > 1e-2


def test_token_request_neutralises_server_sampling_defaults(tokenizer):
    """A vLLM server applies the checkpoint's generation_config (e.g. top_k=20) unless told otherwise."""
    policy = OpenAIPolicy("http://127.0.0.1:1/v1/", NAME, tokenizer=tokenizer)
    body = policy.completion_body([1, 2, 3], SamplingParams(max_new_tokens=7, temperature=0.7))
    assert policy.api_url == "http://127.0.0.1:1/v1"
    assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 7 and body["temperature"] == 0.7
    assert (body["top_p"], body["top_k"], body["min_p"], body["repetition_penalty"]) == (1.0, -1, 0.0, 1.0)
    assert body["stop_token_ids"] == [tokenizer.eos_token_id] and body["ignore_eos"] is True
    assert body["logprobs"] == 1 and body["return_token_ids"] and body["return_tokens_as_token_ids"]
    assert policy.completion_body([1], SamplingParams(greedy=True))["temperature"] == 0.0
