"""Multi-turn chat environments. ``import turnrl`` (which any ``turnrl.*`` import runs first)
registers them with gymnasium.

Built-in ids (``registered_env_ids()``; ``python -m turnrl list-envs``):

* ``turnrl/GuessNumber-v0``, ``turnrl/Mastermind-v0``, ``turnrl/Wordle-v0``: feedback games;
* ``turnrl/CalcMath-v0``: arithmetic (expressions or word problems) with a calculator tool;
* ``turnrl/PythonCoding-v0``: write a function, run it in the sandbox, hidden tests decide;
* ``turnrl/RetrievalQA-v0``: multi-hop questions over a generated corpus (BM25 search + open);
* ``turnrl/FrozenLake-v0``, ``turnrl/Sokoban-v0``: grid puzzles as text;
* ``turnrl/KeyDoor-v0``: a corridor walked to a key and back to a door (long horizons, one reward);
* ``turnrl/Household-v0``: ALFWorld-style long-horizon household tasks;
* ``turnrl/Mixture-v0``: tasks from several envs, routed per episode;
* ``turnrl/ReasoningGym-v0``, ``turnrl/Taxi-v0``: adapters (reasoning-gym, gymnasium toy text).

Remote envs (``turnrl serve-env`` + ``RemoteEnv``) and the adapters are in their modules.
"""

from turnrl.envs.base import Message, MultiTurnEnv, TurnOutcome
from turnrl.envs.tasks.calc_math import CalcMathEnv
from turnrl.envs.check import check
from turnrl.envs.games.frozen_lake import FrozenLakeEnv
from turnrl.envs.games.guess_number import GuessNumberEnv
from turnrl.envs.games.household import HouseholdEnv
from turnrl.envs.games.key_door import KeyDoorEnv
from turnrl.envs.games.mastermind import MastermindEnv
from turnrl.envs.mixture import MixtureEnv
from turnrl.envs.tasks.python_coding import PythonCodingEnv
from turnrl.envs.registration import register_envs, registered_env_ids
from turnrl.envs.tasks.retrieval_qa import RetrievalQAEnv
from turnrl.envs.games.sokoban import SokobanEnv
from turnrl.envs.games.wordle import WordleEnv

__all__ = [
    "CalcMathEnv",
    "FrozenLakeEnv",
    "GuessNumberEnv",
    "HouseholdEnv",
    "KeyDoorEnv",
    "MastermindEnv",
    "Message",
    "MixtureEnv",
    "MultiTurnEnv",
    "PythonCodingEnv",
    "RetrievalQAEnv",
    "SokobanEnv",
    "TurnOutcome",
    "WordleEnv",
    "check",
    "register_envs",
    "registered_env_ids",
]
