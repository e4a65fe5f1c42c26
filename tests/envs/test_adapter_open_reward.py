"""OpenRewardEnv against a real Open Reward Standard server: the ``openreward`` package's own
``Server`` serving an ``Environment`` written here (splits, tasks, ``@tool`` and ``@terminal``
tools, rewards), run by uvicorn in a subprocess on a free loopback port. Nothing is mocked: the
adapter speaks the standard's HTTP and SSE routes."""

from __future__ import annotations

import importlib.util
import re
import textwrap

import pytest

from tests.helpers import missing_tool, serve_script, short_grpo_run, stop_server
from turnrl.envs import check
from turnrl.envs.adapters import OpenRewardEnv
from turnrl.envs.adapters.served_tools import ProtocolError
from turnrl.tools import ToolCall, ToolUnavailableError, format_call

ORS_INSTALL = ("make install, which installs it with --no-deps: every openreward release pins sse-starlette==2.3.6, "
               "which mcp 2 rules out, and it runs on the newer one")


@pytest.fixture(autouse=True)
def _needs_openreward():
    """The test servers are the ``openreward`` package's own (skipped without it; failed under CI)."""
    if importlib.util.find_spec("openreward") is None:
        missing_tool("the openreward package (the ORS server) is not installed", ORS_INSTALL)

SERVER = textwrap.dedent('''
    """An ORS environment for turnrl's adapter tests: run as `python server.py PORT`."""
    import sys

    import uvicorn
    from pydantic import BaseModel
    from openreward.environments import Environment, Server, TextBlock, ToolOutput, terminal, tool

    WORDS = {"train": ["apple", "river", "stone", "cloud", "tiger", "maple", "ocean", "piano"],
             "test": ["robot", "lemon", "candle", "forest"]}


    class Answer(BaseModel):
        answer: str


    class Position(BaseModel):
        position: int


    class Mode(BaseModel):
        mode: str


    class ReverseWord(Environment):
        """Reverse the task's word; `letter` shows one letter of the answer; a plain message submits."""

        def __init__(self, task_spec={}, secrets={}):
            super().__init__(task_spec)
            self.word = task_spec["word"]

        @classmethod
        def list_splits(cls):
            return ["train", "test"]

        @classmethod
        def list_tasks(cls, split):
            return [{"word": w} for w in WORDS[split]]

        def get_prompt(self):
            return [TextBlock(text=f"Write the word {self.word} backwards.")]

        @tool
        def letter(self, params: Position) -> ToolOutput:
            """Show the letter at a position (0-based) of the reversed word."""
            answer = self.word[::-1]
            if not 0 <= params.position < len(answer):
                return ToolOutput(blocks=[TextBlock(text="out of range")], reward=-0.1)
            return ToolOutput(blocks=[TextBlock(text=answer[params.position])], reward=0.0)

        @tool
        def misbehave(self, params: Mode) -> ToolOutput:
            """Misbehave on purpose (for the tests)."""
            if params.mode == "raise":
                raise RuntimeError("the tool broke")
            if params.mode == "nul":
                return ToolOutput(blocks=[TextBlock(text="a\\x00b")])
            if params.mode == "image":
                return ToolOutput(blocks=[{"type": "image", "data": "AAAA", "mimeType": "image/png"}])
            return ToolOutput(blocks=[TextBlock(text="ok")])

        @terminal
        @tool
        def submit(self, params: Answer) -> ToolOutput:
            """Submit the reversed word."""
            right = params.answer.strip() == self.word[::-1]
            return ToolOutput(blocks=[TextBlock(text="correct" if right else "wrong")],
                              reward=1.0 if right else 0.0, finished=True)


    if __name__ == "__main__":
        uvicorn.run(Server([ReverseWord]).app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
''')


def serve(tmp_path_factory) -> tuple:
    return serve_script(tmp_path_factory.mktemp("ors"), SERVER, "/health")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc, url = serve(tmp_path_factory)
    yield url
    stop_server(proc)


def reverse_expert(env):
    """Ask for the first letter once, then write the answer (the terminal tool takes it)."""
    if env.history[-1]["role"] != "tool":
        return format_call(ToolCall("letter", {"position": 0}), env.tool_parser)
    return env.task_spec["word"][::-1]


class ReverseORS(OpenRewardEnv):
    """The server's env with its expert: what ``check-env module:ClassName --kwarg url=...`` builds."""

    def __init__(self, url, **kwargs):
        kwargs.setdefault("max_turns", 3)
        super().__init__(url, expert=reverse_expert, **kwargs)


@pytest.mark.slow
@pytest.mark.e2e
def test_tasks_splits_tools_and_rewards(server):
    env = ReverseORS(server)
    try:
        assert env.env_name == "reverseword" and env.splits == ("train", "test")
        assert [t.name for t in env.tools] == ["letter", "misbehave"]  # the terminal tool is not shown
        obs, info = env.reset(seed=0)
        word = re.fullmatch(r"Write the word (\w+) backwards\.", obs[0]["content"]).group(1)
        assert env.task_spec == {"word": word} and info["task_id"].startswith("reverseword/train/")
        assert [s["function"]["name"] for s in info["tools"]] == ["letter", "misbehave"]
        assert info["tools"][0]["function"]["parameters"] == {
            "type": "object", "properties": {"position": {"title": "Position", "type": "integer",
                                                          "description": "Position"}}, "required": ["position"]}
        obs, reward, terminated, _, info = env.step(format_call(ToolCall("letter", {"position": 0}), env.tool_parser))
        assert obs == ({"role": "tool", "content": word[-1]},) and reward == 0.0 and not terminated
        obs, reward, terminated, _, info = env.step(format_call(ToolCall("letter", {"position": 99}), env.tool_parser))
        assert obs == ({"role": "tool", "content": "out of range"},) and reward == pytest.approx(-0.1)
        obs, reward, terminated, _, info = env.step(word[::-1])  # no call: the terminal tool submits it
        assert obs == ({"role": "user", "content": "correct"},)
        assert (reward, terminated, info["success"]) == (1.0, True, True)

        test_words = {env.reset(seed=s, options={"split": "test"})[0][0]["content"].split()[3] for s in range(12)}
        assert test_words <= {"robot", "lemon", "candle", "forest"} and len(test_words) > 1
        env.reset(seed=1)
        obs, reward, terminated, _, info = env.step("nope")
        assert obs == ({"role": "user", "content": "wrong"},) and (reward, terminated, info["success"]) == (0.0, True,
                                                                                                          False)
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.e2e
def test_check_env_passes(server):
    env = ReverseORS(server)
    try:
        report = check(env, seeds=4)
        assert report.ok, report.format()
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.e2e
def test_calls_the_server_refuses_are_the_models_errors(server):
    env = ReverseORS(server)
    try:
        env.reset(seed=2)
        obs, reward, terminated, _, info = env.step(format_call(ToolCall("nope", {}), env.tool_parser))
        assert obs[0]["content"].startswith("Error: unknown tool 'nope'") and info["tool_errors"] == 1
        # a call the server itself refuses (its input validation): an error message, the episode goes on
        env.tools = tuple(t if t.name != "letter" else type(t)(t.name, t.description, {
            "type": "object", "properties": {"position": {"type": "string", "description": "p"}},
            "required": ["position"]}, t.fn) for t in env.tools)
        obs, reward, terminated, _, info = env.step(format_call(ToolCall("letter", {"position": "x"}), env.tool_parser))
        assert "Tool input validation error" in obs[0]["content"] and not terminated and info["tool_errors"] == 1
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("mode, problem", [
    ("raise", "the tool raised on the server: the tool broke"),
    ("nul", "holds characters no message can carry"),
    ("image", "is a 'image' block; a turnrl env takes text blocks only"),
])
def test_a_broken_tool_result_ends_the_episode_as_a_tool_error(server, mode, problem):
    env = ReverseORS(server, timeout_s=10)
    try:
        env.reset(seed=3)
        with pytest.raises(ToolUnavailableError, match=re.escape(problem)):
            env.step(format_call(ToolCall("misbehave", {"mode": mode}), env.tool_parser))
        env.reset(seed=3)  # a new session plays as usual
        assert env.step(env.task_spec["word"][::-1])[4]["success"]
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.e2e
def test_a_server_gone_mid_episode_ends_it_with_a_clear_error(tmp_path_factory):
    proc, url = serve(tmp_path_factory)
    env = ReverseORS(url, timeout_s=5)
    try:
        env.reset(seed=0)
        stop_server(proc)
        with pytest.raises(ProtocolError, match=r"tool 'submit' at http://127\.0\.0\.1:\d+: POST /reverseword/call "
                                                r"failed: ConnectError"):
            env.step("elppa")
        with pytest.raises(ProtocolError, match="reset at .*ConnectError"):
            env.reset(seed=0)
        with pytest.raises(ProtocolError, match="listing environments"):
            ReverseORS(url, timeout_s=2)
    finally:
        env.close()
        stop_server(proc)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="url must be an http"):
        OpenRewardEnv("127.0.0.1:8080")
    with pytest.raises(ValueError, match="timeout_s must be"):
        OpenRewardEnv("http://127.0.0.1:1", timeout_s=0)


@pytest.mark.slow
@pytest.mark.e2e
def test_a_short_grpo_run_trains_on_the_ors_env(server, tmp_path):
    short_grpo_run(f"{__name__}.ReverseORS", {"url": server, "max_turns": 2}, tmp_path)