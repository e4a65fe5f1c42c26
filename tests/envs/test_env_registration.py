"""Registration: ``import turnrl`` registers every env (tested in fresh interpreters), idempotently,
and every registered env makes and passes gymnasium's checker without warnings."""

import importlib
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import turnrl.envs
from turnrl.envs import registered_env_ids
from turnrl.envs.base import MultiTurnEnv
from turnrl.envs.mixture import MixtureEnv


def test_ids_listed():
    assert {"turnrl/GuessNumber-v0", "turnrl/CalcMath-v0"} <= set(registered_env_ids())


def fresh_python(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a new interpreter: nothing imported or registered before it."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_import_turnrl_registers_every_env_without_importing_one():
    result = fresh_python("""
        import sys
        import gymnasium
        import turnrl
        from turnrl.env_ids import ENV_ENTRY_POINTS
        assert all(env_id in gymnasium.registry for env_id, _ in ENV_ENTRY_POINTS)
        assert not any(name.startswith("turnrl.envs") for name in sys.modules), "registering imported env code"
        obs, info = gymnasium.make("turnrl/GuessNumber-v0").reset(seed=0)
        print(obs[-1]["content"])
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Guess my number between 1 and ")


@pytest.mark.slow
def test_the_docs_snippet_makes_an_env_in_a_fresh_interpreter():
    page = (Path(__file__).resolve().parents[2] / "docs" / "envs.md").read_text()
    section = page[page.index("## Checking an environment"):page.index("## Built-in environments")]
    (snippet,) = re.findall(r"```python\n(.*?)```", section, re.S)
    result = fresh_python(snippet + "print(env.reset(seed=0)[1]['task_id'])\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("guess-")


@pytest.mark.slow
def test_gymnasium_make_with_the_module_prefix_imports_turnrl():
    result = fresh_python("""
        import gymnasium
        env = gymnasium.make("turnrl:turnrl/CalcMath-v0", tool_parser="xml")
        print(env.unwrapped.tool_parser, env.reset(seed=0)[1]["task_id"] != "")
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["xml", "True"]


def test_registration_is_idempotent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importlib.reload(turnrl.envs)
        turnrl.envs.register_envs()
    assert registered_env_ids().count("turnrl/CalcMath-v0") == 1


@pytest.mark.parametrize("env_id", registered_env_ids())
def test_check_env_and_make_without_warnings(env_id):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env = gymnasium.make(env_id, max_turns=3)
        assert isinstance(env.unwrapped, (MultiTurnEnv, MixtureEnv)) and env.unwrapped.max_turns == 3
        check_env(env.unwrapped)
        obs, info = env.reset(seed=0)
        assert obs in env.observation_space
        for _ in range(3):
            obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
            assert obs in env.observation_space
            if terminated or truncated:
                break
        env.close()
