"""The executor interface, the in-process executor and the env's executor wiring (real threads, real loop)."""

import asyncio
import threading
import time

import pytest

from turnrl.envs.base import MultiTurnEnv, TurnOutcome
from turnrl.tools import Tool, ToolCall, calculator, execute_call, get_executor, run_python, run_sync, tool
from turnrl.tools.executors import EXECUTORS, InProcessExecutor, Limits, Program, RunResult


class InFlight:
    """Counts concurrent calls of a real tool (the maximum seen is the concurrency bound)."""

    def __init__(self):
        self.now = self.max = 0
        self.lock = threading.Lock()

    def enter(self):
        with self.lock:
            self.now += 1
            self.max = max(self.max, self.now)

    def exit(self):
        with self.lock:
            self.now -= 1


def sleeper(counter: InFlight, seconds: float) -> Tool:
    def nap(x: int) -> str:
        """Sleep a while, then echo.

        Args:
            x: Value to echo.
        """
        counter.enter()
        try:
            time.sleep(seconds)
        finally:
            counter.exit()
        return f"slept {x}"

    return tool(nap)


def test_tool_decorator_keeps_plain_use_and_sets_executor():
    assert calculator.executor == "inprocess"
    assert run_python.executor == "sandbox"
    program = run_python.fn(code="print(1)")
    assert program == Program(("python3", "main.py"), {"main.py": "print(1)"})

    @tool(executor="sandbox")
    def shout(text: str) -> Program:
        """Echo loudly.

        Args:
            text: The text.
        """
        return Program(("echo", text.upper()))

    assert shout.executor == "sandbox" and shout.parameters["required"] == ["text"]
    with pytest.raises(TypeError, match="executor"):
        tool(executor="")


def test_program_and_limits_validate_input():
    with pytest.raises(ValueError, match="argv"):
        Program(())
    with pytest.raises(ValueError, match="relative"):
        Program(("python3",), {"/etc/passwd": "x"})
    with pytest.raises(ValueError, match="relative"):
        Program(("python3",), {"a/../../x": "x"})
    with pytest.raises(ValueError, match="cpu_s"):
        Limits(cpu_s=0)
    assert Limits.coerce({"cpu_s": 2}).cpu_s == 2
    with pytest.raises(ValueError, match="unknown Limits fields"):
        Limits.coerce({"cpu": 2})


def test_run_result_message_states_exit_code_output_and_limit():
    limits = Limits(cpu_s=5.0)
    hit = RunResult("partial", "", None, "cpu", 5.1, limits.explain("cpu"))
    assert "Exit code: killed" in hit.message()
    assert "more than 5.0 s of CPU time (limit cpu_s=5.0)" in hit.message()
    ok = RunResult("hi\n", "warn", 0, None, 0.1)
    assert ok.message() == "Exit code: 0\nstdout:\nhi\nstderr:\nwarn"
    long = RunResult("x" * 10_000, "", 0, None, 0.1).message()
    assert "characters cut" in long and len(long) < 5_000


def test_get_executor_shares_one_instance_per_kind_and_options():
    a = get_executor("inprocess", max_concurrency=3)
    assert get_executor("inprocess", max_concurrency=3) is a
    assert get_executor("inprocess", max_concurrency=4) is not a
    assert {"inprocess", "sandbox"} <= set(EXECUTORS)
    with pytest.raises(ValueError, match="valid executors"):
        get_executor("nope")


def test_inprocess_runs_exceptions_timeouts_and_refuses_code_tools():
    ex = InProcessExecutor(timeout_s=0.2)

    @tool
    def boom(x: int) -> int:
        """Fail.

        Args:
            x: Ignored.
        """
        raise ZeroDivisionError("no")

    ok = run_sync(ex.arun(calculator, ToolCall("calculator", {"expression": "6 * 7"}), "s"))
    assert (ok.content, ok.error) == ("42", None)
    err = run_sync(ex.arun(boom, ToolCall("boom", {"x": 1}), "s"))
    assert err.error == "exception" and "ZeroDivisionError: no" in err.content
    slow = sleeper(InFlight(), 1.0)
    t = time.monotonic()
    late = run_sync(ex.arun(slow, ToolCall("nap", {"x": 1}), "s"))  # a plain tool that hangs: not the model's fault
    assert late.error == "unavailable" and "took longer than 0.2 s" in late.content
    assert time.monotonic() - t < 0.9
    code = run_sync(ex.arun(run_python, ToolCall("run_python", {"code": "print(1)"}), "s"))
    assert code.error == "unavailable" and "cannot run in-process" in code.content  # the env's setup, not the call
    # the sync path refuses it the same way
    assert execute_call(ToolCall("run_python", {"code": "1"}), {"run_python": run_python}).error == "unavailable"
    ex.close()


def test_max_concurrency_bounds_calls_in_flight():
    counter = InFlight()
    nap = sleeper(counter, 0.15)
    ex = InProcessExecutor(max_concurrency=2)

    async def many():
        return await asyncio.gather(*(ex.arun(nap, ToolCall("nap", {"x": i}), f"s{i}") for i in range(6)))

    results = run_sync(many())
    assert [r.content for r in results] == [f"slept {i}" for i in range(6)]
    assert counter.max == 2
    ex.close()


class Napper(MultiTurnEnv):
    """A real env whose only tool sleeps; every turn calls it twice."""

    default_max_turns = 2

    def __init__(self, nap_tool: Tool, **kwargs):
        self.tools = (nap_tool,)
        super().__init__(**kwargs)

    def _new_task(self, rng, split):
        return int(rng.integers(100))

    def _task_id(self, task):
        return str(task)

    def _start_episode(self, task):
        return [{"role": "user", "content": "nap"}]

    def _on_turn(self, action, parse, tool_results):
        return TurnOutcome(terminated=True, success=all(r.ok for r in tool_results))

    def _state_key(self):
        return 0

    def expert_action(self):
        call = '<tool_call>\n{"name": "nap", "arguments": {"x": %d}}\n</tool_call>'
        return call % 1 + "\n" + call % 2


def test_env_runs_a_turns_calls_concurrently_and_keeps_their_order():
    counter = InFlight()
    env = Napper(sleeper(counter, 0.3), executor_options={"inprocess": {"max_concurrency": 5}})
    env.reset(seed=0)
    t = time.monotonic()
    obs, reward, terminated, _, info = env.step(env.expert_action() + '\n<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>')
    assert time.monotonic() - t < 0.6  # two 0.3 s calls overlapped (0.6 s one after the other)
    assert counter.max == 2
    assert [m["content"] for m in obs][:2] == ["slept 1", "slept 2"]
    assert "unknown tool 'nope'" in obs[2]["content"]
    assert info["tool_calls"] == 3 and info["tool_errors"] == 1


def test_env_astep_and_areset_await_on_a_callers_loop():
    counter = InFlight()
    envs = [Napper(sleeper(counter, 0.3)) for _ in range(4)]

    async def play():
        await asyncio.gather(*(e.areset(seed=i) for i, e in enumerate(envs)))
        return await asyncio.gather(*(e.astep(e.expert_action()) for e in envs))

    t = time.monotonic()
    results = asyncio.run(play())
    assert time.monotonic() - t < 1.0  # 8 calls of 0.3 s, overlapped across envs
    assert all(r[2] and r[4]["success"] for r in results)


def test_env_validates_executor_overrides():
    nap = sleeper(InFlight(), 0.0)
    with pytest.raises(ValueError, match="unknown tools \\['nope'\\].*tools: \\['nap'\\]"):
        Napper(nap, executors={"nope": "inprocess"})
    with pytest.raises(ValueError, match="valid executors"):
        Napper(nap, executors={"nap": "quantum"})
    with pytest.raises(ValueError, match="valid executors"):
        Napper(nap, executor_options={"quantum": {}})
    env = Napper(nap, executor_options={"inprocess": {"timeout_s": 7.0}})
    assert env.executor_for("nap").timeout_s == 7.0


def test_each_episode_is_a_new_session():
    env = Napper(sleeper(InFlight(), 0.0))
    env.reset(seed=0)
    first = env.session
    env.reset(seed=0)
    assert env.session != first and env.session.startswith("Napper-")
    assert Napper(sleeper(InFlight(), 0.0)).session is None
    env.close()
    assert env.session is None
