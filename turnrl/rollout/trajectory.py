"""The one hand-off between rollout and learning."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from turnrl.rollout.termination import Termination


@dataclass
class Trajectory:
    """One multi-turn episode, token-exact, in one or more segments.

    ``T`` is the number of tokens, ``K`` the number of assistant turns, ``S`` of segments. A
    segment is one sequence the sampler saw: it starts with a full render of the conversation
    and goes on with sampled and template ids. A template that preserves its prefix keeps one
    segment; one that rewrites history (or an env's compaction) starts a new one, and the
    learner scores each segment as its own sequence (``turnrl.algorithms.segments``).

    Attributes:
        token_ids: ``[T]`` the prompt, every sampled id exactly as sampled, and the template /
            observation ids in between (sampled text is never re-tokenized); the segments'
            ids concatenated.
        loss_mask: ``[T]`` 1 exactly on sampled ids.
        logprobs: ``[T]`` the sampler's logprob of each sampled id; 0.0 where loss_mask is 0.
        turn_spans: ``[K]`` half-open ``(start, end)`` token span of each turn's sampled ids.
        turn_rewards: ``[K]`` the env's reward for each turn; the outcome arrives on the last.
        success: the env's verdict on the episode (``info["success"]`` of the last step).
        group_id: index of the task within the batch; the G samples of a task share it.
        task_id: the env's stable id of the task (same seed and split, same id).
        termination: why the episode ended, the model's doing or the infrastructure's
            (``turnrl.rollout.termination``): env ``terminated``, ``truncated`` (turn limit),
            ``context_length`` (the next turn would not fit ``max_context_tokens``),
            ``observation_length`` (one observation over ``max_observation_tokens``),
            ``episode_length`` (over ``max_episode_tokens``); or ``env_error`` (the env raised;
            see ``error``), ``tool_error`` (a tool could not run, not for the model's input) or
            ``step_timeout`` (a reset or step past its deadline).
        messages: the conversation as chat messages (the template renders them to the decoded
            ``token_ids``, up to the tokenizer's normalization, e.g. Qwen's NFC).
        state_keys: ``[K]`` the env's ``state_key`` at the start of each turn.
        tool_calls / tool_errors / parse_errors: counts over the episode (from env info).
        length_truncated_turns: turns cut by ``max_new_tokens`` before the end-of-turn token.
        empty_actions: turns that gave the env an empty action (nothing sampled but the end of the
            turn, or a thought the prompt opened and the turn never closed: the env reads only what
            follows it).
        error: the exception text when the infrastructure ended the episode.
        verifier_reward: the env's own return when the rewards came from a learned reward
            model (``info["verifier_reward"]`` of the last step); None otherwise.
        env_id: the sub-env of a mixture that played the episode (``info["env_id"]`` at
            reset); None for a single env.
        segment_starts: ``[S]`` index in ``token_ids`` where each segment begins (``[0]``).
        tools: the tools' JSON schemas the chat template was given (``[]`` for none).
        attempts: 2 when the episode was sampled again because the infrastructure ended the
            first try (``trainer.infra_failures="refill"``), else 1.
    """

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    turn_spans: list[tuple[int, int]]
    turn_rewards: list[float]
    success: bool
    group_id: int
    task_id: str
    termination: Termination
    messages: list[dict] = field(default_factory=list)
    state_keys: list[Hashable] = field(default_factory=list)
    tool_calls: int = 0
    tool_errors: int = 0
    parse_errors: int = 0
    length_truncated_turns: int = 0
    empty_actions: int = 0
    error: str | None = None
    verifier_reward: float | None = None
    env_id: str | None = None
    segment_starts: list[int] = field(default_factory=lambda: [0])
    tools: list[dict] = field(default_factory=list)
    attempts: int = 1

    @classmethod
    def from_conversation(cls, conv, turn_rewards: list[float], success: bool, group_id: int, task_id: str,
                          termination: Termination, **fields) -> "Trajectory":
        """The trajectory of a rendered ``turnrl.chat.renderer.Conversation``: its token-level
        fields (ids, masks, logprobs, turn spans, segments, messages, tools) shared, not copied."""
        return cls(token_ids=conv.token_ids, loss_mask=conv.loss_mask, logprobs=conv.logprobs,
                   turn_spans=conv.turn_spans, turn_rewards=turn_rewards, success=success, group_id=group_id,
                   task_id=task_id, termination=termination, messages=conv.messages,
                   segment_starts=conv.segment_starts, tools=conv.tools, **fields)

    @property
    def reward(self) -> float:
        """Undiscounted return: the sum of per-turn rewards."""
        return float(sum(self.turn_rewards))

    @property
    def num_turns(self) -> int:
        return len(self.turn_spans)

    @property
    def num_segments(self) -> int:
        return len(self.segment_starts)

    @property
    def num_generated_tokens(self) -> int:
        return int(sum(self.loss_mask))

    def __post_init__(self):
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"token_ids, loss_mask and logprobs must have one length; got {n}, "
                f"{len(self.loss_mask)}, {len(self.logprobs)}"
            )
        if len(self.turn_rewards) != len(self.turn_spans):
            raise ValueError(f"{len(self.turn_spans)} turn spans but {len(self.turn_rewards)} turn rewards")
        if not self.segment_starts or self.segment_starts[0] != 0 or any(
                b <= a for a, b in zip(self.segment_starts, self.segment_starts[1:])) or self.segment_starts[-1] > max(n - 1, 0):
            raise ValueError(f"segment_starts must start at 0 and increase within the {n} tokens, got {self.segment_starts}")


def assert_trainable(trajectories: Sequence[Trajectory]) -> None:
    """Refuse to train on turns that are not token-exact.

    A trajectory is trainable when the sampler's logprob of every sampled token
    (``loss_mask == 1``) is finite. Text-mode turns of ``OpenAIPolicy`` carry NaN logprobs
    (their ids were re-tokenized on the client), so a trajectory holding one fails.

    Raises:
        ValueError: Naming the offending trajectories and how to fix it.
    """
    bad = []
    for i, traj in enumerate(trajectories):
        if any(m and not math.isfinite(lp) for m, lp in zip(traj.loss_mask, traj.logprobs)):
            bad.append(i)
    if bad:
        raise ValueError(
            f"{len(bad)} of {len(trajectories)} trajectories (rows {bad[:10]}{' ...' if len(bad) > 10 else ''}) "
            "have sampled tokens without a finite sampler logprob: they are not token-exact (e.g. made by "
            "OpenAIPolicy(mode='text'), whose ids are re-tokenized text) and cannot be trained on. Use "
            "mode='tokens' against a server that returns token ids and logprobs (vLLM, turnrl serve-policy) "
            "for training; keep text mode for evaluation."
        )
