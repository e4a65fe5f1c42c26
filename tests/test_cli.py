"""The ``turnrl`` command line, run as ``python -m turnrl`` in a subprocess."""

import importlib
import re
import signal
import socket
import subprocess
import sys
import textwrap

import httpx
import pytest

from turnrl.cli import COMMANDS, _kwarg, _parser, main
from turnrl.envs import registered_env_ids


def turnrl(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "turnrl", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd)


USER_ENVS = textwrap.dedent('''
    """An env of a user's own, in a file of theirs; importing it registers one id."""
    import gymnasium

    from turnrl.envs import GuessNumberEnv


    class SmallGuessEnv(GuessNumberEnv):
        def __init__(self, **kwargs):
            super().__init__(n=8, n_min=4, **kwargs)


    gymnasium.register("mine/SmallGuess-v0", entry_point=SmallGuessEnv)
''')


@pytest.mark.slow
def test_check_env_passes_and_prints_the_report():
    result = turnrl("check-env", "turnrl/GuessNumber-v0", "--seeds", "10", "--kwarg", "n=16")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "turnrl env check: turnrl/GuessNumber-v0 (seeds=10)" in result.stdout
    assert "PASS  expert_solves" in result.stdout and "checks passed: OK" in result.stdout


@pytest.mark.slow
def test_failing_check_exits_1():
    result = turnrl("check-env", "turnrl/GuessNumber-v0", "--seeds", "1", "--kwarg", "n=2")
    assert result.returncode == 1 and "FAIL  make_env" in result.stdout


@pytest.mark.slow
def test_unknown_env_id_exits_2_listing_the_ids():
    result = turnrl("check-env", "turnrl/Nope-v0")
    assert result.returncode == 2
    assert "unknown env id 'turnrl/Nope-v0'" in result.stderr
    assert all(env_id in result.stderr for env_id in registered_env_ids())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["my_envs:SmallGuessEnv", "my_envs:mine/SmallGuess-v0"])
def test_check_env_loads_an_env_of_your_own_as_module_colon_name(tmp_path, name):
    (tmp_path / "my_envs.py").write_text(USER_ENVS)
    result = turnrl("check-env", name, "--seeds", "3", "--kwarg", "max_turns=5", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"turnrl env check: {name} (seeds=3)" in result.stdout and "checks passed: OK" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name, message", [
    ("no_such_module:Env", "cannot import module 'no_such_module' of 'no_such_module:Env' (ModuleNotFoundError"),
    ("my_envs:Missing", "'my_envs:Missing': module 'my_envs' has no env class named 'Missing' and registers no env "
                        "id 'Missing'"),
])
def test_check_env_says_why_a_module_name_does_not_load(tmp_path, name, message):
    (tmp_path / "my_envs.py").write_text(USER_ENVS)
    result = turnrl("check-env", name, cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr
    assert "an env of your own: module:ClassName or module:env-id" in result.stderr


@pytest.mark.slow
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


def test_every_command_names_a_handler_that_loads():
    subcommands = next(a for a in _parser()._subparsers._group_actions if a.choices).choices
    assert set(subcommands) == set(COMMANDS)
    for command, entry_point in COMMANDS.items():
        module, sep, function = entry_point.partition(":")
        assert sep and module.startswith("turnrl.cli."), (command, entry_point)
        assert callable(getattr(importlib.import_module(module), function)), (command, entry_point)


@pytest.mark.slow
def test_the_command_line_starts_without_torch():
    code = ("import sys; from turnrl.cli import main; code = main(['list-envs']); "
            "heavy = sorted({'torch', 'hydra'} & set(sys.modules)); print(heavy, file=sys.stderr); "
            "sys.exit(code or bool(heavy))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stderr.strip() == "[]", result.stderr


def test_train_takes_everything_after_it_as_hydra_arguments():
    assert _parser().parse_args(["train"]).overrides == []
    args = _parser().parse_args(["train", "env=guess_number", "-m", "seed=0,1"])
    assert args.command == "train" and args.overrides == ["env=guess_number", "-m", "seed=0,1"]


def test_train_hands_hydra_its_arguments_flags_first_included_and_restores_argv(monkeypatch):
    train_command = importlib.import_module(COMMANDS["train"].partition(":")[0])
    seen = []
    monkeypatch.setattr(train_command, "train_main", lambda: seen.append(list(sys.argv)))
    argv = list(sys.argv)
    assert main(["train", "-m", "--cfg", "job", "seed=0,1"]) == 0
    assert seen == [["turnrl train", "-m", "--cfg", "job", "seed=0,1"]] and sys.argv == argv


@pytest.mark.slow
@pytest.mark.e2e
def test_train_runs_the_hydra_entry_point_and_exits_nonzero_on_a_bad_key():
    result = turnrl("train", "trainer.stepz=1")
    assert result.returncode != 0
    assert "trainer.stepz" in result.stderr and "Key 'stepz' not in 'TrainerConfig'" in result.stderr


# ----------------------------------------------------------------- serve-env
def serve_env(*args):
    """Start ``turnrl serve-env``; returns the process and the first stdout line."""
    proc = subprocess.Popen([sys.executable, "-m", "turnrl", "serve-env", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline()


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_serve_env_prints_one_line_serves_and_exits_0_on_signal(stop_signal):
    proc, line = serve_env("turnrl/GuessNumber-v0", "--kwarg", "n=16", "--session-ttl", "30", "--max-sessions", "4")
    try:
        match = re.fullmatch(r"serving turnrl/GuessNumber-v0 at (http://127\.0\.0\.1:(\d+))\n", line)
        assert match, line + proc.stderr.read() if proc.poll() is not None else line
        info = httpx.get(f"{match.group(1)}/info", timeout=10).json()
        assert info["kwargs"] == {"n": 16} and info["session_ttl_s"] == 30 and info["max_sessions"] == 4
        sid = httpx.post(f"{match.group(1)}/sessions", timeout=10).json()["session_id"]
        obs = httpx.post(f"{match.group(1)}/sessions/{sid}/reset", json={"seed": 0}, timeout=10).json()["observation"]
        assert "between 1 and 16" in obs[-1]["content"]
        proc.send_signal(stop_signal)
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out == ""  # nothing after the one line


@pytest.mark.slow
@pytest.mark.e2e
def test_serve_env_usage_errors_exit_2():
    proc, _ = serve_env("turnrl/Nope-v0")
    assert proc.wait(timeout=60) == 2 and "unknown env id 'turnrl/Nope-v0'" in proc.stderr.read()
    proc, _ = serve_env("turnrl/GuessNumber-v0", "--kwarg", "n=2")
    assert proc.wait(timeout=60) == 2 and "n must be an int >= 4" in proc.stderr.read()
    result = turnrl("serve-env", "turnrl/GuessNumber-v0", "--port", "70000")
    assert result.returncode == 2 and "expected a port in 0..65535" in result.stderr


@pytest.mark.slow
@pytest.mark.e2e
def test_serve_env_on_a_taken_port_exits_1():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = turnrl("serve-env", "turnrl/GuessNumber-v0", "--port", str(taken.getsockname()[1]))
    assert result.returncode == 1 and "cannot listen on 127.0.0.1:" in result.stderr and result.stdout == ""


@pytest.mark.slow
def test_baselines_takes_an_env_of_your_own_as_check_env_does(tmp_path):
    (tmp_path / "my_envs.py").write_text(USER_ENVS)
    for name in ("my_envs:SmallGuessEnv", "my_envs:mine/SmallGuess-v0"):
        result = turnrl("baselines", name, "--episodes", "5", cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        row = next(line for line in result.stdout.splitlines() if "SmallGuess" in line)
        expected = "| my_envs/SmallGuessEnv-v0 |" if name.endswith("Env") else "| mine/SmallGuess-v0 |"
        assert row.startswith(expected), row
    result = turnrl("baselines", "my_envs:Missing", cwd=tmp_path)
    assert result.returncode == 2 and "module 'my_envs' has no env class named 'Missing'" in result.stderr


def test_env_id_of_registers_a_class_of_your_own_once_and_serve_env_serves_it(tmp_path, monkeypatch):
    from turnrl.envs.check import env_id_of
    from turnrl.envs.server import EnvServer

    (tmp_path / "my_envs_for_ids.py").write_text(USER_ENVS.replace("mine/SmallGuess-v0", "mine/SmallGuessIds-v0"))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert env_id_of("turnrl/GuessNumber-v0") == "turnrl/GuessNumber-v0"
    assert env_id_of("my_envs_for_ids:SmallGuessEnv") == "my_envs_for_ids/SmallGuessEnv-v0"
    assert env_id_of("my_envs_for_ids:SmallGuessEnv") == "my_envs_for_ids/SmallGuessEnv-v0"  # registered once
    assert env_id_of("my_envs_for_ids:mine/SmallGuessIds-v0") == "mine/SmallGuessIds-v0"
    with EnvServer(env_id_of("my_envs_for_ids:SmallGuessEnv")) as server:
        assert server.info()["env_id"] == "my_envs_for_ids/SmallGuessEnv-v0"

