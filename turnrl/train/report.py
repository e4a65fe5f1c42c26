"""What a run shows a person: the before/after table and the reward/success curve."""

from __future__ import annotations

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


def plot_curves(train: list[dict], evals: list[tuple[int, dict]], path: str | Path) -> None:
    """Training reward/success per step and held-out success at each evaluation, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    steps = [m["step"] for m in train]
    ax.plot(steps, [m["reward"] for m in train], alpha=0.35, label="train reward (sampled)")
    ax.plot(steps, _smooth([m["success"] for m in train]), label="train success (smoothed)")
    ax.plot([s for s, _ in evals], [e["success"] for _, e in evals], "o-", label="held-out success (greedy)")
    ax.set_xlabel("RL step")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _smooth(values: list[float], window: int = 10) -> list[float]:
    out, acc = [], []
    for v in values:
        acc = (acc + [v])[-window:]
        out.append(sum(acc) / len(acc))
    return out
