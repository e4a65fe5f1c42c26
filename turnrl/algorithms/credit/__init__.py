"""Credit assignment: advantage estimators (a registry of pure functions: ``advantages``,
``turn_advantages``, ``critic_advantages``), GAE (``gae``), groups and turns,
and ``assign`` (one step's credit: KL in the reward, values, advantages)."""
