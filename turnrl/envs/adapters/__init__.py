"""Adapters: other libraries' tasks and envs as turnrl multi-turn chat envs.

* ``OpenEnvEnv``: an env an OpenEnv server serves (``openenv-core``), played over its
  WebSocket protocol: a text env, or an MCP-shaped one whose tools the model calls.
* ``OpenRewardEnv``: an Open Reward Standard env server (``openreward``): its tasks, splits,
  tools and rewards, over HTTP and SSE.
* ``MCPEnv``: an MCP server's tools (streamable HTTP, the ``mcp`` package) with tasks and a
  verifier from the env definition, or a reward tool the server marks.
* ``ReasoningGymEnv``: a reasoning-gym procedural dataset (single turn, or retries with
  feedback); needs the ``reasoning`` extra (``pip install 'turnrl[reasoning]'``).
  Registered as ``turnrl/ReasoningGym-v0``.
* ``TextGymEnv``: any gymnasium env with ``Text`` observation and action spaces.
* ``ToyTextEnv``: gymnasium's toy-text games (FrozenLake, Taxi, CliffWalking, Blackjack)
  as text games with named actions and a scripted expert (``ToyTextGame`` is the
  ``Text``-space gymnasium env under it). Registered as ``turnrl/Taxi-v0``.

Importing this package does not import reasoning-gym or the protocol packages (each env imports
its own when built; the protocols need the ``protocols`` extra: ``pip install 'turnrl[protocols]'``).
"""

from turnrl.envs.adapters.mcp import MCPEnv
from turnrl.envs.adapters.open_reward import OpenRewardEnv
from turnrl.envs.adapters.openenv import OpenEnvEnv
from turnrl.envs.adapters.reasoning_gym import ReasoningGymEnv
from turnrl.envs.adapters.text_gym import TextGymEnv
from turnrl.envs.adapters.toy_text import ToyTextEnv, ToyTextGame

__all__ = ["MCPEnv", "OpenEnvEnv", "OpenRewardEnv", "ReasoningGymEnv", "TextGymEnv", "ToyTextEnv", "ToyTextGame"]
