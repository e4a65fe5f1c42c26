"""Policy backend on a transformers causal LM: batched sampling with a KV cache."""

from __future__ import annotations

import torch

from turnrl.agents.sampling import Generation, SamplingParams


class TransformersPolicy:
    """Samples assistant turns for many episodes at once from a ``PreTrainedModel``.

    Prompts of different lengths are left-padded into one batch, with position ids that
    skip the padding, so each row's logits equal those of that row run alone. The logprob
    of each sampled id is read from the very distribution it was drawn from.

    Args:
        model: a causal LM (its weights are the learner's: updates show up at once).
        tokenizer: its tokenizer; ``eos_token_id`` ends a turn, ``pad_token_id`` pads.
        seed: seed of the sampling RNG (a private ``torch.Generator``).
    """

    def __init__(self, model, tokenizer, seed: int = 0):
        self.model = model
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id
        self.needs_weight_push = False  # TEMP until the policy branch lands
        self.token_exact = True

    def sync_from(self, model) -> None:  # TEMP
        if model is not self.model:
            self.load_weights(model.state_dict())

    def close(self) -> None:  # TEMP
        pass

    def rng_state(self) -> torch.Tensor:
        """The state of the sampling generator (to checkpoint a run)."""
        return self.generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Restore a state ``rng_state`` returned: sampling continues exactly from there."""
        self.generator.set_state(state)

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy ``state_dict`` (the learner's ``state_dict()``) into the sampled model; the
        weight sync of a policy on its own copy of the model (asynchronous rollouts)."""
        self.model.load_state_dict(state_dict)

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
            finished |= tokens == self.eos_id
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
            Generation(ids, lps, "stop" if ids and ids[-1] == self.eos_id else "length")
            for ids, lps in zip(sampled, logprobs)
        ]
