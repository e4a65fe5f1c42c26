"""turnrl: multi-turn reinforcement learning of LLM agents.

Importing it registers the built-in envs with gymnasium, as gymnasium packages do, so
``import turnrl; gymnasium.make("turnrl/GuessNumber-v0")`` works (and so does
``gymnasium.make("turnrl:turnrl/GuessNumber-v0")`` without the import). Registration uses
entry-point strings: no env module is imported until an env is made.
"""

from turnrl.env_ids import register_envs as _register_envs

_register_envs()
