"""Remote tools: a real ``ToolServer`` on loopback (in a thread, and as a subprocess via the
CLI) and the real ``RemoteExecutor`` talking to it over HTTP; token-guarded servers bind
every interface (0.0.0.0) and are reached over 127.0.0.1. Failures are made by real server
tools (one that sleeps, one that counts calls and refuses the first N), never by mocks."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnrl.tools import Tool, ToolCall, calculator, run_python, run_sync, tool
from turnrl.tools.executors import EXECUTORS, get_executor
from turnrl.serving import TokenRefusedError
from turnrl.tools.executors.remote import RemoteExecutor, RemoteFunction, RemoteToolTokenError, remote_tools
from turnrl.tools.serve import ToolServer, ToolUnavailable, load_tools

from tests.helpers import BWRAP_INSTALL, missing_tool

ROOT = Path(__file__).resolve().parents[2]


class Gauge:
    """A real tool that sleeps and records how many of its calls were in flight at once."""

    def __init__(self):
        self.lock = threading.Lock()
        self.in_flight = self.peak = self.calls = 0

    def hold(self, seconds: float) -> str:
        """Hold the line for a while, then say so.

        Args:
            seconds: How long to hold.
        """
        with self.lock:
            self.calls += 1
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            time.sleep(seconds)
        finally:
            with self.lock:
                self.in_flight -= 1
        return f"held {seconds}"


class Flaky:
    """A real tool whose backend is 'warming up': its first ``failures`` calls are refused."""

    def __init__(self, failures):
        self.failures = failures
        self.calls = 0
        self.lock = threading.Lock()

    def double(self, x: int) -> int:
        """Double a number.

        Args:
            x: The number.
        """
        with self.lock:
            self.calls += 1
            n = self.calls
        if n <= self.failures:
            raise ToolUnavailable(f"backend warming up (call {n})")
        return 2 * x


def call(executor, tool_, arguments, session="s"):
    return run_sync(executor.arun(tool_, ToolCall(tool_.name, arguments), session))


@pytest.fixture
def gauge():
    return Gauge()


@pytest.fixture
def server(gauge):
    with ToolServer([calculator, tool(gauge.hold)]) as s:
        yield s


def remote(server, **kwargs):
    kwargs.setdefault("backoff_s", 0.01)
    executor = RemoteExecutor(server.url, **kwargs)
    return executor


def test_schemas_round_trip_and_tools_refuse_in_process_calls(server, gauge):
    tools = remote_tools(server.url)
    assert [t.schema() for t in tools] == [calculator.schema(), tool(gauge.hold).schema()]
    assert all(t.executor == "remote" for t in tools)
    assert tools[0].fn == RemoteFunction("calculator", server.url)
    with pytest.raises(RuntimeError, match=f"runs on the tool service at {server.url}"):
        tools[0](expression="1+1")
    assert "remote" in EXECUTORS and "docker" in EXECUTORS


def test_calls_run_on_the_server_with_its_validation_and_errors(server):
    calc = remote_tools(server.url)[0]
    ex = remote(server)
    try:
        assert (call(ex, calc, {"expression": "37 * 24"}).content, call(ex, calc, {"expression": "1"}).error) == ("888", None)
        r = call(ex, calc, {"expression": "1/0"})
        assert r.error == "exception" and "division by zero" in r.content
        r = call(ex, calc, {"expr": "1"})  # arguments the client did not validate: the server does
        assert r.error == "bad_arguments" and "unexpected argument 'expr'" in r.content
    finally:
        ex.close()


def test_executor_without_url_uses_each_tools_own_server(server):
    calc = remote_tools(server.url)[0]
    ex = RemoteExecutor()
    try:
        assert call(ex, calc, {"expression": "6*7"}).content == "42"
        r = call(ex, calculator, {"expression": "6*7"})  # a local tool: no server to go to (the setup's fault)
        assert r.error == "unavailable" and "no tool service" in r.content
    finally:
        ex.close()


def test_4xx_answers_are_not_retried(server):
    ex = remote(server, retries=3)
    try:
        ghost = Tool("ghost", "No such tool.", {"type": "object", "properties": {}}, RemoteFunction("ghost", server.url))
        r = call(ex, ghost, {})
        assert r.error == "unknown_tool" and "Available tools: calculator, hold" in r.content
        assert server.status_counts[404] == 1
        nameless = Tool("", "Empty name.", {"type": "object", "properties": {}}, RemoteFunction("", server.url))
        r = call(ex, nameless, {})
        assert r.error == "exception" and "refused the call (HTTP 400" in r.content
        assert server.status_counts[400] == 1
    finally:
        ex.close()


@pytest.mark.slow
def test_5xx_is_retried_with_backoff_until_it_works():
    flaky = Flaky(failures=2)
    with ToolServer([tool(flaky.double)]) as server:
        ex = RemoteExecutor(server.url, retries=3, backoff_s=0.1)
        start = time.monotonic()
        r = call(ex, remote_tools(server.url)[0], {"x": 21})
        elapsed = time.monotonic() - start
        ex.close()
        assert (r.content, r.error) == ("42", None)
        assert flaky.calls == 3 and server.status_counts[503] == 2
        assert elapsed >= 0.1 + 0.2  # two backoffs, the second doubled


def test_retries_give_up_with_an_unavailable_result():
    flaky = Flaky(failures=100)
    with ToolServer([tool(flaky.double)]) as server:
        url = server.url
        ex = RemoteExecutor(url, retries=2, backoff_s=0.01)
        r = call(ex, remote_tools(url)[0], {"x": 1})
        ex.close()
    assert r.error == "unavailable" and flaky.calls == 3  # the server's failure, not the model's
    assert f"the tool service at {url} did not answer after 3 tries" in r.content
    assert "HTTP 503" in r.content and "backend warming up (call 3)" in r.content


@pytest.mark.slow
def test_slow_tool_times_out_each_try(server, gauge):
    hold = remote_tools(server.url)[1]
    ex = remote(server, timeout_s=0.2, retries=1)
    try:
        start = time.monotonic()
        r = call(ex, hold, {"seconds": 1.5})
        elapsed = time.monotonic() - start
    finally:
        ex.close()
    assert r.error == "unavailable" and "did not answer after 2 tries" in r.content and "within 0.2 s" in r.content
    assert elapsed < 1.0 and gauge.calls == 2


@pytest.mark.slow
def test_server_stopped_mid_call_gives_an_unavailable_result(gauge):
    server = ToolServer([tool(gauge.hold)]).start()
    hold = remote_tools(server.url)[0]
    ex = RemoteExecutor(server.url, retries=2, backoff_s=0.05)
    try:
        threading.Timer(0.3, server.stop).start()
        start = time.monotonic()
        r = call(ex, hold, {"seconds": 3.0})
        elapsed = time.monotonic() - start
        assert r.error == "unavailable" and "did not answer after 3 tries" in r.content
        assert elapsed < 2.0  # it did not wait for the tool: the connection was closed
        r = call(ex, hold, {"seconds": 0.0})  # nothing listens any more
        assert r.error == "unavailable" and "ConnectError" in r.content
    finally:
        ex.close()
        server.stop()


@pytest.mark.slow
def test_concurrency_is_bounded_by_max_concurrency(server, gauge):
    hold = remote_tools(server.url)[1]
    ex = remote(server, max_concurrency=3)

    async def many():
        import asyncio

        return await asyncio.gather(*(ex.arun(hold, ToolCall("hold", {"seconds": 0.15}), f"s{i}") for i in range(12)))

    try:
        start = time.monotonic()
        results = run_sync(many())
        elapsed = time.monotonic() - start
    finally:
        ex.close()
    assert [r.content for r in results] == ["held 0.15"] * 12
    assert gauge.peak == 3 and gauge.calls == 12
    assert elapsed >= 4 * 0.15 * 0.9


def test_malformed_requests_get_a_4xx_saying_what_was_wrong(server):
    example = '{"name": "calculator", "arguments": {"expression": "1+2"}, "session": "episode-1"}'
    with httpx.Client(base_url=server.url, trust_env=False) as http:
        for body, status, kind, param, words in [
            (b"{not json", 400, "invalid_request_error", None, "not valid UTF-8 JSON"),
            (b"[1, 2]", 400, "invalid_request_error", None, "must be a JSON object, got array"),
            (b'{"arguments": {}}', 400, "invalid_request_error", "name", "Field required"),
            (b'{"name": ""}', 400, "invalid_request_error", "name", "at least 1 character"),
            (b'{"name": "calculator", "arguments": [1]}', 400, "invalid_request_error", "arguments",
             "should be a valid dictionary"),
            (b'{"name": "calculator", "session": 3}', 400, "invalid_request_error", "session",
             "should be a valid string"),
            (b'{"name": "calculator", "args": {}}', 400, "invalid_request_error", "args",
             "Extra inputs are not permitted"),
            (b'{"name": "nope"}', 404, "unknown_tool", "name", "unknown tool 'nope'"),
        ]:
            r = http.post("/call", content=body)
            error = r.json()["error"]
            assert (r.status_code, error["code"], error["type"], error["param"]) == (status, status, kind, param), (
                body, r.text)
            assert words in error["message"], (body, r.text)
            if status == 400 and body != b"{not json":
                assert error["message"].startswith("bad body for POST /call: ")
                assert error["message"].endswith(f"; send e.g. {example}")  # the fix is shown
        assert http.post("/call", content=b'{"name": "nope"}').json()["error"]["tools"] == ["calculator", "hold"]
        for body, param in [(b"{}", "session"), (b'{"session": 1}', "session"), (b'{"session": "a", "x": 1}', "x"),
                            (b'"a"', None)]:
            r = http.post("/close_session", content=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
            assert "POST /close_session" in r.json()["error"]["message"]
        assert http.post("/close_session", json={"session": "a"}).json() == {"closed": "a"}
        for method, path in (("GET", "/nowhere"), ("POST", "/nowhere")):
            error = http.request(method, path, content=b"{}").json()["error"]
            assert (error["code"], error["type"]) == (404, "not_found_error")
            assert "GET /tools, POST /call, POST /close_session" in error["message"]
        ok = http.post("/call", json={"name": "calculator", "arguments": {"expression": "2**10"}, "session": "x"})
        assert ok.json() == {"content": "1024", "error": None}  # the connection is still usable


def test_a_404_that_is_not_an_unknown_tool_is_the_setups_failure_not_the_models(server):
    """An executor whose URL has a wrong path prefix reaches the server, which has no such
    endpoint: that is a wrong setup (``"unavailable"``, saying the URL may be wrong), never the
    model's unknown tool; and a 404 is not retried."""
    url = f"{server.url}/v1"
    calc = Tool("calculator", "Calculate.", calculator.parameters, RemoteFunction("calculator", url), executor="remote")
    ex = RemoteExecutor(url, retries=3, backoff_s=0.01)
    try:
        r = call(ex, calc, {"expression": "1+2"})
    finally:
        ex.close()
    assert r.error == "unavailable", r
    assert r.content.startswith("Error: tool 'calculator' is unavailable: ")
    assert f"the server at {url} answered POST /call with HTTP 404" in r.content
    assert "no endpoint '/v1/call'" in r.content and "the URL may be wrong" in r.content
    assert server.status_counts[404] == 1  # one try: a 4xx is final
    ghost = Tool("ghost", "No such tool.", {"type": "object", "properties": {}}, RemoteFunction("ghost", server.url))
    ex = RemoteExecutor(server.url)
    try:  # the right URL and a tool the server lacks: the model's mistake
        r = call(ex, ghost, {})
    finally:
        ex.close()
    assert (r.error, r.content) == ("unknown_tool", "Error: unknown tool 'ghost'. Available tools: calculator, hold.")


@tool
def echo(text: str) -> str:
    """Say the text back.

    Args:
        text: What to say.
    """
    return text


@pytest.fixture
def quick_server():
    """Tools that return at once whatever their arguments (the fuzzed calls run)."""
    with ToolServer([calculator, echo]) as s:
        yield s


CALL_KEYS = ["name", "arguments", "session", "expression", "text", "args"]
scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=2**63, max_value=2**80) | st.floats()
           | st.text(max_size=20) | st.sampled_from(["calculator", "echo", "", "1+2", "2**10", "-0.5", "nope"]))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.sampled_from(CALL_KEYS) | st.text(max_size=8), inner, max_size=4),
                           max_leaves=12)
shaped = st.one_of(  # bodies shaped like each endpoint's, with any values
    st.fixed_dictionaries({"name": st.sampled_from(["calculator", "echo", "nope"]) | json_values},
                          optional={"arguments": st.dictionaries(st.sampled_from(["expression", "text", "x"]),
                                                                 scalars | json_values, max_size=2) | json_values,
                                    "session": st.text(max_size=12) | json_values}),
    st.fixed_dictionaries({"session": st.text(max_size=12) | json_values}))


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(["/call", "/close_session"]),
       body=shaped.map(lambda v: json.dumps(v).encode()) | json_values.map(lambda v: json.dumps(v).encode())
       | st.binary(max_size=40))
def test_fuzz_call_and_close_session_bodies_never_get_a_5xx(quick_server, path, body):
    """Random JSON values (and bytes) as the bodies of ``POST /call`` and ``POST /close_session``:
    a 200 result or a 4xx in the error format, never a 5xx, and the server serves on."""
    server = quick_server
    with httpx.Client(base_url=server.url, trust_env=False) as http:
        r = http.post(path, content=body)
        assert r.status_code in (200, 400, 404), (path, body, r.status_code, r.text)
        reply = r.json()
        if r.status_code == 200:
            assert (set(reply) == {"content", "error"} if path == "/call" else set(reply) == {"closed"}), reply
        else:
            error = reply["error"]
            assert error["code"] == r.status_code and isinstance(error["message"], str) and error["message"]
            assert error["type"] == ("unknown_tool" if r.status_code == 404 else "invalid_request_error"), reply
        assert http.get("/health").json() == {"status": "ok"}
    assert server.status_counts[500] == 0 and server.status_counts[503] == 0


def test_bad_urls_and_missing_servers_are_clear_errors():
    with pytest.raises(ValueError, match="must look like 'http://127.0.0.1:8000'"):
        RemoteExecutor("localhost:8000")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectionError, match="cannot fetch the tool list"):
        remote_tools(f"http://127.0.0.1:{port}")
    with pytest.raises(ValueError, match="retries must be an int >= 0"):
        RemoteExecutor("http://127.0.0.1:1", retries=-1)
    url = f"http://127.0.0.1:{port}"
    assert get_executor("remote", url=url) is get_executor("remote", url=url)


@pytest.mark.slow
def test_served_code_tool_runs_in_the_servers_sandbox_and_sessions_close():
    from turnrl.tools.executors import SandboxUnavailable

    try:
        get_executor("sandbox")
    except SandboxUnavailable as e:
        missing_tool(f"bubblewrap sandbox unavailable: {e}", BWRAP_INSTALL)
    limits = {"cpu_s": 1, "wall_s": 4, "memory_mb": 256}
    with ToolServer([run_python], executor_options={"sandbox": {"limits": limits}}) as server:
        (remote_python,) = remote_tools(server.url)
        ex = RemoteExecutor(server.url)
        session = uuid.uuid4().hex
        try:
            r = call(ex, remote_python, {"code": "open('note.txt', 'w').write('kept')"}, session)
            assert r.error is None and "Exit code: 0" in r.content
            read = "import os\nprint(os.path.exists('note.txt'))"
            assert "True" in call(ex, remote_python, {"code": read}, session).content
            ex.close_session(session)  # the server frees the session's sandbox dir
            assert "False" in call(ex, remote_python, {"code": read}, session).content
            r = call(ex, remote_python, {"code": "while True: pass"}, session)
        finally:
            ex.close()
    assert r.error == "limit" and "CPU time (limit cpu_s=1)" in r.content


@pytest.mark.slow
@pytest.mark.e2e
def test_cli_serves_tools_from_a_subprocess():
    proc = subprocess.Popen(
        [sys.executable, "-m", "turnrl.tools.serve", "turnrl.tools.calculator:calculator", "--port", "0"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving calculator at http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() else "")
        url = line.split(" at ")[1].strip()
        (calc,) = remote_tools(url)
        ex = RemoteExecutor(url)
        assert call(ex, calc, {"expression": "3**4"}).content == "81"
        ex.close()
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


def test_load_tools_specs():
    assert load_tools("turnrl.tools.calculator:calculator") == [calculator]
    with pytest.raises(ValueError, match="must be 'module:attr'"):
        load_tools("turnrl.tools.calculator")
    with pytest.raises(ValueError, match="has no attribute 'nothing'"):
        load_tools("turnrl.tools.calculator:nothing")
    with pytest.raises(ValueError, match="not a Tool, function or list"):
        load_tools("turnrl.tools.calculator:MAX_EXPRESSION_CHARS")


def test_an_env_tool_is_sent_to_a_remote_server_chosen_in_config():
    """CalcMath's calculator, executed by a real ToolServer because the env's kwargs say so."""
    from turnrl.envs import CalcMathEnv

    with ToolServer([calculator]) as server:
        env = CalcMathEnv(num_ops=1, executors={"calculator": "remote"},
                          executor_options={"remote": {"url": server.url}})
        assert env.executor_for("calculator").kind == "remote"
        env.reset(seed=0)
        while True:
            _, reward, terminated, truncated, info = env.step(env.expert_action())
            if terminated or truncated:
                break
        assert info["success"] and reward == 1.0
        assert server.status_counts.get(200, 0) >= 1  # the calls went over HTTP
    with pytest.raises(ValueError, match="calculator"):
        CalcMathEnv(executors={"calculater": "remote"})


# ------------------------------------------------------------------ tokens
TOKEN = "tool-tok-5d2e7a9c04"


@pytest.fixture
def token_server(gauge):
    """A tool server on every interface (not loopback), guarded by ``TOKEN``, and its loopback URL."""
    with ToolServer([calculator, tool(gauge.hold)], host="0.0.0.0", token=TOKEN) as s:
        yield s, f"http://127.0.0.1:{s.port}"


@pytest.mark.slow
def test_tool_server_without_the_token_answers_401_in_the_error_format(token_server):
    server, url = token_server
    body = {"name": "calculator", "arguments": {"expression": "1+2"}, "session": "s"}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        for method, path in (("GET", "/tools"), ("POST", "/call"), ("POST", "/close_session")):
            reply = httpx.request(method, url + path, headers=headers, json=body)
            assert reply.status_code == 401 and reply.headers["WWW-Authenticate"] == "Bearer", (method, path)
            error = reply.json()["error"]
            assert (error["code"], error["type"]) == (401, "authentication_error") and "Bearer <token>" in error["message"]
    ok = httpx.post(url + "/call", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.json() == {"content": "3", "error": None}
    assert server.status_counts[401] == 9


def test_remote_tools_and_executor_send_the_token_from_the_named_variable(token_server, monkeypatch):
    _, url = token_server
    monkeypatch.setenv("TURNRL_TEST_TOOL_TOKEN", TOKEN)
    calc, _ = remote_tools(url, token_env="TURNRL_TEST_TOOL_TOKEN")
    ex = RemoteExecutor(url, token_env="TURNRL_TEST_TOOL_TOKEN", backoff_s=0.01)
    try:
        assert call(ex, calc, {"expression": "37 * 24"}).content == "888"
    finally:
        ex.close()


def test_a_refused_token_raises_naming_the_variable_and_is_never_retried(token_server, monkeypatch):
    server, url = token_server
    monkeypatch.delenv("TURNRL_TEST_TOOL_TOKEN", raising=False)
    with pytest.raises(RemoteToolTokenError, match=rf"GET {url}/tools: HTTP 401: the server at {url} refused the "
                                                   r"token: set TURNRL_TEST_TOOL_TOKEN to its token \(TURNRL_TEST_TOOL_"
                                                   r"TOKEN was unset or empty, so no token was sent\)"):
        remote_tools(url, token_env="TURNRL_TEST_TOOL_TOKEN")
    monkeypatch.setenv("TURNRL_TEST_TOOL_TOKEN", "not-the-token")
    calc = Tool("calculator", "Calculate.", calculator.parameters, RemoteFunction("calculator", url), executor="remote")
    ex = RemoteExecutor(url, token_env="TURNRL_TEST_TOOL_TOKEN", retries=3, backoff_s=0.01)
    try:
        with pytest.raises(RemoteToolTokenError, match=r"tool 'calculator': POST .*/call: HTTP 401: .*refused the "
                                                       r"token: set TURNRL_TEST_TOOL_TOKEN to its token$") as err:
            call(ex, calc, {"expression": "1+1"})
        assert isinstance(err.value, TokenRefusedError) and "not-the-token" not in str(err.value)
    finally:
        ex.close()
    assert server.status_counts[401] == 2  # one GET /tools, one call: a 401 is not retried


def test_an_env_whose_remote_tool_is_refused_raises_instead_of_telling_the_model(token_server, monkeypatch):
    """CalcMath with its calculator on a token-guarded server and the wrong token in the env's
    executor options: the step raises (a wrong setup), it does not become a tool error."""
    from turnrl.envs import CalcMathEnv

    _, url = token_server
    monkeypatch.setenv("TURNRL_TEST_TOOL_TOKEN", "not-the-token")
    options = {"remote": {"url": url, "token_env": "TURNRL_TEST_TOOL_TOKEN", "retries": 0}}
    env = CalcMathEnv(num_ops=1, executors={"calculator": "remote"}, executor_options=options)
    env.reset(seed=0)
    with pytest.raises(RemoteToolTokenError, match="set TURNRL_TEST_TOOL_TOKEN to its token"):
        env.step(env.expert_action())


def test_tool_server_on_a_non_loopback_address_needs_a_token():
    with pytest.raises(ValueError, match=r"refusing to serve on '0\.0\.0\.0' without a token.*TURNRL_SERVER_TOKEN"):
        ToolServer([calculator], host="0.0.0.0")


@pytest.mark.slow
@pytest.mark.e2e
def test_tool_server_cli_needs_a_token_off_loopback_and_never_prints_it(monkeypatch):
    env = {k: v for k, v in os.environ.items() if k != "TURNRL_SERVER_TOKEN"}
    command = [sys.executable, "-m", "turnrl.tools.serve", "turnrl.tools.calculator:calculator", "--host", "0.0.0.0"]
    refused = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode == 2 and refused.stdout == ""
    assert "refusing to serve on '0.0.0.0' without a token" in refused.stderr and "--token-env" in refused.stderr
    proc = subprocess.Popen([*command, "--token-env", "TURNRL_TEST_SERVE_TOKEN"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**env, "TURNRL_TEST_SERVE_TOKEN": TOKEN})
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving calculator at http://0.0.0.0:"), (line, proc.poll() and proc.stderr.read())
        url = "http://127.0.0.1:" + line.rsplit(":", 1)[1].strip()
        with pytest.raises(RemoteToolTokenError):
            remote_tools(url, token_env="TURNRL_TEST_UNSET_TOKEN")
        monkeypatch.setenv("TURNRL_TEST_CLIENT_TOKEN", TOKEN)
        (calc,) = remote_tools(url, token_env="TURNRL_TEST_CLIENT_TOKEN")
        ex = RemoteExecutor(url, token_env="TURNRL_TEST_CLIENT_TOKEN")
        assert call(ex, calc, {"expression": "3**4"}).content == "81"
        ex.close()
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0 and TOKEN not in line + out + err
