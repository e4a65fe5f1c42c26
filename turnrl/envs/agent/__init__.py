"""Agent programs as envs: ``AgentEnv`` runs a program that calls an OpenAI-compatible endpoint
(the gateway, ``gateway``) and makes each of its model calls a turn (``env``); ``program``
runs the program (a function or a command)."""

from turnrl.envs.agent.env import AgentEnv, AgentFailed, AgentResult
from turnrl.envs.agent.gateway import AgentGateway, shared_gateway

__all__ = ["AgentEnv", "AgentFailed", "AgentGateway", "AgentResult", "shared_gateway"]
