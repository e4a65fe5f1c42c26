"""``turnrl.envs.check``: passes on every registered env, reports (never raises) broken envs."""

import warnings

import pytest

from turnrl.envs import GuessNumberEnv, MultiTurnEnv, TurnOutcome, check
from turnrl.envs.check import CHECK_NAMES, CheckReport, UnknownEnvError
from turnrl.envs.extract import first_int
from turnrl.tools import Tool
from tests.helpers import env_ids_in_tiers


class SloppyEnv(MultiTurnEnv):
    """Say back a number, with three planted bugs: the system prompt counts episodes (so two
    resets with one seed differ), the expert is off by one on multiples of 3, and the task
    ignores the split (so train and test share task_ids)."""

    default_max_turns = 1

    def __init__(self):
        super().__init__()
        self.episodes = 0

    def _new_task(self, rng, split):
        return int(rng.integers(0, 30))

    def _task_id(self, task):
        return f"say-{task}"

    def _start_episode(self, task):
        self.episodes += 1
        return [{"role": "system", "content": f"Episode {self.episodes}."},
                {"role": "user", "content": f"Say {task}."}]

    def _on_turn(self, action, parse, tool_results):
        success = first_int(action) == self.task
        return TurnOutcome(reward=float(success), terminated=True, success=success)

    def _state_key(self):
        return self.task

    def expert_action(self):
        return str(self.task + 1 if self.task % 3 == 0 else self.task)


def sloppy_task(env, seed):
    """The task ``SloppyEnv`` draws for ``seed`` (in either split)."""
    env.reset(seed=seed)
    return env.task


def _lookup(key: str) -> str:
    return key


BAD_TOOL = Tool(
    name="look up", description="",
    parameters={"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key", "table"]},
    fn=_lookup,
)


class BadToolEnv(GuessNumberEnv):
    """GuessNumber with a hand-built tool whose schema is invalid in four ways (its prompt, rightly,
    does not show how to call it: the tools come through info['tools'])."""

    tools = (BAD_TOOL,)


class NoExpertEnv(GuessNumberEnv):
    """GuessNumber whose expert is not written yet."""

    def expert_action(self):
        raise NotImplementedError("expert not written yet")


class WarningEnv(GuessNumberEnv):
    """GuessNumber that warns on every reset."""

    def _start_episode(self, task):
        warnings.warn("the opening prompt will change in v1", FutureWarning)
        return super()._start_episode(task)


@pytest.mark.slow
@pytest.mark.parametrize("env_id", env_ids_in_tiers())
def test_every_registered_env_passes(env_id):
    report = check(env_id, seeds=15)
    assert [r.name for r in report.results] == list(CHECK_NAMES)
    assert report.ok, report.format()
    assert report.format().splitlines()[-1] == f"{len(CHECK_NAMES)}/{len(CHECK_NAMES)} checks passed: OK"


def test_env_kwargs_reach_the_env():
    report = check("turnrl/GuessNumber-v0", seeds=10, env_kwargs={"n": 16, "n_min": 8, "max_turns": 5})
    assert report.ok, report.format()


def test_sloppy_env_failures_are_reported_with_their_seeds():
    env = SloppyEnv()
    report = check(env, seeds=12)
    assert isinstance(report, CheckReport) and not report.ok and report.env_id == "SloppyEnv"
    # gymnasium's checker compares reset observations only for envs with a spec: ours catches it.
    assert set(report.failed) == {"seed_determinism", "expert_solves", "splits_disjoint"}
    assert all(report.result(name).passed for name in ("gymnasium_check_env", "tool_schemas", "chat_roundtrip"))

    determinism = report.result("seed_determinism").detail
    assert "train seeds [0, 1, 2, 3, 4]" in determinism
    assert "seed 0 (train): reset observation message 0 differs: {'role': 'system', 'content': 'Episode" in determinism

    wrong = [seed for seed in range(12) if sloppy_task(env, seed) % 3 == 0]  # the same in both splits
    assert wrong
    expert = report.result("expert_solves")
    assert f"train seeds {wrong} ({len(wrong)}/12); test seeds {wrong} ({len(wrong)}/12)" in expert.detail
    assert "success=False" in expert.detail and "expert_action()" in expert.fix

    text = report.format()
    for name in report.failed:
        assert f"FAIL  {name}" in text
    assert "PASS  tool_schemas" in text and "fix: " in text
    assert text.splitlines()[-1].startswith(f"{len(CHECK_NAMES) - 3}/{len(CHECK_NAMES)} checks passed: FAILED (")


def test_invalid_tool_schema_names_each_problem():
    report = check(BadToolEnv(), seeds=10)
    assert report.failed == ["tool_schemas"], report.format()  # its prompt rightly shows no call
    detail = report.result("tool_schemas").detail
    assert "tool #0 ('look up')" in detail
    for problem in ("name 'look up' must be non-empty and match", "description is empty",
                    "required ['table'] are not in properties ['key']", "property 'key' has no 'description'"):
        assert problem in detail


def test_exception_inside_a_check_is_reported_not_raised():
    report = check(NoExpertEnv(), seeds=10)
    assert set(report.failed) == {"seed_determinism", "expert_solves", "chat_roundtrip"}
    for name in report.failed:
        assert "raised NotImplementedError: expert not written yet" in report.result(name).detail
    assert report.result("seed_determinism").fix.startswith("the env raised while being checked")
    assert "train seeds [0, 1, 2, 3, 4, 5, 6, 7, 8, 9] (10/10)" in report.result("expert_solves").detail


def test_unbuildable_env_is_a_failed_make_env_result():
    report = check("turnrl/GuessNumber-v0", seeds=10, env_kwargs={"n": 2})
    assert report.failed == ["make_env"]
    assert "raised ValueError: n must be an int >= 4, got 2" in report.format()


def test_usage_errors_raise():
    with pytest.raises(UnknownEnvError, match="turnrl/CalcMath-v0, .*turnrl/GuessNumber-v0"):
        check("turnrl/Nope-v0")
    with pytest.raises(ValueError, match="seeds must be a positive int"):
        check("turnrl/GuessNumber-v0", seeds=0)
    with pytest.raises(ValueError, match="env_kwargs only applies to an env id"):
        check(GuessNumberEnv(), env_kwargs={"n": 16})


def test_single_split_env_skips_splits_disjoint():
    class TrainOnly(GuessNumberEnv):
        splits = ("train",)

    result = check(TrainOnly(), seeds=10).result("splits_disjoint")
    assert result.passed and result.detail == "skipped" and "single split" in result.notes[0]


def test_check_env_warnings_are_notes():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the other checks reset too; check_env's warnings are still recorded
        report = check(WarningEnv(), seeds=10)
    result = report.result("gymnasium_check_env")
    assert report.ok and result.notes == ("FutureWarning during check_env: the opening prompt will change in v1",)
    assert "note: FutureWarning during check_env" in report.format()


@pytest.mark.parametrize("parser", ["hermes", "qwen3_coder", "glm4", "pythonic"])
def test_strings_that_read_as_json_round_trip_through_the_envs_call_format(parser):
    result = check("turnrl/CalcMath-v0", seeds=5, env_kwargs={"tool_parser": parser}).result("string_arguments")
    assert result.passed and "4 values round-trip" in result.detail


def test_a_parser_that_loses_what_was_written_fails_the_string_check():
    """A raw-value parser that keeps no ``ToolCall.raw`` turns "5" into 5 for good: the check
    names the tool, the parameter and what came back."""
    from turnrl.tools import ParseResult, ToolCall, get_parser, register_formatter, register_parser
    from turnrl.tools.parsers import FORMATTERS, PARSERS

    @register_parser("lossy_test")
    def lossy(text):
        parsed = get_parser("qwen3_coder")(text)
        return ParseResult(parsed.status, tuple(ToolCall(c.name, c.arguments) for c in parsed.calls),
                           parsed.content, parsed.error)

    register_formatter("lossy_test")(FORMATTERS.get("qwen3_coder"))
    try:
        result = check("turnrl/CalcMath-v0", seeds=5, env_kwargs={"tool_parser": "lossy_test"}).result(
            "string_arguments")
    finally:
        PARSERS._fns.pop("lossy_test", None)
        FORMATTERS._fns.pop("lossy_test", None)
    assert not result.passed and "calculator(expression='5')" in result.detail and "reads back as 5" in result.detail


@pytest.fixture(scope="module")
def qwen3_5_tokenizer():
    from turnrl.chat.families import family_tokenizer

    return family_tokenizer("qwen3_5")


def test_agent_settings_check_the_env_against_the_agents_template_and_limits(qwen3_5_tokenizer):
    from turnrl.envs.check import AgentSettings

    roomy = AgentSettings(qwen3_5_tokenizer, max_context_tokens=4096, max_new_tokens=64)
    report = check("turnrl/CalcMath-v0", seeds=3, agent=roomy)
    assert report.ok, report.format()
    assert "qwen3_5 template" in report.result("chat_roundtrip").detail
    assert "qwen3_coder" in report.result("string_arguments").detail  # the env reads the agent's call format
    tight = AgentSettings(qwen3_5_tokenizer, max_context_tokens=4096, max_new_tokens=8)
    limits = check("turnrl/CalcMath-v0", seeds=3, agent=tight).result("agent_limits")
    assert not limits.passed and "> max_new_tokens 8" in limits.detail
    small = AgentSettings(qwen3_5_tokenizer, max_context_tokens=256, max_new_tokens=64)
    limits = check("turnrl/CalcMath-v0", seeds=3, agent=small).result("agent_limits")
    assert not limits.passed and "> max_context_tokens 256" in limits.detail


def test_without_agent_settings_the_limits_check_is_skipped_saying_how_to_run_it():
    result = check("turnrl/GuessNumber-v0", seeds=3).result("agent_limits")
    assert result.passed and result.detail == "skipped" and "--agent-path" in result.notes[0]


def test_check_env_agent_path_loads_the_checkpoints_tokenizer(qwen3_5_tokenizer, tmp_path, capsys):
    from turnrl.cli import main

    qwen3_5_tokenizer.save_pretrained(tmp_path)
    code = main(["check-env", "turnrl/GuessNumber-v0", "--seeds", "3", "--agent-path", str(tmp_path),
                 "--max-context-tokens", "2048", "--max-new-tokens", "4"])
    out = capsys.readouterr().out
    assert code == 1 and "FAIL  agent_limits" in out and "qwen3_5 template" in out, out
    assert main(["check-env", "turnrl/GuessNumber-v0", "--agent-path", str(tmp_path / "none")]) == 2
