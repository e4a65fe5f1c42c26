"""OpenEnvEnv against real OpenEnv servers: ``openenv-core``'s own ``create_fastapi_app`` serving
envs written here with its ``Environment``, ``Action`` and ``Observation`` classes (and its MCP
action types for the tool-using one), run by uvicorn in a subprocess on a free loopback port.
Nothing is mocked: the adapter speaks the server's WebSocket protocol."""

from __future__ import annotations

import re
import textwrap

import pytest

pytest.importorskip("openenv.core", reason="the protocols extra (pip install 'turnrl[protocols]') is not installed")

from tests.helpers import serve_script, short_grpo_run, stop_server  # noqa: E402
from turnrl.cli import main  # noqa: E402
from turnrl.envs import check  # noqa: E402
from turnrl.envs.adapters import OpenEnvEnv  # noqa: E402
from turnrl.envs.adapters.served_tools import ProtocolError  # noqa: E402
from turnrl.tools import ToolCall, ToolUnavailableError, format_call  # noqa: E402

SERVER = textwrap.dedent('''
    """OpenEnv envs for turnrl's adapter tests: run as `python server.py {text,tools} PORT`."""
    import sys
    import time
    from typing import Any

    import uvicorn
    from openenv.core.env_server.http_server import create_fastapi_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.mcp_types import (CallToolAction, CallToolObservation, ListToolsAction,
                                                   ListToolsObservation, Tool, ToolError, ToolErrorType)
    from openenv.core.env_server.types import Action, Observation, State

    WORDS = ["apple", "river", "stone", "cloud", "tiger", "maple", "ocean", "piano", "robot", "lemon",
             "candle", "forest", "garden", "hammer", "island", "jungle", "kitten", "ladder", "mirror", "needle"]


    class ReverseAction(Action):
        message: str


    class ReverseObservation(Observation):
        text: str
        reward: Any = None  # so that a reply may carry a reward that is no number


    class ReverseEnv(Environment):
        """Reverse a word in 3 tries. Hostile replies on purpose: 'prize' (a reward that is a string), 'nul' (a NUL
        in the text), 'boom' (the env raises), 'hang' (no reply for 6 s)."""

        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            super().__init__()
            self.word, self.tries, self._state = "", 0, State()

        def reset(self, seed=None, episode_id=None, **kwargs):
            self.word, self.tries = WORDS[(seed or 0) % len(WORDS)], 0
            self._state = State(episode_id=episode_id, step_count=0)
            return ReverseObservation(text=f"Reverse the word: {self.word}")

        def step(self, action, timeout_s=None, **kwargs):
            self.tries += 1
            self._state.step_count += 1
            if action.message == "prize":
                return ReverseObservation(text="hm", reward="a lot")
            if action.message == "nul":
                return ReverseObservation(text="a\\x00b")
            if action.message == "boom":
                raise RuntimeError("the env broke")
            if action.message == "hang":
                time.sleep(6)
            if action.message == self.word[::-1]:
                return ReverseObservation(text="correct", reward=1.0, done=True)
            left = 3 - self.tries
            return ReverseObservation(text=f"wrong, {left} tries left", reward=0.0, done=left == 0)

        @property
        def state(self):
            return self._state


    ADD = Tool(name="add", description="Add two integers.",
               input_schema={"type": "object", "properties": {"a": {"type": "integer", "description": "first"},
                                                                "b": {"type": "integer", "description": "second"}},
                             "required": ["a", "b"]})
    SUBMIT = Tool(name="submit", description="Submit the final sum; ends the episode.",
                  input_schema={"type": "object", "properties": {"answer": {"type": "integer",
                                                                            "description": "the sum"}},
                                "required": ["answer"]})


    class AddEnv(Environment):
        """MCP-shaped (RFC 003): the model adds two numbers with the add tool and submits the sum."""

        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            super().__init__()
            self.a = self.b = 0
            self._state = State()

        def reset(self, seed=None, episode_id=None, **kwargs):
            seed = seed or 0
            self.a, self.b = 10 + seed % 89, 100 + (seed // 89) % 899
            return Observation(metadata={"a": self.a})

        def step(self, action, timeout_s=None, **kwargs):
            if isinstance(action, ListToolsAction):
                return ListToolsObservation(tools=[ADD, SUBMIT])
            assert isinstance(action, CallToolAction)
            args = action.arguments
            if action.tool_name == "add":
                return CallToolObservation(tool_name="add", result=args["a"] + args["b"], reward=0.0)
            if action.tool_name == "submit":
                right = args["answer"] == self.a + self.b
                return CallToolObservation(tool_name="submit", result="right" if right else "wrong",
                                           reward=1.0 if right else 0.0, done=True)
            return CallToolObservation(tool_name=action.tool_name, error=ToolError(
                error_type=ToolErrorType.TOOL_NOT_FOUND, message=f"no tool {action.tool_name}"))

        @property
        def state(self):
            return self._state


    class PromptObservation(Observation):
        prompt: str


    class AddPromptEnv(AddEnv):
        def reset(self, seed=None, episode_id=None, **kwargs):
            super().reset(seed=seed)
            return PromptObservation(prompt=f"What is {self.a} + {self.b}? Use the tools.")


    if __name__ == "__main__":
        kind, port = sys.argv[1], int(sys.argv[2])
        app = (create_fastapi_app(ReverseEnv, ReverseAction, ReverseObservation, max_concurrent_envs=64)
               if kind == "text" else create_fastapi_app(AddPromptEnv, Action, Observation, max_concurrent_envs=64))
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
''')


def serve(tmp_path_factory, kind: str) -> tuple:
    return serve_script(tmp_path_factory.mktemp(f"openenv-{kind}"), SERVER, "/health", kind)


@pytest.fixture(scope="module")
def text_server(tmp_path_factory):
    proc, url = serve(tmp_path_factory, "text")
    yield url
    stop_server(proc)


@pytest.fixture(scope="module")
def tools_server(tmp_path_factory):
    proc, url = serve(tmp_path_factory, "tools")
    yield url
    stop_server(proc)


def reverse_expert(env):
    return env.observation["text"].rsplit(" ", 1)[-1][::-1]


def add_expert(env):
    """Call add with the prompt's numbers, then submit what it returned."""
    if env.history[-1]["role"] == "tool":
        return format_call(ToolCall("submit", {"answer": int(env.history[-1]["content"])}), env.tool_parser)
    a, b = map(int, re.findall(r"\d+", env.history[-1]["content"]))
    return format_call(ToolCall("add", {"a": a, "b": b}), env.tool_parser)


class ReverseOpenEnv(OpenEnvEnv):
    """The text server's env with its expert: what ``check-env module:ClassName --kwarg url=...`` builds."""

    def __init__(self, url, **kwargs):
        super().__init__(url, expert=reverse_expert, system_prompt="Reverse the word.", **kwargs)


class AddOpenEnv(OpenEnvEnv):
    def __init__(self, url, **kwargs):
        kwargs.setdefault("max_turns", 4)
        super().__init__(url, expert=add_expert, **kwargs)


# ------------------------------------------------------------------ text env
@pytest.mark.slow
@pytest.mark.e2e
def test_text_env_episode_reset_step_and_reward(text_server):
    env = ReverseOpenEnv(text_server, split_fn=None)
    try:
        assert env.action_field == "message" and not env.uses_tools and env.tools == ()
        obs, info = env.reset(seed=0)
        word = obs[-1]["content"].rsplit(" ", 1)[-1]
        assert obs[0] == {"role": "system", "content": "Reverse the word."}
        assert info["tools"] == [] and info["task_id"].startswith("127.0.0.1:") and info["turn"] == 0
        obs, reward, terminated, truncated, info = env.step("  zz \n")
        assert obs == ({"role": "user", "content": "wrong, 2 tries left"},)
        assert (reward, terminated, truncated, info["success"]) == (0.0, False, False, False)
        assert info["state_key"] == "wrong, 2 tries left"
        obs, reward, terminated, truncated, info = env.step(word[::-1])
        assert obs == ({"role": "user", "content": "correct"},)
        assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
        again, _ = env.reset(seed=0)  # same seed, same task
        assert again[-1]["content"].endswith(word)
        for _ in range(3):
            *_, terminated, truncated, info = env.step("zz")
        assert terminated and not info["success"]  # the server ended it: three wrong tries
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.e2e
def test_check_env_passes_on_the_text_env(text_server):
    env = ReverseOpenEnv(text_server)
    try:
        report = check(env, seeds=5)
        assert report.ok, report.format()
    finally:
        env.close()
    code = main(["check-env", f"{__name__}:ReverseOpenEnv", "--kwarg", f"url={text_server}", "--seeds", "3"])
    assert code == 0


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("reply, problem", [
    ("prize", "reward must be a number or null, got str 'a lot'"),
    ("nul", "holds characters no message can carry"),
    ("boom", "the server answered an error: 'the env broke'"),
])
def test_a_bad_server_reply_ends_the_episode_with_a_clear_error(text_server, reply, problem):
    env = ReverseOpenEnv(text_server, timeout_s=5)
    try:
        env.reset(seed=1)
        with pytest.raises(ProtocolError, match=re.escape(problem)) as raised:
            env.step(reply)
        assert raised.value.url == text_server and raised.value.what == "step"
        obs, _ = env.reset(seed=1)  # the next episode plays as usual
        assert env.step(reverse_expert(env))[2]
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.e2e
def test_a_server_that_does_not_answer_times_out_and_the_next_reset_reconnects(text_server):
    env = ReverseOpenEnv(text_server, timeout_s=1.5)
    try:
        env.reset(seed=2)
        with pytest.raises(ProtocolError, match="no reply within timeout_s=1.5"):
            env.step("hang")
        env.reset(seed=2)  # a new WebSocket session
        assert env.step(reverse_expert(env))[4]["success"]
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.e2e
def test_a_server_gone_mid_episode_ends_it_and_a_non_server_is_refused(tmp_path_factory):
    proc, url = serve(tmp_path_factory, "text")
    env = ReverseOpenEnv(url, timeout_s=5)
    try:
        env.reset(seed=3)
        stop_server(proc)
        with pytest.raises(ProtocolError, match="the server is gone"):
            env.step("abc")
        with pytest.raises(ProtocolError, match="GET /schema"):
            ReverseOpenEnv(url, timeout_s=2)
    finally:
        env.close()
        stop_server(proc)


# ----------------------------------------------------------------- tools env
@pytest.mark.slow
@pytest.mark.e2e
def test_mcp_shaped_env_tools_calls_and_rewards(tools_server):
    env = AddOpenEnv(tools_server, split_fn=None)
    try:
        assert env.uses_tools and env.action_field is None
        assert [t.name for t in env.tools] == ["add", "submit"]
        obs, info = env.reset(seed=5)
        a, b = map(int, re.fullmatch(r"What is (\d+) \+ (\d+)\? Use the tools\.", obs[0]["content"]).groups())
        assert [s["function"]["name"] for s in info["tools"]] == ["add", "submit"]
        assert info["tools"][0]["function"]["parameters"]["required"] == ["a", "b"]
        call = format_call(ToolCall("add", {"a": a, "b": b}), env.tool_parser)
        obs, reward, terminated, _, info = env.step(call)
        assert obs == ({"role": "tool", "content": str(a + b)},) and reward == 0.0 and not terminated
        assert info["tool_calls"] == 1 and info["tool_errors"] == 0
        obs, reward, *_ = env.step(f"the answer is {a + b}")  # no call: told how the task is played
        assert obs == ({"role": "user", "content": "Play this task by calling one of its tools."},) and reward == 0.0
        obs, reward, terminated, _, info = env.step(format_call(ToolCall("submit", {"answer": a + b}), env.tool_parser))
        assert obs == ({"role": "tool", "content": "right"},)
        assert (reward, terminated, info["success"]) == (1.0, True, True)

        env.reset(seed=6)
        bad = format_call(ToolCall("add", {"a": "x", "b": 1}), env.tool_parser)  # refused before it is sent
        obs, reward, terminated, _, info = env.step(bad)
        assert "bad arguments for tool 'add'" in obs[0]["content"] and info["tool_errors"] == 1 and not terminated
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.e2e
def test_check_env_passes_on_the_mcp_shaped_env(tools_server):
    env = AddOpenEnv(tools_server)
    try:
        report = check(env, seeds=4)
        assert report.ok, report.format()
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.e2e
def test_a_tool_server_gone_mid_call_is_a_tool_error(tmp_path_factory):
    proc, url = serve(tmp_path_factory, "tools")
    env = AddOpenEnv(url, timeout_s=5)
    try:
        env.reset(seed=1)
        stop_server(proc)
        with pytest.raises(ToolUnavailableError, match="tool 'add' is unavailable"):
            env.step(format_call(ToolCall("add", {"a": 1, "b": 2}), env.tool_parser))
    finally:
        env.close()
        stop_server(proc)


def test_bad_arguments_are_refused_before_connecting():
    with pytest.raises(ValueError, match="url must be an http"):
        OpenEnvEnv("ws://127.0.0.1:1")
    with pytest.raises(ValueError, match="tools must be"):
        OpenEnvEnv("http://127.0.0.1:1", tools="yes")


# ------------------------------------------------------------------ training
@pytest.mark.slow
@pytest.mark.e2e
def test_a_short_grpo_run_trains_on_the_openenv_env(text_server, tmp_path):
    short_grpo_run(f"{__name__}.ReverseOpenEnv", {"url": text_server, "max_turns": 2}, tmp_path, max_new_tokens=8)