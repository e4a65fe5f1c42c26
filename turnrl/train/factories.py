"""Config -> objects: the env factory, the agent (model + tokenizer) and its rollout policy."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import gymnasium

import turnrl.envs  # noqa: F401  (registers the turnrl/... ids)
from turnrl.chat.formats import ChatFormat, detect, get_format
from turnrl.chat.renderer import ChatRenderer
from turnrl.policies.hf.policy import TransformersPolicy
from turnrl.models.causal_lm import build_tiny_model, load_pretrained
from turnrl.policies.protocol import RolloutPolicy
from turnrl.rollout.scripted import corpus_texts
from turnrl.chat.tokenizer import CHAT_TEMPLATE, build_tokenizer
from turnrl.policies.weights import unwrap_model
from turnrl.algorithms.credit.advantages import ADVANTAGES
from turnrl.conf.schema import BACKENDS, Config
from turnrl.rollout.env_calls import DeadlineEnv
from turnrl.train.warm_start import warmstart_seed
from turnrl.conf.validate import advantage_kwargs_problem
from turnrl.envs.remote import RemoteEnv
from turnrl.policies.http import OpenAIPolicy, PolicyRequestError
from turnrl.policies.routing import STRATEGIES
from turnrl.policies.served import TRANSPORTS, ServedPolicy
from turnrl.policies.vllm_engine import VLLMPolicy


def env_factory(cfg: Config) -> Callable[[], gymnasium.Env]:
    """A zero-argument function making one env of ``cfg.env``; one env is made (and closed) now
    so that a bad id, URL, class path or kwargs fails at start with the env's own message.

    ``cfg.env`` picks the kind: ``url`` set -> ``RemoteEnv(url, id, token_env=token_env,
    **kwargs)`` (a ``turnrl serve-env`` server); ``_target_`` set -> the class at that dotted path, ``cls(**kwargs)``;
    else ``gymnasium.make(id, **kwargs)`` of a registered id. The agent's ``tool_parser`` is added
    to the kwargs unless they set it (for a ``_target_`` class only when its constructor takes a
    ``tool_parser`` or ``**kwargs``).

    Raises:
        ValueError: When ``_target_`` is set with ``url`` or ``id``, the id is not registered, the
            class path cannot be imported or is not a ``gymnasium.Env`` subclass, or the env
            rejects the kwargs.
    """
    env_cfg = cfg.env
    kwargs = dict(env_cfg.kwargs)
    parser = agent_tool_parser(cfg)
    if env_cfg.url and env_cfg._target_:
        raise ValueError(f"env.url={env_cfg.url!r} and env._target_={env_cfg._target_!r} are both set; "
                         "set one: url for a served env, _target_ for a local env class")
    if env_cfg._target_ and env_cfg.id:  # else the saved run config would name an env that did not run
        raise ValueError(f"env._target_={env_cfg._target_!r} and env.id={env_cfg.id!r} are both set; a run config "
                         "names one env: use env=custom (or a config of your own without id) with env._target_, "
                         "or add env.id=null")
    if env_cfg.url:

        if not env_cfg.url.startswith(("http://", "https://")):
            raise ValueError(f"env.url must be the http(s) URL of a `turnrl serve-env` server, e.g. "
                             f"env.url=http://127.0.0.1:8000; got {env_cfg.url!r}")

        url, env_id, token_env = env_cfg.url, env_cfg.id, env_cfg.token_env
        kwargs.setdefault("tool_parser", parser)

        def make() -> gymnasium.Env:
            return RemoteEnv(url, env_id, token_env=token_env, **kwargs)
    elif env_cfg._target_:
        cls = _env_class(env_cfg._target_)
        params = inspect.signature(cls).parameters.values()
        if any(p.name == "tool_parser" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            kwargs.setdefault("tool_parser", parser)

        def make() -> gymnasium.Env:
            return cls(**kwargs)
    else:
        env_id = env_cfg.id
        if env_id not in gymnasium.registry:
            known = sorted(k for k in gymnasium.registry if k.startswith("turnrl/"))
            raise ValueError(f"env.id={env_id!r} is not registered; registered turnrl envs: {known}")
        kwargs.setdefault("tool_parser", parser)

        def make() -> gymnasium.Env:
            return gymnasium.make(env_id, disable_env_checker=True, **kwargs)

    probe = make()  # fail now, with the env's own message, on bad kwargs
    getattr(probe.unwrapped, "max_turns", None)  # a RemoteEnv opens its session: the server checks kwargs
    probe.close()
    return make


def _env_class(path: str) -> type[gymnasium.Env]:
    """The ``gymnasium.Env`` subclass at the dotted path ``package.module.ClassName``."""
    module_name, _, attr = path.rpartition(".")
    if not module_name or not attr or not path.replace(".", "").replace("_", "").isalnum():
        raise ValueError(f"env._target_={path!r} must be a dotted path package.module.ClassName")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        raise ValueError(f"env._target_={path!r}: cannot import module {module_name!r} ({type(e).__name__}: {e}); "
                         "put its folder on PYTHONPATH or install its package") from e
    cls = getattr(module, attr, None)
    if cls is None:
        raise ValueError(f"env._target_={path!r}: module {module_name!r} has no attribute {attr!r}")
    if not (isinstance(cls, type) and issubclass(cls, gymnasium.Env)):
        raise ValueError(f"env._target_={path!r} is {cls!r}, not a gymnasium.Env subclass; point it at an env class")
    return cls


def agent_chat_format(cfg: Config) -> ChatFormat:
    """The chat format of the run's model (``agent.chat_format``; ``auto``: detected from the chat
    template of ``agent.path``'s tokenizer, or of the tiny model's)."""
    if cfg.agent.chat_format != "auto":
        return get_format(cfg.agent.chat_format)
    if cfg.agent.path:
        from transformers import AutoTokenizer

        return detect(AutoTokenizer.from_pretrained(cfg.agent.path).chat_template)
    return detect(CHAT_TEMPLATE)


def agent_tool_parser(cfg: Config) -> str:
    """The tool-call format the envs read: ``agent.tool_parser``, or (``auto``) the chat format's."""
    return agent_chat_format(cfg).tool_parser if cfg.agent.tool_parser == "auto" else cfg.agent.tool_parser


def scripted_env(cfg: Config, env_fn: Callable[[], gymnasium.Env]) -> DeadlineEnv:
    """One env for the scripted players (tokenizer corpus, warm start, DPO pairs) whose every
    reset and step returns within ``trainer.step_timeout_s`` (``DeadlineEnv``)."""
    return DeadlineEnv(env_fn, cfg.trainer.step_timeout_s)


def build_agent(cfg: Config, env_fn: Callable[[], gymnasium.Env]):
    """Load ``cfg.agent.path`` or build the tiny model (initialised with ``warmstart_seed(cfg)``)
    and a tokenizer trained on the env's texts."""
    agent = cfg.agent
    if agent.path:
        return load_pretrained(agent.path, agent.dtype)
    env = scripted_env(cfg, env_fn)
    corpus = corpus_texts(env, range(agent.tokenizer.corpus_episodes), player="expert")
    corpus += corpus_texts(env, range(agent.tokenizer.corpus_episodes), player="weak")
    tokenizer = build_tokenizer(corpus, agent.tokenizer.vocab_size, agent.tokenizer.max_number)
    return build_tiny_model(agent.model, tokenizer, seed=warmstart_seed(cfg)), tokenizer


def rollout_policy(cfg: Config, model, tokenizer, workdir: str | Path, seed: int, own_copy: bool,
                   pushes: bool = True) -> RolloutPolicy:
    """The policy that samples training rollouts (``cfg.agent.backend``), a ``RolloutPolicy``
    for every backend (``turnrl.policies.protocol``: the caller needs no backend-specific code).

    ``transformers``: a ``TransformersPolicy`` on ``model`` itself (``needs_weight_push``
    False), or on a copy of it when ``own_copy`` (``TransformersPolicy.copy_of``: asynchronous
    rollouts sample while the learner updates ``model``); ``vllm``: a ``VLLMPolicy`` engine
    started on ``model`` saved under ``workdir`` (``cfg.agent.vllm``; a null
    ``max_model_len`` is ``agent.max_context_tokens``); ``http``: a
    ``ServedPolicy`` over the servers of ``cfg.agent.http``, weight pushes written to
    ``agent.http.weights_dir`` (default ``workdir/weights``). All but the first take the
    learner's weights with ``sync_from(model)`` (or ``load_weights(merged_state_dict(model))``);
    ``pushes=False`` (an evaluation of what the servers serve) skips the start-up check that
    they take weight pushes.

    Raises:
        ValueError: On an unknown backend.
        ImportError: For ``vllm`` when vLLM is not installed (with how to install it).
    """
    backend = cfg.agent.backend
    if backend == "transformers":
        if own_copy:
            return TransformersPolicy.copy_of(model, tokenizer, seed=seed, prefix_cache=cfg.agent.prefix_cache)
        return TransformersPolicy(model, tokenizer, seed=seed, prefix_cache=cfg.agent.prefix_cache)
    if backend == "vllm":

        v = cfg.agent.vllm  # the engine's settings; a null max_model_len is the episode's context limit
        engine = replace(v, max_model_len=v.max_model_len or cfg.agent.max_context_tokens)
        return VLLMPolicy.from_model(model, tokenizer, workdir, seed=seed, engine=engine)
    if backend == "http":

        h = cfg.agent.http
        if not h.base_urls:
            raise ValueError("agent.backend=http needs agent.http.base_urls=[http://host:port,...]: the rollout "
                             "servers (vLLM with VLLM_SERVER_DEV_MODE=1, or `python -m turnrl serve-policy`)")
        if h.route_strategy not in STRATEGIES:
            raise ValueError(f"agent.http.route_strategy must be one of {STRATEGIES}, got {h.route_strategy!r}")
        if h.weight_transport not in TRANSPORTS:
            raise ValueError(f"agent.http.weight_transport must be one of {TRANSPORTS}, got {h.weight_transport!r}")
        servers = [OpenAIPolicy(url, h.model, mode="tokens", api_key_env=h.api_key_env, timeout_s=h.timeout_s,
                                max_concurrency=h.max_concurrency, tokenizer=tokenizer) for url in h.base_urls]
        check_servers(cfg, servers, tokenizer, pushes)
        return ServedPolicy(servers, h.weights_dir or Path(workdir) / "weights", unwrap_model(model).config,
                            h.route_strategy, h.weight_transport)
    raise ValueError(f"agent.backend must be one of {BACKENDS}, got {backend!r}")


def check_servers(cfg: Config, servers: Sequence[OpenAIPolicy], tokenizer, pushes: bool = True) -> None:
    """Before any work: each rollout server serves ``agent.http.model`` (null: its only model),
    holds ``agent.max_context_tokens``, reports logprobs after temperature when the run
    samples at a temperature other than 1 (``OpenAIPolicy.check``), and, when ``pushes`` with
    ``agent.http.weight_transport=http``, takes weight pushes over the network
    (``OpenAIPolicy.check_weight_pull``).

    Raises:
        ValueError: Naming the setting or the server flag to change.
    """
    a = cfg.agent
    temperatures = {a.temperature} | ({a.temperature_end} if a.temperature_schedule != "constant" else set())
    temperature = next((t for t in sorted(temperatures) if t != 1.0), None)
    prompt = ChatRenderer(tokenizer, a.chat_format, a.template_kwargs).start(
        [{"role": "user", "content": "Say hello."}]).prompt_ids
    for server in servers:
        server.check(max_context_tokens=a.max_context_tokens, temperature=temperature, prompt=list(prompt),
                     context_key="agent.max_context_tokens", temperature_key="agent.temperature")
        if pushes and a.http.weight_transport == "http":
            try:
                server.check_weight_pull()
            except PolicyRequestError as e:
                raise ValueError(f"{e}; or push through a shared folder: agent.http.weight_transport=folder "
                                 "agent.http.weights_dir=A_FOLDER_THE_SERVERS_SEE") from e


def advantage_fn(cfg: Config):
    """The configured advantage estimator with its kwargs bound.

    Raises:
        KeyError: On an unknown ``algorithm.advantage`` (listing the registered names).
        ValueError: When ``algorithm.advantage_kwargs`` has keys the estimator does not take
            (the check ``turnrl.conf.validate`` makes).
    """

    fn = ADVANTAGES.get(cfg.algorithm.advantage)
    kwargs = dict(cfg.algorithm.advantage_kwargs)
    problem = advantage_kwargs_problem(cfg.algorithm.advantage, kwargs)
    if problem:
        raise ValueError(problem)
    return lambda batch: fn(batch, **kwargs)
