"""What a run shows a person: the before/after table and the reward/success curve."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

ROWS = (("success", "held-out success"), ("reward", "mean reward"), ("turns", "turns / episode"),
        ("gen_tokens", "generated tokens / episode"), ("tool_parse_error_rate", "tool parse error rate"),
        ("tool_exec_error_rate", "tool exec error rate"), ("truncation_rate", "truncation rate"))


def after_value(evals: list[dict], key: str, last: int = 3) -> float:
    """Mean of ``key`` over the last ``last`` evaluations after the first (the run's "after"
    figure; the first evaluation, before any RL step, is the "before" and never part of it),
    or the first's value when it is the only one."""
    tail = [e[key] for e in evals[1:][-last:]] or [evals[0][key]]
    return sum(tail) / len(tail)


def before_after_table(evals: list[dict], last: int = 3) -> str:
    """A plain-text table of held-out metrics: the first evaluation vs the mean of the last
    ``last``; it ends with the line ``held-out success: before X after Y``."""
    before = evals[0]
    lines = [f"{'metric':<28}{'before':>10}{'after':>10}", "-" * 48]
    for key, label in ROWS:
        lines.append(f"{label:<28}{before[key]:>10.3f}{after_value(evals, key, last):>10.3f}")
    lines.append(f"held-out success: before {before['success']:.2f} after {after_value(evals, 'success', last):.2f}")
    return "\n".join(lines)


PANELS = (
    ("outcome", ()),  # reward, success, held-out success (drawn by plot_curves itself)
    ("policy", ("entropy", "kl", "mismatch_kl")),
    ("diversity and signal", ("unique_ngram_rate", "distinct_answers", "zero_signal_groups")),
    ("failures (rates)", ("turn_length_cut_rate", "tool_parse_error_rate", "infra_failure_rate", "context_limit_rate",
                          "empty_action_rate")),
)
"""The panels of ``curves.png`` after the first: each plots the metrics it names that the run
logged with a value other than 0 at some step (a signal that never moved is left out)."""


def plot_curves(train: list[dict], evals: list[tuple[int, dict]], path: str | Path,
                warnings: Sequence[tuple[int, str]] = ()) -> None:
    """The run's signals together, as a PNG: the outcome (training reward and success per step,
    held-out success at each evaluation), the policy (entropy, KL to the reference, sampler/learner
    KL), diversity and learning signal, and failure rates; each warning of the collapse watch
    (``(step, key)``) a dashed line across every panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    steps = [m["step"] for m in train]
    ax = axes[0][0]
    ax.plot(steps, [m["reward"] for m in train], alpha=0.35, label="train reward (sampled)")
    ax.plot(steps, _smooth([m["success"] for m in train]), label="train success (smoothed)")
    ax.plot([s for s, _ in evals], [e["success"] for _, e in evals], "o-", label="held-out success (greedy)")
    ax.set_ylim(-0.02, 1.02)
    for ax, (title, keys) in zip(axes.flat, PANELS):
        for key in keys:
            values = [float(m.get(key, float("nan"))) for m in train]
            if any(v == v and v != 0 for v in values):
                ax.plot(steps, values, label=key)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        for step, key in warnings:
            ax.axvline(step, color="tab:red", linestyle="--", alpha=0.6)
            if title == "outcome":
                ax.text(step, 0.0, f" {key}", color="tab:red", fontsize=7, rotation=90, va="bottom")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=7)
    for ax in axes[1]:
        ax.set_xlabel("RL step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _smooth(values: list[float], window: int = 10) -> list[float]:
    out, acc = [], []
    for v in values:
        acc = (acc + [v])[-window:]
        out.append(sum(acc) / len(acc))
    return out
