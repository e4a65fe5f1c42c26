"""Training: ``python -m turnrl.train`` (``entry``) runs ``loop.train``.

``setup`` (the run's processes, model and logger), ``factories`` (config -> envs, agent, rollout
policy), ``stages`` (warm start, reward model, DPO before RL), ``warm_start``, ``algorithm`` (the
configured algorithm as one object), ``rollout_source`` (sync/async rollouts for each step),
``recorder`` (metrics, evaluations, checkpoints, outputs), ``evaluation`` (held-out greedy
episodes), ``checkpoint``, ``report`` (table and curve), ``logger``, ``reward_model_env``."""
