import json
import zlib

import pytest

from turnrl.envs import CalcMathEnv
from turnrl.envs.calc_math import FORMAT_REMINDER, Problem


def call(name="calculator", **arguments):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def fresh(seed=0, **kwargs):
    env = CalcMathEnv(**kwargs)
    obs, info = env.reset(seed=seed)
    return env, obs, info


def test_prompt_lists_tool_schema_and_formats():
    env, obs, info = fresh()
    system, user = obs
    assert system["role"] == "system" and user["role"] == "user"
    assert json.dumps(env.tools[0].schema()) in system["content"]
    example = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "37 * 24"}}\n</tool_call>'
    assert example in system["content"]
    assert "Answer: <number>" in system["content"]
    assert user["content"] == f"Compute {info['task_id']}."
    assert info["state_key"] == () and env.max_turns == 5
    assert CalcMathEnv(num_ops=1).max_turns == 4


def test_plan_respects_precedence():
    assert [s.expression for s in Problem((37, 24, 5), ("+", "*")).plan()] == ["24 * 5", "37 + 120"]
    assert [s.expression for s in Problem((37, 24, 5), ("-", "-")).plan()] == ["37 - 24", "13 - 5"]
    assert [s.expression for s in Problem((3, 24, 5), ("*", "-")).plan()] == ["3 * 24", "72 - 5"]
    assert Problem((37, 24, 5), ("-", "*")).answer == 37 - 24 * 5
    assert Problem((7, 9), ("*",)).text == "7 * 9"


def test_expert_episode_messages_and_state_keys():
    env, obs, info = fresh(seed=5)
    problem = env.task
    steps = problem.plan()
    for i, step in enumerate(steps):
        action = env.expert_action()
        assert action == call(expression=step.expression)
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs == ({"role": "tool", "content": str(step.value)},)
        assert info["state_key"] == tuple(s.value for s in steps[: i + 1])
        assert (info["tool_calls"], info["tool_errors"], info["parse_status"]) == (1, 0, "ok")
        assert reward == 0.0 and not terminated
    assert env.expert_action() == f"Answer: {problem.answer}"
    obs, reward, terminated, truncated, info = env.step(f"So the result is... Answer: {problem.answer}")
    assert obs == () and reward == 1.0 and terminated and info["success"] and info["turn"] == 3


def test_wrong_answer_terminates_without_reward():
    env, _, _ = fresh()
    obs, reward, terminated, truncated, info = env.step(f"Answer: {env.task.answer + 1}")
    assert reward == 0.0 and terminated and not truncated and not info["success"]


def test_no_call_no_answer_gets_format_reminder():
    env, _, _ = fresh()
    obs, reward, terminated, truncated, info = env.step("I think it is big.")
    assert obs == ({"role": "user", "content": 'Call the calculator tool or reply "Answer: <number>".'},)
    assert obs[0]["content"] == FORMAT_REMINDER
    assert info["parse_status"] == "absent" and not terminated


def test_answer_ignored_in_a_tool_call_turn():
    env, _, _ = fresh()
    obs, reward, terminated, *_ = env.step(call(expression="1 + 1") + f"\nAnswer: {env.task.answer}")
    assert obs == ({"role": "tool", "content": "2"},) and not terminated and reward == 0.0


@pytest.mark.parametrize(
    "action, expected, counters",
    [
        ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "1 +}\n</tool_call>',
         ("user", "Error: could not parse your tool call: tool call 1 is not valid JSON"), (0, 0, True)),
        ('<tool_call>\n{"name": "calculator"',
         ("user", "Error: could not parse your tool call: unclosed <tool_call>"), (0, 0, True)),
        (call("calc", expression="1 + 1"),
         ("tool", "Error: unknown tool 'calc'. Available tools: calculator."), (1, 1, False)),
        (call(expression=12),
         ("tool", "Error: bad arguments for tool 'calculator': "
                  "argument 'expression' must be string, got integer (12)."),
         (1, 1, False)),
        (call(expr="1 + 1"),
         ("tool", "Error: bad arguments for tool 'calculator': "
                  "unexpected argument 'expr'; the arguments are: expression."),
         (1, 1, False)),
        (call(expression="5 / 0"),
         ("tool", "Error: tool 'calculator' raised ValueError: division by zero in '5 / 0'"), (1, 1, False)),
        (call(expression="x * 2"),
         ("tool", "Error: tool 'calculator' raised ValueError: names are not allowed"), (1, 1, False)),
    ],
)
def test_malformed_calls_give_error_observation_and_continue(action, expected, counters):
    env, _, _ = fresh()
    obs, reward, terminated, truncated, info = env.step(action)
    assert len(obs) == 1 and obs[0]["role"] == expected[0] and obs[0]["content"].startswith(expected[1])
    assert (info["tool_calls"], info["tool_errors"], info["parse_error"]) == counters
    assert info["parse_status"] == ("malformed" if counters[2] else "ok")
    assert reward == 0.0 and not terminated and not truncated and info["state_key"] == ()
    # the episode continues and can still be solved
    while not env.done:
        *_, info = env.step(env.expert_action())
    assert info["success"]


def test_mixed_good_and_bad_calls_in_one_turn():
    env, _, _ = fresh()
    step = env.task.plan()[0]
    obs, *_, info = env.step(call(expression=step.expression) + call("nope"))
    assert [m["content"] for m in obs] == [str(step.value), "Error: unknown tool 'nope'. Available tools: calculator."]
    assert (info["tool_calls"], info["tool_errors"]) == (2, 1)
    assert info["state_key"] == (step.value,)


def test_split_is_crc32_bucket():
    env = CalcMathEnv()
    for split in ("train", "test"):
        for seed in range(30):
            _, info = env.reset(seed=seed, options={"split": split})
            in_test = zlib.crc32(info["task_id"].encode()) % 5 == 0
            assert in_test == (split == "test")
            a, op1, b, op2, c = info["task_id"].split()
            assert op1 in "+-*" and op2 in "+-*" and all(2 <= int(x) <= 99 for x in (a, b, c))


def test_one_op_variant_and_small_operands():
    env = CalcMathEnv(num_ops=1, max_operand=9)
    _, info = env.reset(seed=2)
    a, op, b = info["task_id"].split()
    assert 2 <= int(a) <= 9 and 2 <= int(b) <= 9
    with pytest.raises(ValueError, match="num_ops"):
        CalcMathEnv(num_ops=3)
