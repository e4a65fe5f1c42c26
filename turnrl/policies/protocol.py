"""``RolloutPolicy``: the one interface of every backend that samples training rollouts, so that
a train loop never asks which backend it has.

Implemented by ``TransformersPolicy`` (the learner's own model, or a copy of it:
``TransformersPolicy.copy_of``), ``VLLMPolicy`` (a vLLM engine in this process),
``ServedPolicy`` (rollout servers that take weight pushes) and ``RoutedPolicy`` (several of
them behind one ``generate``, delegating the rest); ``turnrl.train.factories.rollout_policy`` returns one
for every ``agent.backend``. tests/policies/test_policy_contract.py checks the contract below on
each of them with real parts.

``OpenAIPolicy`` (one HTTP server) is not a ``RolloutPolicy``: it is the client of a single
server, which ``ServedPolicy`` wraps for training (weights are pushed through a shared
folder), and an evaluation client of hosted chat APIs (``mode="text"``). It has ``generate``,
``close`` and ``token_exact`` only; ``isinstance(OpenAIPolicy(...), RolloutPolicy)`` is False.

A train loop uses the protocol like this, the same for every backend::

    sampler = rollout_policy(cfg, model, tokenizer, workdir, seed, own_copy)
    sampler.sync_from(model)          # serve the learner's weights (a no-op on its own model)
    for step in steps:
        trajectories = RolloutCollector(env_fn, sampler, renderer).collect(tasks, G, params)
        learner.update(...)
        if sampler.needs_weight_push:  # the next rollouts sample the updated weights
            sampler.sync_from(model)
    sampler.close()

Trajectories of a sampler that is not ``token_exact`` must not be trained on
(``turnrl.rollout.trajectory.assert_trainable`` refuses them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from turnrl.policies.sampling import Generation, SamplingParams

__all__ = ["RolloutPolicy"]


@runtime_checkable
class RolloutPolicy(Protocol):
    """What every rollout backend offers (see the module docstring for who implements it).

    ``isinstance(x, RolloutPolicy)`` checks that every member below exists (not their
    signatures or semantics; the shared contract test does that).
    """

    token_exact: bool
    """True when the ids and logprobs of ``generate`` are the sampler's own, so its
    trajectories can be trained on. (False would be a client that re-tokenizes text, e.g.
    ``OpenAIPolicy(mode="text")``; every ``RolloutPolicy`` of this package is token-exact.)"""

    needs_weight_push: bool
    """True when the backend samples from weights of its own (a copy of the model, an engine,
    servers): the learner's updates reach it only through ``sync_from`` / ``load_weights``.
    False when it samples from the learner's model object itself (``TransformersPolicy`` on
    the learner's model), where ``sync_from(learner)`` is a no-op and updates show at once."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Sample one assistant turn for each prompt.

        Token-exact: prompts go in as ids, each generation's ``token_ids`` are the ids as
        sampled and ``logprobs`` the sampler's logprob of each under the distribution it was
        drawn from, ``softmax(logits / temperature)`` (plain ``log_softmax`` under greedy
        decoding), which the learner's teacher-forced scoring reproduces. A turn ends at the
        tokenizer's end-of-turn id (its last id, ``finish_reason="stop"``) or after
        ``params.max_new_tokens`` ids (``"length"``); the end-of-turn id appears nowhere else.

        Args:
            prompts: ``B`` lists of token ids, each ending with the generation prompt.
            params: sampling parameters.

        Returns:
            ``B`` generations in the order of ``prompts`` (``[]`` for no prompts).
        """
        ...

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> None:
        """Make the backend sample from these weights from its next ``generate`` on.

        Args:
            named_tensors: the learner's weights under checkpoint names, LoRA adapters merged
                and DDP unwrapped: ``turnrl.policies.weights.merged_state_dict(unwrap_model(m))``
                (for a model without adapters that is its ``state_dict()``).

        Raises:
            ValueError: If the names or shapes are not those of the sampled architecture
                (checked before anything changes).
        """
        ...

    def sync_from(self, model: torch.nn.Module) -> None:
        """Take ``model``'s current weights (the learner's; DDP-wrapped or with LoRA adapters):
        ``load_weights`` of its merged state, or nothing when the backend samples from
        ``model`` itself (``needs_weight_push`` False)."""
        ...

    def rng_state(self) -> Any:
        """The state of the backend's sampling randomness, to store in a checkpoint (a tensor or
        a dict of plain values and tensors: ``torch.save`` / ``weights_only`` load keep it)."""
        ...

    def set_rng_state(self, state: Any) -> None:
        """Restore what ``rng_state`` returned: with the same weights, the next ``generate``
        calls on the same prompts repeat the ones after that ``rng_state`` exactly, where the
        backend seeds its sampling (``TransformersPolicy``, ``VLLMPolicy``, ``RoutedPolicy``
        over such backends). ``ServedPolicy``'s servers seed themselves: its state is empty.

        Raises:
            TypeError / ValueError: If ``state`` is not one of this backend's states.
        """
        ...

    def close(self) -> None:
        """Release what the backend holds (an engine, HTTP clients, threads). Idempotent: a
        second call does nothing. The backend must not be used afterwards."""
        ...
