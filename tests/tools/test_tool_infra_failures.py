"""Tool failures that are the infrastructure's, told apart from the model's.

A call the model got wrong (unknown tool, bad arguments, a tool that refused its input) is an
error message in the observation and the episode goes on; a call that failed for another
reason (a tool that raised ``ToolUnavailableError`` or ``ConnectionError``, a tool server gone,
a sandbox that did not start) is an ``"unavailable"`` result, and the env's ``step`` raises
``ToolUnavailableError`` for it. Everything here is real: real exceptions from real
connections, a real tool server, a real bubblewrap whose start is made to fail.
"""

import asyncio
import shutil
import socket
import stat
import uuid

import httpx
import pytest

from tests.helpers import BWRAP_INSTALL, missing_tool
from turnrl.envs.base import MultiTurnEnv, TurnOutcome
from turnrl.tools import ToolCall, ToolUnavailableError, calculator, execute_call, format_call, run_python, run_sync, tool
from turnrl.tools.executors import InProcessExecutor, Limits, SandboxExecutor, SandboxUnavailable
from turnrl.tools.executors.remote import RemoteExecutor, remote_tools
from turnrl.tools.serve import ToolServer


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@tool
def lookup(key: str) -> str:
    """Look a key up in a backend that is down for some keys.

    Args:
        key: "broken" (the tool says so), "refused" (a socket is refused), "http" (an HTTP
            call is refused), "bad" (the tool refuses the key), or any other key (echoed).
    """
    if key == "broken":
        raise ToolUnavailableError("lookup", "the index is being rebuilt")
    if key == "refused":
        socket.create_connection(("127.0.0.1", closed_port()), timeout=2).close()
    if key == "http":
        httpx.get(f"http://127.0.0.1:{closed_port()}/", timeout=2)
    if key == "bad":
        raise ValueError(f"no such key {key!r}")
    return key


def call(key):
    return execute_call(ToolCall("lookup", {"key": key}), {"lookup": lookup})


def test_a_tools_own_refusal_is_the_models_and_a_broken_backend_is_not():
    assert (call("ok").error, call("ok").content) == (None, "ok")
    bad = call("bad")
    assert bad.error == "exception" and bad.content == "Error: tool 'lookup' raised ValueError: no such key 'bad'"
    broken = call("broken")
    assert (broken.error, broken.content) == ("unavailable", "Error: tool 'lookup' is unavailable: the index is being rebuilt")
    refused = call("refused")
    assert refused.error == "unavailable" and "ConnectionRefusedError" in refused.content
    http = call("http")
    assert http.error == "unavailable" and "ConnectError" in http.content
    # the same on the in-process executor
    ex = InProcessExecutor(timeout_s=5)
    assert run_sync(ex.arun(lookup, ToolCall("lookup", {"key": "broken"}), "s")) == broken
    assert run_sync(ex.arun(lookup, ToolCall("lookup", {"key": "bad"}), "s")).error == "exception"


def test_the_error_of_an_unavailable_result_names_its_tool_and_reason():
    e = ToolUnavailableError.of(call("broken"))
    assert (e.tool, e.reason, str(e)) == ("lookup", "the index is being rebuilt",
                                          "tool 'lookup' is unavailable: the index is being rebuilt")


class Lookup(MultiTurnEnv):
    """Every turn calls tools; the env counts the turns it judged."""

    tools = (calculator, lookup)
    default_max_turns = 5

    def _new_task(self, rng, split):
        self.judged = 0
        return 0

    def _task_id(self, task):
        return "t"

    def _start_episode(self, task):
        return [{"role": "user", "content": "look things up"}]

    def _on_turn(self, action, parse, tool_results):
        self.judged += 1
        return TurnOutcome()

    def _state_key(self):
        return self.judged

    def expert_action(self):
        return ""


def turn(*calls):
    return "\n".join(format_call(c, "hermes") for c in calls)


SUM = ToolCall("calculator", {"expression": "1+2"})


def test_step_raises_for_an_infrastructure_failure_and_the_env_serves_after_reset():
    env = Lookup()
    env.reset(seed=0)
    obs, *_, info = env.step(turn(SUM, ToolCall("lookup", {"key": "bad"})))  # the model's: it goes on
    assert [m["content"] for m in obs] == ["3", "Error: tool 'lookup' raised ValueError: no such key 'bad'"]
    assert info["tool_errors"] == 1
    with pytest.raises(ToolUnavailableError) as raised:
        env.step(turn(SUM, ToolCall("lookup", {"key": "broken"}), ToolCall("lookup", {"key": "refused"})))
    assert (raised.value.tool, raised.value.reason) == ("lookup", "the index is being rebuilt")  # the first one
    assert env.judged == 1 and env.done  # the turn was not judged; the episode is over
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(turn(SUM))
    env.reset(seed=0)
    obs, *_ = env.step(turn(SUM))
    assert obs[0]["content"] == "3"
    env.reset(seed=0)
    with pytest.raises(ToolUnavailableError, match="ConnectError"):
        asyncio.run(env.astep(turn(ToolCall("lookup", {"key": "http"}))))
    env.close()


@tool
def double(x: int) -> int:
    """Double a number.

    Args:
        x: The number.
    """
    return 2 * x


def test_a_tool_server_that_is_gone_ends_the_step_and_one_that_refuses_the_call_does_not():
    with ToolServer([double]) as server:
        url = server.url
        remote = remote_tools(url)[0]
        env = Lookup(executor_options={"remote": {"url": url, "retries": 1, "backoff_s": 0.01}})
        env.tools = (remote,)
        env.reset(seed=0)
        obs, *_ = env.step(turn(ToolCall("double", {"x": 21})))
        assert obs[0]["content"] == "42"
        # arguments the server's schema refuses: the model's (the server answers 200 bad_arguments)
        obs, *_, info = env.step(turn(ToolCall("double", {"x": 1.5})))
        assert "bad arguments" in obs[0]["content"] and info["tool_errors"] == 1
    with pytest.raises(ToolUnavailableError, match=f"the tool service at {url} did not answer after 2 tries"):
        env.step(turn(ToolCall("double", {"x": 1})))
    env.close()


def test_a_tool_raising_unavailable_on_a_server_is_retried_then_unavailable():
    tries = []

    @tool
    def flaky(x: int) -> int:
        """Fail while the backend is down.

        Args:
            x: The number.
        """
        tries.append(x)
        raise ConnectionResetError("the backend hung up")

    with ToolServer([flaky]) as server:
        ex = RemoteExecutor(server.url, retries=2, backoff_s=0.01)
        r = run_sync(ex.arun(remote_tools(server.url)[0], ToolCall("flaky", {"x": 1}), "s"))
        ex.close()
        assert server.status_counts[503] == 3 and len(tries) == 3
        reply = httpx.post(f"{server.url}/call", json={"name": "flaky", "arguments": {"x": 2}}, trust_env=False)
        assert reply.status_code == 503 and reply.json() == {"error": {
            "message": "Error: tool 'flaky' is unavailable: ConnectionResetError: the backend hung up",
            "type": "unavailable", "code": 503, "param": None}}
    assert r.error == "unavailable" and "ConnectionResetError: the backend hung up" in r.content


def test_a_tool_server_at_a_wrong_url_ends_the_step_it_is_not_the_models_unknown_tool():
    """The env's tool URL names a path the server has no endpoint under: its 404 is no unknown
    tool the model could fix but the setup's failure, so ``step`` raises."""
    with ToolServer([double]) as server:
        remote = remote_tools(server.url)[0]
        url = f"{server.url}/tools"  # the list's URL where the root was meant
        env = Lookup(executor_options={"remote": {"url": url, "retries": 0}})
        env.tools = (remote,)
        env.reset(seed=0)
        with pytest.raises(ToolUnavailableError, match=r"answered POST /call with HTTP 404 \(no endpoint "
                                                       r"'/tools/call'.*the URL may be wrong") as raised:
            env.step(turn(ToolCall("double", {"x": 21})))
        assert raised.value.tool == "double" and server.status_counts[404] == 1
    env.close()


def test_a_sandbox_backstop_below_the_programs_wall_time_is_refused():
    with pytest.raises(ValueError, match=r"timeout_s=3.0 must exceed limits.wall_s=2 by at least 5.0 s.*set timeout_s >= 7.0"):
        SandboxExecutor({"wall_s": 2}, timeout_s=3)


# ------------------------------------------------------------- a sandbox that does not start

BROKEN = "bwrap: Creating new namespace failed: No space left on device"


@pytest.fixture
def flaky_bwrap(tmp_path):
    """A ``bwrap`` that runs the real one until its ``broken`` file exists, then fails as
    bubblewrap does when the machine's user namespaces run out. Yields (path, broken file)."""
    real = shutil.which("bwrap")
    if real is None:
        missing_tool("bubblewrap is not installed", BWRAP_INSTALL)
    broken = tmp_path / "broken"
    wrapper = tmp_path / "bwrap"
    wrapper.write_text(f'#!/bin/sh\nif [ -e "{broken}" ]; then echo "{BROKEN}" >&2; exit 1; fi\nexec {real} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper), broken


class Coder(Lookup):
    tools = (run_python,)


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["off", "call"])
def test_a_sandbox_that_does_not_start_is_unavailable_not_the_programs_failure(flaky_bwrap, pool):
    bwrap, broken = flaky_bwrap
    try:
        ex = SandboxExecutor(Limits(wall_s=5), bwrap=bwrap, run_as=None, pool=pool, pool_size=0)
    except SandboxUnavailable as e:
        missing_tool(f"bubblewrap sandbox unavailable: {e}", BWRAP_INSTALL)
    session = uuid.uuid4().hex
    code = ToolCall("run_python", {"code": "open('f', 'a').write('x'); print(open('f').read())"})
    try:
        assert run_sync(ex.arun(run_python, code, session)).content == "Exit code: 0\nstdout:\nx"
        broken.touch()
        r = run_sync(ex.arun(run_python, code, session))
        assert r.error == "unavailable" and "its sandbox did not start" in r.content and BROKEN in r.content
        broken.unlink()
        r = run_sync(ex.arun(run_python, code, session))  # the session's files are as the last real run left them
        assert r.content == "Exit code: 0\nstdout:\nxx"
    finally:
        ex.close()


@pytest.mark.slow
def test_an_env_whose_sandbox_does_not_start_raises_from_step(flaky_bwrap):
    bwrap, broken = flaky_bwrap
    try:
        env = Coder(executor_options={"sandbox": {"bwrap": bwrap, "run_as": None}})
    except SandboxUnavailable as e:
        missing_tool(f"bubblewrap sandbox unavailable: {e}", BWRAP_INSTALL)
    env.reset(seed=0)
    broken.touch()
    with pytest.raises(ToolUnavailableError, match="Creating new namespace failed"):
        env.step(turn(ToolCall("run_python", {"code": "print(1)"})))
    broken.unlink()
    env.reset(seed=0)
    obs, *_ = env.step(turn(ToolCall("run_python", {"code": "print(1)"})))
    assert obs[0]["content"] == "Exit code: 0\nstdout:\n1"
    env.close()
