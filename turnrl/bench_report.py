"""What a credit-method benchmark shows: a table (markdown), a plot of held-out success per
method, and one HTML page holding both plus every run."""

from __future__ import annotations

import base64
import html
import statistics
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class RunRecord:
    """One training run of the benchmark grid."""

    algorithm: str
    seed: int
    before: float
    after: float
    evals: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out success)
    wall_s: float = 0.0
    run_dir: str = ""

    @property
    def auc(self) -> float:
        """Mean held-out success over the run's evaluations (area under the curve / steps)."""
        return statistics.fmean(s for _, s in self.evals) if self.evals else 0.0


def _mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.fmean(values):.2f} ± {statistics.stdev(values):.2f}"


def summary_rows(records: list[RunRecord]) -> list[dict]:
    """Per algorithm (in first-seen order): seeds, before, after (mean ± std), AUC, wall time."""
    order = list(dict.fromkeys(r.algorithm for r in records))
    rows = []
    for algorithm in order:
        runs = [r for r in records if r.algorithm == algorithm]
        rows.append({"algorithm": algorithm, "seeds": len(runs),
                     "before": _mean_std([r.before for r in runs]), "after": _mean_std([r.after for r in runs]),
                     "auc": _mean_std([r.auc for r in runs]),
                     "wall": f"{statistics.fmean(r.wall_s for r in runs):.0f} s"})
    return rows


def markdown_table(records: list[RunRecord]) -> str:
    """The summary as a markdown table (held-out success: before, after = mean of the last 3
    evaluations, AUC = mean over all evaluations)."""
    lines = ["| algorithm | seeds | held-out before | held-out after | AUC | wall time / run |",
             "|---|---|---|---|---|---|"]
    for row in summary_rows(records):
        lines.append(f"| {row['algorithm']} | {row['seeds']} | {row['before']} | {row['after']} | {row['auc']} "
                     f"| {row['wall']} |")
    return "\n".join(lines)


def plot(records: list[RunRecord], path: str | Path) -> None:
    """Mean held-out success vs RL step per algorithm, the band spanning its seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for algorithm in dict.fromkeys(r.algorithm for r in records):
        runs = [r for r in records if r.algorithm == algorithm]
        steps = [s for s, _ in runs[0].evals]
        curves = [[v for _, v in r.evals] for r in runs if [s for s, _ in r.evals] == steps]
        mean = [statistics.fmean(col) for col in zip(*curves)]
        line, = ax.plot(steps, mean, "o-", label=f"{algorithm} ({len(curves)} seeds)")
        if len(curves) > 1:
            ax.fill_between(steps, [min(c) for c in zip(*curves)], [max(c) for c in zip(*curves)],
                            color=line.get_color(), alpha=0.15)
    ax.set_xlabel("RL step")
    ax.set_ylabel("held-out success (greedy)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def html_report(records: list[RunRecord], title: str, plot_path: str | Path, path: str | Path) -> None:
    """One self-contained HTML page: the summary, the plot (embedded) and every run."""
    image = base64.b64encode(Path(plot_path).read_bytes()).decode()
    head = ["algorithm", "seeds", "held-out before", "held-out after", "AUC", "wall time / run"]
    summary = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row.values()) + "</tr>"
                      for row in summary_rows(records))
    runs = "".join(f"<tr><td>{html.escape(r.algorithm)}</td><td>{r.seed}</td><td>{r.before:.2f}</td>"
                   f"<td>{r.after:.2f}</td><td>{r.auc:.2f}</td><td>{r.wall_s:.0f} s</td>"
                   f"<td>{html.escape(r.run_dir)}</td></tr>" for r in records)
    Path(path).write_text(f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:.3em .6em;text-align:right}}</style></head><body>
<h1>{html.escape(title)}</h1>
<p>Held-out success is greedy decoding on the env's test split; "after" is the mean of the last
3 evaluations, AUC the mean over all evaluations.</p>
<table><tr>{"".join(f"<th>{h}</th>" for h in head)}</tr>{summary}</table>
<p><img alt="held-out success per algorithm" src="data:image/png;base64,{image}"></p>
<h2>Runs</h2><table><tr><th>algorithm</th><th>seed</th><th>before</th><th>after</th><th>AUC</th>
<th>wall</th><th>run dir</th></tr>{runs}</table></body></html>
""")
