"""Why an episode ended, and whose fault that was.

Every ``Trajectory.termination`` is one of ``TERMINATIONS``, each classed as the model's or
the infrastructure's:

* the model's (``MODEL_TERMINATIONS``): the env judged it (``terminated``), it ran out of turns
  (``truncated``), or its text outgrew a token bound (``context_length``,
  ``observation_length``, ``episode_length``). What the policy did led there, so the episode
  is trained on with the reward it got.
* the infrastructure's (``INFRA_TERMINATIONS``): the env raised (``env_error``: a bug, a
  remote env server gone or answering 5xx), a tool failed for a reason that is not the
  model's input (``tool_error``: a sandbox that could not start, a tool server gone, an
  in-process tool that hung), or a step outran its deadline (``step_timeout``). The episode's
  reward says nothing about the policy: by default it leaves its group's statistics and the
  loss (``turnrl.algorithms.batch.collate``), or is sampled again once
  (``trainer.infra_failures``).

A bad tool call (unknown tool, bad arguments, a program the model wrote that crashes or hits
a sandbox limit) is the model's: it becomes an error message in the observation and the
episode goes on.
"""

from __future__ import annotations

from typing import Literal, get_args

from turnrl.rollout.env_calls import StepTimeout
from turnrl.tools import ToolUnavailableError

__all__ = ["INFRA_FAILURE_POLICIES", "INFRA_TERMINATIONS", "InfraFailurePolicy", "MODEL_TERMINATIONS",
           "TERMINATIONS", "Termination", "failure_termination", "is_infra_failure"]

Termination = Literal["terminated", "truncated", "context_length", "observation_length", "episode_length",
                      "env_error", "tool_error", "step_timeout"]
TERMINATIONS: tuple[str, ...] = get_args(Termination)
MODEL_TERMINATIONS: frozenset[str] = frozenset(
    {"terminated", "truncated", "context_length", "observation_length", "episode_length"})
"""Endings the policy caused: trained on with the reward they got."""
INFRA_TERMINATIONS: frozenset[str] = frozenset({"env_error", "tool_error", "step_timeout"})
"""Endings the infrastructure caused: kept out of the gradient by default."""

InfraFailurePolicy = Literal["drop", "keep", "refill"]
INFRA_FAILURE_POLICIES: tuple[str, ...] = get_args(InfraFailurePolicy)
"""What a run does with an episode the infrastructure ended: ``drop`` it from its group's
statistics and the loss (the default); ``keep`` it with the reward it got (0, usually: the
bias peers measure); ``refill``: sample it again once, and drop it if it fails again."""


def is_infra_failure(termination: str | None) -> bool:
    """Whether ``termination`` is the infrastructure's fault (``INFRA_TERMINATIONS``)."""
    return termination in INFRA_TERMINATIONS



def failure_termination(exc: BaseException) -> Termination:
    """The termination of an episode whose env call raised ``exc``: ``step_timeout`` for a call
    past its deadline (``turnrl.rollout.env_calls.StepTimeout``), ``tool_error`` for a tool that
    could not run (``turnrl.tools.ToolUnavailableError``), ``env_error`` for anything else."""
    if isinstance(exc, StepTimeout):
        return "step_timeout"
    return "tool_error" if isinstance(exc, ToolUnavailableError) else "env_error"
