"""What ``turnrl eval`` reports: typed figures of a set of episodes (``EpisodeStats``), of a
learned reward model against the verifier (``RewardAgreement``) and of the whole evaluation
(``EvalReport``), as JSON and as a Markdown table."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from turnrl.eval.metrics import distinct_n, mean_pass_at_k, pairwise_agreement, pearson
from turnrl.rollout.trajectory import Trajectory


@dataclass(frozen=True)
class RewardAgreement:
    """A learned reward model (the proxy) against the env's verifier, over the episodes that
    carry both (``Trajectory.verifier_reward`` set: the env was wrapped by
    ``turnrl.train.reward_model_env.RewardModelReward``)."""

    episodes: int  # episodes with both returns
    proxy_reward: float  # mean return by the reward model
    verifier_reward: float  # mean return by the verifier
    proxy_verifier_gap: float  # proxy - verifier, as rollout_metrics logs it in training
    pairwise_agreement: float | None  # eval_metrics.pairwise_agreement; None: all verifier returns equal
    pearson: float | None  # correlation of the two returns; None: either is constant


@dataclass(frozen=True)
class EpisodeStats:
    """The figures of one set of episodes: the greedy ones (one per task) or the sampled ones
    (``samples`` per task at ``temperature``). Rates are named as ``rollout_metrics`` names
    them in training logs; "per episode" figures are means over episodes."""

    episodes: int  # how many episodes
    temperature: float | None  # the sampling temperature; None: greedy (argmax)
    success: float  # fraction of episodes the env judged a success
    reward: float  # mean return (the reward model's when one rewards the env)
    turns: float  # mean assistant turns per episode
    gen_tokens: float  # mean sampled tokens per episode
    tokens_sampled: int  # sampled tokens in all
    tool_calls: float  # tool calls per episode
    tool_calls_per_turn: float  # tool calls per turn
    tool_errors: float  # failed tool calls per episode
    tool_exec_error_rate: float  # failed tool calls per tool call
    parse_errors: float  # turns with a malformed tool call, per episode
    tool_parse_error_rate: float  # turns with a malformed tool call, per turn
    turn_length_cut_rate: float  # turns cut by max_new_tokens, per turn
    terminations: dict[str, int]  # how episodes ended (Trajectory.termination) -> count
    distinct_1: float  # distinct word unigrams / all (eval_metrics.distinct_n), each episode's turns as one text
    distinct_2: float  # distinct word bigrams / all: bigrams span consecutive turns, never two episodes
    reward_model: RewardAgreement | None = None  # None: no reward model rewarded the env


def episode_stats(trajectories: Sequence[Trajectory], temperature: float | None) -> EpisodeStats:
    """The ``EpisodeStats`` of ``trajectories`` (``temperature`` None: they were greedy).

    Raises:
        ValueError: On no trajectories.
    """
    if not trajectories:
        raise ValueError("episode_stats needs at least one trajectory, got none")
    n = len(trajectories)
    turns = sum(t.num_turns for t in trajectories)
    calls = sum(t.tool_calls for t in trajectories)
    tokens = sum(t.num_generated_tokens for t in trajectories)
    texts = [" ".join(m["content"] for m in t.messages if m.get("role") == "assistant") for t in trajectories]
    return EpisodeStats(
        episodes=n, temperature=temperature,
        success=sum(t.success for t in trajectories) / n,
        reward=sum(t.reward for t in trajectories) / n,
        turns=turns / n, gen_tokens=tokens / n, tokens_sampled=tokens,
        tool_calls=calls / n, tool_calls_per_turn=calls / max(turns, 1),
        tool_errors=sum(t.tool_errors for t in trajectories) / n,
        tool_exec_error_rate=sum(t.tool_errors for t in trajectories) / max(calls, 1),
        parse_errors=sum(t.parse_errors for t in trajectories) / n,
        tool_parse_error_rate=sum(t.parse_errors for t in trajectories) / max(turns, 1),
        turn_length_cut_rate=sum(t.length_truncated_turns for t in trajectories) / max(turns, 1),
        terminations=dict(sorted(Counter(t.termination for t in trajectories).items())),
        distinct_1=distinct_n(texts, 1), distinct_2=distinct_n(texts, 2),
        reward_model=reward_agreement(trajectories),
    )


def reward_agreement(trajectories: Sequence[Trajectory]) -> RewardAgreement | None:
    """The ``RewardAgreement`` of the trajectories that carry a verifier reward, or None."""
    both = [t for t in trajectories if t.verifier_reward is not None]
    if not both:
        return None
    proxy, verifier = [t.reward for t in both], [t.verifier_reward for t in both]
    return RewardAgreement(episodes=len(both), proxy_reward=sum(proxy) / len(both),
                           verifier_reward=sum(verifier) / len(both),
                           proxy_verifier_gap=sum(p - v for p, v in zip(proxy, verifier)) / len(both),
                           pairwise_agreement=pairwise_agreement(proxy, verifier), pearson=pearson(proxy, verifier))


def pass_at_ks(correct: Sequence[int], samples: int, ks: Sequence[int]) -> dict[int, float]:
    """``{k: pass@k}`` of a task set with ``correct[i]`` of ``samples`` samples of task ``i``
    correct (``eval_metrics.mean_pass_at_k``)."""
    return {k: mean_pass_at_k(correct, samples, k) for k in sorted(set(ks))}


@dataclass(frozen=True)
class EvalReport:
    """One ``turnrl eval``: what was evaluated, on which tasks, and its figures.

    ``greedy`` holds one argmax episode per task (None with ``--no-greedy``); ``sampled``
    holds ``samples`` episodes per task at ``sampled.temperature`` (None with ``--samples
    0``), and ``pass_at_k`` is computed from them: ``pass_at_k[1] == sampled.success``.
    """

    model: str  # the checkpoint or model folder evaluated
    backend: str  # agent.backend that sampled: transformers, vllm or http
    env: str  # the env (its id, class path or URL)
    split: str  # the task split: "test", the held-out tasks training evaluates on
    tasks: int  # tasks evaluated (seeds turnrl.train.evaluation.heldout_tasks)
    samples: int  # sampled episodes per task
    max_new_tokens: int  # the cap on one turn's sampled tokens
    greedy: EpisodeStats | None
    sampled: EpisodeStats | None
    pass_at_k: dict[int, float] = field(default_factory=dict)  # k -> pass@k over the tasks (unbiased estimator)
    wall_time_s: float = 0.0  # seconds from the first episode to the last

    def to_json(self) -> str:
        """The report as indented JSON (``pass_at_k``'s keys become strings)."""
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_dict(cls, data: dict) -> EvalReport:
        """The report ``json.loads(report.to_json())`` holds (``eval.json``)."""

        def stats(value: dict | None) -> EpisodeStats | None:
            if value is None:
                return None
            agreement = value.get("reward_model")
            return EpisodeStats(**{**value, "reward_model": RewardAgreement(**agreement) if agreement else None})

        return cls(**{**data, "greedy": stats(data["greedy"]), "sampled": stats(data["sampled"]),
                      "pass_at_k": {int(k): v for k, v in data.get("pass_at_k", {}).items()}})

    def to_markdown(self) -> str:
        """A Markdown heading line and table: one row per figure, a column per episode set."""
        sets = [(name, stats) for name, stats in (("greedy", self.greedy), ("sampled", self.sampled)) if stats]
        head = ["greedy" if s.temperature is None else f"sampled (T={s.temperature:g}, {self.samples} per task)"
                for _, s in sets]
        rows: list[tuple[str, list[str]]] = [
            ("success", [_f(s.success) for _, s in sets]),
            *[(f"pass@{k}", ["" if s.temperature is None else _f(v) for _, s in sets])
              for k, v in self.pass_at_k.items()],
            ("mean reward", [_f(s.reward) for _, s in sets]),
            ("mean turns", [_f(s.turns, 2) for _, s in sets]),
            ("tool calls / episode", [_f(s.tool_calls, 2) for _, s in sets]),
            ("tool calls / turn", [_f(s.tool_calls_per_turn) for _, s in sets]),
            ("tool errors / call", [_f(s.tool_exec_error_rate) for _, s in sets]),
            ("tool errors / episode", [_f(s.tool_errors) for _, s in sets]),
            ("parse errors / turn", [_f(s.tool_parse_error_rate) for _, s in sets]),
            ("parse errors / episode", [_f(s.parse_errors) for _, s in sets]),
            ("turns cut at max_new_tokens", [_f(s.turn_length_cut_rate) for _, s in sets]),
            ("terminations", [", ".join(f"{k} {v}" for k, v in s.terminations.items()) for _, s in sets]),
            ("distinct-1 (words)", [_f(s.distinct_1) for _, s in sets]),
            ("distinct-2 (words)", [_f(s.distinct_2) for _, s in sets]),
            ("tokens sampled", [str(s.tokens_sampled) for _, s in sets]),
        ]
        if any(s.reward_model for _, s in sets):
            rm = [s.reward_model for _, s in sets]
            rows += [("reward model: pairwise agreement", [_f(r and r.pairwise_agreement) for r in rm]),
                     ("reward model: pearson", [_f(r and r.pearson) for r in rm]),
                     ("reward model: proxy - verifier", [_f(r and r.proxy_verifier_gap) for r in rm])]
        lines = [f"turnrl eval of {self.model} (backend {self.backend}) on {self.env}: {self.tasks} {self.split} "
                 f"tasks, max_new_tokens {self.max_new_tokens}, {self.wall_time_s:.1f} s",
                 "", "| metric | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
        lines += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in rows]
        return "\n".join(lines)


def _f(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"
