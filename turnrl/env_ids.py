"""The built-in env ids and their entry points, registered with gymnasium by ``import turnrl``.

Entry points are ``"module:Class"`` strings, so registering imports no env module: an env's
code loads on its first ``gymnasium.make``. This module imports nothing of turnrl, which keeps
``import turnrl`` as cheap as ``import gymnasium``.
"""

from __future__ import annotations

import gymnasium

NAMESPACE = "turnrl"

ENV_ENTRY_POINTS: tuple[tuple[str, str], ...] = (
    ("turnrl/GuessNumber-v0", "turnrl.envs.games.guess_number:GuessNumberEnv"),
    ("turnrl/CalcMath-v0", "turnrl.envs.tasks.calc_math:CalcMathEnv"),
    ("turnrl/Mastermind-v0", "turnrl.envs.games.mastermind:MastermindEnv"),
    ("turnrl/Wordle-v0", "turnrl.envs.games.wordle:WordleEnv"),
    ("turnrl/FrozenLake-v0", "turnrl.envs.games.frozen_lake:FrozenLakeEnv"),
    ("turnrl/Sokoban-v0", "turnrl.envs.games.sokoban:SokobanEnv"),
    ("turnrl/Household-v0", "turnrl.envs.games.household:HouseholdEnv"),
    ("turnrl/Mixture-v0", "turnrl.envs.mixture:MixtureEnv"),
    ("turnrl/RetrievalQA-v0", "turnrl.envs.tasks.retrieval_qa:RetrievalQAEnv"),
    ("turnrl/ReasoningGym-v0", "turnrl.envs.adapters.reasoning_gym:ReasoningGymEnv"),
    ("turnrl/Taxi-v0", "turnrl.envs.adapters.toy_text:ToyTextEnv"),
    ("turnrl/PythonCoding-v0", "turnrl.envs.tasks.python_coding:PythonCodingEnv"),
)


def register_envs() -> None:
    """Register every turnrl env with gymnasium; ids already registered are left alone."""
    for env_id, entry_point in ENV_ENTRY_POINTS:
        if env_id not in gymnasium.registry:
            gymnasium.register(env_id, entry_point=entry_point)


def registered_env_ids() -> list[str]:
    """Sorted ids of the registered envs in the ``turnrl/`` namespace."""
    return sorted(env_id for env_id, spec in gymnasium.registry.items() if spec.namespace == NAMESPACE)
