"""What a run keeps for people to look at: every step's episodes, token by token
(``rollouts``: the format; ``keep``: records made from a step's trajectories and the learner's
per-token figures; ``store``: the files under ``RUN/rollouts/`` and ``load_rollouts``)."""

from turnrl.runs.rollouts import FORMAT, EpisodeRecord, Tokens
from turnrl.runs.store import load_rollouts, rollout_steps

__all__ = ["FORMAT", "EpisodeRecord", "Tokens", "load_rollouts", "rollout_steps"]
