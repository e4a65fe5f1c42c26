"""How an env gets its tools: a class attribute, ``@tool`` methods that read the episode's data,
or ``self.tools`` set before or after ``super().__init__()``; anything else is a clear error."""

import zlib

import pytest

from turnrl.envs import MultiTurnEnv, TurnOutcome, check
from turnrl.tools import ToolCall, ToolMethod, calculator, format_call, tool

TABLES = {"alpha": {"red": "7", "blue": "3"}, "beta": {"red": "1", "green": "9"},
          "gamma": {"blue": "4", "green": "2"}, "delta": {"red": "5", "green": "8"}}


class TableEnv(MultiTurnEnv):
    """Each task is a table of its own; the model looks a key up with the ``lookup`` tool."""

    default_max_turns = 3

    @tool
    def lookup(self, key: str) -> str:
        """Look a key up in this task's table.

        Args:
            key: A key of the table, e.g. "red".
        """
        return TABLES[self.task].get(key, f"no key {key!r}; the keys are {sorted(TABLES[self.task])}")

    def _new_task(self, rng, split):
        names = sorted(n for n in TABLES if (zlib.crc32(n.encode()) % 2 == 0) == (split == "test"))
        return names[int(rng.integers(len(names)))]

    def _task_id(self, task):
        return task

    def _start_episode(self, task):
        self.seen = None
        key = min(TABLES[task])
        return [{"role": "user", "content": f"Look up {key} in the table. Reply 'Answer: <value>'."}]

    def _on_turn(self, action, parse, tool_results):
        if parse.status != "absent":
            self.seen = tool_results[-1].content if tool_results else self.seen
            return TurnOutcome()
        won = action.strip() == f"Answer: {TABLES[self.task][min(TABLES[self.task])]}"
        return TurnOutcome(reward=float(won), terminated=True, success=won)

    def _state_key(self):
        return self.seen

    def expert_action(self):
        if self.seen is None:
            return format_call(ToolCall("lookup", {"key": min(TABLES[self.task])}), self.tool_parser)
        return f"Answer: {self.seen}"


def test_a_tool_method_reads_the_current_episode():
    assert isinstance(TableEnv.lookup, ToolMethod) and TableEnv.lookup.name == "lookup"
    env = TableEnv()
    assert [t.name for t in env.tools] == ["lookup"]
    assert env.tools[0].parameters["required"] == ["key"]  # self is not an argument
    answers = {}
    for seed in range(8):
        env.reset(seed=seed, options={"split": "train"})
        obs, *_ = env.step(format_call(ToolCall("lookup", {"key": "red"}), "hermes"))
        answers[env.task] = obs[0]["content"]
    assert answers == {name: TABLES[name].get("red", f"no key 'red'; the keys are {sorted(TABLES[name])}")
                       for name in answers} and len(answers) >= 2
    assert env.reset(seed=0)[1]["tools"] == [env.tools[0].schema()]
    assert check(TableEnv(tool_parser="xml"), seeds=4).ok


def test_listed_and_class_tools_come_first_then_the_methods():
    class Both(TableEnv):
        tools = (calculator,)

    assert [t.name for t in Both().tools] == ["calculator", "lookup"]

    class Ordered(TableEnv):
        tools = (TableEnv.lookup, calculator)  # a listed method keeps its place

    assert [t.name for t in Ordered().tools] == ["lookup", "calculator"]


def test_tools_set_after_init_are_offered_and_run():
    class Late(TableEnv):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.tools = (calculator,)

    env = Late()
    env.reset(seed=0)
    obs, *_, info = env.step(format_call(ToolCall("calculator", {"expression": "6 * 7"}), "hermes"))
    assert obs[0] == {"role": "tool", "content": "42"} and info["tool_errors"] == 0
    assert [t.name for t in env.tools] == ["calculator", "lookup"]
    assert env.executor_for("calculator") is env.executor_for("lookup")


def test_tools_set_before_init_and_executor_overrides_still_work():
    class Early(TableEnv):
        def __init__(self, **kwargs):
            self.tools = [calculator]  # any sequence: stored as a tuple
            super().__init__(**kwargs)

    env = Early(executors={"lookup": "inprocess"})
    assert isinstance(env.tools, tuple) and [t.name for t in env.tools] == ["calculator", "lookup"]
    with pytest.raises(ValueError, match=r"executors names unknown tools \['nope'\]"):
        Early(executors={"nope": "inprocess"})


@pytest.mark.parametrize("bad, message", [
    ((print,), "tools holds <built-in function print>, which is not a tool; decorate the function with @tool"),
    (calculator, "tools must be a tuple of tools"),
])
def test_something_that_is_not_a_tool_is_refused(bad, message):
    env = TableEnv()
    with pytest.raises(TypeError, match=message):
        env.tools = bad
    assert [t.name for t in env.tools] == ["lookup"]  # unchanged


def test_a_bad_tool_method_fails_when_the_class_is_defined():
    with pytest.raises(TypeError, match="tool 'lookup', parameter 'key': not documented"):
        class Undocumented(TableEnv):
            @tool
            def lookup(self, key: str) -> str:
                """Look a key up."""
                return key


def test_a_method_redefined_without_tool_is_no_longer_a_tool():
    class Plain(TableEnv):
        def lookup(self, key):
            return key

    assert Plain().tools == ()
