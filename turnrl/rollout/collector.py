"""Runs B tasks x G samples at once, batching generation across all live episodes each turn."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import gymnasium

from turnrl.chat.renderer import ChatRenderer, Conversation
from turnrl.policies.sampling import SamplingParams
from turnrl.serving.tokens import TokenRefusedError
from turnrl.rollout.compaction import ON_CONTEXT_LIMIT, drop_oldest_turn
from turnrl.rollout.env_calls import EnvCalls
from turnrl.rollout.termination import INFRA_FAILURE_POLICIES, Termination, failure_termination, is_infra_failure
from turnrl.rollout.trajectory import Trajectory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Task:
    """A task is an env seed plus the split it is drawn from (``train`` or ``test``)."""

    seed: int
    split: str = "train"


@dataclass
class _Episode:
    """An episode in flight: its env, its conversation, and the ``Trajectory`` it fills in.

    ``traj`` is made at reset with the conversation's own lists as its token-level fields
    (``token_ids``, ``loss_mask``, ``logprobs``, ``turn_spans``, ``messages``: shared, not
    copied), so every renderer append is the trajectory's; the episode-level fields (rewards,
    counts, ``termination``) are set on ``traj`` as steps come in. ``traj.termination`` is None
    while the episode is live; ``collect`` hands out ``traj`` itself.
    """

    env: gymnasium.Env
    conv: Conversation
    traj: Trajectory

    slot: int = 0  # the episode's place in the batch (and its env's in the pool)

    @classmethod
    def start(cls, env: gymnasium.Env | None, conv: Conversation, group_id: int, task_id: str, slot: int,
              termination: Termination | None = None, **fields) -> _Episode:
        """An episode on ``conv``: live, or already ended with ``termination`` (``fields``:
        further ``Trajectory`` fields, e.g. ``env_id``)."""
        traj = Trajectory.from_conversation(conv, [], False, group_id, task_id, termination, **fields)
        return cls(env, conv, traj, slot)


class RolloutCollector:
    """Collects token-exact multi-turn trajectories from a policy and a family of envs.

    Each turn, every live episode's current segment is sent to the policy in one batch; the
    sampled ids are appended verbatim, the decoded text is the env's action, and the
    env's new messages are rendered with the chat template (the env's tools, ``info["tools"]``
    of its reset, are given to the template).

    Beyond new messages, an env may say three things (``turnrl.envs.agent.AgentEnv`` says all
    of them): a step whose info holds ``context`` rewrote the conversation, which goes on in a
    new segment rendered from those messages (with ``info["tools"]``, when given, as its tools);
    a last step whose info holds ``turn_rewards`` (one finite number per turn played) sets every
    turn's reward; and an env with a ``sampled_turn(prompt_tokens, completion_tokens,
    finish_reason)`` method is told each turn's usage just before its step.

    Failures end one episode, never the batch (``turnrl.rollout.termination``): an env that
    cannot be made or raises in ``reset`` or ``step``, or sends messages the template cannot
    render, ends its episode with ``termination="env_error"``; a tool that could not run for a
    reason that is not the model's (``turnrl.tools.ToolUnavailableError``) with ``"tool_error"``;
    a reset or step that runs past ``step_timeout_s`` with ``"step_timeout"`` (its env is
    abandoned and replaced by a new one from ``env_fn``; the stuck thread cannot keep the
    process alive). A ``TokenRefusedError`` (a server refused the token of a remote env or
    tool) is raised instead: it would refuse every episode alike.

    Args:
        env_fn: makes one env (called lazily; envs are pooled and reused across calls).
        policy: a backend with ``generate(prompts, params) -> list[Generation]``.
        renderer: the chat renderer of the policy's tokenizer.
        max_context_tokens: most tokens the sampler sees: a segment that would exceed it after
            its next turn is compacted (``on_context_limit="compact"``) or ends the episode with
            ``termination="context_length"`` (``"end"``).
        max_observation_tokens: an observation (the env's messages of one step) longer than
            this many tokens ends the episode with ``termination="observation_length"``; None:
            no bound of its own.
        max_episode_tokens: an episode whose tokens (all segments) would exceed this after its
            next turn ends with ``termination="episode_length"``; None: no bound.
        on_context_limit: ``"end"`` or ``"compact"``: the env's ``compact(messages) -> messages``
            (default ``turnrl.rollout.compaction.drop_oldest_turn``, repeated while it shortens
            the conversation) and the episode goes on in a new segment rendered from the result.
        env_workers: threads that step the live episodes' envs of a turn concurrently, so
            slow tools of many episodes overlap (1 = one after another). Results are applied
            in row order, so the trajectories do not depend on it.
        step_timeout_s: seconds one ``reset`` or ``step`` may take; None: no deadline.
        infra_failures: ``"refill"`` samples each episode the infrastructure ended once more
            (same task and group; the new episode takes its place, failed or not); ``"drop"``
            and ``"keep"`` return them as they are (the learner's ``collate`` then drops or keeps them).
    """

    def __init__(self, env_fn: Callable[[], gymnasium.Env], policy, renderer: ChatRenderer,
                 max_context_tokens: int = 1024, env_workers: int = 16, *, max_observation_tokens: int | None = None,
                 max_episode_tokens: int | None = None, on_context_limit: str = "end",
                 step_timeout_s: float | None = None, infra_failures: str = "drop"):
        if isinstance(env_workers, bool) or not isinstance(env_workers, int) or env_workers < 1:
            raise ValueError(f"env_workers must be a positive int (1 = sequential), got {env_workers!r}")
        if on_context_limit not in ON_CONTEXT_LIMIT:
            raise ValueError(f"on_context_limit must be one of {ON_CONTEXT_LIMIT}, got {on_context_limit!r}")
        if infra_failures not in INFRA_FAILURE_POLICIES:
            raise ValueError(f"infra_failures must be one of {INFRA_FAILURE_POLICIES}, got {infra_failures!r}")
        self.max_observation_tokens, self.max_episode_tokens = max_observation_tokens, max_episode_tokens
        self.on_context_limit = on_context_limit
        self.env_workers, self.infra_failures = env_workers, infra_failures
        self.env_fn = env_fn
        self.policy = policy
        self.renderer = renderer
        self.max_context_tokens = max_context_tokens
        self._calls = EnvCalls(env_workers, step_timeout_s)
        self._pool: list[gymnasium.Env | None] = []

    @classmethod
    def for_run(cls, cfg, env_fn: Callable[[], gymnasium.Env], policy, renderer: ChatRenderer) -> RolloutCollector:
        """The collector a run's config asks for (``cfg.agent``'s token limits, ``trainer.env_workers``,
        ``trainer.step_timeout_s``, ``trainer.infra_failures``)."""
        agent, trainer = cfg.agent, cfg.trainer
        return cls(env_fn, policy, renderer, agent.max_context_tokens, trainer.env_workers,
                   max_observation_tokens=agent.max_observation_tokens, max_episode_tokens=agent.max_episode_tokens,
                   on_context_limit=agent.on_context_limit, step_timeout_s=trainer.step_timeout_s,
                   infra_failures=trainer.infra_failures)

    def close(self) -> None:
        """Close the pooled envs (a close that raises is logged, never raised) and the workers."""
        envs, self._pool = [e for e in self._pool if e is not None], []
        for env, result in zip(envs, self._calls.map([env.close for env in envs], "env close")):
            if isinstance(result, BaseException):
                log.warning("env.close() of %s raised %r", type(env).__name__, result)
        self._calls.close()

    def _env(self, slot: int) -> gymnasium.Env | Exception:
        """The pooled env of ``slot``, made (``env_fn``) when the slot has none; or what
        ``env_fn`` raised (the slot stays empty, to be made again next time)."""
        while len(self._pool) <= slot:
            self._pool.append(None)
        if self._pool[slot] is None:
            try:
                self._pool[slot] = self.env_fn()
            except TokenRefusedError:
                raise
            except Exception as exc:  # e.g. a remote env whose server is down
                return exc
        return self._pool[slot]

    def collect(self, tasks: list[Task], group_size: int, params: SamplingParams) -> list[Trajectory]:
        """Roll out ``group_size`` episodes of each task. A policy that keeps a prefix cache
        (``clear_cache``) starts the batch with an empty one and empties it after (its keys and
        values are not held through the learner's update).

        Returns:
            ``len(tasks) * group_size`` trajectories, grouped: rows ``g*G .. g*G+G-1`` are the
            samples of ``tasks[g]`` and carry ``group_id == g``. With ``infra_failures="refill"``
            a row the infrastructure ended was sampled once more (its ``attempts`` is 2).
        """
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        clear_cache = getattr(self.policy, "clear_cache", None)
        if clear_cache is not None:  # a batch's figures depend on its own episodes only
            clear_cache()
        try:
            slots = [(group_id, task) for group_id, task in enumerate(tasks) for _ in range(group_size)]
            trajectories = self._run(slots, params)
            failed = [i for i, t in enumerate(trajectories) if is_infra_failure(t.termination)]
            if failed and self.infra_failures == "refill":
                for i, again in zip(failed, self._run([slots[i] for i in failed], params)):
                    again.attempts = 2
                    trajectories[i] = again
            return trajectories
        finally:
            if clear_cache is not None:
                clear_cache()

    def _run(self, slots: list[tuple[int, Task]], params: SamplingParams) -> list[Trajectory]:
        """One episode per ``(group_id, task)`` slot, all turns batched; the trajectories in slot order."""
        made = [self._env(i) for i in range(len(slots))]  # envs made here, one after another
        resets = iter(self._calls.map([_resetter(env, task) for env, (_, task) in zip(made, slots)
                                       if not isinstance(env, BaseException)], "env reset"))
        episodes = [self._start(i, group_id, task, env if isinstance(env, BaseException) else next(resets))
                    for i, (env, (group_id, task)) in enumerate(zip(made, slots))]
        live = [ep for ep in episodes if ep.traj.termination is None]
        while live:
            prompts = [ep.conv.prompt_ids for ep in live]
            generations = self.policy.generate(prompts, params)
            contents = []
            for ep, gen in zip(live, generations):
                contents.append(self.renderer.add_sampled(ep.conv, gen.token_ids, gen.logprobs))
                ep.traj.length_truncated_turns += gen.finish_reason == "length"
                ep.traj.empty_actions += not contents[-1].strip()
            stepped = self._calls.map([_stepper(ep.env, text, len(prompt), gen)
                                       for ep, text, prompt, gen in zip(live, contents, prompts, generations)], "env step")
            live = [ep for ep, outcome in zip(live, stepped) if self._apply(ep, outcome, params)]
        for ep in episodes:  # a state key per turn played (the last observation starts no turn)
            del ep.traj.state_keys[ep.traj.num_turns:]
        return [ep.traj for ep in episodes]

    def _start(self, slot: int, group_id: int, task: Task, outcome: tuple | BaseException) -> _Episode:
        """The episode of ``slot`` after its env's reset returned ``outcome`` (or raised it)."""
        if isinstance(outcome, BaseException):
            return self._failed_start(slot, group_id, task, outcome)
        try:
            obs, info = outcome
            conv = self.renderer.start(_checked_messages(obs), tools=info.get("tools"))
            return _Episode.start(self._pool[slot], conv, group_id, str(info.get("task_id", task.seed)), slot,
                                  state_keys=[info.get("state_key")], env_id=info.get("env_id"))
        except Exception as exc:  # messages the template cannot render: the env's fault
            return self._failed_start(slot, group_id, task, exc)

    def _failed_start(self, slot: int, group_id: int, task: Task, exc: BaseException) -> _Episode:
        """An episode that ended before its first turn because its env failed with ``exc``."""
        termination = self._fail(slot, exc, f"reset of task seed {task.seed}")
        return _Episode.start(self._pool[slot], Conversation(), group_id, str(task.seed), slot, termination,
                              error=repr(exc))

    def _fail(self, slot: int, exc: BaseException, during: str) -> Termination:
        """The termination an env failure ``exc`` gives (re-raising a refused token); an env
        abandoned past its deadline leaves the pool (a new one is made for the next episode)."""
        if isinstance(exc, TokenRefusedError):  # a wrong setup, not a failing episode: stop with its message
            raise exc
        log.warning("env raised during %s: %r", during, exc)
        termination = failure_termination(exc)
        if termination == "step_timeout" and slot < len(self._pool):
            self._pool[slot] = None  # still stuck in the call: never reused
        return termination

    def _apply(self, ep: _Episode, outcome: tuple | BaseException, params: SamplingParams) -> bool:
        """Record one episode's step result (or the exception it raised); return whether it goes on."""
        traj, conv = ep.traj, ep.conv
        if not isinstance(outcome, BaseException):
            saved = (list(conv.messages), len(conv.token_ids), list(conv.segment_starts), conv.text, list(conv.tools))
            try:
                return self._apply_step(ep, *outcome, params)
            except Exception as exc:  # a malformed step result (hostile or buggy env): undo what it added
                outcome = exc
                messages, length, conv.segment_starts[:], conv.text, conv.tools[:] = saved
                conv.messages[:] = messages
                for ids in (conv.token_ids, conv.loss_mask, conv.logprobs):
                    del ids[length:]
        # a failing env or tool ends this episode, not the run
        traj.termination = self._fail(ep.slot, outcome, f"step of task {traj.task_id}")
        traj.error, traj.success = repr(outcome), False
        del traj.turn_rewards[traj.num_turns - 1:], traj.state_keys[traj.num_turns:]
        traj.turn_rewards.append(0.0)
        self.renderer.add_observation(conv, [], add_generation_prompt=False)
        return False

    def _apply_step(self, ep: _Episode, obs, reward, terminated, truncated, info: dict,
                    params: SamplingParams) -> bool:
        """Record a step's result; return whether the episode goes on.

        Raises:
            Exception: On a result that is not what the env contract says (the caller ends
                the episode with ``env_error``).
        """
        traj = ep.traj
        reward = float(reward)
        if reward != reward or reward in (float("inf"), float("-inf")):
            raise ValueError(f"the env returned the reward {reward}, which is not a finite number")
        traj.turn_rewards.append(reward)
        traj.success = bool(info.get("success", False))
        if "verifier_reward" in info:  # rewarded by a learned model (envs.reward_model)
            traj.verifier_reward = float(info["verifier_reward"])
        traj.tool_calls += int(info.get("tool_calls", 0))
        traj.tool_errors += int(info.get("tool_errors", 0))
        traj.parse_errors += int(bool(info.get("parse_error", False)))
        if terminated or truncated:
            if "turn_rewards" in info:  # rewards per turn, known at the end (an agent program's call_rewards)
                traj.turn_rewards[:] = _turn_rewards(info["turn_rewards"], traj.num_turns)
            traj.termination = "terminated" if terminated else "truncated"
            self.renderer.add_observation(ep.conv, [], add_generation_prompt=False)
            return False
        obs = _checked_messages(obs)
        if self.max_observation_tokens is not None and self._tokens(obs) > self.max_observation_tokens:
            traj.termination = "observation_length"
            self.renderer.add_observation(ep.conv, [], add_generation_prompt=False)
            return False
        mark = (len(ep.conv.token_ids), len(ep.conv.segment_starts))
        context = info.get("context")
        if context is not None:  # the env rewrote the conversation: a new segment rendered from it
            if "tools" in info:
                ep.conv.tools[:] = [dict(t) for t in info["tools"] or []]  # the trajectory's list too
            self.renderer.restart(ep.conv, _checked_messages(context))
        else:
            self.renderer.add_observation(ep.conv, obs, add_generation_prompt=True)
        if not self._fits_context(ep, params.max_new_tokens, mark):
            traj.termination = "context_length"
            return False
        if self.max_episode_tokens is not None and len(ep.conv.token_ids) + params.max_new_tokens > self.max_episode_tokens:
            traj.termination = "episode_length"
            return False
        traj.state_keys.append(info.get("state_key"))
        return True

    def _tokens(self, messages: list[dict]) -> int:
        return sum(len(self.renderer.encode(m.get("content", ""))) for m in messages)

    def _fits_context(self, ep: _Episode, max_new_tokens: int, mark: tuple[int, int]) -> bool:
        """Whether the next turn fits ``max_context_tokens``, after compacting the conversation
        (``on_context_limit="compact"``) into a new segment when it does not (the ids rendered
        since ``mark``, ``(tokens, segments)`` before the observation, are dropped first: no
        turn was sampled after them)."""
        conv = ep.conv
        if len(conv.prompt_ids) + max_new_tokens <= self.max_context_tokens:
            return True
        if self.on_context_limit != "compact":
            return False
        compact = getattr(ep.env.unwrapped, "compact", drop_oldest_turn)
        messages = list(conv.messages)
        while True:
            shorter = compact(messages)
            if len(shorter) >= len(messages):
                return False
            messages = shorter
            text = self.renderer.render(messages, add_generation_prompt=True, tools=conv.tools)
            if len(self.renderer.encode(text)) + max_new_tokens <= self.max_context_tokens:
                self.renderer.restart(conv, messages, drop_from=mark)
                return True


def _checked_messages(obs) -> list[dict]:
    """``obs`` as a list of chat messages, checked: each a mapping with a str ``role`` and a
    str ``content`` (what the chat template renders).

    Raises:
        TypeError: Naming the first message that is not one.
    """
    messages = list(obs)
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise TypeError(f"observation message {i} is {m!r:.80}; an env's messages are dicts with a str 'role' "
                            "and a str 'content'")
    return messages


def _turn_rewards(rewards, turns: int) -> list[float]:
    """``info["turn_rewards"]`` checked: one finite number per turn played.

    Raises:
        ValueError: Saying what is wrong with them.
    """
    values = [float(r) for r in rewards]
    if len(values) != turns or not all(math.isfinite(v) for v in values):
        raise ValueError(f"info['turn_rewards'] must hold one finite reward per turn ({turns}), got {rewards!r:.200}")
    return values


def _resetter(env: gymnasium.Env, task: Task) -> Callable[[], tuple]:
    def reset() -> tuple:
        return env.reset(seed=task.seed, options={"split": task.split})
    return reset


def _stepper(env: gymnasium.Env, content: str, prompt_tokens: int, gen) -> Callable[[], tuple]:
    """The step of ``env`` with ``content``; an env with a ``sampled_turn(prompt_tokens,
    completion_tokens, finish_reason)`` hook (``turnrl.envs.agent.AgentEnv``) is told the turn's
    usage first."""
    def step() -> tuple:
        hook = getattr(env.unwrapped, "sampled_turn", None)
        if hook is not None:
            hook(prompt_tokens, len(gen.token_ids), gen.finish_reason)
        return env.step(content)
    return step
