"""Learner model-FLOPs utilisation (MFU) on a Qwen2.5-0.5B-shaped model, against a bare and a lean
torch loop over the same tokens, side by side.

    python3 scripts/bench_mfu.py --device cuda                       # ~0.5B, bf16 autocast
    .venv/bin/python scripts/bench_mfu.py --hidden-size 64 --layers 2 --heads 4 --kv-heads 2 \\
        --intermediate-size 128 --vocab-size 512 --rows 8 --seq-len 64 --micro-batch-size 4

The model is a Qwen2 built from a config (random init; the default shape is Qwen2.5-0.5B's: hidden
896, 24 layers, 14 query / 2 key-value heads of 64, MLP 4864, vocabulary 151,936, tied embeddings,
494M parameters). The batch is ``--rows`` distinct random-token episodes of ragged length (a
``--seq-len / 4`` prompt, then a sampled part of uniform length between ``--seq-len / 4`` and
``3 * --seq-len / 4``), each its own group, with the model's own logprobs as the old ones and random
advantages. Three optimizers train copies of the model on it, alternating, after a warm-up (the
median of ``--repeats`` is kept), all with fp32 weights under bf16 autocast on cuda (``--mixed-precision``;
fp32 by default on CPU), each update one AdamW step over ``--micro-batch-size``-row micro-batches:
``Learner.update`` (PPO-clip, token-mean), ``bare`` (LM head on every position) and ``lean`` (LM
head on the sampled positions, as the learner does) from ``scripts/bench_learner_loop.py``.

Model FLOPs of an update are the work the update needs, whoever does it: 3x (forward + backward)
the forward's matrix products, i.e. ``2 * (q, k, v, o and MLP weights)`` per real token and layer,
causal attention ``2 * hidden * length^2`` per row and layer, and the LM head ``2 * hidden *
vocab`` per sampled token (padding and unscored positions add nothing). MFU is those FLOPs over
the seconds, against the device's bf16 matrix rate measured here (a ``--matmul-size`` cube, median
of 10) and, on a known GPU, its datasheet peak (or ``--peak-tflops``).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_learner_loop import bare_step, lean_step  # noqa: E402
from turnrl.bench import record  # noqa: E402
from turnrl.algorithms import Learner, LossConfig, OptimConfig, TrainBatch, token_logprobs  # noqa: E402
from turnrl.algorithms.learner import scoring  # noqa: E402

# dense bf16 matrix peaks by datasheet (TFLOP/s), matched against torch.cuda.get_device_name
DATASHEET_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--hidden-size", type=int, default=896)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate-size", type=int, default=4864)
    parser.add_argument("--vocab-size", type=int, default=151936)
    parser.add_argument("--rows", type=int, default=64, help="episodes per update")
    parser.add_argument("--seq-len", type=int, default=1024, help="longest episode, tokens")
    parser.add_argument("--micro-batch-size", type=int, default=16, help="rows per forward/backward")
    parser.add_argument("--repeats", type=int, default=3, help="timed updates per optimizer (median kept)")
    parser.add_argument("--mixed-precision", default=None, choices=["bf16", "no"],
                        help="default: bf16 on cuda, no on cpu (bf16 autocast is slow on CPUs without bf16 "
                        "matrix units)")
    parser.add_argument("--chunked-head", default="auto", choices=["auto", "on", "off"],
                        help="the learner's LM head a chunk of positions at a time (turnrl.algorithms.learner.chunked_head): "
                        "auto, from scoring.CHUNKED_HEAD_MIN_ELEMENTS; on; off")
    parser.add_argument("--loops", default="bare,lean", help="torch loops timed beside the learner ('' for none)")
    parser.add_argument("--matmul-size", type=int, default=0, help="cube side of the rate check (0: 8192 on cuda, "
                        "1024 on cpu)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="datasheet peak (default: by device name)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch threads on cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the result to this file")
    args = parser.parse_args(argv)
    if args.mixed_precision is None:
        args.mixed_precision = "bf16" if args.device == "cuda" else "no"
    args.loops = [name for name in args.loops.split(",") if name.strip()]
    if unknown := set(args.loops) - {"bare", "lean"}:
        parser.error(f"--loops takes bare and/or lean, got {sorted(unknown)}")
    if min(args.rows, args.micro_batch_size, args.repeats, args.layers) < 1 or args.seq_len < 8:
        parser.error("--rows, --micro-batch-size, --repeats, --layers must be >= 1 and --seq-len >= 8")
    if args.hidden_size % args.heads or args.heads % args.kv_heads:
        parser.error(f"--hidden-size {args.hidden_size} must divide by --heads {args.heads}, and --heads by "
                     f"--kv-heads {args.kv_heads}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch.cuda.is_available() is False")
    return args


def build_model(args):
    """The Qwen2 of the flags, fp32 weights on ``args.device`` (random init from ``args.seed``)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=args.vocab_size, hidden_size=args.hidden_size,
                         intermediate_size=args.intermediate_size, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         max_position_embeddings=max(args.seq_len, 32), tie_word_embeddings=True,
                         rope_theta=1e6, pad_token_id=0, eos_token_id=1, bos_token_id=0)
    torch.manual_seed(args.seed)
    with torch.device(args.device):
        model = Qwen2ForCausalLM(config)
    return model.float()


def build_batch(args, model) -> tuple[TrainBatch, torch.Tensor]:
    """``args.rows`` ragged random episodes (sorted longest first), their old logprobs and advantages."""
    g = torch.Generator().manual_seed(args.seed)
    prompt = args.seq_len // 4
    sampled = torch.randint(args.seq_len // 4, 3 * args.seq_len // 4 + 1, (args.rows,), generator=g)
    lengths = (prompt + sampled).sort(descending=True).values
    width = int(lengths[0])
    positions = torch.arange(width)[None, :]
    attention = (positions < lengths[:, None]).long()
    loss_mask = ((positions >= prompt) & (attention > 0)).float()
    input_ids = torch.randint(2, args.vocab_size, (args.rows, width), generator=g) * attention
    n = args.rows
    batch = TrainBatch(input_ids=input_ids, attention_mask=attention, loss_mask=loss_mask,
                       old_logprobs=torch.zeros(n, width), turn_index=torch.where(loss_mask > 0, 0, -1),
                       rewards=torch.zeros(n), group_index=torch.arange(n), turn_rewards=torch.zeros(n, 1),
                       num_turns=torch.ones(n, dtype=torch.long), state_index=torch.full((n, 1), -1)).to(args.device)
    with torch.no_grad(), _autocast(args):
        for rows in torch.arange(n).split(args.micro_batch_size):
            mb = batch.rows(rows.to(args.device))
            lp, _, _ = token_logprobs(model, mb.input_ids, mb.attention_mask, score_mask=mb.loss_mask)
            batch.old_logprobs[rows.to(args.device)] = lp.float() * mb.loss_mask
    advantages = torch.randn(n, generator=g).to(args.device)[:, None] * batch.loss_mask
    return batch, advantages


def _autocast(args):
    return torch.autocast(device_type=args.device, dtype=torch.bfloat16, enabled=args.mixed_precision == "bf16")


def model_flops(args, lengths: list[int], sampled: int) -> float:
    """Training FLOPs (3x the forward's matrix products) of one update over rows of ``lengths``
    real tokens with ``sampled`` scored tokens in all."""
    d, head_dim = args.hidden_size, args.hidden_size // args.heads
    kv = args.kv_heads * head_dim
    per_token_layer = 2 * (2 * d * d + 2 * d * kv) + 2 * 3 * d * args.intermediate_size
    decoder = args.layers * per_token_layer * sum(lengths)
    attention = args.layers * 2 * d * sum(n * n for n in lengths)
    head = 2 * d * args.vocab_size * sampled
    return 3.0 * (decoder + attention + head)


def sync(args) -> None:
    if args.device == "cuda":
        torch.cuda.synchronize()


def matmul_tflops(args) -> float:
    """Measured bf16 (cuda) or fp32 (cpu) matrix-product rate: median of 10 products of two random cubes."""
    n = args.matmul_size or (8192 if args.device == "cuda" else 1024)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    a, b = (torch.randn(n, n, device=args.device, dtype=dtype) for _ in range(2))
    times = []
    for i in range(13):  # 3 warm-ups
        sync(args)
        start = time.perf_counter()
        a @ b
        sync(args)
        times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times[3:]) / 1e12


def run(args) -> dict:
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    if args.chunked_head != "auto":
        scoring.CHUNKED_HEAD_MIN_ELEMENTS[args.device] = 1 if args.chunked_head == "on" else 1 << 62
    model = build_model(args)
    batch, advantages = build_batch(args, model)
    lengths = batch.attention_mask.sum(1).tolist()
    sampled = int(batch.loss_mask.sum())
    learner = Learner(copy.deepcopy(model), LossConfig(loss_agg="token-mean"),
                      OptimConfig(lr=1e-6, micro_batch_size=args.micro_batch_size, micro_batch_tokens=None,
                                  mixed_precision=args.mixed_precision))
    loops = {"bare": bare_step, "lean": lean_step}
    twins = {}
    for name in args.loops:
        twin = copy.deepcopy(model).train()
        twins[name] = (twin, torch.optim.AdamW(twin.parameters(), lr=1e-6, weight_decay=0.0))
    del model
    if args.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    times: dict[str, list[float]] = {name: [] for name in ["learner", *args.loops]}
    for repeat in range(args.repeats + 1):  # the first round warms up
        sync(args)
        start = time.perf_counter()
        learner.update(batch, advantages)
        sync(args)
        times["learner"].append(time.perf_counter() - start)
        for name, (twin, optimizer) in twins.items():
            sync(args)
            start = time.perf_counter()
            with _autocast(args):
                loops[name](twin, optimizer, batch, advantages, args.micro_batch_size)
            sync(args)
            times[name].append(time.perf_counter() - start)
    seconds = {name: statistics.median(t[1:]) for name, t in times.items()}
    flops = model_flops(args, lengths, sampled)
    measured = matmul_tflops(args)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    peak = args.peak_tflops or next((v for k, v in DATASHEET_TFLOPS.items() if k in name), None)
    params = sum(p.numel() for p in learner.model.parameters())
    result = {"setup": {"device": name, "params_m": params / 1e6, "rows": args.rows, "tokens": sum(lengths),
                        "padded_tokens": int(batch.attention_mask.numel()), "sampled_tokens": sampled,
                        "micro_batch_size": args.micro_batch_size, "mixed_precision": args.mixed_precision,
                        "chunked_head": args.chunked_head,
                        "repeats": args.repeats, "torch": torch.__version__,
                        "peak_memory_gib": (torch.cuda.max_memory_allocated() / 2**30
                                            if args.device == "cuda" else None)},
              "model_tflop_per_update": flops / 1e12, "matmul_tflops": measured, "datasheet_tflops": peak,
              "seconds": seconds, "tflops": {k: flops / s / 1e12 for k, s in seconds.items()}}
    result["mfu_measured"] = {k: v / measured for k, v in result["tflops"].items()}
    result["mfu_datasheet"] = {k: v / peak for k, v in result["tflops"].items()} if peak else None
    result["learner_speed"] = {k: seconds[k] / seconds["learner"] for k in args.loops}
    return result


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    r = run(args)
    s = r["setup"]
    print(f"learner MFU: Qwen2 {s['params_m']:.1f}M params on {s['device']}, {s['rows']} rows, {s['tokens']} tokens "
          f"({s['sampled_tokens']} sampled, {s['padded_tokens']} padded), micro-batch {s['micro_batch_size']}, "
          f"mixed precision {s['mixed_precision']}, chunked head {s['chunked_head']}, median of {s['repeats']}, "
          f"torch {s['torch']}")
    peak = r["datasheet_tflops"]
    print(f"model FLOPs per update {r['model_tflop_per_update']:.3g} TFLOP; measured matrix rate "
          f"{r['matmul_tflops']:.3g} TFLOP/s" + (f"; datasheet {peak:.0f} TFLOP/s" if peak else ""))
    print(f"{'optimizer':<10} {'s/update':>9} {'TFLOP/s':>8} {'MFU(meas)':>10} {'MFU(sheet)':>11} "
          f"{'learner speed':>14}")
    for name, sec in r["seconds"].items():
        sheet = f"{r['mfu_datasheet'][name]:.1%}" if peak else "-"
        speed = f"{r['learner_speed'][name]:.2f}x" if name in r["learner_speed"] else ""
        print(f"{name:<10} {sec:>9.3f} {r['tflops'][name]:>8.3g} {r['mfu_measured'][name]:>10.1%} {sheet:>11} "
              f"{speed:>14}")
    if s["peak_memory_gib"] is not None:
        print(f"peak GPU memory {s['peak_memory_gib']:.1f} GiB")
    if args.json:
        record.write(args.json, r)


if __name__ == "__main__":
    main()
