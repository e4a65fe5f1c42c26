"""Observations and actions are any Unicode text: the text space, ``to_observation`` (which
never rewrites or cuts content) and Unicode passing through envs unchanged."""

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import turnrl.envs.messages as messages
from turnrl.envs import CalcMathEnv, GuessNumberEnv, MultiTurnEnv, TurnOutcome, check
from turnrl.envs.messages import (
    MAX_TEXT_CHARS,
    SAMPLE_MAX_CHARS,
    TextSpace,
    action_space,
    escape_invalid,
    observation_space,
    to_observation,
)
from turnrl.tools import ToolCall, format_call, tool

UNICODE_TEXTS = (
    "",
    "plain ASCII",
    "café naïve Ångström ß",
    "中文字符，日本語のテキスト，한국어",
    "emoji 😀🎉🚀 and a flag 🇫🇷 and a family 👨‍👩‍👧",
    "line one\r\nline two\r\tindented\ttabs",
    'def f(x):\n\treturn {"κ": x ** 2}  # ∑ ≤ ∞\n',
    "zero\u200bwidth, no\u00a0break, ideographic\u3000space, BOM \ufeff, RTL \u202e",
    "\x01\x1b[31mcontrol\x7f",
)


# ------------------------------------------------------------------- the space
@pytest.mark.parametrize("text", UNICODE_TEXTS)
def test_the_text_space_accepts_any_unicode_text(text):
    assert text in TextSpace() and text in action_space()
    assert ({"role": "tool", "content": text},) in observation_space()


@pytest.mark.parametrize("value", [b"bytes", 7, None, ["a"], "lone \ud800 high", "lone \udfff low",
                                   "\udc80", "nul \x00 inside"])
def test_the_text_space_rejects_non_str_lone_surrogates_and_nul(value):
    assert value not in TextSpace()
    assert ({"role": "user", "content": value},) not in observation_space()


def test_the_text_space_bounds_length_explicitly():
    assert "x" * MAX_TEXT_CHARS in TextSpace() and "x" * (MAX_TEXT_CHARS + 1) not in TextSpace()
    short = TextSpace(5, min_length=2)
    assert "ab" in short and "a" not in short and "abcdef" not in short and "中文字符😀" in short


def test_samples_are_broad_unicode_and_in_the_space():
    space = TextSpace()
    space.seed(0)
    samples = [space.sample() for _ in range(200)]
    assert all(s in space and len(s) <= SAMPLE_MAX_CHARS for s in samples)
    drawn = set("".join(samples))
    assert any(ord(c) > 0xFFFF for c in drawn) and any("\u4e00" <= c <= "\u9fff" for c in drawn)
    assert "\r" in drawn and "é" in drawn
    assert len(space.sample(mask=(10, None))) == 10
    obs = observation_space()
    obs.seed(1)
    assert all(obs.sample() in obs for _ in range(20))


def test_spaces_compare_and_hash():
    assert TextSpace() == action_space() and hash(TextSpace()) == hash(action_space())
    assert TextSpace(10) != TextSpace()


# ------------------------------------------------------------ to_observation
@pytest.mark.parametrize("text", UNICODE_TEXTS)
def test_to_observation_keeps_content_exactly(text):
    assert to_observation([{"role": "tool", "content": text}]) == ({"role": "tool", "content": text},)


def test_to_observation_still_validates_shape():
    with pytest.raises(ValueError, match="message must be"):
        to_observation([{"role": "robot", "content": "hi"}])
    with pytest.raises(ValueError, match="message must be"):
        to_observation([{"role": "user", "content": "hi", "name": "x"}])
    with pytest.raises(ValueError, match="content must be str"):
        to_observation([{"role": "user", "content": b"hi"}])


def test_to_observation_raises_on_what_no_text_carries_and_on_a_runaway_message():
    with pytest.raises(ValueError, match=r"\['0x0'\].*escape_invalid"):
        to_observation([{"role": "user", "content": "a\x00b"}])
    with pytest.raises(ValueError, match=r"\['0xd800'\]"):
        to_observation([{"role": "user", "content": "a\ud800b"}])
    with pytest.raises(ValueError, match="over MAX_TEXT_CHARS"):
        to_observation([{"role": "user", "content": "x" * (MAX_TEXT_CHARS + 1)}])
    long = "y" * 100_000  # far over the old 4,096-character cut: kept whole
    assert to_observation([{"role": "user", "content": long}])[0]["content"] == long


def test_no_character_cut_or_charset_is_left():
    for gone in ("fit_text", "MAX_CONTENT_CHARS", "MAX_ACTION_CHARS", "CHARSET"):
        assert not hasattr(messages, gone)


def test_escape_invalid_is_visible_and_leaves_other_text_alone():
    assert escape_invalid("a\x00b\ud800c") == "a\\x00b\\ud800c"
    for text in UNICODE_TEXTS:
        assert escape_invalid(text) == text


# ------------------------------------------------------- through an env
GREETINGS = {"zh": "你好，世界 🌏", "fr": "Bonjour à tous ! ça va ?\r\n", "emoji": "🎉🎉 👍🏽"}


class GreetingEnv(MultiTurnEnv):
    """Reply with a greeting in a language: a ``greet`` tool returns it (CJK, accents, emoji)."""

    default_max_turns = 3

    @tool
    def greet(self, lang: str) -> str:
        """The greeting of a language.

        Args:
            lang: A language code, e.g. "zh".
        """
        return GREETINGS.get(lang, f"unknown language {lang!r}")

    @tool
    def echo(self, text: str) -> str:
        """Repeat the text.

        Args:
            text: Any text.
        """
        return text

    def _new_task(self, rng, split):
        langs = ["zh", "fr"] if split == "train" else ["emoji"]
        return langs[int(rng.integers(len(langs)))]

    def _task_id(self, task):
        return task

    def _start_episode(self, task):
        self.seen = None
        return [{"role": "system", "content": "Réponds avec la salutation — 回答する 🙂"},
                {"role": "user", "content": f"Greet in {task}, then reply 'Answer: <greeting>'."}]

    def _on_turn(self, action, parse, tool_results):
        if parse.calls:
            self.seen = tool_results[0].content
            return TurnOutcome(messages=({"role": "user", "content": f"Vu : {self.seen} ✓"},))
        won = action == f"Answer: {GREETINGS[self.task]}"
        return TurnOutcome(reward=float(won), terminated=True, success=won)

    def _state_key(self):
        return self.seen

    def expert_action(self):
        if self.seen is None:
            return format_call(ToolCall("greet", {"lang": self.task}), self.tool_parser)
        return f"Answer: {self.seen}"


@pytest.mark.parametrize("parser", ["hermes", "xml", "json_fenced"])
def test_unicode_passes_through_reset_and_step_unchanged(parser):
    env = GreetingEnv(tool_parser=parser)
    for seed in range(4):
        obs, info = env.reset(seed=seed)
        assert obs[0]["content"] == "Réponds avec la salutation — 回答する 🙂" and obs in env.observation_space
        assert [s["function"]["name"] for s in info["tools"]] == ["greet", "echo"]
        obs, _, _, _, info = env.step(env.expert_action())
        greeting = GREETINGS[env.task]
        assert obs == ({"role": "tool", "content": greeting}, {"role": "user", "content": f"Vu : {greeting} ✓"})
        assert obs in env.observation_space and info["tool_errors"] == 0
        obs, reward, terminated, _, _ = env.step(env.expert_action())
        assert reward == 1.0 and terminated


def test_an_action_in_any_unicode_reaches_the_tool_unchanged():
    env = GreetingEnv()
    env.reset(seed=0)
    text = "".join(UNICODE_TEXTS)
    obs, *_ = env.step(format_call(ToolCall("echo", {"text": text}), "hermes"))
    assert obs[0] == {"role": "tool", "content": text}


def test_nul_and_lone_surrogates_from_a_tool_are_shown_escaped_not_raised():
    env = GreetingEnv()
    env.reset(seed=0)
    obs, *_ = env.step(format_call(ToolCall("echo", {"text": "a\x00b\ud800c 中"}), "hermes"))
    assert obs[0] == {"role": "tool", "content": "a\\x00b\\ud800c 中"} and obs in env.observation_space


@pytest.mark.parametrize("make", [GreetingEnv, GuessNumberEnv, CalcMathEnv,
                                  lambda: gymnasium.make("turnrl/RetrievalQA-v0").unwrapped])
def test_gymnasiums_checker_passes(make):
    env = make()
    check_env(env, skip_render_check=True)  # samples broad-Unicode actions from the action space
    env.close()


def test_the_project_check_passes_on_a_unicode_env():
    report = check(GreetingEnv(), seeds=3)
    assert report.ok, report.format()


def test_unicode_actions_never_raise_in_built_in_envs():
    space = action_space()
    space.seed(3)
    for env in (GuessNumberEnv(), CalcMathEnv()):
        for seed in range(5):
            env.reset(seed=seed)
            done = False
            while not done:
                obs, _, terminated, truncated, _ = env.step(space.sample())
                assert obs in env.observation_space
                done = terminated or truncated
