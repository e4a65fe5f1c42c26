"""MCPEnv against a real MCP server: the ``mcp`` package's own ``MCPServer`` (its tools, one of
them marked as the reward tool in its ``_meta``) served over streamable HTTP by uvicorn in a
subprocess on a free loopback port. Nothing is mocked: the adapter is the ``mcp`` package's client."""

from __future__ import annotations

import re
import sys
import textwrap

import pytest

pytest.importorskip("mcp.server.mcpserver", reason="the protocols extra (pip install 'turnrl[protocols]') is not installed")

from tests.helpers import free_port, serve_script, short_grpo_run, start_server, stop_server  # noqa: E402
from turnrl.envs import check  # noqa: E402
from turnrl.envs.adapters import MCPEnv  # noqa: E402
from turnrl.envs.adapters.served_tools import ProtocolError  # noqa: E402
from turnrl.tools import ToolCall, ToolUnavailableError, format_call  # noqa: E402

SERVER = textwrap.dedent('''
    """An MCP server for turnrl's adapter tests: run as `python server.py PORT`."""
    import sys

    import uvicorn
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("arithmetic")


    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b


    @server.tool(meta={"turnrl/reward": True})
    def grade(answer: str, target: int) -> float:
        """Grade a final answer (the reward tool: hidden from the model)."""
        return 1.0 if answer.strip() == str(target) else 0.0


    @server.tool()
    def misbehave(mode: str) -> str:
        """Misbehave on purpose (for the tests)."""
        if mode == "raise":
            raise RuntimeError("the tool broke")
        if mode == "nul":
            return "a\\x00b"
        return "ok"


    if __name__ == "__main__":
        uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
''')

TASKS = [{"prompt": f"What is {a} + {b}? Answer with the number only.", "a": a, "b": b, "target": a + b}
         for a, b in [(17, 25), (3, 9), (40, 2), (11, 11), (8, 30), (21, 5), (6, 7), (90, 9), (14, 14), (5, 55),
                      (12, 34), (7, 70)]]


def serve(tmp_path_factory) -> tuple:
    proc, url = serve_script(tmp_path_factory.mktemp("mcp"), SERVER, "/mcp")
    return proc, url + "/mcp"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc, url = serve(tmp_path_factory)
    yield url
    stop_server(proc)


def add_expert(env):
    """Call add with the task's numbers, then answer what it returned."""
    if env.history[-1]["role"] == "tool":
        return env.history[-1]["content"]
    return format_call(ToolCall("add", {"a": env.task["a"], "b": env.task["b"]}), env.tool_parser)


class ArithmeticMCP(MCPEnv):
    """The test's env definition: its tasks, the server's reward tool, its expert."""

    def __init__(self, url, **kwargs):
        kwargs.setdefault("max_turns", 3)
        super().__init__(url, TASKS, expert=add_expert, **kwargs)


@pytest.mark.slow
@pytest.mark.e2e
def test_tools_tasks_and_the_servers_reward_tool(server):
    env = ArithmeticMCP(server)
    try:
        assert env.reward_tool == "grade" and [t.name for t in env.tools] == ["add", "misbehave"]
        assert env.splits == ("train", "test") and env.tasks["test"]
        obs, info = env.reset(seed=0)
        a, b = env.task["a"], env.task["b"]
        assert obs == ({"role": "user", "content": f"What is {a} + {b}? Answer with the number only."},)
        assert [s["function"]["name"] for s in info["tools"]] == ["add", "misbehave"]
        assert info["tools"][0]["function"]["parameters"]["required"] == ["a", "b"]
        obs, reward, terminated, _, info = env.step(format_call(ToolCall("add", {"a": a, "b": b}), env.tool_parser))
        assert obs == ({"role": "tool", "content": str(a + b)},) and reward == 0.0 and not terminated
        assert info["state_key"] == (info["task_id"], 1)
        obs, reward, terminated, _, info = env.step(f" {a + b}\n")  # no call: the final answer, graded on the server
        assert (reward, terminated, info["success"]) == (1.0, True, True)
        env.reset(seed=0)
        assert env.step("12345")[1:3] == (0.0, True)
        # the reward tool is not the model's to call
        env.reset(seed=1)
        obs, *_ , info = env.step(format_call(ToolCall("grade", {"answer": "1", "target": 1}), env.tool_parser))
        assert obs[0]["content"].startswith("Error: unknown tool 'grade'") and info["tool_errors"] == 1
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.e2e
def test_a_verify_function_of_the_definition_gives_the_reward(server):
    env = MCPEnv(server, {"train": TASKS[:2], "test": TASKS[2:3]},
                 verify=lambda task, answer: answer == str(task["target"]), max_turns=2)
    try:
        assert env.reward_tool == "grade" and "grade" not in [t.name for t in env.tools]  # still hidden
        env.reset(seed=0, options={"split": "test"})
        assert env.task is not TASKS[2] and env.task == TASKS[2]
        assert env.step("42")[1:3] == (1.0, True)
        env.reset(seed=0)
        assert env.step("nope")[1:3] == (0.0, True)
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.e2e
def test_check_env_passes(server):
    env = ArithmeticMCP(server)
    try:
        report = check(env, seeds=4)
        assert report.ok, report.format()
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.e2e
def test_tool_failures_are_the_models_and_bad_results_end_the_episode(server):
    env = ArithmeticMCP(server, timeout_s=10)
    try:
        env.reset(seed=2)
        obs, reward, terminated, _, info = env.step(
            format_call(ToolCall("misbehave", {"mode": "raise"}), env.tool_parser))
        # the server reports the failure (an isError result, its text as the server words it) to the model
        assert obs == ({"role": "tool", "content": "Error: tool 'misbehave' raised ValueError: Error executing tool "
                                                   "misbehave"},)
        assert info["tool_errors"] == 1 and not terminated
        with pytest.raises(ToolUnavailableError, match="holds characters no message can carry"):
            env.step(format_call(ToolCall("misbehave", {"mode": "nul"}), env.tool_parser))
        env.reset(seed=2)  # a new session plays as usual
        assert env.step(str(env.task["target"]))[4]["success"]
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.e2e
def test_a_server_gone_mid_episode_ends_it_with_a_clear_error(tmp_path_factory):
    proc, url = serve(tmp_path_factory)
    env = ArithmeticMCP(url, timeout_s=5)
    try:
        env.reset(seed=0)
        stop_server(proc)
        with pytest.raises(ToolUnavailableError, match="tool 'add' is unavailable"):
            env.step(format_call(ToolCall("add", {"a": 1, "b": 2}), env.tool_parser))
        with pytest.raises(ProtocolError, match="opening a session"):
            env.reset(seed=0)
    finally:
        env.close()
        stop_server(proc)


def test_bad_definitions_are_refused():
    with pytest.raises(ValueError, match="url must be an http"):
        MCPEnv("127.0.0.1:8000/mcp", TASKS)
    with pytest.raises(ValueError, match="task #1 must be a mapping with a non-empty 'prompt'"):
        MCPEnv("http://127.0.0.1:1/mcp", [{"prompt": "x"}, {"question": "y"}])
    with pytest.raises(ValueError, match="tasks holds no train task"):
        MCPEnv("http://127.0.0.1:1/mcp", {"test": TASKS})


@pytest.mark.slow
@pytest.mark.e2e
def test_an_env_without_a_reward_is_refused(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mcp-plain")
    (folder / "server.py").write_text(SERVER.replace('meta={"turnrl/reward": True}', ""))
    port = free_port()
    proc = start_server([sys.executable, str(folder / "server.py"), str(port)], f"http://127.0.0.1:{port}/mcp",
                        folder / "server.log", cwd=folder)
    try:
        with pytest.raises(ValueError, match="the env needs a reward"):
            MCPEnv(f"http://127.0.0.1:{port}/mcp", TASKS)
        env = MCPEnv(f"http://127.0.0.1:{port}/mcp", TASKS, reward_tool="grade")  # named by the definition
        assert env.reward_tool == "grade" and [t.name for t in env.tools] == ["add", "misbehave"]
        env.close()
    finally:
        stop_server(proc)


@pytest.mark.slow
@pytest.mark.e2e
def test_a_short_grpo_run_trains_on_the_mcp_env(server, tmp_path):
    short_grpo_run(f"{__name__}.ArithmeticMCP", {"url": server, "max_turns": 2}, tmp_path)
    assert re.search(r"held-out success", (tmp_path / "summary.txt").read_text())