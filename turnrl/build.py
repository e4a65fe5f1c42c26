"""Config -> objects: the env factory and the agent (model + tokenizer)."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import gymnasium

import turnrl.envs  # noqa: F401  (registers the turnrl/... ids)
from turnrl.agents.model import TinyModelConfig, build_tiny_model, load_pretrained
from turnrl.agents.scripted import corpus_texts
from turnrl.agents.tokenizer import build_tokenizer
from turnrl.algorithms.advantages import ADVANTAGES
from turnrl.conf.schema import Config


def env_factory(cfg: Config) -> Callable[[], gymnasium.Env]:
    """A function making one env of ``cfg.env`` with the agent's tool-call parser."""
    env_id = cfg.env.id
    if env_id not in gymnasium.registry:
        known = sorted(k for k in gymnasium.registry if k.startswith("turnrl/"))
        raise ValueError(f"env.id={env_id!r} is not registered; registered turnrl envs: {known}")
    kwargs = dict(cfg.env.kwargs)
    kwargs.setdefault("tool_parser", cfg.agent.tool_parser)

    def make() -> gymnasium.Env:
        return gymnasium.make(env_id, disable_env_checker=True, **kwargs)

    make()  # fail now, with the env's own message, on bad kwargs
    return make


def build_agent(cfg: Config, env_fn: Callable[[], gymnasium.Env]):
    """Load ``cfg.agent.path`` or build the tiny model and a tokenizer trained on the env's texts."""
    agent = cfg.agent
    if agent.path:
        return load_pretrained(agent.path, agent.dtype)
    env = env_fn()
    corpus = corpus_texts(env, range(agent.tokenizer.corpus_episodes), player="expert")
    corpus += corpus_texts(env, range(agent.tokenizer.corpus_episodes), player="weak")
    tokenizer = build_tokenizer(corpus, agent.tokenizer.vocab_size, agent.tokenizer.max_number)
    m = agent.model
    model_cfg = TinyModelConfig(m.hidden_size, m.num_layers, m.num_heads, m.num_kv_heads,
                                m.intermediate_size, m.max_positions)
    return build_tiny_model(model_cfg, tokenizer, seed=cfg.seed), tokenizer


def advantage_fn(cfg: Config):
    """The configured advantage estimator with its kwargs bound (validated now)."""
    fn = ADVANTAGES.get(cfg.algorithm.advantage)
    kwargs = dict(cfg.algorithm.advantage_kwargs)
    accepted = set(inspect.signature(fn).parameters) - {"batch"}
    unknown = set(kwargs) - accepted
    if unknown:
        raise ValueError(
            f"algorithm.advantage_kwargs has {sorted(unknown)}, which {cfg.algorithm.advantage!r} "
            f"does not take; it accepts {sorted(accepted)}"
        )
    return lambda batch: fn(batch, **kwargs)
