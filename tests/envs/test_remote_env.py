"""Remote envs: ``EnvServer`` over real HTTP and ``RemoteEnv`` making it look local.

Servers run in this process (real sockets and threads) or as ``turnrl serve-env``
subprocesses; nothing is mocked. Token-guarded servers bind every interface (0.0.0.0, not
loopback) and are reached over 127.0.0.1. The collector tests drive the envs with a scripted
bisection policy: a real policy (it reads the conversation and writes token ids of its
guess), not a stand-in for the part under test.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import gymnasium
import httpx
import numpy as np
import pytest

import turnrl.envs  # noqa: F401  (registers the turnrl ids)
from turnrl.policies.sampling import Generation, SamplingParams
from turnrl.rollout.scripted import corpus_texts
from turnrl.train.factories import env_factory
from turnrl.conf.schema import Config
from turnrl.envs import GuessNumberEnv, check
from turnrl.envs.remote import RemoteEnv, RemoteEnvError, RemoteEnvTokenError, from_json
from turnrl.envs.server import MAX_BODY_BYTES, REQUEST_SCHEMAS, EnvServer, to_json
from turnrl.serving import TokenRefusedError
from turnrl.rollout import RolloutCollector, Task
from turnrl.rollout.metrics import rollout_metrics

GUESS, CALC = "turnrl/GuessNumber-v0", "turnrl/CalcMath-v0"
GUESS_KWARGS = {"n": 32, "n_min": 16}
PARAMS = SamplingParams(max_new_tokens=6)
TOKEN = "env-tok-8c1f0e5a9b"


class NonJsonInfoEnv(GuessNumberEnv):
    """GuessNumber whose info carries a set (no JSON form) and whose step raises on 'boom'."""

    def _info(self, **extra):
        return {**super()._info(**extra), "seen": {1, 2}}

    def step(self, action):
        if action == "boom":
            raise ValueError("boom is not a guess")
        return super().step(action)


if "turnrl_tests/NonJsonInfo-v0" not in gymnasium.registry:  # not a turnrl/ id: the checker tests skip it
    gymnasium.register("turnrl_tests/NonJsonInfo-v0", entry_point=NonJsonInfoEnv)


def make_local(env_id, **kwargs):
    return gymnasium.make(env_id, disable_env_checker=True, **kwargs)


@pytest.fixture(scope="module")
def guess_server():
    with EnvServer(GUESS, GUESS_KWARGS, client_kwargs=("n", "n_min")) as server:  # clients may choose the range
        yield server


@pytest.fixture(scope="module")
def calc_server():
    with EnvServer(CALC) as server:
        yield server


def play(env, seed, split, player, rng):
    """The whole transcript of one episode: (reset result, [(action, step result), ...])."""
    base = env.unwrapped
    records = [env.reset(seed=seed, options={"split": split})]
    while True:
        action = {"expert": base.expert_action, "weak": lambda: base.weak_expert_action(rng),
                  "random": lambda: base.random_action(rng)}[player]()
        result = env.step(action)
        records.append((action, result))
        if result[2] or result[3]:
            return records


# ---------------------------------------------------------------- parity
@pytest.mark.parametrize("env_id, kwargs", [(GUESS, GUESS_KWARGS), (CALC, {})])
@pytest.mark.parametrize("player", ["expert", "weak", "random"])
def test_same_seed_gives_the_local_transcript(guess_server, calc_server, env_id, kwargs, player):
    server = guess_server if env_id == GUESS else calc_server
    remote, local = RemoteEnv(server.url, env_id), make_local(env_id, **kwargs)
    try:
        for split in ("train", "test"):
            for seed in range(4):
                rng_r, rng_l = np.random.default_rng(seed), np.random.default_rng(seed)
                got, want = play(remote, seed, split, player, rng_r), play(local, seed, split, player, rng_l)
                assert got == want  # observations, rewards, flags, every info value
                assert rng_r.bit_generator.state == rng_l.bit_generator.state  # same draws
                infos = [got[0][1]] + [result[4] for _, result in got[1:]]
                for info, local_info in zip(infos, [want[0][1]] + [result[4] for _, result in want[1:]]):
                    assert isinstance(info["state_key"], tuple)
                    assert hash(info["state_key"]) == hash(local_info["state_key"])
                assert got[0][1]["split"] == split
    finally:
        remote.close()


def test_weak_player_corpus_matches_local_across_episodes(guess_server):
    """``corpus_texts`` drives one rng through many episodes: the remote corpus is the local one."""
    remote = RemoteEnv(guess_server.url, GUESS)
    try:
        assert corpus_texts(remote, range(6), "weak") == corpus_texts(make_local(GUESS, **GUESS_KWARGS),
                                                                      range(6), "weak")
    finally:
        remote.close()


@pytest.mark.slow
def test_env_checker_passes_through_a_remote_env(calc_server):
    remote = RemoteEnv(calc_server.url, CALC)
    try:
        report = check(remote, seeds=3)
        assert report.ok, report.format()
        assert report.env_id == "RemoteEnv"
    finally:
        remote.close()


def test_json_values_round_trip_tuples_recursively():
    info = {"state_key": (1, (2, 3)), "xs": [np.int64(4)], "f": np.float32(0.5), "none": None}
    back = from_json(to_json(info, "info"))
    assert back == {"state_key": (1, (2, 3)), "xs": (4,), "f": 0.5, "none": None}
    assert type(back["xs"][0]) is int
    with pytest.raises(TypeError, match=r"info\['s'\] is a set"):
        to_json({"s": {1}}, "info")
    with pytest.raises(TypeError, match="JSON keys must be str"):
        to_json({1: 2}, "info")


# ------------------------------------------------------------ the server
def test_info_lists_tools_max_turns_and_request_schemas(calc_server):
    info = httpx.get(f"{calc_server.url}/info").json()
    local = make_local(CALC).unwrapped
    assert info["env_id"] == CALC and info["max_turns"] == local.max_turns == 5
    assert info["tools"] == [t.schema() for t in local.tools]
    assert info["request_schemas"] == REQUEST_SCHEMAS
    remote = RemoteEnv(calc_server.url)
    try:
        assert remote.env_id == CALC and remote.max_turns == 5
        assert [t.schema() for t in remote.tools] == info["tools"]
        with pytest.raises(RuntimeError, match="runs on the env server"):
            remote.tools[0](expression="1 + 1")
        _, reset_info = remote.reset(seed=0)  # the episode's tools, as sent: lists, like the local info
        assert reset_info["tools"] == local.reset(seed=0)[1]["tools"] == info["tools"]
        assert isinstance(reset_info["tools"], list) and isinstance(
            reset_info["tools"][0]["function"]["parameters"]["required"], list)
    finally:
        remote.close()


def test_session_kwargs_override_the_servers(guess_server):
    remote = RemoteEnv(guess_server.url, GUESS, n=8, n_min=None, max_turns=3)  # None: JSON null
    try:
        assert remote.max_turns == 3
        obs, info = remote.reset(seed=0)
        assert "between 1 and 8." in obs[-1]["content"]
        assert obs == make_local(GUESS, n=8, max_turns=3).reset(seed=0)[0]
    finally:
        remote.close()
    bad = RemoteEnv(guess_server.url, GUESS, n=2)
    with pytest.raises(ValueError, match=r"n must be an int >= 4") as err:
        bad.reset(seed=0)
    assert isinstance(err.value, RemoteEnvError) and err.value.status == 400


def test_wrong_env_id_and_bad_url_fail_clearly(guess_server):
    with pytest.raises(ValueError, match=r"serves 'turnrl/GuessNumber-v0', not env_id='turnrl/CalcMath-v0'"):
        RemoteEnv(guess_server.url, CALC)
    with pytest.raises(ValueError, match="http"):
        RemoteEnv("127.0.0.1:8000")


@pytest.mark.parametrize("path, body, status, message", [
    ("/sessions/{sid}/step", {}, 400, "'action': Field required"),
    ("/sessions/{sid}/step", {"action": 7}, 400, "'action': Input should be a valid string (got 7)"),
    ("/sessions/{sid}/step", {"action": "1", "extra": 1}, 400, "'extra': Extra inputs are not permitted"),
    ("/sessions/{sid}/reset", {"seed": "one"}, 400, "'seed': Input should be a valid integer"),
    ("/sessions/{sid}/reset", {"seed": -1}, 400, "'seed': Input should be greater than or equal to 0"),
    ("/sessions/{sid}/reset", [1, 2], 400, "the body must be a JSON object, got array"),
    ("/sessions/{sid}/player", {"player": "genius"}, 400, "'player': Input should be 'expert', 'weak' or 'random'"),
    ("/sessions/{sid}/player", {"player": "weak"}, 400, "exactly one of 'rng_seed'"),
    ("/sessions/{sid}/player", {"player": "expert", "rng_seed": 1}, 400, "takes no randomness"),
    ("/sessions/{sid}/player", {"player": "weak", "rng_state": {"bit_generator": "Evil"}}, 400,
     "must be one of ['PCG64'"),
    ("/sessions/{sid}/player", {"player": "weak", "rng_state": {"bit_generator": "PCG64"}}, 400,
     "not a valid PCG64 state"),
    ("/sessions", {"kwargs": 3}, 400, "'kwargs': Input should be a valid dictionary"),
    ("/sessions/nope/reset", {}, 404, "expired after 600 s idle"),
    ("/sessions/{sid}/dance", {}, 404, "the endpoints are"),
    ("/info", {}, 405, "use GET"),
])
def test_bad_requests_get_a_status_and_a_message(guess_server, path, body, status, message):
    with httpx.Client(base_url=guess_server.url) as client:
        sid = client.post("/sessions").json()["session_id"]
        reply = client.post(path.format(sid=sid), json=body)
        assert reply.status_code == status
        assert message in reply.json()["error"]["message"]
        client.delete(f"/sessions/{sid}")


def test_invalid_json_body_is_400(guess_server):
    reply = httpx.post(f"{guess_server.url}/sessions", content=b"{not json")
    assert reply.status_code == 400 and "is not JSON" in reply.json()["error"]["message"]
    big = httpx.post(f"{guess_server.url}/sessions", content=b" " * (MAX_BODY_BYTES + 1))
    assert big.status_code == 413 and f"at most {MAX_BODY_BYTES}" in big.json()["error"]["message"]


def test_env_exceptions_are_500_and_the_server_keeps_serving():
    with EnvServer("turnrl_tests/NonJsonInfo-v0") as server, httpx.Client(base_url=server.url) as client:
        sid = client.post("/sessions").json()["session_id"]
        early = client.post(f"/sessions/{sid}/step", json={"action": "3"})  # before reset: the request's fault
        assert early.status_code == 409 and early.json()["error"]["type"] == "ResetNeeded"
        assert "reset first" in early.json()["error"]["message"]
        unjson = client.post(f"/sessions/{sid}/reset", json={"seed": 0})
        assert unjson.status_code == 500 and "info['seen'] is a set" in unjson.json()["error"]["message"]
        boom = client.post(f"/sessions/{sid}/step", json={"action": "boom"})
        assert boom.status_code == 500 and boom.json() == {"error": {
            "message": "the env raised ValueError during step: boom is not a guess", "type": "ValueError",
            "code": 500, "param": None, "detail": "boom is not a guess"}}
        assert client.get("/info").status_code == 200
        remote = RemoteEnv(server.url)
        with pytest.raises(TypeError, match=r"info\['seen'\] is a set") as err:
            remote.reset(seed=0)  # the server's env did reset; only its reply failed
        assert isinstance(err.value, RemoteEnvError) and err.value.status == 500
        with pytest.raises(ValueError, match="boom is not a guess") as err:
            remote.step("boom")
        assert isinstance(err.value, RemoteEnvError) and err.value.remote_type == "ValueError"
        remote.close()


def test_step_after_episode_end_raises_like_the_local_env(guess_server):
    remote = RemoteEnv(guess_server.url, GUESS)
    try:
        remote.reset(seed=0)
        while not any(remote.step(remote.expert_action())[2:4]):
            pass
        with pytest.raises(RuntimeError, match="after the episode ended") as err:
            remote.step("1")
        assert err.value.remote_type == "RuntimeError"
        with pytest.raises(TypeError, match="action must be the assistant turn as str"):
            remote.step(3)
    finally:
        remote.close()


def test_rng_seed_mode_continues_one_generator_per_session(guess_server):
    """``rng_seed``: calls with one seed continue ``default_rng(seed)``; a new seed restarts it."""
    local = make_local(GUESS, **GUESS_KWARGS).unwrapped
    with httpx.Client(base_url=guess_server.url) as client:
        sid = client.post("/sessions").json()["session_id"]
        client.post(f"/sessions/{sid}/reset", json={"seed": 3})
        local.reset(seed=3)

        def remote_calls(seed, k):
            return [client.post(f"/sessions/{sid}/player", json={"player": "random", "rng_seed": seed}).json()["action"]
                    for _ in range(k)]

        first = remote_calls(7, 5)
        rng = np.random.default_rng(7)
        assert first == [local.random_action(rng) for _ in range(5)]
        assert len(set(first)) > 1
        assert remote_calls(8, 1) == [local.random_action(np.random.default_rng(8))]
        assert remote_calls(7, 2) == first[:2]  # a changed seed restarted the generator
        client.delete(f"/sessions/{sid}")


def test_max_sessions_gives_503_until_one_is_deleted():
    with EnvServer(GUESS, max_sessions=2) as server, httpx.Client(base_url=server.url) as client:
        ids = [client.post("/sessions").json()["session_id"] for _ in range(2)]
        full = client.post("/sessions")
        assert full.status_code == 503 and "max_sessions=2" in full.json()["error"]["message"]
        assert client.delete(f"/sessions/{ids[0]}").json() == {"deleted": ids[0]}
        assert client.delete(f"/sessions/{ids[0]}").status_code == 404
        assert client.post("/sessions").status_code == 200
        assert server.num_sessions == 2


@pytest.mark.slow
def test_idle_sessions_are_reaped_after_the_ttl_and_reset_reopens_one():
    with EnvServer(GUESS, session_ttl_s=0.3) as server:
        remote = RemoteEnv(server.url, GUESS)
        remote.reset(seed=1)
        first = remote.session_id
        time.sleep(0.9)
        assert server.num_sessions == 0
        with pytest.raises(RemoteEnvError, match=r"expired after 0.3 s idle") as err:
            remote.step("5")
        assert err.value.status == 404
        obs, info = remote.reset(seed=1)  # a new session, the same task
        assert remote.session_id != first
        assert (obs, info) == make_local(GUESS).reset(seed=1)
        remote.close()
        assert server.num_sessions == 0


# --------------------------------------------------------------- failures
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connection_failures_are_retried_then_raise_naming_the_url():
    url = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(RemoteEnvError, match=rf"GET {url}/info \(fetching the env's info\) failed after 3 attempt"):
        RemoteEnv(url, retries=2, backoff_s=0.1)
    assert time.monotonic() - start >= 0.3  # slept 0.1 + 0.2 between the attempts


@pytest.mark.slow
def test_a_server_that_comes_up_late_is_reached_by_the_retries():
    port = free_port()
    server = EnvServer(GUESS, port=port)
    timer = threading.Timer(0.4, server.start)
    timer.start()
    try:
        remote = RemoteEnv(f"http://127.0.0.1:{port}", GUESS, retries=6, backoff_s=0.1)
        assert remote.reset(seed=0) == make_local(GUESS).reset(seed=0)
        remote.close()
    finally:
        timer.join()
        server.stop()


def test_step_is_not_retried_when_the_server_dies():
    server = EnvServer(GUESS).start()
    remote = RemoteEnv(server.url, GUESS, retries=3, backoff_s=0.01)
    remote.reset(seed=0)
    server.stop()
    with pytest.raises(RemoteEnvError, match=r"failed after 1 attempt\(s\).*step is not retried") as err:
        remote.step("16")
    assert server.url in str(err.value) and err.value.status is None
    remote.close()  # deleting the session fails quietly


# ------------------------------------------------------ collector + servers
class BisectPolicy:
    """A scripted policy with ``TransformersPolicy``'s ``generate`` interface: it reads the last
    ``between LO and HI`` of each decoded conversation and answers the midpoint's token ids."""

    def __init__(self, tokenizer, before_call=None):
        self.tokenizer, self.before_call, self.calls = tokenizer, before_call, 0

    def generate(self, prompts, params):
        self.calls += 1
        if self.before_call is not None:
            self.before_call(self.calls)
        generations = []
        for ids in prompts:
            lo, hi = map(int, re.findall(r"between (\d+) and (\d+)", self.tokenizer.decode(ids))[-1])
            out = self.tokenizer(str((lo + hi) // 2), add_special_tokens=False)["input_ids"]
            out.append(self.tokenizer.eos_token_id)
            generations.append(Generation(out, [0.0] * len(out), "stop"))
        return generations


def serve_subprocess(env_id, *kwargs, args=(), env=None):
    """Start ``turnrl serve-env`` (more ``args``, ``env`` added to the environment) and return
    ``(process, url)`` once it prints its line; the URL reaches it over loopback."""
    command = [sys.executable, "-m", "turnrl", "serve-env", env_id, *[f"--kwarg={k}" for k in kwargs], *args]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    line = proc.stdout.readline()
    match = re.fullmatch(rf"serving {re.escape(env_id)} at http://(127\.0\.0\.1|0\.0\.0\.0)(:\d+)\n", line)
    if match is None:
        proc.kill()
        raise AssertionError(f"serve-env printed {line!r}; stderr: {proc.stderr.read()}")
    return proc, f"http://127.0.0.1{match.group(2)}"


@pytest.fixture
def two_servers():
    procs = [serve_subprocess(GUESS, "n=32") for _ in range(2)]
    yield procs
    for proc, _ in procs:
        proc.kill()
        proc.wait(timeout=10)


def slow_seeds(k):
    """Seeds whose bisection takes at least 3 turns (still running when the server is killed)."""
    env, seeds = GuessNumberEnv(n=32), []
    for seed in range(100):
        records = play(env, seed, "train", "expert", None)
        if len(records) - 1 >= 3:
            seeds.append(seed)
    return seeds[:k]


@pytest.mark.slow
@pytest.mark.e2e
def test_killed_server_ends_only_its_episodes_with_env_error(two_servers, tokenizer, renderer):
    (proc_a, url_a), (proc_b, url_b) = two_servers
    urls = iter([url_a, url_b] * 2)  # pooled envs 0, 2 on server A; 1, 3 on server B

    def kill_a(call):
        if call == 2:  # after every episode's first step
            proc_a.kill()
            proc_a.wait(timeout=10)

    collector = RolloutCollector(lambda: RemoteEnv(next(urls), GUESS, retries=1, backoff_s=0.01),
                                 BisectPolicy(tokenizer, before_call=kill_a), renderer)
    trajectories = collector.collect([Task(s) for s in slow_seeds(2)], 2, PARAMS)
    on_a, on_b = trajectories[0::2], trajectories[1::2]
    for t in on_a:
        assert t.termination == "env_error" and not t.success
        assert "RemoteEnvError" in t.error and url_a in t.error and "not retried" in t.error
        assert t.num_turns == 2 and t.turn_rewards == [0.0, 0.0]
    for t in on_b:
        assert t.termination == "terminated" and t.success and t.error is None
        assert t.turn_rewards[-1] == 1.0 and t.num_turns >= 3
    assert rollout_metrics(trajectories)["env_error_rate"] == 0.5


@pytest.mark.slow
@pytest.mark.e2e
def test_env_factory_with_url_collects_the_local_trajectories(tokenizer, renderer):
    proc, url = serve_subprocess(GUESS, "n=32", "n_min=16", args=["--client-kwarg", "n"])
    try:
        cfg = Config()
        cfg.env.url, cfg.env.id = url, GUESS
        remote_fn = env_factory(cfg)
        cfg_local = Config()
        cfg_local.env.id, cfg_local.env.kwargs = GUESS, dict(GUESS_KWARGS)
        local_fn = env_factory(cfg_local)
        tasks = [Task(0), Task(1, "test"), Task(2)]
        got = RolloutCollector(remote_fn, BisectPolicy(tokenizer), renderer).collect(tasks, 2, PARAMS)
        want = RolloutCollector(local_fn, BisectPolicy(tokenizer), renderer).collect(tasks, 2, PARAMS)
        assert [t.token_ids for t in got] == [t.token_ids for t in want]
        assert [(t.task_id, t.state_keys, t.turn_rewards, t.termination) for t in got] == [
            (t.task_id, t.state_keys, t.turn_rewards, t.termination) for t in want]
        assert all(t.success for t in got)
        cfg.env.kwargs = {"n": 2}
        with pytest.raises(ValueError, match="n must be an int >= 4"):
            env_factory(cfg)
        cfg.env.kwargs, cfg.env.id = {}, CALC
        with pytest.raises(ValueError, match="not env_id='turnrl/CalcMath-v0'"):
            env_factory(cfg)
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.mark.slow
@pytest.mark.e2e
def test_train_runs_through_env_remote_with_a_token_no_file_keeps(tmp_path):
    """A token-guarded server on every interface, trained against with ``env.token_env`` naming
    the client's variable: the run works, and neither the server's output nor any file of the
    run dir (the saved Hydra config included) holds the token."""
    server_env = {"TURNRL_TEST_SERVE_TOKEN": TOKEN}
    proc, url = serve_subprocess(GUESS, "n=16", args=["--host", "0.0.0.0", "--token-env", "TURNRL_TEST_SERVE_TOKEN"],
                                 env=server_env)
    client_env = {k: v for k, v in os.environ.items() if k != "TURNRL_SERVER_TOKEN"}
    try:
        run = subprocess.run(
            [sys.executable, "-m", "turnrl.train", "env=remote", f"env.url={url}", f"env.id={GUESS}",
             "env.token_env=TURNRL_TEST_CLIENT_TOKEN",
             "trainer.steps=2", "trainer.tasks_per_step=2", "trainer.group_size=2", "trainer.eval_episodes=4",
             "trainer.eval_every=1", "trainer.threads=1", "trainer.progress=false", "trainer.tensorboard=false",
             "trainer.save_checkpoint=false", "agent.warmstart.steps=0", "agent.tokenizer.corpus_episodes=10",
             "agent.max_new_tokens=6", f"hydra.run.dir={tmp_path}"],
            capture_output=True, text=True, timeout=120, env={**client_env, "TURNRL_TEST_CLIENT_TOKEN": TOKEN})
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
        assert (tmp_path / "metrics.jsonl").read_text().count('"kind": "train"') == 2
        summary = (tmp_path / "summary.txt").read_text()
        assert "held-out success: before " in summary
        assert "token_env: TURNRL_TEST_CLIENT_TOKEN" in (tmp_path / ".hydra" / "config.yaml").read_text()
        files = [f for f in tmp_path.rglob("*") if f.is_file()]
        assert len(files) >= 4 and not [f for f in files if TOKEN.encode() in f.read_bytes()]
        assert TOKEN not in run.stdout + run.stderr
    finally:
        proc.kill()
        out, err = proc.communicate(timeout=10)
    assert TOKEN not in out + err


# ------------------------------------------------------------------ tokens
@pytest.fixture
def token_server():
    """A GuessNumber server on every interface (not loopback), guarded by ``TOKEN``."""
    with EnvServer(GUESS, GUESS_KWARGS, host="0.0.0.0", token=TOKEN) as server:
        yield server, f"http://127.0.0.1:{server.port}"


def test_env_server_without_the_token_answers_401_and_with_it_runs_an_episode(token_server, monkeypatch):
    server, url = token_server
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        for method, path in (("GET", "/info"), ("POST", "/sessions"), ("POST", "/sessions/abc/reset"),
                             ("DELETE", "/sessions/abc"), ("GET", "/nowhere")):
            reply = httpx.request(method, url + path, headers=headers)
            assert reply.status_code == 401 and reply.headers["WWW-Authenticate"] == "Bearer", (method, path)
            assert "missing or wrong token" in reply.json()["error"]["message"]
    assert server.num_sessions == 0  # nothing was opened for the refused requests
    monkeypatch.setenv("TURNRL_TEST_ENV_TOKEN", TOKEN)
    remote = RemoteEnv(url, GUESS, token_env="TURNRL_TEST_ENV_TOKEN")
    try:
        rng_r, rng_l = np.random.default_rng(0), np.random.default_rng(0)
        local = make_local(GUESS, **GUESS_KWARGS)
        assert play(remote, 3, "test", "weak", rng_r) == play(local, 3, "test", "weak", rng_l)
        assert server.num_sessions == 1
    finally:
        remote.close()
    assert server.num_sessions == 0  # the delete went through with the token too


def test_remote_env_with_a_missing_or_wrong_token_fails_at_construction(token_server, monkeypatch):
    _, url = token_server
    monkeypatch.delenv("TURNRL_TEST_ENV_TOKEN", raising=False)
    with pytest.raises(RemoteEnvTokenError, match=rf"GET {url}/info .*HTTP 401: the server at {url} refused the "
                                                  r"token: set TURNRL_TEST_ENV_TOKEN to its token \(TURNRL_TEST_ENV_"
                                                  r"TOKEN was unset or empty, so no token was sent\)") as err:
        RemoteEnv(url, GUESS, token_env="TURNRL_TEST_ENV_TOKEN", retries=3)
    assert err.value.status == 401 and isinstance(err.value, TokenRefusedError)
    monkeypatch.setenv("TURNRL_TEST_ENV_TOKEN", "not-the-token")
    with pytest.raises(RemoteEnvTokenError, match=r"refused the token: set TURNRL_TEST_ENV_TOKEN to its token$") as err:
        RemoteEnv(url, GUESS, token_env="TURNRL_TEST_ENV_TOKEN")
    assert "not-the-token" not in str(err.value)
    monkeypatch.setenv("TURNRL_TEST_ENV_TOKEN", "two words")
    with pytest.raises(ValueError, match="TURNRL_TEST_ENV_TOKEN holds whitespace"):
        RemoteEnv(url, GUESS, token_env="TURNRL_TEST_ENV_TOKEN")


def test_env_server_on_a_non_loopback_address_needs_a_token():
    with pytest.raises(ValueError, match=r"refusing to serve on '0\.0\.0\.0' without a token.*TURNRL_SERVER_TOKEN"):
        EnvServer(GUESS, host="0.0.0.0")
    with EnvServer(GUESS, host="127.0.0.1") as server:  # loopback: a token is optional
        assert RemoteEnv(server.url, GUESS, token_env=None).reset(seed=0) == make_local(GUESS).reset(seed=0)


def test_a_token_refused_mid_run_stops_the_collector_instead_of_failing_every_episode(tokenizer, renderer,
                                                                                      monkeypatch):
    """The server restarts with another token (same port): the next step, and then every reset,
    is refused. The collector raises that, instead of ending each episode with ``env_error``."""
    monkeypatch.setenv("TURNRL_TEST_ENV_TOKEN", TOKEN)
    servers = [EnvServer(GUESS, {"n": 32}, host="0.0.0.0", token=TOKEN).start()]
    url = f"http://127.0.0.1:{servers[0].port}"

    def rotate(call):
        if call == 2:  # after the first step of every episode
            servers[0].stop()
            servers.append(EnvServer(GUESS, {"n": 32}, host="0.0.0.0", port=servers[0].port, token="rotated").start())

    try:
        collector = RolloutCollector(lambda: RemoteEnv(url, GUESS, token_env="TURNRL_TEST_ENV_TOKEN"),
                                     BisectPolicy(tokenizer, before_call=rotate), renderer, env_workers=2)
        with pytest.raises(RemoteEnvTokenError, match=r"\(step\): HTTP 401: .*set TURNRL_TEST_ENV_TOKEN to its token"):
            collector.collect([Task(s) for s in slow_seeds(2)], 1, PARAMS)
        with pytest.raises(RemoteEnvTokenError, match=r"\(reset\): HTTP 401: .*set TURNRL_TEST_ENV_TOKEN"):
            collector.collect([Task(0)], 1, PARAMS)
    finally:
        for server in servers:
            server.stop()


@pytest.mark.slow
@pytest.mark.e2e
def test_serve_env_cli_needs_a_token_off_loopback_and_never_prints_it():
    env = {k: v for k, v in os.environ.items() if k != "TURNRL_SERVER_TOKEN"}
    command = [sys.executable, "-m", "turnrl", "serve-env", GUESS, "--host", "0.0.0.0"]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode == 2 and refused.stdout == ""
    assert "refusing to serve on '0.0.0.0' without a token" in refused.stderr
    assert "export TURNRL_SERVER_TOKEN=" in refused.stderr
    unset = subprocess.run([*command, "--token-env", "TURNRL_TEST_UNSET_TOKEN"], capture_output=True, text=True,
                           timeout=60, env=env)
    assert unset.returncode == 2 and "TURNRL_TEST_UNSET_TOKEN (named by --token-env) is unset or empty" in unset.stderr
    proc, url = serve_subprocess(GUESS, args=["--host", "0.0.0.0"], env={"TURNRL_SERVER_TOKEN": TOKEN})
    try:  # the default variable, TURNRL_SERVER_TOKEN, holds the token
        assert httpx.get(url + "/info").status_code == 401
        assert httpx.get(url + "/info", headers={"Authorization": f"Bearer {TOKEN}"}).json()["env_id"] == GUESS
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and TOKEN not in out + err
