"""``validate(cfg)``: the checks of a composed ``Config`` that its types cannot express.

Hydra (the schema in ``turnrl.conf.schema``) already rejects unknown keys and values of the
wrong type. What is left is meaning: a choice field must name a registered estimator,
aggregation, schedule, parser, backend ...; numbers must be in range; and some switches
exclude or need others. ``turnrl.train.loop.train`` calls ``validate`` first, before any env,
model or file is made, so a bad config fails in a second, with every problem listed at once.

Every message names the key, the bad value, what is allowed and how to fix it. The registries
and tuples are the ones the code looks names up in, so a newly registered name is valid here
as soon as it exists.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Mapping, Sequence

from turnrl.algorithms import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, VALUE_TARGETS
from turnrl.algorithms.kl_control import PLACEMENTS
from turnrl.algorithms.learner.critic import CRITICS
from turnrl.algorithms.learner.learner import MIXED_PRECISION
from turnrl.algorithms.losses.importance import LEVELS
from turnrl.algorithms.losses.policy import TURN_RATIOS
from turnrl.algorithms.schedules import SCHEDULES
from turnrl.chat.formats import FORMATS
from turnrl.conf.schema import BACKENDS, TRACKER_PACKAGES, TRACKERS_EXTRA, WANDB_MODES, Config, LoggerConfig
from turnrl.models.causal_lm import DTYPES
from turnrl.policies.routing import STRATEGIES
from turnrl.policies.vllm_engine import ENGINE_DTYPES
from turnrl.rollout.compaction import ON_CONTEXT_LIMIT
from turnrl.rollout.scripted import PLAYERS
from turnrl.rollout.termination import INFRA_FAILURE_POLICIES
from turnrl.tools.parsers import PARSERS


def validate(cfg: Config) -> None:
    """Check ``cfg`` (a ``Config`` instance, e.g. ``OmegaConf.to_object`` of the composed
    config) before any work.

    Raises:
        ValueError: Listing every problem found (one per line), each naming the key, its
            value, the allowed values and the fix.
    """
    found = problems(cfg)
    if found:
        raise ValueError(f"invalid config ({len(found)} problem{'s' if len(found) > 1 else ''}):\n- "
                         + "\n- ".join(found))


def choice_fields(cfg: Config) -> list[tuple[str, str, Sequence[str]]]:
    """``(key, value, allowed names)`` of every field of ``cfg`` that names one of a fixed set
    (a registry the code looks the name up in, or a tuple of the accepted values)."""
    agent, algo, trainer = cfg.agent, cfg.algorithm, cfg.trainer
    return [
        ("agent.backend", agent.backend, BACKENDS),
        ("agent.dtype", agent.dtype, DTYPES),
        ("agent.vllm.dtype", agent.vllm.dtype, ENGINE_DTYPES),
        ("agent.http.route_strategy", agent.http.route_strategy, STRATEGIES),
        ("agent.tool_parser", agent.tool_parser, ["auto", *PARSERS.names()]),
        ("agent.chat_format", agent.chat_format, ["auto", *FORMATS.names()]),
        ("agent.on_context_limit", agent.on_context_limit, ON_CONTEXT_LIMIT),
        ("agent.temperature_schedule", agent.temperature_schedule, SCHEDULES.names()),
        ("agent.warmstart.player", agent.warmstart.player, PLAYERS),
        ("algorithm.advantage", algo.advantage, ADVANTAGES.names()),
        ("algorithm.kl_estimator", algo.kl_estimator, KL_ESTIMATORS.names()),
        ("algorithm.kl_placement", algo.kl_placement, PLACEMENTS),
        ("algorithm.tis", algo.tis, LEVELS),
        ("algorithm.loss_agg", algo.loss_agg, AGGREGATIONS.names()),
        ("algorithm.policy_loss", algo.policy_loss, POLICY_LOSSES.names()),
        ("algorithm.turn_ratio", algo.turn_ratio, TURN_RATIOS),
        ("algorithm.critic", algo.critic, CRITICS),
        ("algorithm.entropy_schedule", algo.entropy_schedule, SCHEDULES.names()),
        ("trainer.mixed_precision", trainer.mixed_precision, MIXED_PRECISION),
        ("trainer.infra_failures", trainer.infra_failures, INFRA_FAILURE_POLICIES),
    ]


def problems(cfg: Config) -> list[str]:
    """The problems ``validate`` raises for, as messages (empty: the config is valid)."""
    agent, algo, trainer = cfg.agent, cfg.algorithm, cfg.trainer
    out: list[str] = []

    # ------------------------------------------------------------ choice fields
    for key, value, allowed in choice_fields(cfg):
        if value not in allowed:
            out.append(_not_one_of(key, value, allowed))
    if algo.advantage in ADVANTAGES:
        problem = advantage_kwargs_problem(algo.advantage, algo.advantage_kwargs)
        if problem:
            out.append(problem)

    # ------------------------------------------------------------ ranges
    at_least = [
        ("algorithm.ppo_epochs", algo.ppo_epochs, 1), ("algorithm.num_minibatches", algo.num_minibatches, 1),
        ("algorithm.critic_epochs", algo.critic_epochs, 1), ("trainer.micro_batch_size", trainer.micro_batch_size, 1),
        ("trainer.eval_every", trainer.eval_every, 1),
        ("trainer.lora_rank", trainer.lora_rank, 0), ("algorithm.kl_coef", algo.kl_coef, 0),
        *((f"algorithm.{name}", getattr(algo, name), 0)
          for name in ("gspo_clip_low", "gspo_clip_high", "cispo_clip_low", "cispo_clip_high")),
        *((key, value, 1) for key, value in (("agent.max_observation_tokens", agent.max_observation_tokens),
                                             ("agent.max_episode_tokens", agent.max_episode_tokens),
                                             ("trainer.micro_batch_tokens", trainer.micro_batch_tokens)) if value is not None),
    ]
    for key, value, low in at_least:
        if value < low:
            out.append(f"{key}={value!r} must be >= {low}; set {key} to a value >= {low}")
    if trainer.threads is not None and trainer.threads < 0:
        out.append(f"trainer.threads={trainer.threads!r} must be null (this process's share of the cores), 0 "
                   "(torch's default) or a positive count; set trainer.threads=null")
    if trainer.step_timeout_s is not None and not trainer.step_timeout_s > 0:
        out.append(f"trainer.step_timeout_s={trainer.step_timeout_s!r} must be a positive number of seconds (the "
                   "deadline of one env reset or step) or null (no deadline); set e.g. trainer.step_timeout_s=300")
    if algo.tis_cap <= 0:
        out.append(f"algorithm.tis_cap={algo.tis_cap!r} must be > 0 (the upper truncation of the TIS ratio, "
                   "e.g. 2.0); set algorithm.tis_cap to a positive value")
    elif algo.tis == "icepop" and not 0 <= algo.tis_floor < algo.tis_cap:
        out.append(f"algorithm.tis_floor={algo.tis_floor!r} must be in [0, algorithm.tis_cap={algo.tis_cap!r}): IcePop "
                   "keeps tokens whose ratio is in [tis_floor, tis_cap]; its paper's are 0.5 and 5")
    if algo.tis == "geo_mask" and not 0 < algo.tis_band < 1:
        out.append(f"algorithm.tis_band={algo.tis_band!r} must be in (0, 1): geometric masking keeps rows whose "
                   "geometric-mean ratio is within 1 +- tis_band; SkyRL's is 0.01")
    if algo.dual_clip is not None and algo.dual_clip <= 1:
        out.append(f"algorithm.dual_clip={algo.dual_clip!r} must be > 1 (e.g. 3.0) or null (off); "
                   "set algorithm.dual_clip=3.0 or algorithm.dual_clip=null")
    dual_clipping = [name for name in POLICY_LOSSES if "dual_clip" in inspect.signature(POLICY_LOSSES[name]).parameters]
    if algo.dual_clip is not None and algo.policy_loss in POLICY_LOSSES and algo.policy_loss not in dual_clipping:
        out.append(f"algorithm.dual_clip={algo.dual_clip!r} is set but algorithm.policy_loss={algo.policy_loss!r} has "
                   f"no dual clip (the losses with one: {dual_clipping}); set algorithm.dual_clip=null, or "
                   f"algorithm.policy_loss={dual_clipping[0]}")
    if algo.kl_target is not None and (algo.kl_target <= 0 or algo.kl_coef <= 0):
        out.append(f"algorithm.kl_target={algo.kl_target!r} (adaptive KL) needs kl_target > 0 and an initial "
                   f"algorithm.kl_coef > 0, got kl_coef={algo.kl_coef!r}; set both > 0 (e.g. algorithm.kl_coef=0.01), "
                   "or algorithm.kl_target=null for a fixed coefficient")
    if algo.state_similarity is not None and not 0 < algo.state_similarity <= 1:
        out.append(f"algorithm.state_similarity={algo.state_similarity!r} must be in (0, 1] or null (exact "
                   "state_key match); set it to e.g. 0.9, or algorithm.state_similarity=null")
    if trainer.checkpoint_every < 0 or trainer.keep_checkpoints < 1:
        out.append(f"trainer.checkpoint_every must be >= 0 (0 = off) and trainer.keep_checkpoints >= 1, got "
                   f"{trainer.checkpoint_every!r} and {trainer.keep_checkpoints!r}; set e.g. "
                   "trainer.checkpoint_every=50 trainer.keep_checkpoints=1")
    keep = trainer.rollouts
    if keep.view_every < 0:
        out.append(f"trainer.rollouts.view_every={keep.view_every!r} must be >= 0 (0 = write view.html at the end "
                   "only); set e.g. trainer.rollouts.view_every=10")
    if keep.every < 0 or (keep.episodes is not None and keep.episodes < 1) or (keep.tokens is not None
                                                                                and keep.tokens < 0):
        out.append(f"trainer.rollouts.every must be >= 0 (0 = keep no rollouts), trainer.rollouts.episodes >= 1 or "
                   f"null (all) and trainer.rollouts.tokens >= 0 or null (all), got every={keep.every!r}, "
                   f"episodes={keep.episodes!r}, tokens={keep.tokens!r}; set e.g. trainer.rollouts.every=10 "
                   "trainer.rollouts.episodes=16")
    staleness = trainer.max_staleness
    staleness_ok = isinstance(staleness, int) and not isinstance(staleness, bool) and staleness >= 0
    if not staleness_ok:
        out.append(f"trainer.max_staleness must be an int >= 0 (0 = the synchronous algorithm), got {staleness!r}; "
                   "set e.g. trainer.max_staleness=1")
    out += logger_problems(cfg.logger)

    # ------------------------------------------------------------ switches that exclude or need others
    if trainer.async_rollouts and staleness_ok and staleness > 0 and algo.tis == "none":
        out.append(f"trainer.max_staleness={staleness} samples rollouts with weights up to that many updates old, "
                   "but algorithm.tis='none' does not correct for it; set algorithm.tis=token (or sequence) to "
                   "correct for it by importance sampling, or trainer.max_staleness=0")
    if agent.backend == "http" and trainer.accelerate:
        out.append("agent.backend='http' with trainer.accelerate=true would have every process push the weights to "
                   "the same servers; run the learner in one process against the servers (trainer.accelerate=false; "
                   "several servers route the rollouts), or use agent.backend=vllm (one engine per process)")
    if agent.vllm.sleep_during_update and (trainer.async_rollouts or agent.backend != "vllm"):
        out.append(f"agent.vllm.sleep_during_update=true frees a colocated vLLM engine's memory during each update; "
                   f"it needs agent.backend=vllm (got {agent.backend!r}) and synchronous rollouts "
                   f"(trainer.async_rollouts=false, got {trainer.async_rollouts!r}); set those, or "
                   "agent.vllm.sleep_during_update=false")
    if trainer.accelerate and algo.advantage in VALUE_TARGETS and algo.critic == "separate":
        out.append(f"trainer.accelerate=true trains the policy data-parallel, but algorithm.advantage="
                   f"{algo.advantage!r} with algorithm.critic='separate' trains a critic model on one process; "
                   "set algorithm.critic=shared (a value head trained data-parallel with the policy)")
    return out


def logger_problems(logger: LoggerConfig) -> list[str]:
    """A chosen tracker without its library, an unknown W&B mode, table sizes out of range."""
    out = [f"logger.{name} is chosen but the {package} package is not installed; {TRACKERS_EXTRA} (or pip install "
           f"{package}), or leave {name} out of logger=[...]"
           for name, package in TRACKER_PACKAGES.items()
           if getattr(logger, name) is not None and importlib.util.find_spec(package) is None]
    if logger.wandb is not None and logger.wandb.mode not in WANDB_MODES:
        out.append(_not_one_of("logger.wandb.mode", logger.wandb.mode, WANDB_MODES))
    if logger.episodes < 0 or logger.episodes_every < 1:
        out.append(f"logger.episodes must be >= 0 (0 = no episode tables) and logger.episodes_every >= 1, got "
                   f"episodes={logger.episodes!r}, episodes_every={logger.episodes_every!r}; set e.g. "
                   "logger.episodes=8 logger.episodes_every=10")
    return out


def advantage_kwargs_problem(advantage: str, kwargs: Mapping) -> str | None:
    """Why ``kwargs`` cannot be given to the registered estimator ``advantage`` (keys its
    signature does not take), or None when it takes them all."""
    accepted = set(inspect.signature(ADVANTAGES.get(advantage)).parameters) - {"batch"}
    unknown = set(kwargs) - accepted
    if not unknown:
        return None
    return (f"algorithm.advantage_kwargs has {sorted(unknown)}, which algorithm.advantage={advantage!r} does not "
            f"take; it accepts {sorted(accepted)}: remove the others (e.g. ~algorithm.advantage_kwargs.{min(unknown)})")


def _not_one_of(key: str, value, allowed: Sequence[str]) -> str:
    allowed = list(allowed)
    return f"{key}={value!r} is not one of {allowed}; set {key} to one of them (e.g. {key}={allowed[0]})"
