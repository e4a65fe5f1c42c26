"""Policy backend on a transformers causal LM: batched sampling with a KV cache."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping

import torch

from turnrl.agents.chat_format import turn_end_ids
from turnrl.agents.sampling import Generation, SamplingParams
from turnrl.agents.weights import merged_state_dict, unwrap_model


class TransformersPolicy:
    """Samples assistant turns for many episodes at once from a ``PreTrainedModel``.

    Prompts of different lengths are left-padded into one batch, with position ids that
    skip the padding, so each row's logits equal those of that row run alone. The logprob
    of each sampled id is read from the very distribution it was drawn from.

    A ``RolloutPolicy`` (``turnrl.agents.protocol``) in two ways:

    * on the learner's own model (``TransformersPolicy(model, ...)``): the learner's updates
      show up at once; ``needs_weight_push`` is False and ``sync_from(model)`` a no-op;
    * on a copy of it (``TransformersPolicy.copy_of(model, ...)``, for rollouts sampled while
      the learner updates): ``needs_weight_push`` is True, and ``sync_from`` /
      ``load_weights`` copy the learner's weights into the copy.

    ``token_exact`` is True; ``close`` does nothing (there is nothing to release).

    Args:
        model: a causal LM (its weights are the learner's: updates show up at once).
        tokenizer: its tokenizer; ``eos_token_id`` (and the other end-of-turn tokens of its chat
            format, ``turnrl.agents.chat_format.turn_end_ids``) end a turn, ``pad_token_id`` pads.
        seed: seed of the sampling RNG (a private ``torch.Generator``).
    """

    token_exact = True

    def __init__(self, model, tokenizer, seed: int = 0):
        self.model = model
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.eos_id = tokenizer.eos_token_id
        self.stop_ids = turn_end_ids(tokenizer)
        self.pad_id = tokenizer.pad_token_id
        self._own_copy = False

    @classmethod
    def copy_of(cls, model: torch.nn.Module, tokenizer, seed: int = 0) -> TransformersPolicy:
        """A policy on a private copy of ``model`` (the learner's; DDP-wrapped or with LoRA
        adapters), which the learner's updates reach only through ``sync_from`` /
        ``load_weights`` (``needs_weight_push`` is True).

        The copy is the architecture an inference engine serves: DDP unwrapped and LoRA
        adapters merged into the base weights (so it takes ``merged_state_dict(learner)``, as
        ``VLLMPolicy`` and ``ServedPolicy`` do). Everything else is copied as it is (forward
        hooks, training/eval mode, ``requires_grad``: with it turned off the copy's logprobs were
        seen to differ from the learner model's in the last bits, and asynchronous rollouts
        with ``max_staleness=0`` must repeat the synchronous run exactly).
        """
        twin = copy.deepcopy(unwrap_model(model))
        _merge_lora_in_place(twin)
        policy = cls(twin, tokenizer, seed=seed)
        policy._own_copy = True
        return policy

    @property
    def needs_weight_push(self) -> bool:
        """True on a copy (``copy_of``), False on the learner's own model (class docstring)."""
        return self._own_copy

    def sync_from(self, model: torch.nn.Module) -> None:
        """Take ``model``'s current weights: nothing to do when ``model`` (unwrapped) is the
        sampled model itself, else ``load_weights`` of its weights (LoRA merged when the
        sampled model has no adapters of its own)."""
        source = unwrap_model(model)
        if source is self.model:
            return
        has_adapters = any(hasattr(m, "base_layer") for m in self.model.modules())
        self.load_weights(source.state_dict() if has_adapters else merged_state_dict(source))

    def close(self) -> None:
        """Nothing to release (the model belongs to the caller); idempotent."""

    def rng_state(self) -> torch.Tensor:
        """The state of the sampling generator (to checkpoint a run)."""
        return self.generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Restore a state ``rng_state`` returned: sampling continues exactly from there."""
        self.generator.set_state(state)

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy weights into the sampled model; the weight sync of a policy on its own copy of
        the model (asynchronous rollouts).

        Args:
            named_tensors: ``{name: tensor}`` or ``(name, tensor)`` pairs holding every weight
                of the sampled model under its ``state_dict()`` names: for a ``copy_of`` copy
                the learner's ``merged_state_dict`` (or its ``state_dict()`` when it has no
                LoRA adapters).

        Raises:
            ValueError: If names are missing or unknown (nothing is copied then), naming them.
        """
        state = dict(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
        own = self.model.state_dict()
        missing, unknown = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        if missing or unknown:
            hint = (" (LoRA adapter weights: push merged_state_dict(model) to a copy_of copy, whose adapters are "
                    "merged)" if any("lora_" in n or ".base_layer." in n for n in unknown) else "")
            raise ValueError(f"load_weights needs exactly the sampled model's weights; {len(missing)} missing, e.g. "
                             f"{missing[:3]}, and {len(unknown)} unknown, e.g. {unknown[:3]}{hint}")
        self.model.load_state_dict(state)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Sample one assistant turn for each prompt.

        Args:
            prompts: ``B`` lists of token ids, each ending with the generation prompt.
            params: sampling parameters.

        Returns:
            ``B`` generations, in the order of ``prompts``.
        """
        if not prompts:
            return []
        was_training = self.model.training
        self.model.eval()
        batch = len(prompts)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((batch, width), self.pad_id, dtype=torch.long, device=self.device)
        attention = torch.zeros((batch, width), dtype=torch.long, device=self.device)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            attention[row, width - len(prompt):] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                         use_cache=True, logits_to_keep=1)
        past, logits = out.past_key_values, out.logits[:, -1, :].float()
        next_position = positions[:, -1] + 1

        sampled = [[] for _ in range(batch)]
        logprobs = [[] for _ in range(batch)]
        finished = torch.zeros(batch, dtype=torch.bool, device=self.device)
        stops = torch.tensor(self.stop_ids, dtype=torch.long, device=self.device)
        for _ in range(params.max_new_tokens):
            if params.greedy:
                logp = torch.log_softmax(logits, dim=-1)
                tokens = logp.argmax(dim=-1)
            else:
                logp = torch.log_softmax(logits / params.temperature, dim=-1)
                tokens = torch.multinomial(logp.exp(), 1, generator=self.generator).squeeze(-1)
            chosen = logp.gather(-1, tokens[:, None]).squeeze(-1)
            for row in (~finished).nonzero().flatten().tolist():
                sampled[row].append(int(tokens[row]))
                logprobs[row].append(float(chosen[row]))
            finished |= torch.isin(tokens, stops)
            if bool(finished.all()):
                break
            tokens = tokens.masked_fill(finished, self.pad_id)
            attention = torch.cat([attention, (~finished).long()[:, None]], dim=1)
            out = self.model(
                input_ids=tokens[:, None],
                attention_mask=attention,
                position_ids=next_position[:, None],
                past_key_values=past,
                use_cache=True,
            )
            past, logits = out.past_key_values, out.logits[:, -1, :].float()
            next_position = next_position + 1
        self.model.train(was_training)
        return [
            Generation(ids, lps, "stop" if ids and ids[-1] in self.stop_ids else "length")
            for ids, lps in zip(sampled, logprobs)
        ]


def _merge_lora_in_place(model: torch.nn.Module) -> None:
    """Replace every peft LoRA layer of ``model`` by its base layer with the active adapters'
    delta added to the weight (``merged_state_dict``'s weights; the result has its names)."""
    adapted = [(name, module) for name, module in model.named_modules()
               if hasattr(module, "base_layer") and hasattr(module, "get_delta_weight")]
    for name, module in adapted:
        base = module.base_layer
        with torch.no_grad():
            for adapter in getattr(module, "active_adapters", []):
                if adapter in getattr(module, "lora_A", {}):
                    base.weight += module.get_delta_weight(adapter).to(base.weight.dtype)
        parent_name, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, leaf, base)
