"""Rollout time against turns per episode, with and without the transformers backend's prefix
cache (the keys and values of an episode's history kept across its turns): kept in rows of one
buffer (``turnrl.policies.hf.row_cache``, the default), copied into each call's buffer and out again
(``row_cache=False``), or with keys and values concatenated per token (transformers'
``DynamicCache``); and against raw ``model.generate`` loops of the same tokens, side by side.

    .venv/bin/python scripts/bench_turns.py [--turns 4,8,16,32] [--episodes 16] [--json out.json]
        [--hidden-size 128 --layers 2 --heads 4 --kv-heads 2 --intermediate-size 512] [--modes rows,copied,...]

The same tiny Qwen2 (random init, built from a config; the tokenizer built in code) plays
``--episodes`` GuessNumber episodes (1..1000, so a random model almost never wins and every
episode runs its ``max_turns``) with ``RolloutCollector``, ``--max-new-tokens`` per reply. Every
mode and baseline runs on the same seeds, alternating, in ``--repeats`` rounds over all the turn
counts after a warm-up round (so a machine whose speed drifts during the run slows every count
alike); the median seconds are kept. Printed: seconds per episode in each mode, their ratio,
and the growth exponent of time in turns (the least-squares slope of log time on log turns):
about 1 when a turn costs the same however long the history, toward 2
when each turn runs the model over the whole history again.

Two raw ``model.generate`` baselines (sampling, transformers' own KV cache), same batch:

* "first prompt only": one call over the episodes' first prompts, left-padded, with as many new
  tokens as an episode sampled in all its turns (``min_new_tokens`` = ``max_new_tokens``). It
  never reads an observation, so it attends over ~5x fewer tokens than the episodes hold.
* "per turn": what a hand-written transformers loop does. One call per turn over the same
  observation tokens the collector's episodes read (cut from their trajectories, between the
  sampled spans), each call continuing the previous one's ``past_key_values`` (rows padded in
  the middle, masked out), ``max_new_tokens`` new tokens a turn. Same batch shape, same
  observations, same new tokens per turn; no env, no renderer, no parsing.

Each ratio is the collector's sampled tokens per second (prefix cache on) over the baseline's.

The learner's side ("learner update"): one ``Learner.update`` with the trainer's defaults on a
copy of the model, over the episodes the collector sampled (fixed random advantages), each
round; "step" is a GRPO step's time, the rollout (prefix cache) plus that update.

Work exponents: what any implementation that runs each token once must do per episode, and how
it grows in turns. Arithmetic ("FLOPs"): ``2 x`` the layers' weights per token run, ``4 x`` the
query width x layers x context per token (attention over every earlier token), and the LM head
per sampled token. Memory traffic ("bytes"), what bounds decoding on a CPU: each forward call
reads the weights once for the whole batch (one call per decoded token and one per turn's
prefill) and every row's cached keys and values once. Attention makes both grow faster than
the tokens; the time's exponent is compared with them.
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
from transformers import DynamicCache

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from turnrl.chat.renderer import ChatRenderer  # noqa: E402
from turnrl.policies.sampling import SamplingParams  # noqa: E402
from turnrl.models.causal_lm import TinyModelConfig  # noqa: E402
from turnrl.policies.hf.policy import TransformersPolicy  # noqa: E402
from turnrl.models.causal_lm import build_tiny_model  # noqa: E402
from turnrl.chat.tokenizer import build_tokenizer  # noqa: E402
from turnrl.rollout.scripted import corpus_texts  # noqa: E402
from turnrl.algorithms import Learner, LossConfig, OptimConfig, collate  # noqa: E402
from turnrl.bench.record import emit  # noqa: E402
from turnrl.bench.stats import growth_exponent  # noqa: E402
from turnrl.envs import GuessNumberEnv  # noqa: E402
from turnrl.rollout import RolloutCollector, Task  # noqa: E402

# mode: TransformersPolicy's options
MODES = {"prefix cache": {},
         "cache, copied per call": {"row_cache": False},
         "cache, KV concatenated": {"kv_buffer": False},
         "whole prefill": {"prefix_cache": False}}
# --modes names: the collector's modes, the raw baselines and the learner's update
SHORT = {"rows": "prefix cache", "copied": "cache, copied per call", "concatenated": "cache, KV concatenated",
         "whole": "whole prefill", "generate": "generate", "turn-generate": "generate per turn",
         "update": "learner update"}
# ratio key: (numerator mode, denominator mode), seconds per episode (speed-ups of the prefix cache)
RATIOS = {"speedup": ("whole prefill", "prefix cache"), "buffer_speedup": ("cache, KV concatenated", "prefix cache"),
          "rows_speedup": ("cache, copied per call", "prefix cache"), "collector_vs_generate": ("generate", "prefix cache")}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", default="4,8,16,32", help="comma-separated turns per episode")
    parser.add_argument("--episodes", type=int, default=16, help="episodes per rollout batch")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="timed batches per mode and turn count")
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--intermediate-size", type=int, default=TinyModelConfig.intermediate_size, help="MLP width")
    parser.add_argument("--heads", type=int, default=TinyModelConfig.num_heads, help="attention heads")
    parser.add_argument("--kv-heads", type=int, default=TinyModelConfig.num_kv_heads, help="key/value heads")
    parser.add_argument("--modes", default=",".join(SHORT),
                        help=f"comma-separated, of {', '.join(SHORT)} (rows, the default cache, always runs)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch threads")
    parser.add_argument("--json", default=None, help="also write the result to this file")
    args = parser.parse_args(argv)
    args.turns = sorted({int(t) for t in args.turns.split(",") if t.strip()})
    if len(args.turns) < 2 or args.turns[0] < 1:
        parser.error(f"--turns needs at least two positive counts, got {args.turns}")
    if args.episodes < 1 or args.repeats < 1:
        parser.error("--episodes and --repeats must be >= 1")
    names = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in names if m not in SHORT]
    if unknown:
        parser.error(f"--modes: unknown {unknown}; choose from {', '.join(SHORT)}")
    args.modes = [SHORT[m] for m in SHORT if m in names or m == "rows"]  # in the table's order
    if args.hidden_size % args.heads or args.heads % args.kv_heads:
        parser.error(f"--hidden-size ({args.hidden_size}) must be a multiple of --heads ({args.heads}), "
                     f"and --heads of --kv-heads ({args.kv_heads})")
    return args


def raw_generate(model, tokenizer, renderer, tasks, new_tokens: int) -> float:
    """Seconds of one ``model.generate`` sampling ``new_tokens`` after each task's first prompt
    (left-padded into one batch)."""
    prompts = [renderer.start(list(GuessNumberEnv(n=1000).reset(seed=t.seed)[0])).token_ids for t in tasks]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                       max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=tokenizer.pad_token_id)
    return time.perf_counter() - start


def observations(trajectory) -> list[list[int]]:
    """The ids an episode's sampler read before each turn: the first prompt, then the template
    and observation ids between one turn's sampled span and the next."""
    ids, cuts = trajectory.token_ids, [0] + [end for _, end in trajectory.turn_spans]
    return [list(ids[prev:start]) for prev, (start, _) in zip(cuts, trajectory.turn_spans)]


def raw_turns(model, pad_id: int, trajectories, new_tokens: int) -> tuple[float, int]:
    """Seconds and sampled tokens of a hand-written per-turn ``model.generate`` loop over the
    trajectories' observations (see the module docstring): ``new_tokens`` a turn, every row every
    turn (a row out of turns gets an empty observation)."""
    reads = [observations(t) for t in trajectories]
    turns, batch = max(len(r) for r in reads), len(reads)
    ids = torch.zeros((batch, 0), dtype=torch.long)
    mask = torch.zeros((batch, 0), dtype=torch.long)
    cache = DynamicCache()
    start = time.perf_counter()
    with torch.no_grad():
        for k in range(turns):
            parts = [r[k] if k < len(r) else [] for r in reads]
            width = max(len(p) for p in parts)
            block = torch.tensor([[pad_id] * (width - len(p)) + p for p in parts], dtype=torch.long)
            block_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in parts], dtype=torch.long)
            ids, mask = torch.cat([ids, block], 1), torch.cat([mask, block_mask], 1)
            out = model.generate(input_ids=ids, attention_mask=mask, past_key_values=cache, do_sample=True,
                                 temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, pad_token_id=pad_id, return_dict_in_generate=True)
            ids, cache = out.sequences, out.past_key_values
            mask = torch.cat([mask, torch.ones((batch, new_tokens), dtype=torch.long)], 1)
    return time.perf_counter() - start, batch * turns * new_tokens


def learner_update(learner: Learner, pad_id: int, trajectories) -> float:
    """Seconds of one ``Learner.update`` (the trainer's defaults: PPO-clip, micro-batches of up
    to 8,192 padded tokens) on the episodes the collector sampled, with fixed random advantages
    (the time does not depend on their values)."""
    batch = collate(trajectories, pad_id)
    advantages = torch.randn(len(trajectories), generator=torch.Generator().manual_seed(0))[:, None] * batch.loss_mask
    start = time.perf_counter()
    learner.update(batch, advantages)
    return time.perf_counter() - start


def episode_flops(model, trajectories) -> float:
    """Mean model arithmetic of an episode run once through a prefix-cached sampler (see the
    module docstring): ``2 P T + 4 L W T (T - 1) / 2 + 2 H S`` for ``T`` tokens, ``S`` sampled,
    layer weights ``P``, query width ``W``, ``L`` layers and LM-head weights ``H``."""
    config = model.config
    layer_weights = sum(p.numel() for p in model.model.layers.parameters())
    width = config.num_attention_heads * (getattr(config, "head_dim", None)
                                          or config.hidden_size // config.num_attention_heads)
    head = model.lm_head.weight.numel()
    total = 0.0
    for t in trajectories:
        n, sampled = len(t.token_ids), sum(t.loss_mask)
        total += 2 * layer_weights * n + 4 * config.num_hidden_layers * width * n * (n - 1) / 2 + 2 * head * sampled
    return total / len(trajectories)


def episode_bytes(model, trajectories) -> float:
    """Mean memory read per episode (see the module docstring): every forward call, the batch's
    prefill of a turn and each decoding step, reads the weights once for the batch (``1/B`` of
    them per episode) and the row's keys and values of every position before the call's first
    new token. ``2 x kv_heads x head_dim x layers`` elements a position."""
    config = model.config
    size = next(model.parameters()).element_size()
    weights = sum(p.numel() for p in model.parameters()) * size / len(trajectories)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_position = 2 * config.num_key_value_heads * head_dim * config.num_hidden_layers * size
    total = 0.0
    for t in trajectories:
        for start, end in t.turn_spans:  # a prefill reads the cache up to its turn's prompt, a step up to its token
            total += weights + per_position * start
            total += sum(weights + per_position * position for position in range(start, end - 1))
    return total / len(trajectories)


def guess_number_model(args):
    """The tokenizer (built on GuessNumber 1..1000 episodes), its renderer and the tiny Qwen2 of
    ``args`` (``hidden_size``, ``layers``, ``heads``, ``kv_heads``, ``intermediate_size``), in
    eval mode, for up to 8,192 positions."""
    corpus = corpus_texts(GuessNumberEnv(n=1000), range(30))
    tokenizer = build_tokenizer(corpus, vocab_size=3000, max_number=255)
    cfg = TinyModelConfig(hidden_size=args.hidden_size, num_layers=args.layers, num_heads=args.heads,
                          num_kv_heads=args.kv_heads, intermediate_size=args.intermediate_size, max_positions=8192)
    return tokenizer, ChatRenderer(tokenizer), build_tiny_model(cfg, tokenizer, seed=0).eval()


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    tokenizer, renderer, model = guess_number_model(args)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0)
    tasks = [Task(seed) for seed in range(args.episodes)]
    modes = [m for m in args.modes if m in MODES]
    learner = None
    if "learner update" in args.modes:  # on a copy: the sampling modes all sample the same weights
        learner = Learner(copy.deepcopy(model).train(), LossConfig(), OptimConfig(lr=1e-5))
    times = {turns: {mode: [] for mode in args.modes} for turns in args.turns}
    found: dict[int, dict] = {}
    replayed: dict[int, list] = {}
    # rounds over every turn count (the first warms up and counts the tokens), so that a machine
    # whose speed drifts during the run moves every count alike, not the exponent
    for repeat in range(args.repeats + 1):
        for turns in args.turns:
            for mode in modes:
                policy = TransformersPolicy(model, tokenizer, seed=repeat, **MODES[mode])
                collector = RolloutCollector(lambda t=turns: GuessNumberEnv(n=1000, max_turns=t), policy, renderer,
                                             max_context_tokens=65536)
                start = time.perf_counter()
                trajectories = collector.collect(tasks, 1, params)
                times[turns][mode].append(time.perf_counter() - start)
            if repeat == 0:
                n = len(trajectories)
                found[turns] = {"turns": turns, "played_turns": sum(t.num_turns for t in trajectories) / n,
                                "episode_tokens": sum(len(t.token_ids) for t in trajectories) / n,
                                "sampled_tokens": round(sum(sum(t.loss_mask) for t in trajectories) / n),
                                "flops": episode_flops(model, trajectories),
                                "bytes": episode_bytes(model, trajectories)}
                replayed[turns] = trajectories
            if "generate" in times[turns]:
                times[turns]["generate"].append(raw_generate(model, tokenizer, renderer, tasks,
                                                             found[turns]["sampled_tokens"]))
            if "generate per turn" in times[turns]:
                seconds, raw_sampled = raw_turns(model, tokenizer.pad_token_id, replayed[turns], args.max_new_tokens)
                times[turns]["generate per turn"].append(seconds)
                found[turns]["raw_sampled_tokens"] = raw_sampled / args.episodes
            if "learner update" in times[turns]:
                times[turns]["learner update"].append(learner_update(learner, tokenizer.pad_token_id, replayed[turns]))
        print(f"  round {repeat} of {args.repeats}{' (warm-up)' if repeat == 0 else ''} done", flush=True)
    rows = []
    for turns in args.turns:
        row = found[turns]
        for mode, seconds in times[turns].items():
            row[mode] = statistics.median(seconds[1:]) / args.episodes
        for key, (slow, fast) in RATIOS.items():
            if slow in row:
                row[key] = row[slow] / row[fast]
        if "learner update" in row:  # a GRPO step: the rollout (rows) and the update on its episodes
            row["step"] = row["prefix cache"] + row["learner update"]
        if "generate per turn" in row:
            # tokens per second: the per-turn loop samples max_new_tokens every turn, the collector up to a stop
            row["collector_vs_turn_generate"] = ((row["sampled_tokens"] / row["prefix cache"])
                                                 / (row["raw_sampled_tokens"] / row["generate per turn"]))
        rows.append(row)
        print(f"  {turns} turns: " + ", ".join(f"{mode} {row[mode]:.3f}" for mode in args.modes) + " s per episode",
              flush=True)
    xs = [r["played_turns"] for r in rows]
    growth = {mode: growth_exponent(xs, [r[mode] for r in rows]) for mode in args.modes if mode != "generate"}
    if "step" in rows[0]:
        growth["step"] = growth_exponent(xs, [r["step"] for r in rows])
    growth["work"] = growth_exponent(xs, [r["flops"] for r in rows])
    growth["traffic"] = growth_exponent(xs, [r["bytes"] for r in rows])
    setup = {"params_m": sum(p.numel() for p in model.parameters()) / 1e6, "threads": args.threads,
             "hidden_size": args.hidden_size, "layers": args.layers, "intermediate_size": args.intermediate_size,
             "heads": args.heads, "kv_heads": args.kv_heads, "modes": args.modes,
             "episodes": args.episodes, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
             "torch": torch.__version__}
    return {"setup": setup, "rows": rows, "exponent": growth}


# table columns after tokens and sampled: (header, row key, ratio?) for the modes a run has
COLUMNS = (("prefix cache s/ep", "prefix cache", False), ("copied per call s/ep", "cache, copied per call", False),
           ("copied/rows", "rows_speedup", True),
           ("KV concatenated s/ep", "cache, KV concatenated", False), ("whole prefill s/ep", "whole prefill", False),
           ("speed-up", "speedup", True), ("generate, 1st prompt s/ep", "generate", False),
           ("collector/it", "collector_vs_generate", True), ("generate per turn s/ep", "generate per turn", False),
           ("collector/it", "collector_vs_turn_generate", True), ("learner update s/ep", "learner update", False),
           ("step s/ep", "step", False))


def print_table(result: dict) -> None:
    s = result["setup"]
    print(f"rollout time vs turns: tiny Qwen2 {s['params_m']:.2f}M params ({s['heads']} heads, {s['kv_heads']} "
          f"key/value heads), {s['episodes']} GuessNumber episodes per batch, {s['max_new_tokens']} new tokens per "
          f"turn, {s['threads']} threads, median of {s['repeats']}, torch {s['torch']}")
    columns = [c for c in COLUMNS if c[1] in result["rows"][0]]
    print(f"{'turns':>6} {'tokens/episode':>15} {'sampled':>8} " + " ".join(f"{h:>{len(h) + 1}}" for h, _, _ in columns))
    for r in result["rows"]:
        cells = [f"{r[key]:>{len(h)}.2f}x" if ratio else f"{r[key]:>{len(h) + 1}.3f}" for h, key, ratio in columns]
        print(f"{r['played_turns']:>6.1f} {r['episode_tokens']:>15.0f} {r['sampled_tokens']:>8} " + " ".join(cells))
    if any(key.startswith("collector_vs") for _, key, _ in columns):
        print("collector/it: the collector's sampled tokens per second over the baseline's")
    e = result["exponent"]
    modes = ", ".join(f"{mode} {e[mode]:.2f}" for mode in (*s["modes"], "step") if mode in e)
    print(f"growth exponent in turns (time ~ turns^k): {modes}; the work itself: model FLOPs {e['work']:.2f}, "
          f"memory read {e['traffic']:.2f}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    emit(run(args), print_table, args.json)


if __name__ == "__main__":
    main()
