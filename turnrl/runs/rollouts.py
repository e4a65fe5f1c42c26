"""The rollout record format (version ``FORMAT``): one JSON object per episode, one gzip'd JSON
Lines file per step and kind (``turnrl.runs.store``).

An episode record holds what the env and the sampler saw (messages, rewards, termination) and,
per token of the episode, what the learner made of it: the token's id and text piece, whether it
was sampled (in the loss mask), its turn and segment, the sampler's and the learner's logprob,
its advantage, its importance weight and the learner's entropy there. Figures that exist only
for sampled tokens are ``None`` on the others (prompt, template and observation tokens), and on
every token of an evaluation episode except the sampler's logprob (nothing trains on them).

A reader checks ``format``: a file written by a newer version is refused with a message, not
misread.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

FORMAT = 1
"""The version of the record format this code writes and reads."""

KINDS = ("train", "eval")
"""``train``: a step's sampled episodes, credited and trained on; ``eval``: the held-out greedy
episodes of an evaluation (after the step of that number; step 0 is before RL)."""


@dataclass
class Tokens:
    """An episode's tokens, one list entry per token (columns of equal length ``n``; ``n`` is
    ``total`` unless ``trainer.rollouts.tokens_per_episode`` kept only the first ``n``).

    Attributes:
        ids: the token ids, exactly as the model saw and sampled them.
        pieces: each token's text (its bytes decoded; a character split over several byte
            tokens is given to the token that completes it, the others get "").
        sampled: whether the token was sampled (the loss mask; False on infrastructure
            failures' rows, which nothing trains on).
        turn: the assistant turn a sampled token belongs to; -1 elsewhere.
        segment: the segment of each token (a template that rewrote history starts a new one).
        sampler_logprob: the sampler's logprob of a sampled token.
        learner_logprob: the learner's logprob of a sampled token (first pass of the update).
        advantage: the credit method's advantage of a sampled token.
        importance_weight: ``algorithm.tis``'s truncated weight of a sampled token; None
            without TIS.
        entropy: the entropy of the learner's next-token distribution at a sampled token.
        total: the episode's token count.
    """

    ids: list[int]
    pieces: list[str]
    sampled: list[bool]
    turn: list[int]
    segment: list[int]
    sampler_logprob: list[float | None]
    learner_logprob: list[float | None]
    advantage: list[float | None]
    importance_weight: list[float | None]
    entropy: list[float | None]
    total: int

    def __post_init__(self):
        n = len(self.ids)
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list) and len(value) != n:
                raise ValueError(f"Tokens.{f.name} has {len(value)} entries for {n} ids: every column has one "
                                 "entry per token")


@dataclass
class EpisodeRecord:
    """One kept episode (``FORMAT`` 1).

    Attributes:
        kind: ``"train"`` or ``"eval"`` (``KINDS``).
        step: the RL step that sampled it (train), or after which it was evaluated (eval; 0:
            before RL).
        index: its position among the step's kept episodes.
        group_id: the task's index in the step's batch (the samples of a task share it).
        task_id: the env's stable id of the task.
        env_id: the sub-env of a mixture, or None.
        reward: the episode's return (the sum of ``turn_rewards``).
        turn_rewards: the env's reward for each assistant turn.
        success: the env's verdict.
        termination: why the episode ended (``turnrl.rollout.termination``).
        error: what failed, when the infrastructure ended the episode.
        excluded: an infrastructure failure left out of training (``trainer.infra_failures``).
        messages: the conversation (``{"role", "content"}``; an assistant message is a turn's
            decoded text, tool calls included; the env's tool results are its messages).
        tool_names: the tools the template was given.
        tool_calls, tool_errors, parse_errors, length_truncated_turns, empty_actions: counts.
        attempts: 2 when the episode was sampled again after an infrastructure failure.
        turn_spans: ``[start, end)`` token span of each turn's sampled ids.
        state_keys: each turn's start state (the env's ``state_key``) as text.
        segment_starts: the token index where each segment begins.
        tokens: per token figures, or None when none were kept.
        format: the record format's version.
    """

    kind: str
    step: int
    index: int
    group_id: int
    task_id: str
    env_id: str | None
    reward: float
    turn_rewards: list[float]
    success: bool
    termination: str
    error: str | None
    excluded: bool
    messages: list[dict]
    tool_names: list[str]
    tool_calls: int
    tool_errors: int
    parse_errors: int
    length_truncated_turns: int
    empty_actions: int
    attempts: int
    turn_spans: list[list[int]]
    state_keys: list[str]
    segment_starts: list[int]
    tokens: Tokens | None = None
    format: int = field(default=FORMAT)

    def to_json(self) -> dict:
        """The record as a JSON-ready dict (sharing this record's lists: no copy is made)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["tokens"] = None if self.tokens is None else {f.name: getattr(self.tokens, f.name) for f in fields(Tokens)}
        return out

    @classmethod
    def from_json(cls, data: dict) -> "EpisodeRecord":
        """The record a ``to_json`` dict holds.

        Raises:
            ValueError: On a record of another format version, or one missing fields.
        """
        version = data.get("format")
        if version != FORMAT:
            raise ValueError(f"a rollout record of format {version!r}; this turnrl reads format {FORMAT}: "
                             "read it with the turnrl version that wrote it")
        names = {f.name for f in fields(cls)}
        missing = names - set(data) - {"tokens"}
        if missing:
            raise ValueError(f"a rollout record without {sorted(missing)}: not a turnrl rollout record")
        tokens = data.get("tokens")
        return cls(**{k: v for k, v in data.items() if k in names and k != "tokens"},
                   tokens=None if tokens is None else Tokens(**tokens))
