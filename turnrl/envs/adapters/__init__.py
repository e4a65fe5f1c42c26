"""Adapters: other libraries' tasks and envs as turnrl multi-turn chat envs.

* ``ReasoningGymEnv``: a reasoning-gym procedural dataset (single turn, or retries with
  feedback); needs the ``reasoning`` extra (``pip install 'turnrl[reasoning]'``).
  Registered as ``turnrl/ReasoningGym-v0``.
* ``TextGymEnv``: any gymnasium env with ``Text`` observation and action spaces.
* ``ToyTextEnv``: gymnasium's toy-text games (FrozenLake, Taxi, CliffWalking, Blackjack)
  as text games with named actions and a scripted expert (``ToyTextGame`` is the
  ``Text``-space gymnasium env under it). Registered as ``turnrl/Taxi-v0``.

Importing this package does not import reasoning-gym (the env imports it when built).
"""

from turnrl.envs.adapters.reasoning_gym import ReasoningGymEnv
from turnrl.envs.adapters.text_gym import TextGymEnv
from turnrl.envs.adapters.toy_text import ToyTextEnv, ToyTextGame

__all__ = ["ReasoningGymEnv", "TextGymEnv", "ToyTextEnv", "ToyTextGame"]
