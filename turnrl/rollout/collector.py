"""Runs B tasks x G samples at once, batching generation across all live episodes each turn."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import gymnasium

from turnrl.agents.renderer import ChatRenderer, Conversation
from turnrl.agents.sampling import SamplingParams
from turnrl.http_json import TokenRefusedError
from turnrl.rollout.compaction import ON_CONTEXT_LIMIT, drop_oldest_turn
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

    @classmethod
    def start(cls, env: gymnasium.Env, conv: Conversation, group_id: int, task_id: str, **fields) -> _Episode:
        """A live episode on ``conv`` (``fields``: further ``Trajectory`` fields, e.g. ``env_id``)."""
        traj = Trajectory.from_conversation(conv, [], False, group_id, task_id, None, **fields)
        return cls(env, conv, traj)


class RolloutCollector:
    """Collects token-exact multi-turn trajectories from a policy and a family of envs.

    Each turn, every live episode's current segment is sent to the policy in one batch; the
    sampled ids are appended verbatim, the decoded text is the env's action, and the
    env's new messages are rendered with the chat template (the env's tools, ``info["tools"]``
    of its reset, are given to the template). An env (or tool) that raises
    ends its own episode with ``termination="env_error"``; the other episodes go on. A
    ``TokenRefusedError`` (a server refused the token of a remote env or tool) is raised
    instead: it would refuse every episode alike.

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
    """

    def __init__(self, env_fn: Callable[[], gymnasium.Env], policy, renderer: ChatRenderer,
                 max_context_tokens: int = 1024, env_workers: int = 16, *, max_observation_tokens: int | None = None,
                 max_episode_tokens: int | None = None, on_context_limit: str = "end"):
        if isinstance(env_workers, bool) or not isinstance(env_workers, int) or env_workers < 1:
            raise ValueError(f"env_workers must be a positive int (1 = sequential), got {env_workers!r}")
        if on_context_limit not in ON_CONTEXT_LIMIT:
            raise ValueError(f"on_context_limit must be one of {ON_CONTEXT_LIMIT}, got {on_context_limit!r}")
        self.max_observation_tokens, self.max_episode_tokens = max_observation_tokens, max_episode_tokens
        self.on_context_limit = on_context_limit
        self.env_workers = env_workers
        self.env_fn = env_fn
        self.policy = policy
        self.renderer = renderer
        self.max_context_tokens = max_context_tokens
        self._pool: list[gymnasium.Env] = []

    @classmethod
    def for_run(cls, cfg, env_fn: Callable[[], gymnasium.Env], policy, renderer: ChatRenderer) -> RolloutCollector:
        """The collector a run's config asks for (``cfg.agent``'s token limits, ``trainer.env_workers``)."""
        agent = cfg.agent
        return cls(env_fn, policy, renderer, agent.max_context_tokens, cfg.trainer.env_workers,
                   max_observation_tokens=agent.max_observation_tokens, max_episode_tokens=agent.max_episode_tokens,
                   on_context_limit=agent.on_context_limit)

    def _envs(self, n: int) -> list[gymnasium.Env]:
        while len(self._pool) < n:
            self._pool.append(self.env_fn())
        return self._pool[:n]

    def collect(self, tasks: list[Task], group_size: int, params: SamplingParams) -> list[Trajectory]:
        """Roll out ``group_size`` episodes of each task. A policy that keeps a prefix cache
        (``clear_cache``) starts the batch with an empty one and empties it after (its keys and
        values are not held through the learner's update).

        Returns:
            ``len(tasks) * group_size`` trajectories, grouped: rows ``g*G .. g*G+G-1`` are the
            samples of ``tasks[g]`` and carry ``group_id == g``.
        """
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        clear_cache = getattr(self.policy, "clear_cache", None)
        if clear_cache is not None:  # a batch's figures depend on its own episodes only
            clear_cache()
        try:
            return self._collect(tasks, group_size, params)
        finally:
            if clear_cache is not None:
                clear_cache()

    def _collect(self, tasks: list[Task], group_size: int, params: SamplingParams) -> list[Trajectory]:
        envs = self._envs(len(tasks) * group_size)
        episodes: list[_Episode] = []
        for group_id, task in enumerate(tasks):
            for k in range(group_size):
                env = envs[group_id * group_size + k]
                try:
                    obs, info = env.reset(seed=task.seed, options={"split": task.split})
                except TokenRefusedError:  # a wrong setup, not a failing episode: stop with its message
                    raise
                except Exception as exc:  # this episode ends before it starts; the rest go on
                    log.warning("env raised during reset of task seed %d: %r", task.seed, exc)
                    episodes.append(_Episode.start(env, Conversation(), group_id, str(task.seed),
                                                   termination="env_error", error=repr(exc)))
                    continue
                conv = self.renderer.start(list(obs), tools=info.get("tools"))
                episodes.append(_Episode.start(env, conv, group_id, str(info.get("task_id", task.seed)),
                                               state_keys=[info.get("state_key")], env_id=info.get("env_id")))
        live = [ep for ep in episodes if ep.traj.termination is None]
        workers = min(self.env_workers, len(live))
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="turnrl-env") if workers > 1 else _Inline()
        with pool:
            while live:
                generations = self.policy.generate([ep.conv.prompt_ids for ep in live], params)
                contents = []
                for ep, gen in zip(live, generations):
                    contents.append(self.renderer.add_sampled(ep.conv, gen.token_ids, gen.logprobs))
                    ep.traj.length_truncated_turns += gen.finish_reason == "length"
                stepped = list(pool.map(_env_step, [ep.env for ep in live], contents))
                live = [ep for ep, outcome in zip(live, stepped) if self._apply(ep, outcome, params)]
        for ep in episodes:  # a state key per turn played (the last observation starts no turn)
            del ep.traj.state_keys[ep.traj.num_turns:]
        return [ep.traj for ep in episodes]

    def _apply(self, ep: _Episode, outcome: tuple | BaseException, params: SamplingParams) -> bool:
        """Record one episode's step result (or the exception it raised); return whether it goes on."""
        traj = ep.traj
        if isinstance(outcome, BaseException):  # a failing env or tool ends this episode, not the run
            exc = outcome
            log.warning("env raised during step of task %s: %r", traj.task_id, exc)
            traj.turn_rewards.append(0.0)
            traj.termination, traj.error = "env_error", repr(exc)
            self.renderer.add_observation(ep.conv, [], add_generation_prompt=False)
            return False
        obs, reward, terminated, truncated, info = outcome
        traj.turn_rewards.append(float(reward))
        traj.success = bool(info.get("success", False))
        if "verifier_reward" in info:  # rewarded by a learned model (envs.reward_model)
            traj.verifier_reward = float(info["verifier_reward"])
        traj.tool_calls += int(info.get("tool_calls", 0))
        traj.tool_errors += int(info.get("tool_errors", 0))
        traj.parse_errors += int(bool(info.get("parse_error", False)))
        if terminated or truncated:
            traj.termination = "terminated" if terminated else "truncated"
            self.renderer.add_observation(ep.conv, [], add_generation_prompt=False)
            return False
        obs = list(obs)
        if self.max_observation_tokens is not None and self._tokens(obs) > self.max_observation_tokens:
            traj.termination = "observation_length"
            self.renderer.add_observation(ep.conv, [], add_generation_prompt=False)
            return False
        mark = (len(ep.conv.token_ids), len(ep.conv.segment_starts))
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


def _env_step(env: gymnasium.Env, content: str) -> tuple | Exception:
    """``env.step(content)``, or the exception it raised (run in a worker thread)."""
    try:
        return env.step(content)
    except TokenRefusedError:  # raised to the caller (see RolloutCollector)
        raise
    except Exception as exc:
        return exc


class _Inline:
    """A stand-in for a thread pool that maps in the calling thread (``env_workers=1``)."""

    def __enter__(self) -> _Inline:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @staticmethod
    def map(fn: Callable, *iterables):
        return map(fn, *iterables)
