"""The built-in env ids and their entry points, registered with gymnasium by ``import turnrl``,
and ``env_id_of``: the id a command-line env name (a registered id, ``module:ClassName`` or
``module:env-id``) stands for.

Entry points are ``"module:Class"`` strings, so registering imports no env module: an env's
code loads on its first ``gymnasium.make``. This module imports nothing of turnrl, which keeps
``import turnrl`` as cheap as ``import gymnasium``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import gymnasium

NAMESPACE = "turnrl"

ENV_ENTRY_POINTS: tuple[tuple[str, str], ...] = (
    ("turnrl/GuessNumber-v0", "turnrl.envs.games.guess_number:GuessNumberEnv"),
    ("turnrl/CalcMath-v0", "turnrl.envs.tasks.calc_math:CalcMathEnv"),
    ("turnrl/Mastermind-v0", "turnrl.envs.games.mastermind:MastermindEnv"),
    ("turnrl/Wordle-v0", "turnrl.envs.games.wordle:WordleEnv"),
    ("turnrl/FrozenLake-v0", "turnrl.envs.games.frozen_lake:FrozenLakeEnv"),
    ("turnrl/KeyDoor-v0", "turnrl.envs.games.key_door:KeyDoorEnv"),
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


class UnknownEnvError(ValueError):
    """An env name that cannot be resolved: an unregistered id, a module that does not import,
    or a ``module:name`` whose name is neither a registered id nor an env class."""


def env_id_of(name: str) -> str:
    """The gymnasium id of the env ``name`` names, for the commands that make envs by id
    (``baselines``, ``build-model``, ``serve-env``): a registered id is itself; ``module:env-id``
    is ``env-id`` (the module registers it on import); ``module:ClassName`` registers the class
    as ``module/ClassName-v0`` (once) and is that id.

    Raises:
        UnknownEnvError: As ``check`` does, saying what did not load and what names work.
    """
    if name in gymnasium.registry:
        return name
    make, _ = resolve_env(name)
    if isinstance(make, type):
        module_name, _, class_name = name.partition(":")
        env_id = f"{module_name}/{class_name}-v0"
        if env_id not in gymnasium.registry:
            gymnasium.register(env_id, entry_point=make)
        return env_id
    return name.partition(":")[2]  # module:env-id (an unregistered name without ":" raised above)


def resolve_env(name: str) -> tuple[Callable[..., gymnasium.Env], str]:
    """How to build the env ``name`` names (a registered id, ``module:env-id`` or
    ``module:ClassName``): a constructor taking the env kwargs, and how a report says it."""
    hint = (f"registered {NAMESPACE} ids: {', '.join(registered_env_ids())}; an env of your own: "
            "module:ClassName or module:env-id (run from the module's folder or put it on PYTHONPATH)")
    env_id = name
    if name not in gymnasium.registry and ":" in name:
        module_name, _, env_id = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except Exception as e:
            raise UnknownEnvError(f"cannot import module {module_name!r} of {name!r} ({type(e).__name__}: {e}); "
                                  f"{hint}") from e
        cls = getattr(module, env_id, None)
        if isinstance(cls, type) and issubclass(cls, gymnasium.Env):
            return cls, f"{module_name}.{env_id}"
        if env_id not in gymnasium.registry:
            raise UnknownEnvError(f"{name!r}: module {module_name!r} has no env class named {env_id!r} and "
                                  f"registers no env id {env_id!r}; {hint}")
    if env_id not in gymnasium.registry:
        raise UnknownEnvError(f"unknown env id {env_id!r}; {hint}")
    return (lambda **kwargs: gymnasium.make(env_id, disable_env_checker=True, **kwargs)), f"gymnasium.make({env_id!r})"
