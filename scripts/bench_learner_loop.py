"""The learner's update against a bare torch loop (forward, backward, AdamW) over the same
tokens, side by side.

    .venv/bin/python scripts/bench_learner_loop.py [--rows 64] [--micro-batch-size 16] [--repeats 5]

Both train copies of one tiny Qwen2 (``scripts/bench_learner.py``'s model and batch: scripted
GuessNumber episodes with random advantages) on the same ``--rows``-row batch, one optimizer
step per call, alternating, after a warm-up; the median seconds are kept. The bare loop is what
a policy-gradient step cannot do with less: per micro-batch a forward over the whole rows, the
log-softmax of every position gathered at the next token, ``-(A * logp)`` averaged over the
sampled tokens, backward; then gradient clipping and one AdamW step. A second, lean loop runs
the LM head on the sampled positions only, as the learner does. The learner adds what it does
on top (PPO-clip ratio, entropy, the loss aggregation's weights, the metrics). Printed: seconds
per update of each and each loop's time over the learner's (the learner's speed against it;
1.00 = no overhead).
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

from bench_learner import setup  # noqa: E402
from turnrl.bench import record  # noqa: E402
from turnrl.algorithms import Learner, LossConfig, OptimConfig  # noqa: E402


def bare_step(model, optimizer, batch, advantages, micro: int) -> None:
    """One policy-gradient step as plainly as torch allows."""
    tokens = batch.loss_mask.sum()
    for rows in torch.arange(len(batch)).split(micro):
        ids, mask = batch.input_ids[rows], batch.attention_mask[rows]
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        scored = batch.loss_mask[rows][:, 1:]
        loss = -(advantages[rows][:, 1:] * logp * scored).sum() / tokens
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def lean_step(model, optimizer, batch, advantages, micro: int) -> None:
    """``bare_step`` with the LM head and softmax run on the sampled positions only (in
    multi-turn episodes most tokens are prompts and observations), as the learner does."""
    tokens = batch.loss_mask.sum()
    for rows in torch.arange(len(batch)).split(micro):
        ids, mask = batch.input_ids[rows], batch.attention_mask[rows]
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state[:, :-1]
        scored = batch.loss_mask[rows][:, 1:].bool()
        logits = model.lm_head(hidden[scored]).float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:][scored][:, None]).squeeze(-1)
        loss = -(advantages[rows][:, 1:][scored] * logp).sum() / tokens
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


LOOPS = {"bare": bare_step, "lean": lean_step}


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    model, batch, advantages = setup(args.rows)
    learner = Learner(copy.deepcopy(model), LossConfig(loss_agg="token-mean"),
                      OptimConfig(lr=1e-5, micro_batch_size=args.micro_batch_size))
    loops = {}
    for name in LOOPS:
        twin = copy.deepcopy(model).train()
        loops[name] = (twin, torch.optim.AdamW(twin.parameters(), lr=1e-5, weight_decay=0.0))
    times: dict[str, list[float]] = {"learner": [], **{name: [] for name in LOOPS}}
    for repeat in range(args.repeats + 1):  # the first round warms up
        start = time.perf_counter()
        learner.update(batch, advantages)
        times["learner"].append(time.perf_counter() - start)
        for name, (twin, optimizer) in loops.items():
            start = time.perf_counter()
            LOOPS[name](twin, optimizer, batch, advantages, args.micro_batch_size)
            times[name].append(time.perf_counter() - start)
    seconds = {name: statistics.median(t[1:]) for name, t in times.items()}
    return {"setup": {"rows": args.rows, "tokens": int(batch.attention_mask.sum()),
                      "sampled_tokens": int(batch.loss_mask.sum()), "micro_batch_size": args.micro_batch_size,
                      "threads": args.threads, "repeats": args.repeats, "torch": torch.__version__,
                      "params_m": sum(p.numel() for p in model.parameters()) / 1e6},
            "seconds": seconds, "ratio": {name: seconds[name] / seconds["learner"] for name in LOOPS}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--micro-batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--json", default=None, help="also write the result to this file")
    args = parser.parse_args(argv)
    if min(args.rows, args.micro_batch_size, args.repeats) < 1:
        parser.error("--rows, --micro-batch-size and --repeats must be >= 1")
    r = run(args)
    s = r["setup"]
    print(f"learner vs bare torch loop: tiny Qwen2 {s['params_m']:.2f}M params, {s['rows']} rows, {s['tokens']} tokens "
          f"({s['sampled_tokens']} sampled), micro-batch {s['micro_batch_size']}, {s['threads']} threads, median of "
          f"{s['repeats']}, torch {s['torch']}")
    t = r["seconds"]
    print(f"{'loop':<40} {'s/update':>9} {'learner speed':>14}")
    print(f"{'turnrl Learner.update':<40} {t['learner']:>9.3f} {'':>14}")
    print(f"{'bare torch (LM head on every position)':<40} {t['bare']:>9.3f} {r['ratio']['bare']:>13.2f}x")
    print(f"{'lean torch (LM head on sampled tokens)':<40} {t['lean']:>9.3f} {r['ratio']['lean']:>13.2f}x")
    if args.json:
        record.write(args.json, r)


if __name__ == "__main__":
    main()
