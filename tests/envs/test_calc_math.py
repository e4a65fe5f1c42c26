import json
import zlib

import pytest

from turnrl.envs import CalcMathEnv
from turnrl.envs.tasks.calc_math import FORMAT_REMINDER, Problem
from turnrl.tools import calculator


def call(name="calculator", **arguments):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def fresh(seed=0, **kwargs):
    env = CalcMathEnv(**kwargs)
    obs, info = env.reset(seed=seed)
    return env, obs, info


def test_prompt_states_the_task_and_info_gives_the_tool():
    env, obs, info = fresh()
    system, user = obs
    assert system["role"] == "system" and user["role"] == "user"
    assert info["tools"] == [env.tools[0].schema()] == [calculator.schema()]
    assert json.dumps(env.tools[0].schema()) not in system["content"] and "<tool_call>" not in system["content"]
    assert system["content"] == ("You solve arithmetic with the calculator tool.\n"
                                 "Use one call per operation. When you are done, reply: Answer: <number>")
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


# ------------------------------------------------------------ word problems
import math  # noqa: E402
import re  # noqa: E402

from turnrl.envs.baselines import play_episode  # noqa: E402
from turnrl.envs.tasks.calc_math import STORIES, Term, word_problem  # noqa: E402

STORY = {s.name: s for s in STORIES}
LOSS_WORDS = ("sells", "gives away", "loses", "taken out", "falls", "back toward", "younger")


def read_story(text):
    """An independent reader of the stories: numbers in one sentence multiply; a sentence is a
    loss when it says so; "times as old" multiplies the running total."""
    total = None
    for sentence in re.split(r"(?<=[.?])\s+", text):
        numbers = [int(x) for x in re.findall(r"\d+", sentence)]
        if not numbers:
            continue
        if "times as old" in sentence:
            total *= numbers[0]
        elif total is None:
            total = math.prod(numbers)
        elif any(w in sentence for w in LOSS_WORDS):
            total -= math.prod(numbers)
        else:
            total += math.prod(numbers)
    return total


def test_terms_follow_standard_precedence():
    assert Problem((37, 24, 5), ("-", "*")).terms() == (Term("+", (37,)), Term("-", (24, 5)))
    assert Problem((37, 24, 5), ("*", "+")).terms() == (Term("+", (37, 24)), Term("+", (5,)))
    assert Problem((37, 24, 5), ("-", "-")).terms() == (Term("+", (37,)), Term("-", (24,)), Term("-", (5,)))
    assert Problem((3, 4, 5), ("*", "*")).terms() == (Term("+", (3, 4, 5)),)
    for ops in [(a, b) for a in "+-*" for b in "+-*"]:
        problem = Problem((37, 24, 5), ops)
        assert sum(t.value for t in problem.terms()) == problem.answer


def test_stories_by_hand():
    p = Problem((37, 24, 5), ("*", "-"))
    assert STORY["shop"].render(p.terms()) == (
        "A shop has 37 boxes with 24 pens each. It sells 5 pens. How many pens does the shop have now?")
    p = Problem((37, 24, 5), ("+", "*"))
    assert STORY["distance"].render(p.terms()) == (
        "A truck leaves its depot and drives 37 km along a straight road. Then it drives 24 hours at 5 km "
        "per hour further along the road. How many km from the depot is the truck now?")
    p = Problem((7, 9, 5), ("*", "-"))
    assert STORY["ages"].render(p.terms()) == (
        "Ana is 7 years old. Ben is 9 times as old as Ana. Cleo is 5 years younger than Ben. How old is Cleo?")
    p = Problem((5, 37), ("-",))
    assert STORY["shop"].render(p.terms()) is None  # a shop cannot sell more pens than it has
    assert STORY["ages"].render(p.terms()) is None
    assert STORY["account"].render(p.terms()) == (
        "An account receives 5 dollars. Then 37 dollars are taken out. "
        "What is the balance of the account now (negative if overdrawn)?")
    assert STORY["temperature"].render(Problem((5, 3), ("*",)).terms()) is None  # no groups of degrees
    assert STORY["ages"].render(Problem((5, 3, 2), ("+", "*")).terms()) is None  # would read as (5 + 3) * 2
    assert STORY["ages"].render(Problem((60, 3), ("*",)).terms()) is None  # 180 years old


@pytest.mark.slow
@pytest.mark.parametrize("num_ops", [1, 2])
def test_word_problems_keep_the_problem_and_precedence(num_ops):
    expression, word = CalcMathEnv(num_ops=num_ops), CalcMathEnv(num_ops=num_ops, style="word")
    used = set()
    for split in ("train", "test"):
        for seed in range(400):
            obs_e, info_e = expression.reset(seed=seed, options={"split": split})
            obs_w, info_w = word.reset(seed=seed, options={"split": split})
            problem, text = word.task, obs_w[1]["content"]
            assert problem == expression.task and info_w == info_e
            assert text == word_problem(problem) and not text.startswith("Compute")
            assert [int(x) for x in re.findall(r"\d+", text)] == list(problem.operands)
            assert read_story(text) == problem.answer, text
            used.update(s.name for s in STORIES if s.render(problem.terms()) == text)
    assert used == set(STORY)  # every story is used


def test_word_style_episode_is_the_expression_episode():
    word, expression = CalcMathEnv(style="word"), CalcMathEnv()
    for seed in range(50):
        obs_w, _ = word.reset(seed=seed, options={"split": "test"})
        expression.reset(seed=seed, options={"split": "test"})
        assert obs_w[0]["content"].startswith("You solve arithmetic word problems with the calculator tool.\n")
        while not word.done:
            action = word.expert_action()
            assert action == expression.expert_action()
            assert word.step(action) == expression.step(action)  # same observations, rewards and infos
        assert word.max_turns == 5 and expression.done
    for seed in range(100):
        assert play_episode(word, seed, "expert", "train")[0]
    with pytest.raises(ValueError, match="style must be one of"):
        CalcMathEnv(style="story")


def test_default_style_is_unchanged():
    env, obs, info = fresh(seed=1)
    assert env.style == "expression" and obs[1]["content"] == f"Compute {info['task_id']}."
    assert obs[0]["content"].startswith("You solve arithmetic with the calculator tool.\n")


def test_calc_word_hydra_group_builds_the_word_style_env():
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from turnrl.train.factories import env_factory
    from turnrl.conf.schema import register_configs

    register_configs()
    with initialize_config_module(config_module="turnrl.conf", version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name="config", overrides=["env=calc_word"]))
    env = env_factory(cfg)()
    obs, _ = env.reset(seed=0)
    assert env.unwrapped.style == "word" and obs[1]["content"] == word_problem(env.unwrapped.task)
