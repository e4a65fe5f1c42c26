"""What the agent gateway costs per model call: the same conversations rolled out by the
collector as a native env and as agent programs (``AgentEnv``) calling the gateway.

    .venv/bin/python scripts/bench_gateway.py [--agents 16 --turns 8 --repeats 5] [--json out.json]

A Qwen2 built from a config (random init, a Qwen2.5 family tokenizer built in code) samples on
the transformers backend. Each side rolls out ``--agents`` episodes at once (one step of all
of them is one batched ``generate``), each ``--turns`` turns: a system and a user message, then
after every reply the user message "Go on (k)." The native side is a ``gymnasium.Env`` that
returns those messages; the gateway side is an ``AgentEnv`` whose program (``async def``, the
``openai`` SDK) sends them as chat completions, so every turn crosses the gateway (an HTTP
request, a wait for the batch, the reply) and the program's next call is checked against the
history. ``trainer.env_workers`` is the number of agents, so every program's call waits at once.
The sides alternate over ``--repeats`` rounds after a warm-up; medians of the seconds per turn
(all episodes' turns of a rollout / the rollout's wall time) and the ratio gateway / native.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
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
    async def program(base_url: str, api_key: str, task: dict) -> float:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
            messages = opening(task["seed"])
            for k in range(1, turns + 1):
                reply = await client.chat.completions.create(model="policy", messages=messages)
                messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""}, nudge(k)]
        return 0.0

    return AgentEnv(program, {"train": [{"id": str(s), "seed": s} for s in range(1000)]}, max_turns=turns + 1)


def run(args) -> dict:
    torch.manual_seed(0)
    tokenizer = family_tokenizer("qwen2_5", [SYSTEM, "Tell me about the number 12. Go on (3)."], vocab_size=800)
    model = build_model("qwen2", tokenizer, hidden=args.hidden_size, layers=args.layers, seed=0)
    renderer = ChatRenderer(tokenizer)
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    sides = {"native": lambda: NativeChat(args.turns), "gateway": lambda: agent_env(args.turns)}
    figures: dict[str, list[float]] = {name: [] for name in sides}
    for round_ in range(args.repeats + 1):
        for name, make in sides.items():
            policy = TransformersPolicy(model, tokenizer, seed=round_)
            collector = RolloutCollector(make, policy, renderer, max_context_tokens=4096, env_workers=args.agents)
            tasks = [Task(1000 * round_ + i) for i in range(args.agents)]
            start = time.perf_counter()
            trajectories = collector.collect(tasks, 1, params)
            seconds = time.perf_counter() - start
            collector.close()
            bad = [t for t in trajectories if t.termination not in ("terminated", "truncated") or t.error]
            if bad:
                raise RuntimeError(f"{name}: {len(bad)} episodes failed: {bad[0].termination} {bad[0].error}")
            turns = sum(t.num_turns for t in trajectories)
            print(f"  round {round_} {name:8s}: {turns} turns in {seconds:.2f} s, {1000 * seconds / turns:.2f} ms/turn",
                  flush=True)
            if round_:
                figures[name].append(seconds / turns)
    rows = {name: {"seconds_per_turn": statistics.median(v), "runs": v} for name, v in figures.items()}
    return {"setup": {"agents": args.agents, "turns": args.turns, "max_new_tokens": args.max_new_tokens,
                      "hidden_size": args.hidden_size, "layers": args.layers, "repeats": args.repeats,
                      "params": sum(p.numel() for p in model.parameters()), "backend": "transformers"},
            "sides": rows, "ratio": rows["gateway"]["seconds_per_turn"] / rows["native"]["seconds_per_turn"],
            "overhead_ms_per_call": 1000 * (rows["gateway"]["seconds_per_turn"] - rows["native"]["seconds_per_turn"])}


def print_table(result: dict) -> None:
    s = result["setup"]
    print(f"{s['agents']} agents in flight, {s['turns']} turns each, {s['max_new_tokens']} new tokens a turn "
          f"({s['params'] / 1e6:.2f}M-parameter Qwen2); median of {s['repeats']}")
    for name, row in result["sides"].items():
        print(f"{name:8s} {1000 * row['seconds_per_turn']:8.2f} ms/turn")
    print(f"gateway / native: {result['ratio']:.3f}x ({result['overhead_ms_per_call']:+.2f} ms a call)")


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
