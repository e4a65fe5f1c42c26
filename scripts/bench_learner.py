"""Learner throughput, 1 process vs 2 processes (DDP over gloo) on CPU, side by side.

    .venv/bin/python scripts/bench_learner.py [--rows 128] [--updates 3] [--micro-batch-size 16]

Both runs train the tiny model (``tests/conftest.py``'s builders) on the same global batch of
scripted GuessNumber episodes with fixed advantages, one torch thread per process; the
2-process run is this script relaunched by ``accelerate launch`` with
``turnrl/conf/accelerate/cpu_2proc.yaml``, each process on its ``shard_rows`` shard.
Throughput is real (non-padding) tokens of the global batch times updates over the wall time
of the updates (after one warm-up update), the same global batch in both runs.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from turnrl.chat.renderer import ChatRenderer  # noqa: E402
from turnrl.models.causal_lm import TinyModelConfig, build_tiny_model  # noqa: E402
from turnrl.chat.tokenizer import build_tokenizer  # noqa: E402
from turnrl.rollout.scripted import corpus_texts, scripted_episode  # noqa: E402
from turnrl.algorithms import Learner, LossConfig, OptimConfig, collate, token_logprobs  # noqa: E402
from turnrl.algorithms.distributed import shard_rows  # noqa: E402
from turnrl.envs import CalcMathEnv, GuessNumberEnv  # noqa: E402

TINY = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)


def setup(rows: int):
    """The tiny model and a ``rows``-row batch of expert/weak GuessNumber episodes."""
    corpus = corpus_texts(GuessNumberEnv(), range(30)) + corpus_texts(CalcMathEnv(), range(30))
    tokenizer = build_tokenizer(corpus, vocab_size=3000, max_number=255)
    renderer = ChatRenderer(tokenizer)
    model = build_tiny_model(TINY, tokenizer, seed=0)
    env = GuessNumberEnv(n=32, max_turns=6)
    trajs = [scripted_episode(env, i // 4, renderer, "expert" if i % 4 == 0 else "weak",
                              rng=np.random.default_rng(i)) for i in range(rows)]
    batch = collate(trajs, tokenizer.pad_token_id)
    with torch.no_grad():
        lp, _, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, score_mask=batch.loss_mask)
    batch.old_logprobs = lp * batch.loss_mask
    advantages = torch.randn(rows, generator=torch.Generator().manual_seed(0))[:, None] * batch.loss_mask
    return model, batch, advantages


def timed_updates(args, accelerator=None) -> dict:
    """Wall time of ``args.updates`` updates on this process's shard (after one warm-up)."""
    model, batch, advantages = setup(args.rows)
    tokens = int(batch.attention_mask.sum())
    world, rank = (1, 0) if accelerator is None else (accelerator.num_processes, accelerator.process_index)
    rows = shard_rows(len(batch), args.num_minibatches, world, rank)
    batch, advantages = batch.rows(rows), advantages[rows]
    learner = Learner(model, LossConfig(num_minibatches=args.num_minibatches),
                      OptimConfig(lr=1e-4, micro_batch_size=args.micro_batch_size), accelerator=accelerator)
    learner.update(batch, advantages)  # warm-up
    if accelerator is not None:
        accelerator.wait_for_everyone()
    start = time.perf_counter()
    for _ in range(args.updates):
        learner.update(batch, advantages)
    if accelerator is not None:
        accelerator.wait_for_everyone()
    seconds = time.perf_counter() - start
    return {"processes": world, "seconds": seconds, "tokens": tokens * args.updates,
            "tokens_per_s": tokens * args.updates / seconds}


def worker(args) -> None:
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    result = timed_updates(args, accelerator)
    if accelerator.is_main_process:
        Path(args.worker_out).write_text(json.dumps(result))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=128, help="global batch rows (trajectories)")
    parser.add_argument("--updates", type=int, default=3, help="timed updates")
    parser.add_argument("--micro-batch-size", type=int, default=16)
    parser.add_argument("--num-minibatches", type=int, default=2)
    parser.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.worker_out:
        return worker(args)
    one = timed_updates(args)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "two.json"
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(ROOT / "turnrl/conf/accelerate/cpu_2proc.yaml"), "--main_process_port", str(free_port()),
               __file__, "--rows", str(args.rows), "--updates", str(args.updates),
               "--micro-batch-size", str(args.micro_batch_size), "--num-minibatches", str(args.num_minibatches),
               "--worker-out", str(out)]
        subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
        two = json.loads(out.read_text())
    print(f"tiny model, {args.rows} rows x {args.updates} updates, {one['tokens'] // args.updates} tokens per "
          f"update, micro-batch {args.micro_batch_size}, {args.num_minibatches} minibatches, 1 thread per process")
    print(f"{'processes':>10} {'seconds':>9} {'tokens/s':>10}")
    for r in (one, two):
        print(f"{r['processes']:>10} {r['seconds']:>9.2f} {r['tokens_per_s']:>10.0f}")
    print(f"speed-up 2 vs 1 process: {two['tokens_per_s'] / one['tokens_per_s']:.2f}x")


if __name__ == "__main__":
    main()
