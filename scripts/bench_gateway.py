"""What the agent gateway costs per model call: the same agent programs calling the policy
directly (``turnrl serve-policy``'s server, in process) and through the gateway (``AgentEnv``
under the rollout collector), beside the same conversations as a native env.

    .venv/bin/python scripts/bench_gateway.py [--agents 16 --turns 8 --repeats 5] [--json out.json]

A Qwen2 built from a config (random init, a Qwen2.5 family tokenizer built in code) samples with
the transformers backend on every side. ``--agents`` programs run at once, each ``--turns`` calls:
a system and a user message, then after every reply the user message "Go on (k)." (an
``async def`` with the ``openai`` SDK, each on an event loop of its own thread).

* ``direct``: the programs call ``PolicyServer`` (serve-policy), which batches the requests
  that arrive together into shared ``generate`` calls.
* ``gateway``: the programs call the gateway; the collector samples every waiting call in one
  batch per turn (``trainer.env_workers`` = the number of agents) and records the turns.
* ``native``: a ``gymnasium.Env`` returning those messages, no program and no HTTP: the floor.

The sides alternate over ``--repeats`` rounds after a warm-up; medians of the seconds per call
(all programs' calls / the wall time of the round), and the ratio gateway / direct.
"""


from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gymnasium
import openai
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from turnrl.bench.record import emit  # noqa: E402
from turnrl.chat.families import family_tokenizer  # noqa: E402
from turnrl.chat.renderer import ChatRenderer  # noqa: E402
from turnrl.envs.agent import AgentEnv  # noqa: E402
from turnrl.envs.messages import action_space, observation_space  # noqa: E402
from turnrl.models.tiny_checkpoints import build_model  # noqa: E402
from turnrl.policies.hf.policy import TransformersPolicy  # noqa: E402
from turnrl.policies.sampling import SamplingParams  # noqa: E402
from turnrl.policies.server import PolicyServer  # noqa: E402
from turnrl.rollout import RolloutCollector, Task  # noqa: E402

SYSTEM = "You are a patient assistant."


def opening(seed: int) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Tell me about the number {seed}."}]


def nudge(k: int) -> dict:
    return {"role": "user", "content": f"Go on ({k})."}


class NativeChat(gymnasium.Env):
    """The conversation as an env: the opening, then a nudge after every reply, ``turns`` turns."""

    def __init__(self, turns: int):
        self.turns, self.observation_space, self.action_space = turns, observation_space(), action_space()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.turn = 0
        return opening(seed or 0), {"task_id": str(seed), "state_key": 0}

    def step(self, action):
        self.turn += 1
        if self.turn == self.turns:
            return [], 0.0, True, False, {"success": False}
        return [nudge(self.turn)], 0.0, False, False, {"state_key": self.turn}


def agent_env(turns: int) -> AgentEnv:
    return AgentEnv(program(turns), {"train": [{"id": str(s), "seed": s} for s in range(1000)]}, max_turns=turns + 1)


def program(turns: int):
    """The agent program of every side: ``turns`` calls, each reply and a nudge appended."""
    async def agent(base_url: str, api_key: str, task: dict) -> float:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
            messages = opening(task["seed"])
            for k in range(1, turns + 1):
                reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=24)
                messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""}, nudge(k)]
        return 0.0
    return agent


def direct(model, tokenizer, args, seed: int) -> tuple[float, int]:
    """The programs against serve-policy's server: (seconds, calls)."""
    agent = program(args.turns)
    with PolicyServer(model, tokenizer, seed=seed, max_batch=max(64, args.agents), model_name="policy") as server:
        def one(i: int) -> float:
            return asyncio.run(agent(f"{server.url}/v1", "unused", {"seed": 1000 * seed + i}))

        start = time.perf_counter()
        with ThreadPoolExecutor(args.agents) as pool:
            list(pool.map(one, range(args.agents)))
        return time.perf_counter() - start, args.agents * args.turns


def collected(make, model, tokenizer, renderer, args, seed: int) -> tuple[float, int]:
    """Episodes of ``make``'s env through the collector: (seconds, turns)."""
    policy = TransformersPolicy(model, tokenizer, seed=seed)
    collector = RolloutCollector(make, policy, renderer, max_context_tokens=4096, env_workers=args.agents)
    start = time.perf_counter()
    trajectories = collector.collect([Task(1000 * seed + i) for i in range(args.agents)], 1,
                                     SamplingParams(max_new_tokens=args.max_new_tokens))
    seconds = time.perf_counter() - start
    collector.close()
    bad = [t for t in trajectories if t.termination != "terminated" or t.error]
    if bad:
        raise RuntimeError(f"{len(bad)} episodes failed: {bad[0].termination} {bad[0].error}")
    return seconds, sum(t.num_turns for t in trajectories)


def run(args) -> dict:
    torch.manual_seed(0)
    tokenizer = family_tokenizer("qwen2_5", [SYSTEM, "Tell me about the number 12. Go on (3)."], vocab_size=800)
    model = build_model("qwen2", tokenizer, hidden=args.hidden_size, layers=args.layers, seed=0)
    renderer = ChatRenderer(tokenizer)
    sides = {"direct": lambda seed: direct(model, tokenizer, args, seed),
             "gateway": lambda seed: collected(lambda: agent_env(args.turns), model, tokenizer, renderer, args, seed),
             "native": lambda seed: collected(lambda: NativeChat(args.turns), model, tokenizer, renderer, args, seed)}
    figures: dict[str, list[float]] = {name: [] for name in sides}
    for round_ in range(args.repeats + 1):
        for name, side in sides.items():
            seconds, calls = side(round_)
            print(f"  round {round_} {name:8s}: {calls} calls in {seconds:.2f} s, {1000 * seconds / calls:.2f} ms/call",
                  flush=True)
            if round_:
                figures[name].append(seconds / calls)
    rows = {name: {"seconds_per_call": statistics.median(v), "runs": v} for name, v in figures.items()}
    per = {name: row["seconds_per_call"] for name, row in rows.items()}
    return {"setup": {"agents": args.agents, "turns": args.turns, "max_new_tokens": args.max_new_tokens,
                      "hidden_size": args.hidden_size, "layers": args.layers, "repeats": args.repeats,
                      "params": sum(p.numel() for p in model.parameters()), "backend": "transformers"},
            "sides": rows, "ratio_gateway_to_direct": per["gateway"] / per["direct"],
            "ratio_gateway_to_native": per["gateway"] / per["native"]}


def print_table(result: dict) -> None:
    s = result["setup"]
    print(f"{s['agents']} agents in flight, {s['turns']} calls each, {s['max_new_tokens']} new tokens a call "
          f"({s['params'] / 1e6:.2f}M-parameter Qwen2); median of {s['repeats']}")
    for name, row in result["sides"].items():
        print(f"{name:8s} {1000 * row['seconds_per_call']:8.2f} ms/call")
    print(f"gateway / direct: {result['ratio_gateway_to_direct']:.3f}x; gateway / native: "
          f"{result['ratio_gateway_to_native']:.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    emit(run(args), print_table, args.json)


if __name__ == "__main__":
    main()
