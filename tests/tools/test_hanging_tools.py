"""A plain tool that hangs never poisons the process: the in-process executor stays usable and
the process still exits.

The whole-process checks run a real script in a new interpreter: it calls a tool that never
returns (a sleep, a busy loop) more times than the executor runs at once, then the calculator,
then exits; the test asserts the calculator's answer, the exit status and the time it took.
"""

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from turnrl.tools import ToolCall, ToolUnavailableError, calculator, run_sync, tool
from turnrl.tools.executors import InProcessExecutor


def run_script(body: str, timeout_s: float = 60.0) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``body`` in a new interpreter; (the finished process, seconds it took). A process
    still alive after ``timeout_s`` fails the test (and is killed)."""
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(body)], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the script did not exit within {timeout_s} s; its output: {e.stdout!r} {e.stderr!r}")
    return done, time.monotonic() - start


HANG = {
    "sleep": "time.sleep(10 ** 6)",
    "busy": "while True: pass",
}


@pytest.mark.slow
@pytest.mark.parametrize("how", sorted(HANG))
def test_hung_calls_leave_the_executor_usable_and_the_process_exits(how):
    done, elapsed = run_script(f"""
        import time
        from turnrl.tools import ToolCall, calculator, run_sync, tool
        from turnrl.tools.executors import get_executor

        @tool
        def hang(x: int) -> str:
            \"\"\"Never return.

            Args:
                x: Ignored.
            \"\"\"
            {HANG[how]}

        ex = get_executor("inprocess", max_concurrency=2, timeout_s=1.0)
        for i in range(5):  # more hung calls than the executor runs at once
            r = run_sync(ex.arun(hang, ToolCall("hang", {{"x": i}}), "s"))
            print(r.error)
        # The calculator must answer inside the executor's own deadline (error None) even with
        # five abandoned busy loops still holding a share of the GIL; its wall time is not
        # asserted, since that share depends on the machine's load.
        r = run_sync(ex.arun(calculator, ToolCall("calculator", {{"expression": "1+2"}}), "s"))
        print(r.error, r.content)
        print("done", flush=True)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["unavailable"] * 5 + ["None 3", "done"]
    assert elapsed < 40, f"the script took {elapsed:.1f} s to exit"


@pytest.mark.slow
def test_an_env_whose_tool_hangs_raises_then_works_after_reset_and_the_process_exits():
    done, elapsed = run_script("""
        import time
        from turnrl.envs.base import MultiTurnEnv, TurnOutcome
        from turnrl.tools import ToolCall, ToolUnavailableError, calculator, format_call, tool

        @tool
        def hang(x: int) -> str:
            \"\"\"Never return.

            Args:
                x: Ignored.
            \"\"\"
            time.sleep(10 ** 6)

        class Env(MultiTurnEnv):
            tools = (calculator, hang)
            def _new_task(self, rng, split): return 0
            def _task_id(self, task): return "t"
            def _start_episode(self, task): return [{"role": "user", "content": "go"}]
            def _on_turn(self, action, parse, results): return TurnOutcome()
            def _state_key(self): return None
            def expert_action(self): return ""

        env = Env(max_turns=10, executor_options={"inprocess": {"max_concurrency": 2, "timeout_s": 0.3}})
        hang_call = format_call(ToolCall("hang", {"x": 1}), "hermes")
        for _ in range(4):
            env.reset(seed=0)
            try:
                env.step(hang_call)
            except ToolUnavailableError as e:
                print(type(e).__name__, e.tool)
        env.reset(seed=0)
        obs, *_ = env.step(format_call(ToolCall("calculator", {"expression": "1+2"}), "hermes"))
        print(obs[0]["content"])
        env.close()
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["ToolUnavailableError hang"] * 4 + ["3"]
    assert elapsed < 20, f"the script took {elapsed:.1f} s to exit"


@tool
def calc_slowly(expression: str) -> str:
    """Wait until released, then compute.

    Args:
        expression: What to compute.
    """
    RELEASE.wait()
    return calculator(expression=expression)


RELEASE = threading.Event()


@pytest.mark.slow
def test_stuck_calls_are_capped_then_the_executor_recovers_when_they_end():
    RELEASE.clear()
    ex = InProcessExecutor(max_concurrency=2, timeout_s=0.2, max_stuck=3)
    try:
        hung = [run_sync(ex.arun(calc_slowly, ToolCall("calc_slowly", {"expression": f"{i}"}), "s"))
                for i in range(3)]
        assert [r.error for r in hung] == ["unavailable"] * 3
        assert "took longer than 0.2 s" in hung[0].content and ex.stuck == 3
        start = time.monotonic()
        refused = run_sync(ex.arun(calculator, ToolCall("calculator", {"expression": "1+2"}), "s"))
        assert refused.error == "unavailable" and time.monotonic() - start < 0.1  # no thread started
        assert "3 calls of in-process tools hung" in refused.content and "max_stuck=3" in refused.content
        RELEASE.set()  # the stuck calls end: their threads go, and the executor serves again
        deadline = time.monotonic() + 5
        while ex.stuck and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ex.stuck == 0
        ok = run_sync(ex.arun(calculator, ToolCall("calculator", {"expression": "1+2"}), "s"))
        assert (ok.error, ok.content) == (None, "3")
    finally:
        RELEASE.set()
        ex.close()


def test_max_stuck_must_be_a_positive_int():
    with pytest.raises(ValueError, match="max_stuck must be a positive int"):
        InProcessExecutor(max_stuck=0)


def test_tool_unavailable_error_names_the_tool_and_the_reason():
    e = ToolUnavailableError("search", "the index server is down")
    assert (e.tool, e.reason) == ("search", "the index server is down")
    assert str(e) == "tool 'search' is unavailable: the index server is down"
