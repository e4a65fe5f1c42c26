"""Gymnasium registration of the turnrl environments (idempotent)."""

from __future__ import annotations

import gymnasium

NAMESPACE = "turnrl"

ENV_ENTRY_POINTS: tuple[tuple[str, str], ...] = (
    ("turnrl/GuessNumber-v0", "turnrl.envs.guess_number:GuessNumberEnv"),
    ("turnrl/CalcMath-v0", "turnrl.envs.calc_math:CalcMathEnv"),
)


def register_envs() -> None:
    """Register every turnrl env with gymnasium; ids already registered are left alone."""
    for env_id, entry_point in ENV_ENTRY_POINTS:
        if env_id not in gymnasium.registry:
            gymnasium.register(env_id, entry_point=entry_point)


def registered_env_ids() -> list[str]:
    """Sorted ids of the registered envs in the ``turnrl/`` namespace."""
    return sorted(env_id for env_id, spec in gymnasium.registry.items() if spec.namespace == NAMESPACE)
