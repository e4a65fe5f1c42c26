"""Policy backend on a transformers causal LM: batched sampling with a KV cache, kept across an
episode's turns (``turnrl.policies.hf.prefix_cache``)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from turnrl.chat.formats import turn_end_ids
from turnrl.policies.hf.fast_decode import DecodeStep
from turnrl.policies.hf.gqa_attention import gqa_attention
from turnrl.policies.hf.kv_buffer import BufferLayer, buffer_cache, plain_attention
from turnrl.policies.hf.prefix_cache import CachedPrefix, PrefixCache
from turnrl.policies.hf.row_cache import RowCache
from turnrl.policies.sampling import Generation, SamplingParams
from turnrl.policies.weights import merged_state_dict, unwrap_model

OnToken = Callable[[int, int, float, "list[tuple[int, float]] | None"], bool]
"""``TransformersPolicy.generate``'s per-token callback: ``on_token(row, token_id, logprob, top)``
for each token as it is sampled (``top``: the step's ``(id, logprob)`` alternatives with
``SamplingParams.top_logprobs``, else None); a true return ends the row's turn there."""


class TransformersPolicy:
    """Samples assistant turns for many episodes at once from a ``PreTrainedModel``.

    Prompts of different lengths are left-padded into one batch, with position ids that
    skip the padding, so each row's logits equal those of that row run alone. The logprob
    of each sampled id is read from the very distribution it was drawn from.
    ``turnrl.policies.hf.reference.ReferencePolicy`` is the plain sampler (one prompt at a time,
    one forward per token) it is tested equal to (tests/policies/test_reference_sampler.py).

    A ``RolloutPolicy`` (``turnrl.policies.protocol``) in two ways:

    * on the learner's own model (``TransformersPolicy(model, ...)``): the learner's updates
      show up at once; ``needs_weight_push`` is False and ``sync_from(model)`` a no-op;
    * on a copy of it (``TransformersPolicy.copy_of(model, ...)``, for rollouts sampled while
      the learner updates): ``needs_weight_push`` is True, and ``sync_from`` /
      ``load_weights`` copy the learner's weights into the copy.

    ``token_exact`` is True; ``close`` does nothing (there is nothing to release).

    With ``prefix_cache`` (the default) the keys and values of each generated sequence are kept
    for the next call, and a prompt that extends one (the episode's next turn) runs only over its
    new tokens (``turnrl.policies.hf.prefix_cache``): a turn costs its new tokens, not its history. On
    a model on ``sdpa`` attention whose layers are all plain attention they stay in one buffer, a
    row per episode, and a turn writes after its row's history in place
    (``turnrl.policies.hf.row_cache``); otherwise each call copies its rows' histories in and out.
    The cache is dropped whenever the weights change (an in-place update of any parameter, which
    optimizer steps and ``load_weights`` are; a write through ``.data`` is not seen: call
    ``rng_state()`` or make a new policy after one), and used only on models whose every layer keeps
    plain attention keys and values (else each prompt is prefilled whole). The figures agree
    with a whole prefill to float rounding (the same sums in another order). Within a call, keys
    and values are written in place (``kv_buffer``), and a model on ``sdpa`` attention samples
    with grouped query heads passed to SDPA as they are (``turnrl.policies.hf.gqa_attention``: no
    per-head copy of the history per token). With ``kv_buffer``, a prompt that several rows of a
    call share and none has cached (a task's ``G`` samples) is also run once for all of them, and
    a row with far more new tokens than the others (a long observation) runs its extra tokens in
    a call of its own instead of making every row's prefill as wide (``_even_out``).

    Args:
        model: a causal LM (its weights are the learner's: updates show up at once).
        tokenizer: its tokenizer; ``eos_token_id`` (and the other end-of-turn tokens of its chat
            format, ``turnrl.chat.formats.turn_end_ids``) end a turn, ``pad_token_id`` pads.
        seed: seed of the sampling RNG (a private ``torch.Generator``).
        prefix_cache: keep keys and values across calls (above; ``self.cache`` is the
            ``RowCache`` or ``PrefixCache``, None without).
        kv_buffer: within a call, write each token's keys and values in place into a buffer sized
            for the call (``turnrl.policies.hf.kv_buffer``) instead of concatenating them onto the
            history per token (transformers' ``DynamicCache``); used only where every layer is
            plain attention. The figures are the same either way.
        fast_decode: with ``kv_buffer`` on a Qwen2, Qwen3 or Llama decoder, run each decoded
            token through ``turnrl.policies.hf.fast_decode.DecodeStep`` (the model's weights and
            operations in plain torch calls, without the per-call Python of its forward); its
            logits equal the forward's to float rounding. Other models use their forward.
        row_cache: with ``prefix_cache`` and ``kv_buffer`` on a model on ``sdpa`` attention, keep
            the episodes in rows of one buffer (``turnrl.policies.hf.row_cache``); False copies each
            call's histories in and out (the figures are the same either way).
    """

    token_exact = True

    def __init__(self, model, tokenizer, seed: int = 0, prefix_cache: bool = True, kv_buffer: bool = True,
                 fast_decode: bool = True, row_cache: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.eos_id = tokenizer.eos_token_id
        self.stop_ids = turn_end_ids(tokenizer)
        self.pad_id = tokenizer.pad_token_id
        self._own_copy = False
        self._weights_version = -1
        # keys and values written in place (turnrl.policies.hf.kv_buffer) where every layer is plain attention
        config = getattr(unwrap_model(model), "config", None)
        plain = kv_buffer and config is not None and plain_attention(config)
        self._buffer_layers = config.num_hidden_layers if plain else 0
        self._fast_decode = fast_decode and plain
        # episodes kept in rows of one buffer across turns (turnrl.policies.hf.row_cache) where SDPA takes a 4D mask
        rows = row_cache and prefix_cache and plain and getattr(config, "_attn_implementation", None) == "sdpa"
        self.cache = RowCache(config.num_hidden_layers) if rows else PrefixCache() if prefix_cache else None

    @classmethod
    def copy_of(cls, model: torch.nn.Module, tokenizer, seed: int = 0, prefix_cache: bool = True) -> TransformersPolicy:
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
        policy = cls(twin, tokenizer, seed=seed, prefix_cache=prefix_cache)
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
        """The state of the sampling generator (to checkpoint a run). Empties the prefix cache:
        a cached prefix changes a row's figures in the last float bits, so the calls after
        ``rng_state`` and those after ``set_rng_state`` both start from an empty one."""
        self.clear_cache()
        return self.generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Restore a state ``rng_state`` returned: sampling continues exactly from there (the
        prefix cache is emptied, as it was then)."""
        self.clear_cache()
        self.generator.set_state(state)

    def clear_cache(self) -> None:
        """Empty the prefix cache. ``RolloutCollector.collect`` calls it before each batch, so a
        batch's figures depend on its own episodes only (not on what was sampled before, e.g.
        an evaluation whose replies a training episode repeats), as without the cache."""
        if self.cache is not None:
            self.cache.clear()

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

    def generate(self, prompts: list[list[int]], params: SamplingParams, on_token: OnToken | None = None,
                 generator: torch.Generator | None = None) -> list[Generation]:
        """Sample one assistant turn for each prompt.

        Runs in ``torch.inference_mode`` (no autograd bookkeeping; on the TRL benchmark's tool
        episodes a rollout took 0.90-0.93x the time it took under ``no_grad``): the tensors it
        keeps between calls (the prefix cache) are inference tensors, used only by later calls; a
        buffer the model's forward replaced meanwhile (dynamic rotary frequencies) is made a
        normal tensor again after the call, so that training can use it.

        Args:
            prompts: ``B`` lists of token ids, each ending with the generation prompt.
            params: sampling parameters.
            on_token: called as ``on_token(row, token_id, logprob, top)`` for each token of
                row ``row`` (an index into ``prompts``) right after it is sampled, end-of-turn
                ids included (``OnToken``), on this thread; when it returns true the row's turn
                ends after that token (``finish_reason`` ``"stop"``), as at an end-of-turn id. For
                streaming and stop strings; None (the default) adds no per-token work.
            generator: the random generator to draw from (a request's own seed); default the
                policy's (``seed``).

        Returns:
            ``B`` generations, in the order of ``prompts``.
        """
        if not prompts:
            return []
        with torch.inference_mode(), gqa_attention(self.model):
            generations = self._generate(prompts, params, _Hooks(on_token, self.generator if generator is None else generator))
        _normal_buffers(self.model)
        return generations

    def _generate(self, prompts: list[list[int]], params: SamplingParams, hooks: _Hooks) -> list[Generation]:
        was_training = self.model.training
        self.model.eval()
        try:
            if isinstance(self.cache, RowCache):
                sampled, logprobs = self._generate_rows(prompts, params, hooks)
            else:
                sampled, logprobs = self._generate_call(prompts, params, hooks)
        finally:
            self.model.train(was_training)
        tops = hooks.tops or [None] * len(sampled)
        return [
            Generation(ids, lps, "stop" if ids and (ids[-1] in self.stop_ids or row in hooks.stopped) else "length",
                       top_logprobs=top)
            for row, (ids, lps, top) in enumerate(zip(sampled, logprobs, tops))
        ]

    def _generate_call(self, prompts: list[list[int]], params: SamplingParams, hooks: _Hooks) -> tuple[list, list]:
        """One call in a cache of its own: each row's cached prefix (``PrefixCache``) copied in,
        its keys and values copied out into the prefix cache after."""
        hits = self._even_out(prompts, self._share_prompts(prompts, self._lookup(prompts)))
        cached = [0 if h is None else len(h.ids) for h in hits]
        input_ids, attention, past = self._prefill_inputs(prompts, hits, cached, params.max_new_tokens)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, attention.shape[1] - input_ids.shape[1]:]
        out = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                         past_key_values=past, use_cache=True, logits_to_keep=1)
        past, logits = out.past_key_values, out.logits[:, -1, :].float()
        next_position = positions[:, -1] + 1
        decode = DecodeStep.for_model(unwrap_model(self.model)) if self._fast_decode else None

        def step(tokens: torch.Tensor, finished: torch.Tensor) -> torch.Tensor:
            nonlocal attention, past, next_position
            attention = torch.cat([attention, (~finished).long()[:, None]], dim=1)
            if decode is not None:
                logits = decode(tokens, next_position, attention, past)
            else:
                out = self.model(input_ids=tokens[:, None], attention_mask=attention,
                                 position_ids=next_position[:, None], past_key_values=past, use_cache=True)
                past, logits = out.past_key_values, out.logits[:, -1, :].float()
            next_position = next_position + 1
            return logits

        sampled, logprobs = self._sample(logits, params, step, hooks)
        self._keep(prompts, sampled, attention, past)
        return sampled, logprobs

    def _generate_rows(self, prompts: list[list[int]], params: SamplingParams, hooks: _Hooks) -> tuple[list, list]:
        """One call on the ``RowCache``: each prompt runs in its row, after the history kept there
        (``turnrl.policies.hf.row_cache``); the call's new keys and values stay in the rows."""
        cache = self.cache
        prompts = [list(p) for p in prompts]
        self._check_weights()
        found = cache.arrange(prompts)
        if found is not None:  # rows rebuilt for this call's prompts: row i runs prompt i
            found = self._share_prompts(prompts, found)
            held = [0 if f is None else len(f.ids) if isinstance(f, CachedPrefix) else len(cache.ids[f]) for f in found]
            width = max(len(p) - h for p, h in zip(prompts, held))
            cache.rebuild(found, max(held) + width + params.max_new_tokens)
        starts = self._even_out_rows(cache, prompts)
        logits, ends = self._prefill_rows(cache, prompts, starts, [len(p) for p in prompts], params.max_new_tokens)
        lengths = list(ends)  # each row's next slot; a row that stopped keeps its own
        decode = DecodeStep.for_model(unwrap_model(self.model)) if self._fast_decode else None
        slot_ids = torch.arange(max(ends) + params.max_new_tokens + 1, device=self.device)

        def step(tokens: torch.Tensor, finished: torch.Tensor) -> torch.Tensor:
            at = torch.tensor(lengths, device=self.device)
            width = max(lengths) + 1
            attention = slot_ids[None, :width] <= at[:, None]  # [B, width]: the row's history and this token
            cache.prepare(at[:, None], width)
            if decode is not None:
                logits = decode(tokens, at, attention, cache)
            else:
                out = self.model(input_ids=tokens[:, None], attention_mask=attention[:, None, None, :],
                                 position_ids=at[:, None], past_key_values=cache, use_cache=True)
                logits = out.logits[:, -1].float()
            for row, done in enumerate(finished.tolist()):
                lengths[row] += not done
            return logits

        sampled, logprobs = self._sample(logits, params, step, hooks)
        for row, (prompt, end) in enumerate(zip(prompts, ends)):
            cache.ids[row] = prompt + sampled[row][:lengths[row] - end]
        cache.end_call()
        return sampled, logprobs

    def _sample(self, logits: torch.Tensor, params: SamplingParams, step, hooks: _Hooks) -> tuple[list, list]:
        """Up to ``params.max_new_tokens`` tokens a row from the prefill's ``logits`` ``[B, V]``:
        ``step(tokens, finished)`` feeds ``tokens`` ``[B]`` (padding on rows that ``finished``,
        ``[B]`` bool, marks) and returns the next logits. A row stops at an end-of-turn id, which
        is not fed, or where ``hooks.on_token`` says so (that row goes into ``hooks.stopped``).
        Returns each row's sampled ids and their logprobs (and fills ``hooks.tops`` with
        ``params.top_logprobs``)."""
        batch = logits.shape[0]
        sampled = [[] for _ in range(batch)]
        logprobs = [[] for _ in range(batch)]
        live = list(range(batch))  # rows still sampling (the same as ~finished, on the host)
        stops = set(self.stop_ids)
        finished = torch.zeros(batch, dtype=torch.bool, device=self.device)
        generator, on_token, top_k = hooks.generator, hooks.on_token, params.top_logprobs
        nucleus = params.top_p < 1.0
        tops = hooks.tops = [[] for _ in range(batch)] if top_k else None
        top = [None] * batch
        for _ in range(params.max_new_tokens):
            if params.greedy:
                logp = torch.log_softmax(logits, dim=-1)
                tokens = logp.argmax(dim=-1)
            else:
                logp = torch.log_softmax(logits if params.temperature == 1.0 else logits / params.temperature, dim=-1)
                if nucleus:
                    logp = top_p_logprobs(logp, params.top_p)
                tokens = sample_categorical(logp.exp(), generator)
            chosen = logp.gather(-1, tokens[:, None]).squeeze(-1)
            token_list, chosen_list = tokens.tolist(), chosen.tolist()  # one host copy per step, not per row
            for row in live:
                sampled[row].append(token_list[row])
                logprobs[row].append(chosen_list[row])
            ended = [row for row in live if token_list[row] in stops]
            if top_k:
                values, ids = logp.topk(top_k, dim=-1)
                values, ids = values.tolist(), ids.tolist()
                for row in live:  # ids of probability 0 (outside the nucleus) left out
                    top[row] = [(i, v) for i, v in zip(ids[row], values[row]) if v > -math.inf]
                    tops[row].append(top[row])
            if on_token is not None:
                for row in live:
                    if on_token(row, token_list[row], chosen_list[row], top[row]) and token_list[row] not in stops:
                        ended.append(row)
                        hooks.stopped.add(row)
            if ended:
                live = [row for row in live if row not in ended]
                finished[ended] = True
            if not live:
                break
            logits = step(tokens.masked_fill(finished, self.pad_id), finished)
        return sampled, logprobs

    def _check_weights(self) -> None:
        """Empty the cache when the weights changed since the last call."""
        version = sum(p._version for p in self.model.parameters())
        if version != self._weights_version:  # (a change through .data is not counted)
            self.cache.clear()
            self._weights_version = version

    def _prefill_rows(self, cache: RowCache, prompts: list[list[int]], starts: list[int], ends: list[int],
                      room: int) -> tuple[torch.Tensor, list[int]]:
        """Run ``prompts[r][starts[r]:ends[r]]`` (at least one token a row) in row ``r`` of
        ``cache`` after its ``starts[r]`` cached slots, with ``room`` slots kept free after; returns
        the logits ``[B, V]`` after each row's last token, and ``ends``.

        The rows' tokens are left-padded to ``S``, the most new tokens of a row, so each row's last
        one is the call's last column; a row's tokens go to slots ``start ..`` and its padding to
        the slots after them (which its next tokens overwrite), under a 4D mask: each token sees its
        row's history and its own earlier new tokens; a padding column sees those and itself."""
        batch = len(prompts)
        new = [end - start for start, end in zip(starts, ends)]
        width = max(new)
        start = torch.tensor(starts, device=self.device)[:, None]
        count = torch.tensor(new, device=self.device)[:, None]
        column = torch.arange(width, device=self.device)[None]
        pad = width - count
        slots = torch.where(column >= pad, start + column - pad, start + count + column)  # [B, S]
        span = max(starts) + width
        cache.reserve(span + room)
        input_ids = torch.full((batch, width), self.pad_id, dtype=torch.long, device=self.device)
        for row, (prompt, a, b) in enumerate(zip(prompts, starts, ends)):
            input_ids[row, width - (b - a):] = torch.tensor(prompt[a:b], dtype=torch.long)
        keys = torch.arange(span, device=self.device)[None, None]
        at = slots[:, :, None]
        mask = (keys <= at) & ((keys < (start + count)[:, :, None]) | (keys == at))  # [B, S, span]
        cache.prepare(slots, span)
        out = self.model(input_ids=input_ids, attention_mask=mask[:, None], position_ids=slots, past_key_values=cache,
                         use_cache=True, logits_to_keep=1)
        for row, (prompt, b) in enumerate(zip(prompts, ends)):
            cache.ids[row] = prompt[:b]
        return out.logits[:, -1, :].float(), list(ends)

    def _even_out_rows(self, cache: RowCache, prompts: list[list[int]]) -> list[int]:
        """``_even_out`` on the rows: the few rows whose new tokens far outnumber the others' run
        their extra tokens first, in a call of their own on copies of those rows, which are copied
        back. Returns each row's cached slots after."""
        starts = [len(ids) for ids in cache.ids]
        split = _long_rows([len(p) - s for p, s in zip(prompts, starts)]) if self._buffer_layers else None
        if split is None:
            return starts
        long, width = split
        sub = cache.take(long)
        ends = [len(prompts[r]) - width for r in long]
        self._prefill_rows(sub, [prompts[r] for r in long], [starts[r] for r in long], ends, 0)
        cache.reserve(max(ends))
        cache.put(sub, long, [starts[r] for r in long])
        for r, end in zip(long, ends):
            starts[r] = end
        return starts

    def _lookup(self, prompts: list[list[int]]) -> list[CachedPrefix | None]:
        """Each prompt's cached prefix (None: none, or no cache); the cache is emptied first when
        the weights changed since the last call."""
        if self.cache is None:
            return [None] * len(prompts)
        self._check_weights()
        return [self.cache.lookup(p) for p in prompts]

    def _share_prompts(self, prompts: list[list[int]], hits: list[CachedPrefix | None]) -> list[CachedPrefix | None]:
        """``hits`` with each prompt that several rows of this call share and none has cached
        (the ``G`` samples of a task) run once: the keys and values of all its tokens but the last
        (which each row runs, to draw its first token from), made the prefix of those rows. On a
        plain-attention model (``kv_buffer``); the logits are the unshared prefill's to float
        rounding. On a GRPO group the first turn's prefill then costs one prompt, not ``G``."""
        if not self._buffer_layers:
            return hits
        keys = [tuple(prompt) if hit is None and len(prompt) > 1 else None for prompt, hit in zip(prompts, hits)]
        counts: dict[tuple[int, ...], int] = {}
        for key in keys:
            if key is not None:
                counts[key] = counts.get(key, 0) + 1
        shared = [ids for ids, n in counts.items() if n > 1]
        if not shared:
            return hits
        width = max(len(ids) for ids in shared) - 1
        input_ids = torch.full((len(shared), width), self.pad_id, dtype=torch.long, device=self.device)
        attention = torch.zeros_like(input_ids)
        for row, ids in enumerate(shared):  # right-padded: a real token's causal context holds real tokens only
            input_ids[row, :len(ids) - 1] = torch.tensor(ids[:-1], dtype=torch.long)
            attention[row, :len(ids) - 1] = 1
        past = self.model(input_ids=input_ids, use_cache=True, logits_to_keep=1).past_key_values
        entries = _prefixes([ids[:-1] for ids in shared], attention, past)
        if entries is None:
            return hits
        prefixes = dict(zip(shared, entries))
        return [hit if key is None else prefixes.get(key, hit) for key, hit in zip(keys, hits)]

    def _even_out(self, prompts: list[list[int]], hits: list[CachedPrefix | None]) -> list[CachedPrefix | None]:
        """``hits`` with the few rows whose uncached tokens far outnumber the others' (a long tool
        result or error message among short ones) brought down to the others' width first: those
        rows' extra tokens run in a call of their own and become their prefix. The call's prefill
        is left-padded to its longest row, so without this one row's 160-token observation made
        16 rows run 160 columns each. On a plain-attention model (``kv_buffer``); the logits are
        the one-call prefill's to float rounding.

        A row is long when its uncached tokens exceed twice the median's plus ``LONG_MARGIN``;
        at most a quarter of the rows, and only when the columns saved on the other rows are at
        least ``MIN_COLUMNS_SAVED`` tokens."""
        split = _long_rows([len(p) - (0 if h is None else len(h.ids)) for p, h in zip(prompts, hits)])
        if not self._buffer_layers or split is None:
            return hits
        long, width = split
        fed = [prompts[row][:len(prompts[row]) - width] for row in long]
        sub_hits = [hits[row] for row in long]
        sub_cached = [0 if h is None else len(h.ids) for h in sub_hits]
        input_ids, attention, past = self._prefill_inputs(fed, sub_hits, sub_cached, 0)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, attention.shape[1] - input_ids.shape[1]:]
        past = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions, past_key_values=past,
                          use_cache=True, logits_to_keep=1).past_key_values
        entries = _prefixes(fed, attention, past)
        if entries is None:
            return hits
        hits = list(hits)
        for row, entry in zip(long, entries):
            hits[row] = entry
        return hits

    def _prefill_inputs(self, prompts: list[list[int]], hits: list[CachedPrefix | None], cached: list[int],
                        max_new_tokens: int):
        """``(input_ids [B, S], attention [B, C + S], past or None)`` of the first forward: each
        row's uncached tokens left-padded to ``S``, after its cached keys and values left-padded
        to ``C = max(cached)`` (padding is masked out wherever it sits). On a plain-attention
        model ``past`` is a cache of ``BufferLayer`` s with room for ``C + S + max_new_tokens``."""
        batch, width_c = len(prompts), max(cached)
        width = max(len(p) - c for p, c in zip(prompts, cached))
        input_ids = torch.full((batch, width), self.pad_id, dtype=torch.long, device=self.device)
        attention = torch.zeros((batch, width_c + width), dtype=torch.long, device=self.device)
        for row, (prompt, c) in enumerate(zip(prompts, cached)):
            rest = prompt[c:]
            input_ids[row, width - len(rest):] = torch.tensor(rest, dtype=torch.long)
            attention[row, width_c - c:width_c] = 1
            attention[row, width_c + width - len(rest):] = 1
        if self._buffer_layers:
            capacity = width_c + width + max_new_tokens
            past = buffer_cache(self._buffer_layers, capacity)
            if width_c:
                template = next(h for h in hits if h is not None).layers
                for index, layer in enumerate(past.layers):
                    layer.reserve(batch, *template[index], filled=width_c)
                    for row, (hit, c) in enumerate(zip(hits, cached)):
                        if hit is not None:
                            layer.keys[row, :, width_c - c:] = hit.layers[index][0]
                            layer.values[row, :, width_c - c:] = hit.layers[index][1]
            return input_ids, attention, past
        if width_c == 0:
            return input_ids, attention, None
        layers = []
        template = next(h for h in hits if h is not None).layers
        for index, (k0, v0) in enumerate(template):
            keys = k0.new_zeros((batch, k0.shape[0], width_c, k0.shape[2]))
            values = v0.new_zeros((batch, v0.shape[0], width_c, v0.shape[2]))
            for row, (hit, c) in enumerate(zip(hits, cached)):
                if hit is not None:
                    keys[row, :, width_c - c:] = hit.layers[index][0]
                    values[row, :, width_c - c:] = hit.layers[index][1]
            layers.append((keys, values))
        return input_ids, attention, DynamicCache(ddp_cache_data=layers)

    def _keep(self, prompts: list[list[int]], sampled: list[list[int]], attention: torch.Tensor, past) -> None:
        """Store each row's fed tokens (its prompt and the reply tokens fed back) with their
        keys and values; on a model whose cache is not plain attention, turn the cache off."""
        if self.cache is None:
            return
        entries = _prefixes([prompt + reply for prompt, reply in zip(prompts, sampled)], attention, past)
        if entries is None:
            self.cache = None
            return
        self.cache.store(entries)


LONG_MARGIN = 8
MIN_COLUMNS_SAVED = 256
"""``TransformersPolicy._even_out``: a row is long when its uncached tokens exceed twice the
median's plus ``LONG_MARGIN``; it runs them apart when that saves the other rows at least
``MIN_COLUMNS_SAVED`` padded tokens (a call of its own costs ~1-2 ms of overhead on CPU)."""


def _long_rows(rest: list[int]) -> tuple[list[int], int] | None:
    """``(long rows, width)`` for ``_even_out`` from each row's uncached token count ``rest``:
    the rows over twice the median plus ``LONG_MARGIN`` (at most a quarter of the rows, at least 4
    rows in all) and the most tokens of any other row, or None when there are none or splitting
    them off saves the other rows fewer than ``MIN_COLUMNS_SAVED`` padded tokens."""
    if len(rest) < 4:
        return None
    median = sorted(rest)[len(rest) // 2]
    long = [row for row, n in enumerate(rest) if n > 2 * median + LONG_MARGIN]
    if not long or len(long) > len(rest) // 4:
        return None
    width = max(n for row, n in enumerate(rest) if row not in long)  # what the other rows need
    if (max(rest) - width) * (len(rest) - len(long)) < MIN_COLUMNS_SAVED:
        return None
    return long, width


def _prefixes(fed: list[list[int]], attention: torch.Tensor, past) -> list[CachedPrefix] | None:
    """Each row's fed ids (cut to the tokens its attention mask holds) with their keys and values
    from ``past``, the padding left out; None when ``past`` is not plain attention whose width is
    the mask's (a sliding-window, linear-attention or conv layer: not cut by position)."""
    layers = getattr(past, "layers", None)
    if not layers or any(type(layer) not in (DynamicLayer, BufferLayer) for layer in layers):
        return None
    kv = [(layer.keys, layer.values) for layer in layers]
    if kv[0][0].shape[2] != attention.shape[1]:
        return None
    entries = []
    for row, ids in enumerate(fed):
        keep = attention[row].nonzero().flatten()
        entries.append(CachedPrefix(tuple(ids[:len(keep)]), [(k[row][:, keep], v[row][:, keep]) for k, v in kv]))
    return entries


class _Hooks:
    """What one ``generate`` call adds to plain sampling: the generator to draw from, the
    per-token callback, and what they leave (rows the callback ended, top alternatives)."""

    __slots__ = ("generator", "on_token", "stopped", "tops")

    def __init__(self, on_token: OnToken | None, generator: torch.Generator) -> None:
        self.on_token, self.generator = on_token, generator
        self.stopped: set[int] = set()
        self.tops: list[list[list[tuple[int, float]]]] | None = None


def top_p_logprobs(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """``logp`` ``[B, V]`` (log-probabilities) cut to each row's nucleus and renormalised: the
    smallest set of most likely ids whose probability sums to at least ``top_p`` keeps its
    logprobs less the log of that sum; every other id gets ``-inf`` (probability 0). The most
    likely id is always kept. As vLLM's top-p: the sampled id's logprob is its log-probability
    under the renormalised distribution it is drawn from."""
    probs = logp.exp()
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs  # the mass of the ids more likely than each
    outside = before >= top_p
    outside[..., 0] = False  # the most likely id, whatever top_p (one below float32's smallest reads as 0)
    drop = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, order, outside)
    return torch.log_softmax(logp.masked_fill(drop, -math.inf), dim=-1)


def sample_categorical(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One draw per row of ``probs`` ``[B, V]`` (rows of non-negative weights, each with a positive
    sum, e.g. a softmax) by inverse transform sampling: a uniform ``u`` per row, scaled to the
    row's sum, and the first id whose cumulative weight exceeds it. Returns ``[B]`` ids.

    The same distribution as ``torch.multinomial(probs, 1)``, from ``B`` uniform numbers instead
    of ``B * V`` exponential ones (multinomial draws one per vocabulary entry: on CPU, at a
    vocabulary of 1,000 and 8 rows, 0.18 ms of a decoded token's ~1 ms; this takes a ninth of
    that). The sums run in float64, and ``u`` stays strictly below the row's total, so an id of
    weight 0 is never drawn (its cumulative weight equals the one before it).

    Raises:
        ValueError: On a row whose sum is not a positive finite number (NaN or inf weights, or
            all zero), as ``torch.multinomial`` does.
    """
    cdf = probs.double().cumsum(dim=-1)
    total = cdf[:, -1:]
    if not all(0.0 < t < math.inf for t in total.flatten().tolist()):  # NaN fails too; 10x cheaper than tensor ops
        raise ValueError("sample_categorical: a row of probs has NaN/inf weights or sums to 0 "
                         "(non-finite logits?); every row needs non-negative weights with a positive finite sum")
    u = torch.rand(total.shape, generator=generator, dtype=torch.float64, device=probs.device) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, u, right=True).squeeze(-1)


def _normal_buffers(model: torch.nn.Module) -> None:
    """Replace each buffer of ``model`` that is an inference tensor (one its forward set under
    ``torch.inference_mode``) by a normal copy: training may not save or update an inference
    tensor."""
    for module in model.modules():
        for name, buffer in module._buffers.items():
            if buffer is not None and buffer.is_inference():
                module._buffers[name] = buffer.clone()


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
