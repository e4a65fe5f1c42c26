"""Learner tokens per step with segments vs one sample per turn, on the same episodes.

    .venv/bin/python scripts/bench_segments.py [--episodes 16] [--json out.json]

A template that rewrites history (Qwen3 drops earlier think blocks at a new user message) makes
an episode go on in a new segment (``turnrl.chat.renderer``); where nothing is rewritten (tool
results, prefix-preserving templates) the episode stays one sequence. Peers that meet such
templates train one sample per turn, each holding the whole history re-rendered. This script
plays the same scripted episodes (the env's expert, its turns written with a thought block for
thinking families) through the real renderer for each (family, env) (``qwen3_6+keep``: Qwen3.6's
thought-preserving render, ``preserve_thinking=True``), and prints per step: turns
and segments per episode, the learner's tokens with segments and with one sample per turn, their
ratio, and the seconds of one forward + backward of a tiny model over each batch (median of 3).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from turnrl.bench import record  # noqa: E402
from turnrl.chat.renderer import ChatRenderer  # noqa: E402
from turnrl.models.causal_lm import TinyModelConfig, build_tiny_model
from turnrl.chat.families import family_tokenizer  # noqa: E402
from turnrl.algorithms import collate, token_logprobs  # noqa: E402
from turnrl.envs import CalcMathEnv, GuessNumberEnv  # noqa: E402
from turnrl.rollout.trajectory import Trajectory  # noqa: E402

ENVS = {"guess_number (user feedback)": lambda parser: GuessNumberEnv(n=64, max_turns=8, tool_parser=parser),
        "calc_math (tool results)": lambda parser: CalcMathEnv(max_turns=6, tool_parser=parser)}
FAMILIES = {"qwen3": ("qwen3", {}), "qwen3_6": ("qwen3_6", {}),
            "qwen3_6+keep": ("qwen3_6", {"preserve_thinking": True}),  # the keep-history render
            "qwen2_5": ("qwen2_5", {}), "gemma3": ("gemma3", {})}


def episode(env, seed: int, renderer: ChatRenderer) -> Trajectory:
    """The env's expert episode, each turn with a short thought for a thinking family."""
    base = env.unwrapped
    obs, info = env.reset(seed=seed)
    conv = renderer.start(list(obs), tools=info.get("tools"))
    rewards = []
    for turn in range(base.max_turns):
        text = base.expert_action()
        if renderer.format.thinking is not None and renderer.format.history == "raw":
            open_tag, close_tag = renderer.format.thinking
            opened = conv.text.endswith(f"{open_tag}\n")  # the prompt opened the thought (Qwen3.5+)
            text = f"{'' if opened else open_tag + chr(10)}Turn {turn}: the expert's move is next.\n{close_tag}\n\n{text}"
        ids = renderer.encode(text) + [renderer.tokenizer.eos_token_id]
        action = renderer.add_sampled(conv, ids, [0.0] * len(ids))
        obs, reward, terminated, truncated, _ = env.step(action)
        rewards.append(float(reward))
        if terminated or truncated:
            renderer.add_observation(conv, [], add_generation_prompt=False)
            break
        renderer.add_observation(conv, list(obs), add_generation_prompt=True)
    return Trajectory.from_conversation(conv, rewards, True, 0, str(seed), "terminated")


def per_turn(traj: Trajectory, renderer: ChatRenderer, tools: list[dict]) -> list[Trajectory]:
    """One sample per turn: the whole history before the turn rendered afresh, then its ids."""
    out, assistants = [], [i for i, m in enumerate(traj.messages) if m["role"] == "assistant"]
    for k, ((start, end), at) in enumerate(zip(traj.turn_spans, assistants)):
        prompt = renderer.encode(renderer.render(traj.messages[:at], add_generation_prompt=True, tools=tools))
        sampled = traj.token_ids[start:end]
        out.append(Trajectory(prompt + sampled, [0] * len(prompt) + [1] * len(sampled), [0.0] * (len(prompt) + len(sampled)),
                              [(len(prompt), len(prompt) + len(sampled))], [0.0], True, 0, traj.task_id, "terminated"))
    return out


def step_seconds(model, trajectories: list[Trajectory], pad_id: int) -> float:
    """Median seconds of one forward + backward over the batch (3 runs after a warm-up)."""
    batch = collate(trajectories, pad_id)
    times = []
    for _ in range(4):
        model.zero_grad()
        t0 = time.perf_counter()
        lp, _, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, score_mask=batch.loss_mask,
                               segments=batch.segment_index)
        (-(lp * batch.loss_mask).sum()).backward()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=16, help="episodes per step (default 16)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(2)
    rows = []
    print(f"{'family':13} {'env':29} {'turns':>5} {'segs':>5} {'tokens seg':>10} {'tokens turn':>11} "
          f"{'ratio':>6} {'s seg':>7} {'s turn':>7}")
    for label, (family, template_kwargs) in FAMILIES.items():
        tok = family_tokenizer(family)
        model = build_tiny_model(TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                                 intermediate_size=128), tok, seed=0)
        renderer = ChatRenderer(tok, template_kwargs=template_kwargs)
        for env_name, make in ENVS.items():
            env = make(renderer.format.tool_parser)  # the expert writes calls in the family's format
            trajectories = [episode(env, seed, renderer) for seed in range(args.episodes)]
            tools = env.reset(seed=0)[1].get("tools", [])
            turns = [s for t in trajectories for s in per_turn(t, renderer, tools)]
            row = {"family": label, "env": env_name,
                   "turns": sum(t.num_turns for t in trajectories) / len(trajectories),
                   "segments": sum(t.num_segments for t in trajectories) / len(trajectories),
                   "tokens_segments": sum(len(t.token_ids) for t in trajectories),
                   "tokens_per_turn": sum(len(t.token_ids) for t in turns),
                   "seconds_segments": step_seconds(model, trajectories, tok.pad_token_id),
                   "seconds_per_turn": step_seconds(model, turns, tok.pad_token_id)}
            row["ratio"] = row["tokens_per_turn"] / row["tokens_segments"]
            rows.append(row)
            print(f"{label:13} {env_name:29} {row['turns']:5.1f} {row['segments']:5.1f} {row['tokens_segments']:10d} "
                  f"{row['tokens_per_turn']:11d} {row['ratio']:5.2f}x {row['seconds_segments']:7.3f} "
                  f"{row['seconds_per_turn']:7.3f}")
    if args.json:
        record.write(args.json, {"episodes": args.episodes, "rows": rows})
    return rows


if __name__ == "__main__":
    main()
