"""turnrl against TRL's ``GRPOTrainer``: seconds per GRPO step on the same model, prompts,
reward, sampling and optimizer settings, both sides in one process, alternating.

    .venv/bin/python scripts/bench_trl.py [--bench single,tools] [--steps 40] [--json out.json]

Both sides train their own copy of one tiny Qwen2 (built from a config, random init; a byte-level
BPE tokenizer built in code with the Qwen2.5 special tokens and TRL's own ``qwen2_5`` chat
template, as ``python -m turnrl build-model --arch qwen2`` builds them). Per step each side
samples ``--group-size`` completions of one prompt, scores them, computes group-relative
advantages (mean-centred, divided by the group's std) and takes one AdamW step (PPO-clip loss,
clip 0.2, token-mean aggregation, no KL, gradient clipping at 1.0, constant learning rate).

* ``single``: one turn. A prompt is ``"{a}+{b}="`` (``a, b`` in 0..99) in the chat template;
  the reward is ``1 / (1 + |n - (a + b)|)`` for the completion's first integer ``n``, 0.0
  without one; at most ``--max-new-tokens`` (32) new tokens. turnrl runs its step pieces as its
  trainer does (``RolloutCollector.collect`` on a ``MultiTurnEnv``, ``collate``, ``assign_credit``
  with the ``grpo`` estimator, ``Learner.update``), with ``env_workers=1`` (``trainer.env_workers``:
  these envs answer at once, so threads would only add overhead); TRL runs ``GRPOTrainer.train``.
* ``tools``: tool episodes. ``CalcMathEnv`` problems (``"Compute 37 + 24 * 5."``, two operations)
  with the ``calculator`` tool, at most 2 calls and an answer per episode, reward 1.0 for the right
  ``Answer: N``. Both sides start from the same warm start (``turnrl.train.warm_start.warm_start`` on the
  env's scripted expert), so the model writes calls. TRL gets the calculator as ``tools=`` (a
  function with the same name, docstring and results) and ``max_tool_calling_iterations=2``.

Both sides render the same prompt ids (checked: the function has no return annotation, which
would add ``"return"`` to TRL's schema) and the same tool results, and bound each turn at
``--tool-tokens`` (64) new tokens (TRL: ``generation_kwargs={"max_new_tokens": 64}``, with a
``max_completion_length`` for the whole completion that leaves room for 3 turns and 2 results,
``trl_budget``). The differences TRL's API leaves: TRL ends an episode at the first turn without
a parsed call (an answer, a malformed call or anything else), and after 2 calls it stops without
running a third; turnrl ends an episode at its answer or after 3 turns, and the env answers a
turn with neither a call nor an answer (or a malformed call) with a message the model then
reads. Printed per side: sampled tokens and tool calls per episode.

turnrl runs twice beside TRL: its step pieces as above, and its trainer as a user runs it
(``TrainerSide``: ``turnrl.train.loop.train``, what ``python -m turnrl.train`` runs, on the same
saved model, env and settings, with the trainer's defaults otherwise: every step's episodes kept,
TensorBoard, the collapse watch, the run page every 10 steps; held-out evaluation left out of the
timed steps, as TRL runs none).

Timing: TRL's step is the wall time between two ``on_step_end`` callbacks less the turnrl steps
run inside the callback (so it holds everything TRL does per step: batching the prompts,
rendering, generation, rewards, the loss, the optimizer, its metrics); turnrl's pieces are timed
around them, its trainer from a step's start to the end of its recording. The three alternate
step by step. The first ``--warmup`` steps of each side are dropped; medians are kept.
Printed: versions, each side's median seconds per step and the ratios turnrl / TRL (below 1:
turnrl is faster).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from turnrl.bench.record import emit  # noqa: E402
from turnrl.chat.renderer import ChatRenderer  # noqa: E402
from turnrl.policies.sampling import SamplingParams  # noqa: E402
from turnrl.policies.hf.policy import TransformersPolicy  # noqa: E402
from turnrl.rollout.scripted import corpus_texts  # noqa: E402
from turnrl.models.tiny_checkpoints import build_model, template_tokenizer  # noqa: E402
from turnrl.algorithms import ADVANTAGES, Learner, LossConfig, OptimConfig, StepCoefs, collate  # noqa: E402
from turnrl.algorithms.credit.assign import assign_credit  # noqa: E402
from turnrl.envs import CalcMathEnv  # noqa: E402
from turnrl.envs.base import MultiTurnEnv, TurnOutcome  # noqa: E402
from turnrl.rollout import RolloutCollector, Task  # noqa: E402
from turnrl.tools.calculator import evaluate, format_number  # noqa: E402
from turnrl.train.loop import train  # noqa: E402
from turnrl.train.warm_start import warm_start  # noqa: E402

BENCHES = ("single", "tools")
INT = re.compile(r"-?\d+")
ANSWER = re.compile(r"Answer:\s*(-?\d+)")
MAX_CALLS = 2
"""Tool calls per episode (turnrl: ``max_turns`` = this + 1; TRL: ``max_tool_calling_iterations``)."""


# ---------------------------------------------------------------- the single-turn task
def sum_reward(text: str, answer: int) -> float:
    """``1 / (1 + |n - answer|)`` for the first integer ``n`` of ``text`` (1.0 when right), 0.0
    without one: graded, so that a random model's groups have advantages to learn from."""
    found = INT.search(text)
    return 0.0 if found is None else 1.0 / (1.0 + abs(int(found.group()) - answer))


class SumEnv(MultiTurnEnv):
    """One turn: the user writes ``"{a}+{b}="``, the reply is scored by ``sum_reward``."""

    default_max_turns = 1

    def _new_task(self, rng: np.random.Generator, split: str) -> tuple[int, int]:
        return int(rng.integers(0, 100)), int(rng.integers(0, 100))

    def _task_id(self, task: tuple[int, int]) -> str:
        return f"{task[0]}+{task[1]}="

    def _start_episode(self, task: tuple[int, int]) -> list[dict]:
        return [{"role": "user", "content": self._task_id(task)}]

    def _on_turn(self, action, parse, tool_results) -> TurnOutcome:
        reward = sum_reward(action, sum(self._task))
        return TurnOutcome(reward=reward, terminated=True, success=reward == 1.0)

    def _state_key(self):
        return ()

    def expert_action(self) -> str:
        return str(sum(self._task))


# ---------------------------------------------------------------- the tool task (TRL's side)
def calculator(expression: str):  # no return annotation: TRL would add "return" to the schema
    """Evaluate an arithmetic expression and return the result.

    Args:
        expression: Arithmetic with numbers, + - * / // % ** and parentheses, e.g. "37 * 24".
    """
    return format_number(evaluate(expression))


def answer_reward(completions, answer, **kwargs) -> list[float]:
    """CalcMath's reward on TRL's completions: 1.0 when the last assistant turn's first
    ``Answer: N`` is right."""
    out = []
    for turns, right in zip(completions, answer):
        text = next((m.get("content") or "" for m in reversed(turns) if m.get("role") == "assistant"), "")
        found = ANSWER.search(text)
        out.append(1.0 if found is not None and int(found.group(1)) == right else 0.0)
    return out


def single_reward(completions, answer, **kwargs) -> list[float]:
    """``sum_reward`` on TRL's completions."""
    return [sum_reward(turns[0]["content"] if isinstance(turns, list) else turns, right)
            for turns, right in zip(completions, answer)]


# ---------------------------------------------------------------- setup
def build(args):
    """The tokenizer (Qwen2.5 specials and template) and the random-init tiny Qwen2."""
    # build-model's corpus (CalcMath's scripted episodes, expert and weak) and some sums
    corpus = [text for player in ("expert", "weak") for text in corpus_texts(CalcMathEnv(), range(50), player=player)]
    corpus += [f"{a}+{b}={a + b}" for a in range(0, 100, 7) for b in range(0, 100, 9)]
    tokenizer = template_tokenizer("qwen2_5", corpus, vocab_size=args.vocab_size)
    model = build_model("qwen2", tokenizer, hidden=args.hidden, layers=args.layers, heads=2, kv_heads=1, seed=0)
    # one end-of-turn id on both sides (the checkpoint's generation config also lists <|endoftext|>)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id]
    model.config.eos_token_id = tokenizer.eos_token_id
    return tokenizer, model


def env_for(bench: str):
    if bench == "single":
        return SumEnv()
    return CalcMathEnv(num_ops=2, max_turns=MAX_CALLS + 1)


def trl_dataset(bench: str, steps: int):
    """One prompt per step, in step order: the env's opening messages of seed ``step``."""
    from datasets import Dataset

    env, rows = env_for(bench), []
    for seed in range(steps):
        obs, info = env.reset(seed=seed, options={"split": "train"})
        answer = sum(env.task) if bench == "single" else env.task.answer
        rows.append({"prompt": [dict(m) for m in obs], "answer": answer})
    return Dataset.from_list(rows)


class TurnrlSide:
    """turnrl's GRPO step as its trainer runs it: collect -> collate -> credit -> update."""

    def __init__(self, bench: str, model, tokenizer, args):
        self.model, self.bench, self.args = model, bench, args
        renderer = ChatRenderer(tokenizer)
        self.policy = TransformersPolicy(model, tokenizer, seed=0)
        self.collector = RolloutCollector(lambda: env_for(bench), self.policy, renderer, max_context_tokens=2048,
                                          env_workers=1)
        self.pad = tokenizer.pad_token_id
        self.params = SamplingParams(max_new_tokens=args.max_new_tokens if bench == "single" else args.tool_tokens,
                                     temperature=args.temperature)
        grpo = ADVANTAGES.get("grpo")
        self.advantages = lambda batch: grpo(batch, normalize_std=True)
        self.learner = Learner(model, LossConfig(loss_agg="token-mean", clip_low=0.2, clip_high=0.2),
                               OptimConfig(lr=args.lr, weight_decay=0.0, max_grad_norm=1.0, micro_batch_size=64,
                                           skip_zero_grad=False))
        self.coefs = StepCoefs(temperature=args.temperature)
        self.sampled, self.calls, self.episodes, self.rollout = 0, 0, 0, []

    def step(self, seed: int) -> float:
        start = time.perf_counter()
        trajectories = self.collector.collect([Task(seed)], self.args.group_size, self.params)
        rolled = time.perf_counter()
        batch = collate(trajectories, self.pad)
        credited = assign_credit(batch, self.advantages)
        self.learner.update(credited.batch, credited.advantages, coefs=self.coefs)
        end = time.perf_counter()
        self.rollout.append(rolled - start)
        self.sampled += sum(sum(t.loss_mask) for t in trajectories)
        self.calls += sum(t.tool_calls for t in trajectories)
        self.episodes += len(trajectories)
        return end - start


def trainer_config(bench: str, args, model_dir: Path, steps: int):
    """The trainer's config of ``bench``: the saved model, the env, the benchmark's settings, the
    trainer's defaults otherwise (a ``Config``)."""
    from omegaconf import OmegaConf

    from turnrl.conf.schema import Config

    cfg = OmegaConf.structured(Config)
    cfg.env.id = None
    if bench == "single":
        cfg.env._target_, cfg.env.kwargs = "scripts.bench_trl.SumEnv", {}
    else:
        cfg.env._target_, cfg.env.kwargs = "turnrl.envs.CalcMathEnv", {"num_ops": 2, "max_turns": MAX_CALLS + 1}
    cfg.agent.update(dict(path=str(model_dir), max_new_tokens=args.max_new_tokens if bench == "single"
                          else args.tool_tokens, temperature=args.temperature, max_context_tokens=2048))
    cfg.agent.warmstart.steps = 0
    cfg.algorithm.update(dict(advantage="grpo", loss_agg="token-mean", clip_low=0.2, clip_high=0.2, kl_coef=0.0))
    cfg.algorithm.advantage_kwargs = {"normalize_std": True}
    cfg.trainer.update(dict(steps=steps, tasks_per_step=1, group_size=args.group_size, lr=args.lr, weight_decay=0.0,
                            max_grad_norm=1.0, micro_batch_size=64, skip_zero_grad=False, threads=args.threads,
                            env_workers=1, eval_every=10**9, eval_episodes=2, progress=False, save_checkpoint=False))
    return OmegaConf.to_object(cfg)


class TrainerSide:
    """turnrl's step as a user gets it: ``turnrl.train.loop.train`` (what ``python -m
    turnrl.train`` runs), on the same model (``agent.path``: the benchmark's model, saved), env and
    settings, with the trainer's defaults otherwise: every step's episodes kept
    (``trainer.rollouts``), TensorBoard, the collapse watch, the run page every 10 steps. The run
    goes in a thread of its own, one step per ``step`` call (the two sides never run at once); a
    step is timed from its start to the end of its recording (metrics, episodes kept, page).

    Held-out evaluation is left out of the timed steps (``trainer.eval_every`` past the run; the
    step-0 evaluation falls in a warm-up step, the final one after the last timed step), as TRL
    runs none."""

    def __init__(self, bench: str, model, tokenizer, args, workdir: Path, steps: int):
        model.save_pretrained(workdir / "model")
        tokenizer.save_pretrained(workdir / "model")
        self.cfg = trainer_config(bench, args, workdir / "model", steps + 1)
        self.go, self.done = threading.Semaphore(0), threading.Semaphore(0)
        self.started, self.error, self.run_dir = 0.0, None, workdir / "run"

        def on_rl_start(model):
            self.go.acquire()
            self.started = time.perf_counter()

        def on_step_end(step):
            self.ended = time.perf_counter()
            if step == steps + 1:  # the last, untimed step: the run ends
                return
            self.done.release()
            self.go.acquire()
            self.started = time.perf_counter()

        def run():
            try:
                train(self.cfg, self.run_dir, on_rl_start=on_rl_start, on_step_end=on_step_end)
            except BaseException as e:  # reported by the step that waits for it
                self.error = e
            finally:
                self.done.release()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def step(self, seed: int) -> float:
        self.go.release()
        self.done.acquire()
        if self.error is not None:
            raise RuntimeError(f"the turnrl trainer failed: {self.error!r}") from self.error
        return self.ended - self.started

    def finish(self) -> dict:
        """Run the last (untimed) step and the run's end; return its per-step figures."""
        self.go.release()
        self.thread.join()
        if self.error is not None:
            raise RuntimeError(f"the turnrl trainer failed: {self.error!r}") from self.error
        rows = [json.loads(line) for line in (self.run_dir / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r for r in rows if r["kind"] == "train"}


def trl_budget(args) -> int:
    """TRL's ``max_completion_length`` for tool episodes: room for every turn's ``--tool-tokens``
    and 32 tokens of each tool result, so that only the per-turn bound binds, as in turnrl."""
    return (MAX_CALLS + 1) * args.tool_tokens + MAX_CALLS * 32


def trl_trainer(bench: str, model, tokenizer, args, workdir: str, callback):
    from trl import GRPOConfig, GRPOTrainer

    tools = bench == "tools"
    config = GRPOConfig(
        output_dir=workdir, per_device_train_batch_size=args.group_size, num_generations=args.group_size,
        gradient_accumulation_steps=1, max_completion_length=trl_budget(args) if tools else args.max_new_tokens,
        generation_kwargs={"max_new_tokens": args.tool_tokens} if tools else None,
        temperature=args.temperature, top_p=1.0, top_k=0, learning_rate=args.lr, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, optim="adamw_torch", beta=0.0, num_iterations=1,
        epsilon=0.2, loss_type="dapo", scale_rewards="group", max_steps=args.warmup + args.steps,
        logging_steps=10**9, save_strategy="no", report_to="none", use_cpu=True, bf16=False, fp16=False,
        disable_tqdm=True, shuffle_dataset=False, seed=0, dataloader_num_workers=0,
        max_tool_calling_iterations=MAX_CALLS if tools else None)
    return GRPOTrainer(model=model, reward_funcs=answer_reward if tools else single_reward, args=config,
                       train_dataset=trl_dataset(bench, args.warmup + args.steps), processing_class=tokenizer,
                       tools=[calculator] if tools else None, callbacks=[callback])


def same_prompts(bench: str, tokenizer, steps: int) -> bool:
    """Whether turnrl's renderer and TRL's ``apply_chat_template`` (with ``tools=`` as TRL passes
    them) give the same prompt ids for the benchmark's prompts."""
    renderer, env = ChatRenderer(tokenizer), env_for(bench)
    for seed in range(steps):
        obs, info = env.reset(seed=seed, options={"split": "train"})
        ours = renderer.start(list(obs), tools=info.get("tools")).prompt_ids
        theirs = tokenizer.apply_chat_template([dict(m) for m in obs], tools=[calculator] if bench == "tools" else None,
                                               add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        if list(ours) != list(theirs):
            return False
    return True


def run_bench(bench: str, base_model, tokenizer, args) -> dict:
    """Both sides of ``bench``, alternating step by step inside TRL's training loop."""
    from transformers import TrainerCallback

    turnrl_side = TurnrlSide(bench, copy.deepcopy(base_model), tokenizer, args)
    scratch = tempfile.TemporaryDirectory()
    trainer_side = TrainerSide(bench, copy.deepcopy(base_model), tokenizer, args, Path(scratch.name),
                               args.warmup + args.steps)
    times = {"turnrl": [], "trainer": [], "trl": []}

    class Alternate(TrainerCallback):
        """After each TRL step, one turnrl step; TRL's step is the time between two of these."""

        last = None

        def on_train_begin(self, *a, **k):
            Alternate.last = time.perf_counter()

        def on_step_end(self, a, state, control, **k):
            now = time.perf_counter()
            times["trl"].append(now - Alternate.last)
            times["turnrl"].append(turnrl_side.step(state.global_step - 1))
            times["trainer"].append(trainer_side.step(state.global_step - 1))
            Alternate.last = time.perf_counter()

    trl_model = copy.deepcopy(base_model)
    with tempfile.TemporaryDirectory() as workdir, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = trl_trainer(bench, trl_model, tokenizer, args, workdir, Alternate())
        trl_stats = {"sampled": 0, "calls": 0, "episodes": 0}
        generate = trainer._generate

        def counted(prompts):  # TRL's own outputs, counted (not changed)
            out = generate(prompts)
            tool_mask = out[2]
            trl_stats["sampled"] += sum(sum(m) for m in tool_mask) if tool_mask is not None else \
                sum(len(c) for c in out[1])
            trl_stats["episodes"] += len(prompts)
            trl_stats["calls"] += sum(len(m.get("tool_calls") or []) for turns in out[3] if isinstance(turns, list)
                                      for m in turns)
            return out

        trainer._generate = counted
        trainer.train()
    trainer_rows = trainer_side.finish()
    scratch.cleanup()
    keep = slice(args.warmup, None)
    seconds = {side: statistics.median(t[keep]) for side, t in times.items()}
    side = turnrl_side
    timed = range(args.warmup + 1, args.warmup + args.steps + 1)
    return {
        "bench": bench, "seconds": seconds, "ratio": seconds["turnrl"] / seconds["trl"],
        "ratio_trainer": seconds["trainer"] / seconds["trl"],
        "turnrl_rollout": statistics.median(side.rollout[keep]),
        "trainer_step_time": statistics.median(trainer_rows[s]["step_time"] for s in timed),
        "trainer_rollout": statistics.median(trainer_rows[s]["rollout_time"] for s in timed),
        "range": {name: [min(t[keep]), max(t[keep])] for name, t in times.items()},
        "per_episode": {"turnrl": {"sampled_tokens": side.sampled / side.episodes,
                                   "tool_calls": side.calls / side.episodes},
                        "trl": {"sampled_tokens": trl_stats["sampled"] / trl_stats["episodes"],
                                "tool_calls": trl_stats["calls"] / trl_stats["episodes"]}},
        "steps": len(times["trl"][keep]), "same_prompt_ids": same_prompts(bench, tokenizer, args.warmup + args.steps),
    }


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import transformers
    import trl

    tokenizer, model = build(args)
    setup = {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
             "params": sum(p.numel() for p in model.parameters()), "threads": args.threads,
             "group_size": args.group_size, "max_new_tokens": args.max_new_tokens, "tool_tokens": args.tool_tokens,
             "steps": args.steps, "warmup": args.warmup, "lr": args.lr, "temperature": args.temperature}
    rows = []
    for bench in args.bench:
        base = model
        if bench == "tools":
            base = copy.deepcopy(model)
            losses = warm_start(base, ChatRenderer(tokenizer), CalcMathEnv(num_ops=2, max_turns=MAX_CALLS + 1),
                                steps=args.warmstart_steps, batch_size=8, lr=3e-3, player="expert", progress=False)
            setup["warmstart_loss"] = losses[-1] if losses else None
        rows.append(run_bench(bench, base, tokenizer, args))
        r = rows[-1]
        print(f"  {bench}: turnrl pieces {r['seconds']['turnrl']:.4f} s, trainer {r['seconds']['trainer']:.4f} s, "
              f"TRL {r['seconds']['trl']:.4f} s per step (ratios {r['ratio']:.2f}, {r['ratio_trainer']:.2f})", flush=True)
    return {"setup": setup, "rows": rows}


def print_table(result: dict) -> None:
    s = result["setup"]
    print(f"turnrl vs TRL GRPOTrainer: tiny Qwen2 ({s['params'] / 1e3:.0f}k params, Qwen2.5 template), "
          f"{s['group_size']} samples of 1 prompt per step, {s['threads']} thread(s), median of {s['steps']} steps "
          f"after {s['warmup']}; torch {s['torch']}, transformers {s['transformers']}, trl {s['trl']}")
    print(f"{'benchmark':<10} {'pieces s/step':>14} {'trainer s/step':>15} {'TRL s/step':>11} {'ratio':>6} "
          f"{'trainer':>8} {'turnrl rollout':>15} "
          f"{'tokens/ep turnrl':>17} {'TRL':>6} {'calls/ep turnrl':>16} {'TRL':>5}")
    for r in result["rows"]:
        e = r["per_episode"]
        print(f"{r['bench']:<10} {r['seconds']['turnrl']:>14.4f} {r['seconds']['trainer']:>15.4f} "
              f"{r['seconds']['trl']:>11.4f} {r['ratio']:>6.2f} {r['ratio_trainer']:>8.2f} "
              f"{r['turnrl_rollout']:>15.4f} {e['turnrl']['sampled_tokens']:>17.1f} {e['trl']['sampled_tokens']:>6.1f} "
              f"{e['turnrl']['tool_calls']:>16.2f} {e['trl']['tool_calls']:>5.2f}")
    print("ratio = turnrl's pieces s/step / TRL s/step, trainer = the trainer's s/step / TRL's (below 1: turnrl "
          "faster); same prompt ids on both sides: "
          + ", ".join(f"{r['bench']} {'yes' if r['same_prompt_ids'] else 'NO'}" for r in result["rows"]))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", default="single,tools", help=f"comma-separated, of {BENCHES}")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per side")
    parser.add_argument("--warmup", type=int, default=3, help="steps per side dropped before timing")
    parser.add_argument("--group-size", type=int, default=8, help="samples per prompt (one prompt per step)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="single: new tokens per completion")
    parser.add_argument("--tool-tokens", type=int, default=64, help="tools: tokens per completion (see the docstring)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=3000)
    parser.add_argument("--warmstart-steps", type=int, default=150, help="tools: supervised steps on the expert")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (both sides)")
    parser.add_argument("--json", default=None, help="also write the result to this file")
    args = parser.parse_args(argv)
    args.bench = [b.strip() for b in args.bench.split(",") if b.strip()]
    if not args.bench or set(args.bench) - set(BENCHES):
        parser.error(f"--bench must name some of {BENCHES}, got {args.bench}")
    if args.steps < 1 or args.warmup < 0 or args.group_size < 2:
        parser.error("--steps must be >= 1, --warmup >= 0 and --group-size >= 2")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    emit(run(args), print_table, args.json)


if __name__ == "__main__":
    main()
