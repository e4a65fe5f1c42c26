"""The collapse watch: after each RL step, checks the run's metrics so far for the signs of a run
going wrong that a reward curve hides, and warns once per run and kind, naming the likely cause
and the setting to try.

Each check in ``CHECKS`` is a pure function ``check(history, watch, cfg) -> Finding | None`` of
the train metrics so far (``history``: one dict per step, the last is the step just taken), the
thresholds (``trainer.watch``, ``turnrl.conf.schema.WatchConfig``) and the run's config (to name
its settings). ``Watch`` runs them, logs each new finding as a warning and keeps them all
(``RUN/warnings.json``; the first page of ``view.html`` shows them).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from turnrl.conf.schema import Config, WatchConfig
from turnrl.registry import Registry

log = logging.getLogger(__name__)

WARNINGS_FILE = "warnings.json"


@dataclass(frozen=True)
class Finding:
    """What a check saw (``title``, with the figures) and what to do (``detail``: the likely
    cause and the settings to try)."""

    title: str
    detail: str


@dataclass(frozen=True)
class RunWarning:
    """A finding at the step it was first seen, under its check's name (``key``)."""

    step: int
    key: str
    title: str
    detail: str


Check = Callable[[list[dict], WatchConfig, Config], "Finding | None"]
CHECKS: Registry[Check] = Registry("collapse check")


def _mean(rows: list[dict], key: str) -> float | None:
    values = [float(r[key]) for r in rows if key in r and math.isfinite(float(r[key]))]
    return sum(values) / len(values) if values else None


def _windows(history: list[dict], window: int) -> tuple[list[dict], list[dict]] | None:
    """The ``window`` steps before the last ``window``, and the last ``window``; None while fewer
    than ``2 * window`` steps ran."""
    if window < 1 or len(history) < 2 * window:
        return None
    return history[-2 * window:-window], history[-window:]


@CHECKS.register("diversity")
def diversity(history: list[dict], watch: WatchConfig, cfg: Config) -> Finding | None:
    """Reward rose while the samples' diversity (``unique_ngram_rate``, ``distinct_answers``) fell
    by ``watch.diversity_drop`` or more: the last window against the one before."""
    windows = _windows(history, watch.window)
    if windows is None:
        return None
    before, last = windows
    reward_before, reward_last = _mean(before, "reward"), _mean(last, "reward")
    if reward_before is None or reward_last is None or reward_last <= reward_before:
        return None
    for key in ("unique_ngram_rate", "distinct_answers"):
        was, now = _mean(before, key), _mean(last, key)
        if was and now is not None and now < (1 - watch.diversity_drop) * was:
            return Finding(
                f"diversity fell while reward rose: {key} {was:.2f} -> {now:.2f}, reward {reward_before:.2f} -> "
                f"{reward_last:.2f} (means of steps {before[0].get('step')}-{before[-1].get('step')} and "
                f"{last[0].get('step')}-{last[-1].get('step')})",
                "a group's samples are becoming copies of one another: the reward can keep rising on a narrowing "
                "set of answers while exploration stops (a silent collapse). Try a higher agent.temperature (now "
                f"{cfg.agent.temperature}), an entropy bonus (algorithm.entropy_coef=0.001, now "
                f"{cfg.algorithm.entropy_coef}), a KL to the reference (algorithm.kl_coef=0.01, now "
                f"{cfg.algorithm.kl_coef}) or a lower trainer.lr (now {cfg.trainer.lr})")
    return None


def _entropy_now_and_first(history: list[dict], window: int) -> tuple[float, float] | None:
    """Mean entropy of the first ``window`` steps and of the last ``window``; None before
    ``2 * window`` steps or without entropies."""
    if window < 1 or len(history) < 2 * window:
        return None
    first, now = _mean(history[:window], "entropy"), _mean(history[-window:], "entropy")
    return None if not first or now is None else (first, now)


@CHECKS.register("entropy_collapse")
def entropy_collapse(history: list[dict], watch: WatchConfig, cfg: Config) -> Finding | None:
    """The policy's entropy per sampled token over the last window fell below
    ``watch.entropy_fraction`` of the first window's."""
    figures = _entropy_now_and_first(history, watch.window)
    if figures is None or figures[1] >= watch.entropy_fraction * figures[0]:
        return None
    first, now = figures
    return Finding(
        f"entropy collapsed: {first:.3f} -> {now:.3f} nats per sampled token (first {watch.window} steps, last "
        f"{watch.window})",
        "the policy has become nearly deterministic: its samples stop exploring and a group's samples stop "
        "differing (see zero_signal_groups). Usual causes: a learning rate too high for the model (trainer.lr="
        f"{cfg.trainer.lr}) or sampling too cold (agent.temperature={cfg.agent.temperature}). Try a lower "
        "trainer.lr, an entropy bonus (algorithm.entropy_coef=0.001), a KL to the reference "
        "(algorithm.kl_coef=0.01) or clip-higher (algorithm.clip_high=0.28)")


def _rate(key: str, what: str, advice: Callable[[Config], str]) -> Check:
    """A check that the last step's ``key`` is at most its ``trainer.watch`` threshold."""

    def check(history: list[dict], watch: WatchConfig, cfg: Config) -> Finding | None:
        value, bound = history[-1].get(key) if history else None, getattr(watch, key)
        if value is None or not float(value) > bound:
            return None
        return Finding(f"{what}: {key}={float(value):.2f} (above trainer.watch.{key}={bound})", advice(cfg))

    check.__doc__ = f"The last step's ``{key}`` above ``trainer.watch.{key}``."
    return check


CHECKS.register("turn_length_cut_rate")(_rate(
    "turn_length_cut_rate", "most turns were cut before their end-of-turn token",
    lambda cfg: f"replies run into agent.max_new_tokens={cfg.agent.max_new_tokens}: raise it if replies are cut; "
                "a rise during training is the sign of replies that stop ending (often with rising entropy)"))
CHECKS.register("tool_parse_error_rate")(_rate(
    "tool_parse_error_rate", "most turns hold a malformed tool call",
    lambda cfg: f"check the call format the model writes (parser {cfg.agent.tool_parser!r}, chat format "
                f"{cfg.agent.chat_format!r}); python -m turnrl check-env ENV --agent-path MODEL shows what the "
                "template and parser expect"))
CHECKS.register("infra_failure_rate")(_rate(
    "infra_failure_rate", "the infrastructure ended most episodes (env_error, tool_error, step_timeout)",
    lambda cfg: f"trainer.infra_failures={cfg.trainer.infra_failures!r} "
                + ("trains on them with the reward they got" if cfg.trainer.infra_failures == "keep" else
                   "leaves them out of the gradient, so few episodes train")
                + "; each episode's error (view.html, the rollouts) says what failed"))
CHECKS.register("context_limit_rate")(_rate(
    "context_limit_rate", "many episodes ran out of context (termination context_length) before the env ended them",
    lambda cfg: f"the prompt (system block, tool schemas) may take most of agent.max_context_tokens="
                f"{cfg.agent.max_context_tokens}: raise it, or shorten the prompt or the observations "
                "(env.kwargs), or let the env compact its history (agent.on_context_limit=compact)"))
CHECKS.register("empty_action_rate")(_rate(
    "empty_action_rate", "nearly no turn reached the env: the actions were empty",
    lambda cfg: "with a thinking template (the prompt opens <think>) the env reads only what follows the closing "
                f"tag, so a turn that never closes its thought does nothing; raise agent.max_new_tokens (now "
                f"{cfg.agent.max_new_tokens}) so thoughts close, warm-start on the env's expert "
                "(agent.warmstart.steps: its targets close the thought), or turn thinking off "
                "(agent.template_kwargs='{enable_thinking: false}')"))
CHECKS.register("mismatch_kl")(_rate(
    "mismatch_kl", "the sampler's logprobs drifted from the learner's",
    lambda cfg: "the tokens trained on were sampled from another distribution than the one the learner scores: "
                "weights not reaching the sampler, a sampler in lower precision than the learner, or sampling "
                "settings the sampler's logprobs leave out (a vLLM server needs --logprobs-mode processed_logprobs "
                f"at agent.temperature={cfg.agent.temperature}). Correct what remains with algorithm.tis=token "
                f"(now {cfg.algorithm.tis!r})"))
CHECKS.register("kl")(_rate(
    "kl", "the policy moved far from the reference",
    lambda cfg: f"raise algorithm.kl_coef (now {cfg.algorithm.kl_coef}), set algorithm.kl_target for an adaptive "
                f"coefficient, or lower trainer.lr (now {cfg.trainer.lr})"))


@CHECKS.register("entropy_rise")
def entropy_rise(history: list[dict], watch: WatchConfig, cfg: Config) -> Finding | None:
    """The policy's entropy per sampled token over the last window rose above
    ``watch.entropy_rise`` times the first window's."""
    figures = _entropy_now_and_first(history, watch.window)
    if figures is None or figures[1] <= watch.entropy_rise * figures[0]:
        return None
    first, now = figures
    return Finding(
        f"entropy rose: {first:.3f} -> {now:.3f} nats per sampled token (first {watch.window} steps, last "
        f"{watch.window})",
        "the policy is spreading its probability over the vocabulary: replies stop ending and turn to noise, and "
        "rewards fall to 0 for good (no group keeps a success, so no gradient brings it back). Usual causes: a "
        f"learning rate too high (trainer.lr={cfg.trainer.lr}), or advantages that push net negative per episode "
        "(turn-level credit under algorithm.loss_agg=seq-mean-token-mean). Try a lower trainer.lr, "
        "algorithm.loss_agg=token-mean, or a KL to the reference (algorithm.kl_coef=0.01)")


@CHECKS.register("zero_signal_groups")
def zero_signal_groups(history: list[dict], watch: WatchConfig, cfg: Config) -> Finding | None:
    """Over the last window, the mean share of groups whose samples all got one reward above
    ``watch.zero_signal_groups``."""
    if watch.window < 1 or len(history) < watch.window:
        return None
    share = _mean(history[-watch.window:], "zero_signal_groups")
    if share is None or share <= watch.zero_signal_groups:
        return None
    reward = _mean(history[-watch.window:], "reward") or 0.0
    return Finding(
        f"no learning signal in {share:.0%} of groups over the last {watch.window} steps (every sample of the task "
        f"got the same reward; mean reward {reward:.2f})",
        "a group-relative advantage is 0 on all of them: the tasks are "
        + ("too hard for the policy" if reward < 0.5 else "too easy for the policy")
        + f". Try a larger trainer.group_size (now {cfg.trainer.group_size}), tasks of mixed difficulty (env.kwargs), "
        f"a warm start (agent.warmstart.steps), or a higher agent.temperature (now {cfg.agent.temperature})")


class Watch:
    """Runs every check after each step; each kind warns once per run.

    Args:
        cfg: the run's config (``cfg.trainer.watch`` holds the thresholds).
        run_dir: where ``warnings.json`` is written (None: nowhere).
        warned: the kinds already warned of (a resumed run's, from its checkpoint).
    """

    def __init__(self, cfg: Config, run_dir: str | Path | None = None, warned: set[str] | None = None):
        self.cfg, self.warned = cfg, set() if warned is None else warned
        self.path = None if run_dir is None else Path(run_dir) / WARNINGS_FILE
        self.warnings: list[RunWarning] = []

    def resume(self, step: int) -> None:
        """Take back the warnings of ``warnings.json`` up to ``step`` (a resumed run's)."""
        if self.path is not None and self.path.is_file():
            kept = [RunWarning(**w) for w in json.loads(self.path.read_text(encoding="utf-8")) if w["step"] <= step]
            self.warnings = kept
            self.warned.update(w.key for w in kept)

    def observe(self, history: list[dict]) -> list[RunWarning]:
        """Run the checks on ``history`` (its last row is the step just taken); log, keep and return
        the new warnings."""
        new = []
        step = int(history[-1].get("step", len(history))) if history else 0
        for key in CHECKS:
            if key in self.warned:
                continue
            finding = CHECKS[key](history, self.cfg.trainer.watch, self.cfg)
            if finding is not None:
                self.warned.add(key)
                new.append(RunWarning(step, key, finding.title, finding.detail))
                log.warning("%s. %s", finding.title, finding.detail)
        if new:
            self.warnings += new
            self.save()
        return new

    def save(self) -> None:
        if self.path is not None:
            self.path.write_text(json.dumps([asdict(w) for w in self.warnings], indent=1), encoding="utf-8")

    def checks_line(self) -> str:
        """What is checked, for the page when nothing warned."""
        return (f"Checked after every step: {', '.join(CHECKS.names())} (thresholds: trainer.watch; trends over "
                f"windows of {self.cfg.trainer.watch.window} steps).")


def load_warnings(run_dir: str | Path) -> list[RunWarning]:
    """The warnings a run wrote (``RUN/warnings.json``); [] when it has none."""
    path = Path(run_dir) / WARNINGS_FILE
    return [RunWarning(**w) for w in json.loads(path.read_text(encoding="utf-8"))] if path.is_file() else []
