"""Losses: per-token policy-gradient losses and KL estimators (``token_losses``), the policy losses
by name (``policy``: PPO clip, GSPO, CISPO, ...), loss aggregation modes and importance weights."""
