"""The ``turnrl`` command line, run as ``python -m turnrl`` in a subprocess."""

import subprocess
import sys

import pytest

from turnrl.cli import _kwarg
from turnrl.envs import registered_env_ids


def turnrl(*args):
    return subprocess.run([sys.executable, "-m", "turnrl", *args], capture_output=True, text=True, timeout=120)


def test_check_env_passes_and_prints_the_report():
    result = turnrl("check-env", "turnrl/GuessNumber-v0", "--seeds", "10", "--kwarg", "n=16")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "turnrl env check: turnrl/GuessNumber-v0 (seeds=10)" in result.stdout
    assert "PASS  expert_solves" in result.stdout and "checks passed: OK" in result.stdout


def test_failing_check_exits_1():
    result = turnrl("check-env", "turnrl/GuessNumber-v0", "--seeds", "1", "--kwarg", "n=2")
    assert result.returncode == 1 and "FAIL  make_env" in result.stdout


def test_unknown_env_id_exits_2_listing_the_ids():
    result = turnrl("check-env", "turnrl/Nope-v0")
    assert result.returncode == 2
    assert "unknown env id 'turnrl/Nope-v0'" in result.stderr
    assert all(env_id in result.stderr for env_id in registered_env_ids())


def test_list_envs():
    result = turnrl("list-envs")
    assert result.returncode == 0
    assert result.stdout.split() == registered_env_ids()
    assert {"turnrl/GuessNumber-v0", "turnrl/CalcMath-v0"} <= set(result.stdout.split())


@pytest.mark.parametrize("text, expected", [("n=16", ("n", 16)), ("flag=true", ("flag", True)),
                                            ("xs=[1, 2]", ("xs", [1, 2])), ("parser=hermes", ("parser", "hermes")),
                                            ("s=a=b", ("s", "a=b"))])
def test_kwarg_values_are_json_else_str(text, expected):
    assert _kwarg(text) == expected
