"""Per-step statistics of a batch of trajectories (what a run's logs show)."""

from __future__ import annotations

from turnrl.rollout.termination import INFRA_TERMINATIONS, is_infra_failure
from turnrl.rollout.trajectory import Trajectory


def unique_ngram_rate(sequences: list[list[int]], n: int = 3) -> float:
    """Distinct n-grams over all n-grams of the batch's sampled text (1.0 = no repeats).

    A falling value is the usual sign of collapsing exploration: the group's samples
    become copies of each other.
    """
    grams = [tuple(seq[i:i + n]) for seq in sequences for i in range(len(seq) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def group_figures(trajectories: list[Trajectory]) -> tuple[float, float]:
    """``(zero_signal_groups, distinct_answers)`` over the groups of two or more samples (a task's
    samples, by ``group_id``; infrastructure failures left out): the share of groups whose samples
    all got the same reward (a group-relative advantage is 0 on every one of them: no learning
    signal), and the mean over groups of distinct final answers (the last assistant message,
    stripped) per sample (1.0: every sample answered differently; 1/G: all the same). ``(0.0,
    1.0)`` when no group has two samples (greedy evaluations)."""
    groups: dict[int, list[Trajectory]] = {}
    for t in trajectories:
        if not is_infra_failure(t.termination):
            groups.setdefault(t.group_id, []).append(t)
    groups = {g: members for g, members in groups.items() if len(members) > 1}
    if not groups:
        return 0.0, 1.0
    flat = sum(len({t.reward for t in members}) == 1 for members in groups.values()) / len(groups)
    distinct = sum(len({_final_answer(t) for t in members}) / len(members) for members in groups.values())
    return flat, distinct / len(groups)


def _final_answer(t: Trajectory) -> str:
    return next((m.get("content", "") for m in reversed(t.messages) if m.get("role") == "assistant"), "").strip()


def rollout_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """``episodes`` (the count) and means over the batch: reward, success, turns, tokens, tool and
    truncation rates, ``empty_action_rate`` (turns that gave the env nothing, e.g. a thought never
    closed), ``segments`` per episode (more than 1 where the chat template rewrote
    history); ``infra_failure_rate``, the fraction of episodes the infrastructure ended
    (``turnrl.rollout.termination.INFRA_TERMINATIONS``), and the fraction of each such ending
    (``env_error_rate``, ``step_timeout_rate``, ``tool_error_rate``), counted after any refill,
    and ``refill_rate``, the fraction sampled again after such an ending
    (``trainer.infra_failures="refill"``); with a learned reward model
    also ``verifier_reward`` and ``proxy_verifier_gap`` (proxy - verifier); for a mixture env
    ``success@<env>``, ``reward@<env>`` and ``episodes@<env>`` per sub-env. Diversity:
    ``unique_ngram_rate`` (``unique_ngram_rate``), ``distinct_answers`` and the share of groups with
    no learning signal, ``zero_signal_groups`` (``group_figures``).

    ``reward`` and ``success`` (and their per-env forms) measure the policy: they are means over
    the episodes the model ended, leaving out those the infrastructure ended (an env server that
    died says nothing about the agent); over all episodes when the infrastructure ended every
    one (then they are those episodes' zeros, and ``infra_failure_rate`` is 1)."""
    n = max(len(trajectories), 1)
    scored = [t for t in trajectories if not is_infra_failure(t.termination)] or trajectories
    m = max(len(scored), 1)
    turns = sum(t.num_turns for t in trajectories)
    calls = sum(t.tool_calls for t in trajectories)
    sampled = [
        [tok for tok, m in zip(t.token_ids, t.loss_mask) if m] for t in trajectories
    ]
    out = {
        "episodes": float(len(trajectories)),
        "reward": sum(t.reward for t in scored) / m,
        "success": sum(t.success for t in scored) / m,
        "turns": turns / n,
        "gen_tokens": sum(t.num_generated_tokens for t in trajectories) / n,
        "tool_calls": calls / n,
        "tool_parse_error_rate": sum(t.parse_errors for t in trajectories) / max(turns, 1),
        "tool_exec_error_rate": sum(t.tool_errors for t in trajectories) / max(calls, 1),
        "truncation_rate": sum(t.termination == "truncated" for t in trajectories) / n,
        "turn_length_cut_rate": sum(t.length_truncated_turns for t in trajectories) / max(turns, 1),
        "empty_action_rate": sum(t.empty_actions for t in trajectories) / max(turns, 1),
        "infra_failure_rate": sum(is_infra_failure(t.termination) for t in trajectories) / n,
        **{f"{reason}_rate": sum(t.termination == reason for t in trajectories) / n
           for reason in sorted(INFRA_TERMINATIONS)},
        "refill_rate": sum(t.attempts > 1 for t in trajectories) / n,
        "context_limit_rate": sum(t.termination == "context_length" for t in trajectories) / n,
        "length_limit_rate": sum(t.termination in ("observation_length", "episode_length") for t in trajectories) / n,
        "segments": sum(t.num_segments for t in trajectories) / n,
        "unique_ngram_rate": unique_ngram_rate(sampled),
    }
    out["zero_signal_groups"], out["distinct_answers"] = group_figures(trajectories)
    verified = [t for t in trajectories if t.verifier_reward is not None]
    if verified:  # a learned reward model gave the rewards: watch it against the verifier
        out["verifier_reward"] = sum(t.verifier_reward for t in verified) / len(verified)
        out["proxy_verifier_gap"] = sum(t.reward - t.verifier_reward for t in verified) / len(verified)
    by_env: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        if t.env_id is not None:
            by_env.setdefault(t.env_id, []).append(t)
    for env_id, group in sorted(by_env.items()):  # a mixture: each sub-env's own figures
        kept = [t for t in group if not is_infra_failure(t.termination)] or group
        out[f"success@{env_id}"] = sum(t.success for t in kept) / len(kept)
        out[f"reward@{env_id}"] = sum(t.reward for t in kept) / len(kept)
        out[f"episodes@{env_id}"] = float(len(group))
    return out
