"""Shared, session-scoped real parts for the agents / rollout / algorithms tests.

Everything here is real: a byte-level BPE tokenizer trained in code on both envs' scripted
episodes, a tiny Qwen2 built from a config (random init, no warm start), real envs and the
real ``TransformersPolicy``. Nothing is mocked.
"""

import copy
import os
import sys
from functools import lru_cache
from pathlib import Path

import pytest
import torch

ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from turnrl.chat.renderer import ChatRenderer  # noqa: E402
from turnrl.policies.sampling import SamplingParams  # noqa: E402
from turnrl.models.causal_lm import TinyModelConfig  # noqa: E402
from turnrl.policies.hf.policy import TransformersPolicy  # noqa: E402
from turnrl.models.causal_lm import build_tiny_model  # noqa: E402
from turnrl.chat.tokenizer import build_tokenizer  # noqa: E402
from turnrl.rollout.scripted import corpus_texts  # noqa: E402
from turnrl.envs import CalcMathEnv, GuessNumberEnv  # noqa: E402
from turnrl.rollout import RolloutCollector, Task  # noqa: E402

torch.set_num_threads(int(os.environ.get("TURNRL_TEST_THREADS", "2")))  # the suite is sized for 2 cores

MAX_NUMBER = 255  # the config default (turnrl.conf.schema.TokenizerConfig.max_number)
TINY = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
EOS_BIAS = 3.0  # added to the end-of-turn logit of the rollout model (see ``policy_model``)
ENV_FNS = {"guess_number": lambda: GuessNumberEnv(n=32, max_turns=6), "calc_math": lambda: CalcMathEnv()}


class RecordingPolicy(TransformersPolicy):
    """The real ``TransformersPolicy`` that also keeps every ``(prompts, generations)`` call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def generate(self, prompts, params):
        gens = super().generate(prompts, params)
        self.calls.append(([list(p) for p in prompts], gens))
        return gens


@pytest.fixture(scope="session")
def tiny_config():
    return TINY


@pytest.fixture(scope="session")
def max_number():
    """``max_number`` the shared tokenizer was built with."""
    return MAX_NUMBER


@pytest.fixture(scope="session")
def corpus():
    return corpus_texts(GuessNumberEnv(), range(30)) + corpus_texts(CalcMathEnv(), range(30))


@pytest.fixture(scope="session")
def tokenizer(corpus):
    return build_tokenizer(corpus, vocab_size=3000, max_number=MAX_NUMBER)


@pytest.fixture(scope="session")
def renderer(tokenizer):
    return ChatRenderer(tokenizer)


@pytest.fixture(scope="session")
def tiny_model(tokenizer):
    """The tiny model as built (never trained in place: use ``fresh_model`` for that)."""
    return build_tiny_model(TINY, tokenizer, seed=0)


@pytest.fixture
def fresh_model(tiny_model):
    """A private copy of ``tiny_model`` that a test may train."""
    return copy.deepcopy(tiny_model)


@pytest.fixture(scope="session")
def policy_model(tiny_model, tokenizer):
    """A copy of the tiny model whose ``<|im_end|>`` logit is raised by ``EOS_BIAS``.

    A random-init model almost never samples the end-of-turn id, so every turn would be cut
    by ``max_new_tokens``; with the bias, turns end at varied lengths (both ``"stop"`` and
    ``"length"``), as they do for a trained model. The bias is part of the model's forward,
    so sampler and learner see the same distribution.
    """
    model = copy.deepcopy(tiny_model)
    eos = tokenizer.eos_token_id

    def add_eos_bias(module, inputs, logits):
        bias = torch.zeros(logits.shape[-1], dtype=logits.dtype, device=logits.device)
        bias[eos] = EOS_BIAS
        return logits + bias

    model.lm_head.register_forward_hook(add_eos_bias)
    return model


@pytest.fixture(scope="session")
def rollouts(policy_model, tokenizer, renderer):
    """``rollouts(env_name, temperature) -> (trajectories, policy)``: B=2 tasks x G=2 samples
    collected by ``RecordingPolicy`` on ``policy_model`` (cached per argument pair)."""

    @lru_cache(maxsize=None)
    def collect(env_name: str, temperature: float):
        policy = RecordingPolicy(policy_model, tokenizer, seed=1234)
        collector = RolloutCollector(ENV_FNS[env_name], policy, renderer, max_context_tokens=1024)
        params = SamplingParams(max_new_tokens=12, temperature=temperature)
        trajectories = collector.collect([Task(0), Task(1)], group_size=2, params=params)
        return trajectories, policy

    return collect
