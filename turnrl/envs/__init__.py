"""Multi-turn chat environments; importing this package registers them with gymnasium.

Ids: ``turnrl/GuessNumber-v0`` and ``turnrl/CalcMath-v0`` (see ``registered_env_ids``).
"""

from turnrl.envs.base import Message, MultiTurnEnv, TurnOutcome
from turnrl.envs.calc_math import CalcMathEnv
from turnrl.envs.check import check
from turnrl.envs.guess_number import GuessNumberEnv
from turnrl.envs.registration import register_envs, registered_env_ids

register_envs()

__all__ = [
    "CalcMathEnv",
    "GuessNumberEnv",
    "Message",
    "MultiTurnEnv",
    "TurnOutcome",
    "check",
    "register_envs",
    "registered_env_ids",
]
