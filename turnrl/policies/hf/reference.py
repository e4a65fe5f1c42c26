"""The plain reference sampler: what ``TransformersPolicy`` computes, written to be read.

``ReferencePolicy`` samples one prompt at a time (no batch, no padding) with the model's own
forward and transformers' ``DynamicCache``, one token per forward. ``TransformersPolicy``
(batched, left-padded, a KV cache kept across turns, in-place buffers, a fused decoder) is tested
equal to it in tests/policies/test_reference_sampler.py.

The contract both keep, for each prompt:

* the next-token distribution is ``log_softmax(logits)`` under ``params.greedy`` (the id is its
  argmax) and ``log_softmax(logits / params.temperature)`` otherwise (the id is drawn from it by
  ``sample_categorical`` with the policy's ``torch.Generator``, seeded with ``seed``); the logits
  are the model's, in float32;
* ``logprobs[i]`` is the logprob of ``token_ids[i]`` under the distribution it was chosen from;
* a turn ends at the first end-of-turn id (``turn_end_ids``: kept as its last id,
  ``finish_reason="stop"``) or after ``params.max_new_tokens`` ids (``"length"``).

Randomness: the engine draws one uniform per batch row per step (finished rows included), step
by step across the batch; this sampler draws one per token, prompt after prompt. For a single
prompt both consume the generator alike, so the same seed gives the same ids (up to rounding that
moves a draw across a boundary of the cumulative distribution); for a batch the ids differ, and
the engine's logprobs are compared with ``score`` of its ids instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

import torch
from transformers import DynamicCache

from turnrl.chat.formats import turn_end_ids
from turnrl.policies.hf.policy import sample_categorical
from turnrl.policies.sampling import Generation, SamplingParams
from turnrl.policies.weights import merged_state_dict, unwrap_model


class ReferencePolicy:
    """A ``RolloutPolicy`` (``turnrl.policies.protocol``) on ``model`` itself: one prompt at a time,
    one forward per token (module docstring). ``needs_weight_push`` is False (the learner's
    updates show at once), ``close`` and ``clear_cache`` do nothing (nothing is kept between
    calls). Args as ``TransformersPolicy``'s: ``model`` a causal LM, ``tokenizer`` its tokenizer,
    ``seed`` the seed of the sampling generator."""

    token_exact = True
    needs_weight_push = False

    def __init__(self, model: torch.nn.Module, tokenizer, seed: int = 0):
        self.model = model
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.stop_ids = turn_end_ids(tokenizer)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One sampled turn per prompt, in the order of ``prompts`` (``[]`` for none)."""
        with _eval_no_grad(self.model):
            return [self._generate_one(prompt, params) for prompt in prompts]

    def score(self, prompt: list[int], token_ids: list[int], params: SamplingParams) -> list[float]:
        """The logprob of each of ``token_ids`` after ``prompt`` (and the ids before it) under the
        distribution ``generate`` would choose it from at ``params`` (teacher forcing: one forward
        over the whole sequence)."""
        if not token_ids:
            return []
        with _eval_no_grad(self.model):
            ids = torch.tensor([list(prompt) + list(token_ids)], device=self.device)
            logits = self.model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()  # [L, V]
            logp = _log_distribution(logits, params)
            return logp.gather(-1, ids[0, len(prompt):, None]).squeeze(-1).tolist()

    def _generate_one(self, prompt: list[int], params: SamplingParams) -> Generation:
        cache = DynamicCache()
        tokens, logprobs = [], []
        next_input = torch.tensor([list(prompt)], device=self.device)  # the whole prompt, then one id
        for _ in range(params.max_new_tokens):
            out = self.model(input_ids=next_input, past_key_values=cache, use_cache=True)
            logp = _log_distribution(out.logits[:, -1, :].float(), params)  # [1, V]
            token = int(logp.argmax() if params.greedy else sample_categorical(logp.exp(), self.generator))
            tokens.append(token)
            logprobs.append(float(logp[0, token]))
            if token in self.stop_ids:
                return Generation(tokens, logprobs, "stop")
            next_input = torch.tensor([[token]], device=self.device)
        return Generation(tokens, logprobs, "length")

    def rng_state(self) -> torch.Tensor:
        """The state of the sampling generator."""
        return self.generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Restore a state ``rng_state`` returned."""
        self.generator.set_state(state)

    def clear_cache(self) -> None:
        """Nothing is cached between calls."""

    def close(self) -> None:
        """Nothing to release."""

    def sync_from(self, model: torch.nn.Module) -> None:
        """Nothing when ``model`` (unwrapped) is the sampled model, else ``load_weights`` of its
        merged weights."""
        source = unwrap_model(model)
        if source is not self.model:
            self.load_weights(merged_state_dict(source))

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy ``{name: tensor}`` (every weight of the model under its ``state_dict`` names) into
        the model; ValueError, with nothing copied, on a missing, unknown or mis-shaped one."""
        state = dict(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
        own = self.model.state_dict()
        wrong = sorted(set(own) ^ set(state)) + sorted(n for n in own if n in state and own[n].shape != state[n].shape)
        if wrong:
            raise ValueError(f"load_weights needs exactly the model's weights; missing, unknown or mis-shaped: "
                             f"{wrong[:5]}")
        self.model.load_state_dict(state)


def _log_distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Logprobs of the distribution a token is chosen from: temperature 1 under greedy."""
    return torch.log_softmax(logits if params.greedy else logits / params.temperature, dim=-1)


@contextmanager
def _eval_no_grad(model: torch.nn.Module) -> Iterator[None]:
    """No autograd, and ``model`` in eval mode (its training mode restored after)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)
