"""Every env reads, describes and demonstrates the call format of the parser it is given; a
malformed call, a call in another format and a prompt in the wrong format are told, never silent."""

import warnings

import gymnasium
import pytest

from turnrl.envs import GuessNumberEnv, MultiTurnEnv, TurnOutcome, check
from turnrl.envs.base import PARSE_ERROR_PREFIX
from turnrl.tools import PARSERS, ToolCall, calculator, format_call, get_parser
from tests.helpers import env_ids_in_tiers

TOOL_ENVS = ("turnrl/CalcMath-v0", "turnrl/RetrievalQA-v0", "turnrl/PythonCoding-v0")
# Observations are printable ASCII (turnrl.envs.messages.CHARSET): a format whose markup is not
# (deepseek_v3's fullwidth special tokens) cannot be shown in a prompt, so envs are not tested with it.
ENV_PARSERS = sorted(p for p in PARSERS if format_call(ToolCall("a", {"x": 1}), p).isascii())
PAIRS = [(parser, written) for parser in ENV_PARSERS for written in ENV_PARSERS if written != parser]


def make(env_id, parser):
    return gymnasium.make(env_id, disable_env_checker=True, tool_parser=parser).unwrapped


@pytest.mark.slow
@pytest.mark.parametrize("parser", [p for p in ENV_PARSERS if p != "hermes"])  # hermes: test_check.py
@pytest.mark.parametrize("env_id", env_ids_in_tiers())
def test_every_env_passes_every_check_with_every_parser(env_id, parser):
    report = check(env_id, seeds=5, env_kwargs={"tool_parser": parser})
    assert report.ok, report.format()


@pytest.mark.parametrize("parser", ENV_PARSERS)
@pytest.mark.parametrize("env_id", TOOL_ENVS)
def test_the_prompt_shows_the_example_call_in_the_parsers_format(env_id, parser):
    env = make(env_id, parser)
    obs, _ = env.reset(seed=0)
    assert format_call(env.example_call(), parser) in obs[0]["content"]
    assert env.tools_prompt() in obs[0]["content"]
    env.close()


def cut_in_half(text):
    return text[: len(text) // 2]


def broken_json(text):
    return text.replace('"}', "}", 1)  # the last string argument loses its closing quote


def drop_last_char(text):
    return text[:-1]  # the closing tag (or the JSON's last brace) is cut


@pytest.mark.parametrize("damage", [cut_in_half, broken_json, drop_last_char])
@pytest.mark.parametrize("parser", ENV_PARSERS)
@pytest.mark.parametrize("env_id", TOOL_ENVS)
def test_a_malformed_call_is_told_with_the_reason_and_a_well_formed_call(env_id, parser, damage):
    env = make(env_id, parser)
    env.reset(seed=0)
    well_formed = format_call(env.example_call(), parser)
    action = damage(well_formed)
    if action == well_formed:
        pytest.skip(f"the {parser} format writes string arguments raw: no JSON string to break")
    parse = get_parser(parser)(action)
    assert parse.status == "malformed"
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs[0] == {"role": "user", "content": f"{PARSE_ERROR_PREFIX}{parse.error}.\nWrite a call like this:\n"
                                                 f"{well_formed}"}
    assert info["parse_error"] and info["tool_calls"] == 0 and reward == 0.0 and not terminated
    env.close()


def test_a_malformed_call_in_an_env_without_tools_is_told_too():
    env = GuessNumberEnv()
    env.reset(seed=0)
    action = '<tool_call>{"name": "guess"'
    obs, *_, info = env.step(action)
    reason = get_parser("hermes")(action).error
    assert obs[0]["content"] == f"{PARSE_ERROR_PREFIX}{reason}. No tools are available in this task."
    assert obs[1]["content"].startswith("Reply with one number") and info["parse_error"]


@pytest.mark.parametrize("parser, written", PAIRS)
@pytest.mark.parametrize("env_id", TOOL_ENVS)
def test_a_call_in_another_format_is_malformed_and_told(env_id, parser, written):
    """A model that writes calls in a format the env does not read (e.g. trained on another
    template) gets a parse error on every such turn: told to the model, counted in
    ``info["parse_error"]`` (the rollout's ``tool_parse_error_rate``, which the trainer warns about
    above 0.5), never an "absent" turn judged as an answer."""
    env = make(env_id, parser)
    env.reset(seed=0)
    action = format_call(env.example_call(), written)
    obs, reward, terminated, truncated, info = env.step(action)
    assert (info["parse_status"], info["parse_error"], info["tool_calls"]) == ("malformed", True, 0)
    own = get_parser(parser)(action)  # hermes reads the <tool_call> blocks of qwen3_coder and glm4 as bad JSON
    reason = own.error if own.status == "malformed" else (
        f"the call is written in the {written} format, but this task reads calls in the {parser} format")
    assert obs[0]["content"].startswith(f"{PARSE_ERROR_PREFIX}{reason}.\nWrite a call like this:\n")
    assert obs[0]["content"].endswith(format_call(env.example_call(), parser))
    assert reward == 0.0 and not terminated
    env.close()


@pytest.mark.parametrize("parser, written", PAIRS)
def test_an_episode_written_in_another_format_is_a_parse_error_every_turn(parser, written):
    """The calculator expert of a ``written`` env, played into a ``parser`` env (what a model
    trained on the other format does): every call turn is a parse error, none executes."""
    env, twin = make("turnrl/CalcMath-v0", parser), make("turnrl/CalcMath-v0", written)
    env.reset(seed=3)
    twin.reset(seed=3)
    infos = []
    for _ in range(2):  # the two calculator calls of the plan
        action = twin.expert_action()
        twin.step(action)
        infos.append(env.step(action)[-1])
    assert [info["parse_error"] for info in infos] == [True, True]
    assert infos[-1]["state_key"] == () and infos[-1]["tool_calls"] == 0  # nothing was computed


class HandWrittenPromptEnv(MultiTurnEnv):
    """The calculator with a prompt that hard-codes the hermes format instead of tools_prompt()."""

    tools = (calculator,)
    default_max_turns = 2

    def _new_task(self, rng, split):
        return int(rng.integers(2, 50)) * 2 + (split == "test")

    def _task_id(self, task):
        return str(task)

    def _start_episode(self, task):
        return [{"role": "system", "content": 'Call tools like this: <tool_call>{"name": "calculator", "arguments": '
                                              '{"expression": "1 + 1"}}</tool_call>'},
                {"role": "user", "content": f"What is {task} + 1?"}]

    def _on_turn(self, action, parse, tool_results):
        won = action.strip() == f"Answer: {self.task + 1}"
        return TurnOutcome(reward=float(won), terminated=not parse.calls, success=won)

    def _state_key(self):
        return self.task

    def expert_action(self):
        return f"Answer: {self.task + 1}"


def test_a_prompt_in_another_format_warns_at_the_first_reset_and_fails_the_check():
    env = HandWrittenPromptEnv(tool_parser="xml")
    with pytest.warns(UserWarning, match="opening messages show tool calls in the hermes format, but it parses "
                                         "calls with tool_parser='xml'.*self.tools_prompt()"):
        env.reset(seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env.reset(seed=1)  # once per env
    report = check(HandWrittenPromptEnv(tool_parser="xml"), seeds=3)
    assert report.failed == ["call_format"], report.format()
    assert "the opening messages show calls in the hermes format, but the env parses tool_parser='xml'" in (
        report.result("call_format").detail)
    assert "self.tools_prompt()" in report.result("call_format").fix
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check(HandWrittenPromptEnv(tool_parser="hermes"), seeds=3).ok
