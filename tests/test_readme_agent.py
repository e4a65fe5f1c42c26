"""The README's "Train an agent you already have" example runs as printed: its ``my_agent.py``
is written into a user's directory and its command trains on it (with short-run settings
appended), the agent's tool loop going through the gateway."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
HEADING = "## Train an agent you already have"
SHORT = ["trainer.steps=2", "trainer.eval_every=2", "trainer.eval_episodes=4", "trainer.tasks_per_step=2",
         "trainer.group_size=2", "agent.tokenizer.corpus_episodes=20", "agent.max_new_tokens=32", "trainer.threads=1",
         "trainer.progress=false", "trainer.tensorboard=false"]


def blocks(lang: str) -> list[str]:
    text = README.read_text()
    start = text.index(HEADING)
    end = text.find("\n## ", start + len(HEADING))
    return re.findall(rf"```{lang}\n(.*?)```", text[start:end], re.S)


def test_the_agent_example_is_30_to_60_lines():
    code = blocks("python")[0]
    assert 30 <= len(code.splitlines()) <= 60


@pytest.mark.slow
def test_the_agent_example_trains_as_printed(tmp_path):
    (tmp_path / "my_agent.py").write_text(blocks("python")[0])
    [command] = [line for line in blocks("bash")[0].splitlines() if line.strip()]
    command += " " + " ".join(SHORT) + f" hydra.run.dir={tmp_path / 'run'}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in steps] == [1, 2] and all(r["infra_failure_rate"] == 0 for r in steps)
    assert all(r["turns"] >= 1 for r in steps)
