"""The README's "Write your own environment" example runs exactly as printed: the env file,
its Hydra config file and the two shell commands are read out of README.md. A user's env class
is checked by name (``module:Class``), works with every call format, gives its tools in
``info["tools"]`` without hand-writing them in its prompt, and its training run saves a config that names it."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from turnrl.envs import check
from turnrl.envs.check import CHECK_NAMES
from turnrl.tools import PARSERS, ToolMethod

README = Path(__file__).resolve().parents[1] / "README.md"
HEADING = "## Write your own environment"
FAST = ["trainer.steps=2", "trainer.eval_every=2", "trainer.eval_episodes=8", "trainer.tasks_per_step=2",
        "trainer.group_size=2", "agent.warmstart.steps=2", "agent.tokenizer.corpus_episodes=20",
        "trainer.threads=1", "trainer.progress=false", "trainer.tensorboard=false"]


def section() -> str:
    text = README.read_text()
    start = text.index(HEADING)
    end = text.find("\n## ", start + len(HEADING))
    return text[start:end if end != -1 else None]


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", section(), re.S)


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A user's directory holding the README's files, importable as ``capitals``."""
    (tmp_path / "capitals.py").write_text(blocks("python")[0])
    conf = tmp_path / "my_conf" / "env"
    conf.mkdir(parents=True)
    (conf / "capitals.yaml").write_text(blocks("yaml")[0])
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("capitals", None)
    yield tmp_path
    sys.modules.pop("capitals", None)


def run_shell(command: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_example_is_a_few_dozen_lines():
    code = blocks("python")[0]
    assert 25 <= sum(bool(line.strip()) for line in code.splitlines()) <= 45


@pytest.mark.slow
@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_the_example_env_passes_every_check_with_every_parser(project, parser):
    from capitals import CapitalsEnv

    report = check(CapitalsEnv(tool_parser=parser))
    assert report.ok, report.format()
    env = CapitalsEnv(tool_parser=parser)
    env.reset(seed=0, options={"split": "test"})
    _, reward, terminated, _, info = env.step("Answer: Lima")  # the test split is Ghana only
    assert terminated and reward == 0.0 and not info["success"]


def test_the_example_describes_its_tool_without_writing_a_description(project):
    from capitals import CapitalsEnv

    assert "schema()" not in blocks("python")[0] and "Tool:" not in blocks("python")[0]
    assert isinstance(CapitalsEnv.capital, ToolMethod)
    env = CapitalsEnv(tool_parser="json_fenced")
    obs, info = env.reset(seed=0)
    assert info["tools"] == [env.tools[0].schema()] and info["tools"][0]["function"]["name"] == "capital"
    assert '"name": "capital"' not in obs[0]["content"] and "```json" not in obs[0]["content"]  # the task only
    assert "```json" in env.tools_prompt()  # a renderer's fallback shows the env's own call format
    obs, *_, info = env.step('```json\n{"name": "capital", "arguments": {"country": "Peru"\n```')
    assert info["parse_error"] and obs[0]["content"].startswith("Error: could not parse your tool call: ")


@pytest.mark.slow
def test_the_printed_check_command_passes(project):
    check_command = blocks("bash")[0].splitlines()[0]
    result = run_shell(check_command, project)
    assert result.returncode == 0, result.stderr
    assert "turnrl env check: capitals:CapitalsEnv" in result.stdout and f"{len(CHECK_NAMES)}/{len(CHECK_NAMES)} checks passed: OK" in result.stdout


@pytest.mark.slow
@pytest.mark.e2e
def test_the_printed_train_command_trains_through_the_users_hydra_config(project):
    train_command = blocks("bash")[0].splitlines()[1]
    assert "env=capitals" in train_command
    run_dir = project / "run"
    result = run_shell(f"{train_command} {' '.join(FAST)} hydra.run.dir={run_dir}", project)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "held-out success: before" in result.stdout
    assert (run_dir / "metrics.jsonl").exists()
    saved = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())["env"]
    assert saved["_target_"] == "capitals.CapitalsEnv" and saved["id"] is None  # the env that ran
