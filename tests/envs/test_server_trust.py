"""A hostile client against a real ``EnvServer`` over real HTTP: what a client may choose, what
it can reach, what its requests can break, and the sandboxes its sessions hold.

Every server here is a real ``EnvServer`` in this process, reached over loopback with httpx or
with raw sockets (for requests no well-behaved client library would send). The sandbox tests run
model code in the real bubblewrap sandbox of ``turnrl/PythonCoding-v0`` and count the sandbox
processes under this process in ``/proc``. Nothing is mocked. Under CI (``CI=true``) a missing
bubblewrap fails the sandbox tests instead of skipping them.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gymnasium
import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import turnrl.envs  # noqa: F401  (registers the turnrl ids)
from turnrl.cli import main as cli_main
from turnrl.envs import GuessNumberEnv
from turnrl.envs.server import MAX_BODY_BYTES, MAX_KWARG_CHARS, EnvServer, execution_setting
from turnrl.tools.executors import SandboxUnavailable, get_executor
from turnrl.tools.serve import ToolServer
from turnrl.tools.calculator import calculator

from tests.helpers import BWRAP_INSTALL, descendants, missing_tool, read_reply

pytestmark = pytest.mark.slow  # every test starts a server

GUESS, CALC, PYCODE = "turnrl/GuessNumber-v0", "turnrl/CalcMath-v0", "turnrl/PythonCoding-v0"
TOKEN = "trust-tok-5e1d9c0b7a"
SECRET = "server-secret-0f3e2d1c"


def hermes_call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


class RangeGuess(GuessNumberEnv):
    """GuessNumber whose class lets clients choose the range."""

    client_kwargs = ("n", "n_min")


class LeakyGuess(GuessNumberEnv):
    """An env class that declares a kwarg no client may ever choose."""

    client_kwargs = ("n", "executor_options")


for _id, _cls in (("turnrl_tests/RangeGuess-v0", RangeGuess), ("turnrl_tests/LeakyGuess-v0", LeakyGuess)):
    if _id not in gymnasium.registry:  # not turnrl/ ids: the registered-env checks skip them
        gymnasium.register(_id, entry_point=_cls)


# ------------------------------------------------------------------ raw HTTP
def raw(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    """The bytes of one request; a Content-Length is added for a body unless ``headers`` frame it."""
    headers = {"Host": "test", **(headers or {})}
    if body and not {"content-length", "transfer-encoding"} & {k.lower() for k in headers}:
        headers["Content-Length"] = str(len(body))
    head = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def connect(url: str, timeout: float = 10.0) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout)


def exchange(url: str, data: bytes, head_only: bool = False) -> tuple[int | None, dict[str, str], bytes]:
    """Send ``data`` on a new connection and read the reply."""
    with connect(url) as sock:
        sock.sendall(data)
        return read_reply(sock, head_only)


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server ends ``sock`` within ``seconds`` (any reply it sends first is read)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
        return True
    except (socket.timeout, TimeoutError):
        return False
    except OSError:  # reset by the server
        return True


def healthy(url: str) -> bool:
    return httpx.get(f"{url}/health", timeout=10).json() == {"status": "ok"}


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def guess():
    with EnvServer(GUESS, {"n": 32}, read_timeout_s=3.0, max_sessions=4096) as server:
        yield server


@pytest.fixture(scope="module")
def calc():
    with EnvServer(CALC) as server:
        yield server


class _Bait(BaseHTTPRequestHandler):
    """A tool server at an address a client picked: records every request and answers like one."""

    seen: list[dict[str, str]]

    def do_POST(self):  # noqa: N802
        self.server.seen.append(dict(self.headers))  # type: ignore[attr-defined]
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"content": "reply of the client's server", "error": None}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def bait():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Bait)
    server.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


# ================================================= what a client may choose
def test_a_client_cannot_point_the_servers_tools_and_token_at_its_own_url(calc, bait, monkeypatch):
    """The review's first finding: a client's ``executors`` / ``executor_options`` made the
    server send ``Authorization: Bearer $TURNRL_SERVER_TOKEN`` to the client's URL and reflect
    the reply into the observation."""
    monkeypatch.setenv("TURNRL_SERVER_TOKEN", SECRET)
    url = f"http://127.0.0.1:{bait.server_port}"
    attack = {"executors": {"calculator": "remote"},
              "executor_options": {"remote": {"url": url, "token_env": "TURNRL_SERVER_TOKEN", "retries": 0}}}
    with httpx.Client(base_url=calc.url) as client:
        reply = client.post("/sessions", json={"kwargs": attack})
        assert reply.status_code == 403
        error = reply.json()["error"]["message"]
        assert "['executor_options', 'executors']" in error and "only the server's operator sets them" in error
        assert "a client may pass only ['max_turns', 'tool_parser']" in error.lower()
        assert f"serve-env {CALC} --client-kwarg NAME" in error
        assert calc.num_sessions == 0
        sid = client.post("/sessions").json()["session_id"]  # the server's own executors still serve
        client.post(f"/sessions/{sid}/reset", json={"seed": 0})
        step = client.post(f"/sessions/{sid}/step", json={"action": hermes_call("calculator", expression="6*7")})
        assert step.json()["observation"][0] == {"role": "tool", "content": "42"}
        client.delete(f"/sessions/{sid}")
    assert bait.seen == []  # nothing ever reached the client's URL, with or without the token


@pytest.mark.parametrize("kwargs", [
    {"executors": {"calculator": "inprocess"}},
    {"executor_options": {"inprocess": {"max_concurrency": 64}}},
    {"executor_options": None},
    {"run_as": None}, {"bwrap": "/bin/sh"}, {"limits": {"cpu_s": 60}}, {"cpu_limit_s": 60},
    {"token_env": "TURNRL_SERVER_TOKEN"}, {"url": "http://10.0.0.1"}, {"tool_url": "http://x"},
    {"envs": ["turnrl/GuessNumber-v0"]}, {"env_kwargs": {}}, {"work_dir": "/"}, {"data_path": "/etc"},
    {"__class__": 1}, {"disable_env_checker": True}, {"max_episode_steps": 1},
    {"max_turns": 3, "executors": {}},  # one refused name refuses the whole request
])
def test_execution_settings_from_a_client_are_refused_with_403(calc, kwargs):
    reply = httpx.post(f"{calc.url}/sessions", json={"kwargs": kwargs})
    assert reply.status_code == 403, reply.text
    error = reply.json()["error"]["message"]
    assert "does not let clients choose the kwargs" in error and "--client-kwarg" in error
    assert calc.num_sessions == 0


def test_task_kwargs_need_the_operators_leave(guess):
    refused = httpx.post(f"{guess.url}/sessions", json={"kwargs": {"n": 8}})
    assert refused.status_code == 403
    error = refused.json()["error"]["message"]
    assert "the kwargs ['n']" in error and "only ['max_turns', 'tool_parser']" in error
    assert f"serve-env {GUESS} --client-kwarg NAME" in error
    assert "only the server's operator sets them" not in error  # n is a task kwarg, merely not allowed here
    assert httpx.get(f"{guess.url}/info").json()["client_kwargs"] == ["max_turns", "tool_parser"]
    with EnvServer(GUESS, {"n": 32}, client_kwargs=["n"]) as server, httpx.Client(base_url=server.url) as client:
        sid = client.post("/sessions", json={"kwargs": {"n": 8, "max_turns": 3}}).json()["session_id"]
        obs = client.post(f"/sessions/{sid}/reset", json={"seed": 0}).json()["observation"]
        assert "between 1 and 8." in obs[-1]["content"]
        assert client.get("/info").json()["client_kwargs"] == ["max_turns", "n", "tool_parser"]


def test_an_env_class_declares_the_kwargs_its_clients_may_choose():
    with EnvServer("turnrl_tests/RangeGuess-v0") as server, httpx.Client(base_url=server.url) as client:
        assert client.get("/info").json()["client_kwargs"] == ["max_turns", "n", "n_min", "tool_parser"]
        reply = client.post("/sessions", json={"kwargs": {"n": 12, "n_min": 12, "tool_parser": "xml"}})
        assert reply.status_code == 200 and reply.json()["kwargs"] == {"n": 12, "n_min": 12, "tool_parser": "xml"}
    with pytest.raises(ValueError, match=r"LeakyGuess.client_kwargs names 'executor_options', which clients may "
                                         r"never choose.*serve-env turnrl_tests/LeakyGuess-v0 --kwarg "
                                         r"executor_options=VALUE"):
        EnvServer("turnrl_tests/LeakyGuess-v0")


@pytest.mark.parametrize("name", ["executors", "executor_options", "token_env", "api_token", "tool_url",
                                  "bwrap", "run_as", "cpu_limit", "limits", "timeout_s", "memory_mb", "work_dir",
                                  "cache_path", "min_path", "envs", "envKwargs", "secret", "pool_size", "_private",
                                  "max_episode_steps"])
def test_the_operator_cannot_let_clients_choose_execution_settings(name):
    assert execution_setting(name)
    with pytest.raises(ValueError, match=rf"names '{name}', which clients may never choose.*how or where code "
                                         rf"runs.*--kwarg {name}=VALUE"):
        EnvServer(CALC, client_kwargs=[name])


@pytest.mark.parametrize("name", ["n", "n_min", "max_turns", "tool_parser", "split", "difficulty", "show_middle",
                                  "num_ops", "max_operand", "vocab_size", "min_expert_steps", "receptacles"])
def test_task_kwarg_names_are_not_execution_settings(name):
    assert not execution_setting(name)


def test_the_operator_can_only_allow_kwargs_the_env_takes():
    with pytest.raises(ValueError, match=r"names 'difficulty', which the constructor of turnrl/GuessNumber-v0 does "
                                         r"not take; its kwargs: \['max_turns', 'n', 'n_min', 'show_middle', "
                                         r"'tool_parser'\]"):
        EnvServer(GUESS, client_kwargs=["difficulty"])
    with pytest.raises(ValueError, match="'1n', which is no kwarg name"):
        EnvServer(GUESS, client_kwargs=["1n"])
    with pytest.raises(ValueError, match="must be a list of names"):
        EnvServer(GUESS, client_kwargs="n")


@pytest.mark.e2e
def test_serve_env_refuses_to_start_when_told_to_let_clients_choose_execution(capsys):
    assert cli_main(["serve-env", CALC, "--client-kwarg", "executor_options"]) == 2
    err = capsys.readouterr().err
    assert "turnrl serve-env: error: client_kwargs (serve-env --client-kwarg) names 'executor_options'" in err
    assert "clients may never choose" in err and f"serve-env {CALC} --kwarg executor_options=VALUE" in err


@pytest.mark.parametrize("value, problem", [
    ("x" * (MAX_KWARG_CHARS + 1), f"a string of {MAX_KWARG_CHARS + 1} characters"),
    ({"nested": "object"}, "a JSON object"),
    ([{"a": 1}], "a list holding a JSON object"),
    ([[1]], "a list holding a JSON list"),
    (list(range(1000)), "a list of 1000 items"),
    (2**70, "an integer beyond 64 bits"),
])
def test_kwarg_values_must_be_short_plain_json(guess, value, problem):
    reply = httpx.post(f"{guess.url}/sessions", json={"kwargs": {"tool_parser": value}})
    assert reply.status_code == 400
    assert f"kwargs['tool_parser'] is {problem}; send a JSON string (at most {MAX_KWARG_CHARS} characters)" in (
        reply.json()["error"]["message"])


def test_non_finite_numbers_and_values_the_env_rejects_are_400(guess):
    nan = httpx.post(f"{guess.url}/sessions", content=b'{"kwargs": {"max_turns": NaN}}')
    assert nan.status_code == 400 and "nan (not a finite number)" in nan.json()["error"]["message"]
    for kwargs, env_type, words in [({"max_turns": 0}, "ValueError", "max_turns must be a positive int"),
                                    ({"tool_parser": "nope"}, "KeyError", "unknown tool parser 'nope'")]:
        reply = httpx.post(f"{guess.url}/sessions", json={"kwargs": kwargs})
        assert reply.status_code == 400 and reply.json()["error"]["type"] == env_type
        assert "the env refused the kwargs" in reply.json()["error"]["message"] and words in reply.json()["error"]["message"]


def test_replies_never_show_the_servers_execution_settings():
    options = {"inprocess": {"max_concurrency": 3}}
    with EnvServer(CALC, {"executor_options": options, "max_operand": 9}) as server:
        assert httpx.get(f"{server.url}/info").json()["kwargs"] == {"max_operand": 9}
        assert httpx.post(f"{server.url}/sessions").json()["kwargs"] == {"max_operand": 9}


# ================================================================ sessions
def test_guessed_or_crafted_session_ids_reach_nothing(guess):
    with httpx.Client(base_url=guess.url) as client:
        sid = client.post("/sessions").json()["session_id"]
        client.post(f"/sessions/{sid}/reset", json={"seed": 1})
        guesses = [secrets.token_hex(12) for _ in range(20)] + [sid[:-1] + ("0" if sid[-1] != "0" else "1"),
                                                                sid.upper(), sid + "0", sid[:12]]
        for other in guesses:
            assert client.delete(f"/sessions/{other}").status_code == 404
        for path in ["/sessions/../info", f"/sessions/{sid}/../../info", "/sessions/%2e%2e/reset",
                     f"/sessions/{sid}%00/reset", f"/sessions/{sid}/reset/x", "/sessions/" + "a" * 65,
                     f"/sessions//{sid}/reset", "/./sessions", "/sessions/../sessions"]:
            status, _, body = exchange(guess.url, raw("POST", path, b'{"action": "1"}'))
            # 404, or 405 where the path has the shape of DELETE /sessions/{id}
            assert status == 404 or (status == 405 and "use DELETE" in body.decode()), (path, body)
        step = client.post(f"/sessions/{sid}/step", json={"action": "16"})  # the real session is untouched
        assert step.status_code == 200 and step.json()["info"]["turn"] == 1
        assert client.delete(f"/sessions/{sid}").json() == {"deleted": sid}


def test_max_sessions_holds_under_a_burst_of_creations():
    with EnvServer(GUESS, max_sessions=3) as server:
        def create():
            return httpx.post(f"{server.url}/sessions", timeout=30).status_code

        threads, codes = [], []
        for _ in range(16):
            threads.append(threading.Thread(target=lambda: codes.append(create())))
            threads[-1].start()
        for t in threads:
            t.join()
        assert sorted(codes) == [200] * 3 + [503] * 13 and server.num_sessions == 3
        full = httpx.post(f"{server.url}/sessions")
        assert full.status_code == 503 and "max_sessions=3" in full.json()["error"]["message"]
        assert healthy(server.url)


def test_calls_out_of_turn_are_409_and_the_session_recovers(guess):
    with httpx.Client(base_url=guess.url) as client:
        sid = client.post("/sessions").json()["session_id"]
        for body, path in [({"action": "5"}, "step"), ({"player": "expert"}, "player"),
                           ({"player": "weak", "rng_seed": 1}, "player")]:
            reply = client.post(f"/sessions/{sid}/{path}", json=body)
            assert reply.status_code == 409 and "reset first" in reply.json()["error"]["message"], reply.text
        client.post(f"/sessions/{sid}/reset", json={"seed": 3})
        while True:
            action = client.post(f"/sessions/{sid}/player", json={"player": "expert"}).json()["action"]
            result = client.post(f"/sessions/{sid}/step", json={"action": action}).json()
            if result["terminated"] or result["truncated"]:
                break
        late = client.post(f"/sessions/{sid}/step", json={"action": "5"})
        assert late.status_code == 409 and late.json()["error"]["type"] == "RuntimeError"
        assert "after the episode ended" in late.json()["error"]["message"]
        assert client.post(f"/sessions/{sid}/reset", json={"seed": 4}).status_code == 200
        assert client.post(f"/sessions/{sid}/step", json={"action": "5"}).status_code == 200
        client.delete(f"/sessions/{sid}")


def test_seeds_rng_states_and_reset_options_are_checked(guess):
    with httpx.Client(base_url=guess.url) as client:
        sid = client.post("/sessions").json()["session_id"]
        for body, words in [({"seed": 2**64}, "'seed': Input should be less than or equal to 18446744073709551615"),
                            ({"seed": -1}, "'seed': Input should be greater than or equal to 0"),
                            ({"options": {"split": "nope"}}, "options['split'] must be one of"),
                            ({"options": {"split": {"a": 1}}}, "options['split'] is a JSON object"),
                            ({"options": {"split": "x" * 1000}}, "is a string of 1000 characters")]:
            reply = client.post(f"/sessions/{sid}/reset", json=body)
            assert reply.status_code == 400 and words in reply.json()["error"]["message"], (body, reply.text)
        long_seed = client.post(f"/sessions/{sid}/reset", content=b'{"seed": ' + b"7" * 4000 + b"}")
        assert long_seed.status_code == 400 and "'seed': Input should be less than or equal to" in long_seed.json()["error"]["message"]
        too_long = client.post(f"/sessions/{sid}/reset", content=b'{"seed": ' + b"7" * 5000 + b"}")
        assert too_long.status_code == 400 and "more than 4300 digits" in too_long.json()["error"]["message"]
        client.post(f"/sessions/{sid}/reset", json={"seed": 0})
        for state in [{"bit_generator": "PCG64", "state": {"state": 2**200, "inc": 1}, "has_uint32": 0,
                       "uinteger": 0},
                      {"bit_generator": "PCG64", "state": {"state": "x", "inc": []}},
                      {"bit_generator": "MT19937", "state": {"key": [1, 2], "pos": 10**9}},
                      {"bit_generator": "Philox"}, {"bit_generator": ["PCG64"]}]:
            reply = client.post(f"/sessions/{sid}/player", json={"player": "random", "rng_state": state})
            assert reply.status_code == 400 and "rng_state" in reply.json()["error"]["message"], (state, reply.text)
        big = client.post(f"/sessions/{sid}/player", json={"player": "weak", "rng_seed": 2**64})
        assert big.status_code == 400 and "'rng_seed': Input should be less than or equal to" in big.json()["error"]["message"]
        assert client.post(f"/sessions/{sid}/player", json={"player": "weak", "rng_seed": 2**64 - 1}).status_code == 200
        client.delete(f"/sessions/{sid}")


# ============================================================ the HTTP layer
def test_idle_short_and_trickling_connections_are_dropped_after_the_read_timeout():
    """The review saw 0 of 50 idle connections dropped after 20 s, and a body shorter than its
    Content-Length hold a connection for good."""
    with EnvServer(GUESS, read_timeout_s=0.5) as server:
        idle = [connect(server.url) for _ in range(50)]
        short = connect(server.url)
        short.sendall(raw("POST", "/sessions", b"{", {"Content-Length": "100"}))
        headers_only = connect(server.url)
        headers_only.sendall(b"POST /sessions HTTP/1.1\r\nHost: test\r\n")  # the headers never end
        trickle = connect(server.url)
        stop = threading.Event()

        def drip():  # one byte every 0.1 s: each read is quick, the request never completes
            for byte in raw("GET", "/info", headers={"X-Pad": "p" * 200}):
                if stop.wait(0.1):
                    return
                try:
                    trickle.send(bytes([byte]))
                except OSError:
                    return

        dripper = threading.Thread(target=drip, daemon=True)
        dripper.start()
        start = time.monotonic()
        try:
            for sock in [*idle, short, headers_only, trickle]:
                assert closed_within(sock, max(0.01, 3.0 - (time.monotonic() - start)))
            assert time.monotonic() - start < 3.0
        finally:
            stop.set()
            for sock in [*idle, short, headers_only, trickle]:
                sock.close()
        with httpx.Client(base_url=server.url) as client:  # and it serves on
            assert client.get("/health").json() == {"status": "ok"}
            sid = client.post("/sessions").json()["session_id"]
            assert client.post(f"/sessions/{sid}/reset", json={"seed": 0}).status_code == 200
        dripper.join(timeout=5)


def test_a_slow_body_gets_408_and_a_quick_client_keeps_its_connection():
    with EnvServer(GUESS, read_timeout_s=0.5) as server:
        with connect(server.url) as sock:
            sock.sendall(raw("POST", "/sessions", b"", {"Content-Length": "10"}) + b"{")
            status, headers, body = read_reply(sock)
            assert status in (408, None)  # 408 when the socket's own timeout fires first
            if status == 408:
                assert "did not arrive within 0.5 s" in json.loads(body)["error"]["message"]
                assert headers["connection"] == "close"
        with connect(server.url) as sock:  # a keep-alive client that is quick is not disturbed
            for _ in range(3):
                sock.sendall(raw("GET", "/info"))
                assert read_reply(sock)[0] == 200
                time.sleep(0.2)


@pytest.mark.parametrize("headers, status, words", [
    ({"Content-Length": "abc"}, 400, "Content-Length must be one non-negative integer"),
    ({"Content-Length": "-5"}, 400, "Content-Length must be one non-negative integer"),
    ({"Content-Length": "1e3"}, 400, "Content-Length must be one non-negative integer"),
    ({"Content-Length": "9" * 40}, 400, "Content-Length must be one non-negative integer"),
    ({"Content-Length": "\u00b2"}, 400, "Content-Length must be one non-negative integer"),
    # "{}" is no chunk: the parser's 400 or the server's 411 for chunked bodies, whichever comes first
    ({"Transfer-Encoding": "chunked"}, (400, 411), "with a Content-Length"),
])
def test_bad_body_framing_is_a_4xx_that_closes_the_connection(guess, headers, status, words):
    got, reply_headers, body = exchange(guess.url, raw("POST", "/sessions", b"", headers) + b"{}")
    assert got in (status if isinstance(status, tuple) else (status,)), (got, body)
    assert words in json.loads(body)["error"]["message"]
    assert reply_headers["connection"] == "close"
    assert healthy(guess.url)


def test_two_different_content_lengths_are_400(guess):
    data = b"POST /sessions HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nContent-Length: 40\r\n\r\n{}"
    status, _, body = exchange(guess.url, data)
    assert status == 400 and "one non-negative integer" in json.loads(body)["error"]["message"]


def test_json_too_deep_too_long_or_not_utf8_is_400_and_the_server_serves_on(guess):
    sid = httpx.post(f"{guess.url}/sessions").json()["session_id"]
    cases = [("/sessions", b"[" * 100_000 + b"]" * 100_000, "nests deeper than 64 levels"),
             ("/sessions", b'{"kwargs": {"x": ' + b"[" * 70 + b"]" * 70 + b"}}", "nests deeper than 64 levels"),
             (f"/sessions/{sid}/reset", b'{"seed": ' + b"9" * 5000 + b"}", "more than 4300 digits"),
             (f"/sessions/{sid}/step", b'{"action": "\xff\xfe"}', "not valid UTF-8 JSON"),
             ("/sessions", b"{not json", "is not JSON")]
    for path, body, words in cases:
        status, _, reply = exchange(guess.url, raw("POST", path, body))
        assert status == 400 and words in json.loads(reply)["error"]["message"], (path, body[:30], reply[:300])
    huge = exchange(guess.url, raw("POST", "/sessions", b" " * (MAX_BODY_BYTES + 1)))
    assert huge[0] == 413
    assert healthy(guess.url)
    httpx.delete(f"{guess.url}/sessions/{sid}")


def test_methods_an_endpoint_does_not_take_are_405(guess):
    sid = httpx.post(f"{guess.url}/sessions").json()["session_id"]
    paths = ["/health", "/info", "/sessions", f"/sessions/{sid}", f"/sessions/{sid}/step"]
    for path in paths:
        for method in ("PUT", "PATCH", "OPTIONS", "TRACE"):
            status, headers, body = exchange(guess.url, raw(method, path, b"{}"))
            assert status == 405 and "error" in json.loads(body), (method, path)
        # a method HTTP does not define is refused by the parser: 400, in the same format
        status, headers, body = exchange(guess.url, raw("BREW", path, b"{}"))
        assert status == 400 and json.loads(body)["error"]["code"] == 400, (path, body)
        status, headers, body = exchange(guess.url, raw("HEAD", path), head_only=True)
        assert status == 405 and headers["content-type"] == "application/json"
    for method, path in [("POST", "/info"), ("GET", "/sessions"), ("GET", f"/sessions/{sid}/reset"),
                         ("DELETE", f"/sessions/{sid}/step"), ("POST", f"/sessions/{sid}")]:
        reply = httpx.request(method, guess.url + path)
        assert reply.status_code == 405 and "is not allowed on" in reply.json()["error"]["message"]
    with connect(guess.url) as sock:  # a HEAD reply has no body: the connection stays in step
        sock.sendall(raw("HEAD", "/info"))
        assert read_reply(sock, head_only=True)[0] == 405
    assert httpx.get(f"{guess.url}/sessions/{sid}").status_code == 405
    assert httpx.delete(f"{guess.url}/sessions/{sid}").status_code == 200


def test_malformed_request_lines_and_versions_are_4xx(guess):
    for data in [b"GARBAGE\r\n\r\n", b"GET /info HTTP/2.0\r\nHost: t\r\n\r\n", b"GET /info HTTP/9\r\n\r\n",
                 b"GET /info HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n"]:
        status, _, body = exchange(guess.url, data)
        assert status is not None and 400 <= status < 500, (data[:40], status, body[:200])
    assert healthy(guess.url)


def test_health_is_open_on_every_server_and_nothing_else_is():
    with EnvServer(GUESS, host="0.0.0.0", token=TOKEN) as env_server, \
            ToolServer([calculator], host="0.0.0.0", token=TOKEN) as tool_server:
        for server in (env_server, tool_server):
            url = f"http://127.0.0.1:{server.port}"
            assert httpx.get(f"{url}/health").json() == {"status": "ok"}
            assert httpx.get(f"{url}/info" if server is env_server else f"{url}/tools").status_code == 401


# =================================================================== fuzzing
ENV_KEYS = ["kwargs", "seed", "options", "action", "player", "rng_seed", "rng_state", "split", "tool_parser",
            "max_turns", "n", "executors", "bit_generator", "state", "inc"]
scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=2**63, max_value=2**80)
           | st.floats() | st.text(max_size=20) | st.sampled_from(["expert", "weak", "random", "train", "test",
                                                                   "PCG64", "hermes", "16"]))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.sampled_from(ENV_KEYS) | st.text(max_size=8), inner, max_size=4),
                           max_leaves=12)
shaped = st.one_of(  # bodies shaped like each endpoint's, with any values
    st.fixed_dictionaries({"kwargs": st.dictionaries(
        st.sampled_from(["tool_parser", "max_turns", "n", "executors", "split"]), json_values, max_size=3)}),
    st.fixed_dictionaries({}, optional={"seed": st.integers() | json_values, "options": st.dictionaries(
        st.sampled_from(["split", "env", "x"]), json_values, max_size=2)}),
    st.fixed_dictionaries({"action": st.text(max_size=40) | json_values}),
    st.fixed_dictionaries({"player": st.sampled_from(["expert", "weak", "random"]) | json_values},
                          optional={"rng_seed": st.integers() | json_values, "rng_state": json_values | st.just(
                              dict(np.random.default_rng(0).bit_generator.state))}))
bodies = (shaped.map(lambda v: json.dumps(v).encode())
          | json_values.map(lambda v: json.dumps(v).encode())
          | st.dictionaries(st.sampled_from(ENV_KEYS), json_values, max_size=4).map(lambda v: json.dumps(v).encode())
          | st.binary(max_size=64) | st.just(b""))
header_values = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30)
headers = st.dictionaries(
    st.sampled_from(["Content-Type", "Authorization", "Accept", "Connection", "Expect", "X-Fuzz", "Cookie",
                     "Content-Encoding", "Transfer-Encoding", "Content-Length", "Host"])
    | st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,12}", fullmatch=True),
    header_values, max_size=4)
other_verbs = st.sampled_from(["GET", "POST", "DELETE", "PUT", "HEAD", "OPTIONS", "PATCH"])
routes = st.sampled_from([("GET", "/health"), ("GET", "/info"), ("POST", "/sessions"), ("DELETE", "/sessions/{sid}"),
                          ("POST", "/sessions/{sid}/reset"), ("POST", "/sessions/{sid}/step"),
                          ("POST", "/sessions/{sid}/player"), ("POST", "/sessions/{other}/step"),
                          ("POST", "/sessions/{sid}/dance"), ("GET", "/{text}"), ("POST", "/sessions/{text}/reset")])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(route=routes, verb=st.none() | st.none() | st.none() | other_verbs,
       text=st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=12),
       body=bodies, extra=headers | st.just({}), reset_first=st.booleans())
def test_fuzz_no_request_gets_a_5xx_and_the_server_serves_on(guess, route, verb, text, body, extra, reset_first):
    """Random bodies and headers at every endpoint (mostly with its own method): never a 5xx,
    and the server answers ``/health`` after each."""
    with httpx.Client(base_url=guess.url) as client:
        sid = client.post("/sessions").json()["session_id"]
        if reset_first:
            client.post(f"/sessions/{sid}/reset", json={"seed": 0})
        method = verb or route[0]
        path = route[1].format(sid=sid, other=secrets.token_hex(12), text=text)
        if extra_length_is_numeric(extra):  # a longer body than sent would only wait for the read timeout
            extra = {k: v for k, v in extra.items() if k.lower() != "content-length"}
        status, _, reply = exchange(guess.url, raw(method, path, body, extra), head_only=method == "HEAD")
        assert status is not None and status < 500, (method, path, body[:80], extra, reply[:300])
        if method == "POST" and path == "/sessions" and status == 200:
            client.delete(f"/sessions/{json.loads(reply)['session_id']}")
        client.delete(f"/sessions/{sid}")
        assert client.get("/health").json() == {"status": "ok"}


def extra_length_is_numeric(extra: dict[str, str]) -> bool:
    """Whether ``extra`` sets a Content-Length that is a number."""
    return any(k.lower() == "content-length" and v.strip().isdigit() for k, v in extra.items())


# ================================================================ sandboxes
SANDBOX = {"limits": {"cpu_s": 1, "wall_s": 4, "memory_mb": 256}, "pool": "recycle", "pool_size": 2}


def pycode_server(**kwargs) -> EnvServer:
    """A PythonCoding server whose sandboxes are set by the server (pool of 2 warm ones)."""
    try:
        return EnvServer(PYCODE, {"executor_options": {"sandbox": SANDBOX}}, **kwargs)
    except ValueError as e:
        if isinstance(e.__cause__, SandboxUnavailable):
            missing_tool(f"bubblewrap sandbox unavailable: {e.__cause__}", BWRAP_INSTALL)
        raise


def sandboxes() -> set[int]:
    """The bubblewrap processes under this process (one per sandbox)."""
    found = set()
    for pid in descendants():
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "bwrap":
                    found.add(pid)
        except OSError:
            pass
    return found


def settled(pool) -> dict[str, int]:
    """The pool's counts once no sandbox is starting, being wiped or being reaped (every live
    one idle or held)."""
    deadline = time.monotonic() + 20
    while True:
        counts = pool.counts()
        quiet = counts["starting"] == 0 and counts["wiping"] == 0 and counts["live"] == counts["idle"] + counts["held"]
        if quiet or time.monotonic() > deadline:
            return counts
        time.sleep(0.05)


def run_code(client: httpx.Client, sid: str, code: str) -> str:
    reply = client.post(f"/sessions/{sid}/step", json={"action": hermes_call("run_python", code=code)})
    assert reply.status_code == 200, reply.text
    return reply.json()["observation"][0]["content"]


@pytest.fixture
def pycode():
    with pycode_server(read_timeout_s=1.0, session_ttl_s=600) as server:
        yield server


def test_sandbox_settings_come_from_the_server_and_its_limits_hold(pycode):
    """The review ran model code as uid 0 (``run_as: null``), a host binary as root (``bwrap``)
    and burned 12 s of CPU against a 2 s cap (raised ``limits``), and grew warm pools, all
    from a client's kwargs."""
    pool = get_executor("sandbox", **SANDBOX).pool
    before, processes = settled(pool), len(sandboxes())
    attacks = [{"executor_options": {"sandbox": {**SANDBOX, "run_as": None}}},
               {"executor_options": {"sandbox": {**SANDBOX, "bwrap": "/usr/bin/id"}}},
               {"executor_options": {"sandbox": {**SANDBOX, "limits": {"cpu_s": 30, "wall_s": 60}}}},
               {"executor_options": {"sandbox": {"pool": "recycle", "pool_size": 8}}},
               {"executors": {"run_python": "inprocess"}}]
    with httpx.Client(base_url=pycode.url, timeout=60) as client:
        for attack in attacks:
            assert client.post("/sessions", json={"kwargs": attack}).status_code == 403
        assert settled(pool) == before and len(sandboxes()) == processes  # no new executor, no new sandbox
        sid = client.post("/sessions").json()["session_id"]
        client.post(f"/sessions/{sid}/reset", json={"seed": 0})
        assert "stdout:\n65534" in run_code(client, sid, "import os; print(os.getuid())")  # not root
        start = time.monotonic()
        burnt = run_code(client, sid, "while True: pass")  # also outlasts the 1 s read timeout: still answered
        assert "Stopped: the program used more than 1 s of CPU" in burnt or "limit wall_s=4" in burnt, burnt
        assert time.monotonic() - start < 8
        client.delete(f"/sessions/{sid}")


def test_sandboxes_go_with_their_sessions_and_the_pool_stays_the_servers(pycode):
    pool = get_executor("sandbox", **SANDBOX).pool
    live = settled(pool)["live"]  # (first: the pool's own sandboxes may still be starting)
    others = len(sandboxes()) - live  # sandboxes of other executors of this process, if any
    with httpx.Client(base_url=pycode.url, timeout=60) as client:
        for seed in range(5):  # one session after another: the pool never grows
            sid = client.post("/sessions").json()["session_id"]
            client.post(f"/sessions/{sid}/reset", json={"seed": seed})
            assert "stdout:\n42" in run_code(client, sid, "print(6 * 7)")
            assert pool.counts()["held"] == 1
            client.delete(f"/sessions/{sid}")
            counts = settled(pool)
            assert counts["held"] == 0 and counts["live"] <= SANDBOX["pool_size"] + 1, counts
            assert len(sandboxes()) == others + counts["live"]
        sids = [client.post("/sessions").json()["session_id"] for _ in range(3)]  # sessions side by side
        for seed, sid in enumerate(sids):
            client.post(f"/sessions/{sid}/reset", json={"seed": seed})
            run_code(client, sid, "print(1)")
        assert pool.counts()["held"] == 3
        for sid in sids:
            client.delete(f"/sessions/{sid}")
        counts = settled(pool)
        assert counts["held"] == 0 and counts["live"] <= SANDBOX["pool_size"] + len(sids), counts


def test_sessions_side_by_side_leave_no_more_warm_sandboxes_than_the_pool_size(pycode):
    pool = get_executor("sandbox", **SANDBOX).pool
    with httpx.Client(base_url=pycode.url, timeout=60) as client:
        sids = [client.post("/sessions").json()["session_id"] for _ in range(3)]
        for seed, sid in enumerate(sids):
            client.post(f"/sessions/{sid}/reset", json={"seed": seed})
            run_code(client, sid, "print(1)")
        for sid in sids:
            client.delete(f"/sessions/{sid}")
    assert settled(pool)["live"] <= SANDBOX["pool_size"] + 1


def test_an_expired_session_gives_its_sandbox_back():
    with pycode_server(session_ttl_s=0.5) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        pool = get_executor("sandbox", **SANDBOX).pool
        sid = client.post("/sessions").json()["session_id"]
        client.post(f"/sessions/{sid}/reset", json={"seed": 0})
        run_code(client, sid, "open('keep.txt', 'w').write('x')")
        assert pool.counts()["held"] == 1
        deadline = time.monotonic() + 10
        while server.num_sessions and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.num_sessions == 0 and settled(pool)["held"] == 0
        assert client.post(f"/sessions/{sid}/step", json={"action": "x"}).status_code == 404


def test_stopping_the_server_leaves_no_sandbox_process():
    outside = descendants()  # other tests' sandboxes, if any
    own = {**SANDBOX, "pool_size": 1}  # an executor of this server's own
    try:
        server = EnvServer(PYCODE, {"executor_options": {"sandbox": own}}, close_executors=True).start()
    except ValueError as e:
        if isinstance(e.__cause__, SandboxUnavailable):
            missing_tool(f"bubblewrap sandbox unavailable: {e.__cause__}", BWRAP_INSTALL)
        raise
    with httpx.Client(base_url=server.url, timeout=60) as client:
        sids = [client.post("/sessions").json()["session_id"] for _ in range(2)]
        for seed, sid in enumerate(sids):
            client.post(f"/sessions/{sid}/reset", json={"seed": seed})
            run_code(client, sid, "import subprocess; subprocess.Popen(['sleep', '60']); print('left a child')")
        assert len(sandboxes() - outside) >= 2
    server.stop()
    deadline = time.monotonic() + 10
    while descendants() - outside and time.monotonic() < deadline:
        time.sleep(0.1)
    assert descendants() - outside == set()  # no sandbox, nor anything started inside one
