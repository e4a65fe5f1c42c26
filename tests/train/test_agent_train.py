"""Agent programs trained by ``python -m turnrl.train`` (``env=custom env._target_=...``), 3 steps
each on a tiny Qwen2 built from a config (a Qwen2.5 family tokenizer with its real chat
template, saved as a checkpoint folder): a plain ``openai`` tool loop, an ``openai-agents``
agent with two tools, a harness that compacts its history and one that runs a sub-agent.

Every kept training episode is matched to the program run that made it (the programs write each
call they send to ``TURNRL_AGENT_LOG``): each turn's prompt is the template's render of that
call's messages and tools (tests/envs/agent_programs.py ``check_turns``), and the learner's
logprob of every sampled token equals the sampler's within the rounding bound.
"""

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.envs.agent_programs import check_turns, match_runs
from tests.tolerances import logprob_tol_any_input
from turnrl.chat.families import family_tokenizer
from turnrl.models.causal_lm import load_pretrained
from turnrl.models.tiny_checkpoints import build_model
from turnrl.runs.store import load_rollouts

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
MAX_CONTEXT = 2048


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("agent-ckpt")
    tok = family_tokenizer("qwen2_5", ["What is 1 + 2? Use the add tool. Try again. Summary checker"], vocab_size=600)
    build_model("qwen2", tok, hidden=64, layers=2, seed=0).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.mark.parametrize("program, multi_segment", [
    ("ToolLoop", False), ("AgentsSDK", False), ("Compacting", True), ("SubAgent", True)])
def test_an_agent_program_trains_token_exact(program, multi_segment, checkpoint, tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "calls.jsonl"
    command = [sys.executable, "-m", "turnrl.train", "env=custom", f"env._target_=tests.envs.agent_programs.{program}",
               f"agent.path={checkpoint}", "agent.warmstart.steps=0", "agent.max_new_tokens=24",
               f"agent.max_context_tokens={MAX_CONTEXT}", "trainer.steps=3", "trainer.eval_every=3",
               "trainer.eval_episodes=4", "trainer.tasks_per_step=2", "trainer.group_size=2", "trainer.threads=1",
               "trainer.progress=false", "trainer.tensorboard=false", f"hydra.run.dir={run_dir}"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "TURNRL_AGENT_LOG": str(log)})
    assert result.returncode == 0, result.stderr[-3000:]

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in steps] == [1, 2, 3] and all(r["infra_failure_rate"] == 0 for r in steps)
    model, tok = load_pretrained(str(run_dir / "checkpoint"))
    tol = logprob_tol_any_input(model, MAX_CONTEXT, 1.0)
    assert all(r["mismatch_max"] <= tol for r in steps), ([r["mismatch_max"] for r in steps], tol)

    runs: dict[str, list] = defaultdict(list)
    for line in log.read_text().splitlines():
        call = json.loads(line)
        runs[call["key"]].append((call["messages"], call["tools"]))
    episodes = list(load_rollouts(run_dir, "train"))
    assert len(episodes) == 3 * 2 * 2

    def check(episode, calls) -> int:
        assert len(calls) == len(episode.turn_spans)
        check_turns(tok, episode.tokens.ids, episode.turn_spans, episode.segment_starts, calls)
        for sampled, sampler, learner in zip(episode.tokens.sampled, episode.tokens.sampler_logprob,
                                             episode.tokens.learner_logprob):
            assert not sampled or abs(sampler - learner) <= tol
        return len(episode.segment_starts)

    segments = match_runs(episodes, list(runs.values()), check)
    assert any(s > 1 for s in segments) == multi_segment, segments
    assert (run_dir / "view.html").stat().st_size > 0
