"""What a credit-method benchmark shows: a table (markdown), a plot of held-out success per
method, and one HTML page holding both plus every run.

Two readers use it: ``turnrl.bench.grid`` (one env, an algorithm grid: mean ± std over seeds per
algorithm) and ``turnrl.bench.suite`` (envs x methods: the intervals and paired differences of
``turnrl.bench.stats``, a CSV of every run, one plot panel per env).
"""

from __future__ import annotations

import base64
import csv
import html
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from turnrl.bench.stats import Interval, MethodSummary, RunRecord, samples_to_threshold


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


GRID_HEAD = ["algorithm", "seeds", "held-out before", "held-out after", "AUC", "wall time / run"]


def markdown(head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table of ``rows`` (each as many cells as ``head``)."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def html_table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """An HTML table of ``rows``, every cell escaped."""
    cells = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{''.join(f'<th>{html.escape(h)}</th>' for h in head)}</tr>{cells}</table>"


def markdown_table(records: list[RunRecord]) -> str:
    """The summary as a markdown table (held-out success: before, after = mean of the last 3
    evaluations, AUC = mean over all evaluations)."""
    return markdown(GRID_HEAD, [list(row.values()) for row in summary_rows(records)])


# ------------------------------------------------------------------------- the plot
Band = Callable[[list[list[float]]], "tuple[list[float], list[float]] | None"]


def seed_range(curves: list[list[float]]) -> tuple[list[float], list[float]] | None:
    """The band spanning the seeds: lowest and highest curve at each evaluation."""
    return ([min(c) for c in zip(*curves)], [max(c) for c in zip(*curves)]) if len(curves) > 1 else None


def plot_panels(panels: Mapping[str, Sequence[RunRecord]], path: str | Path, x: str = "step",
                band: Band = seed_range, caption: str = "band: the range over seeds") -> None:
    """One panel per key of ``panels`` (its title): mean held-out success per label (method or
    algorithm, first-seen order) with ``band`` around it, against RL steps (``x="step"``) or
    sampled episodes (``x="episodes"``: step * ``episodes_per_step``).

    A label's runs are averaged over those evaluated at the same steps as its first run (the
    legend says how many seeds); ``caption`` (what the band is) goes under the panels.

    Raises:
        ValueError: On an ``x`` other than "step" or "episodes".
    """
    if x not in ("step", "episodes"):
        raise ValueError(f"x must be 'step' or 'episodes', got {x!r}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(9 * len(panels), 4.4), squeeze=False)
    for ax, (title, records) in zip(axes[0], panels.items()):
        for label in dict.fromkeys(r.algorithm for r in records):
            runs = [r for r in records if r.algorithm == label]
            steps = [s for s, _ in runs[0].evals]
            curves = [[v for _, v in r.evals] for r in runs if [s for s, _ in r.evals] == steps]
            xs = steps if x == "step" else [s * runs[0].episodes_per_step for s in steps]
            line, = ax.plot(xs, [statistics.fmean(col) for col in zip(*curves)], "o-",
                            label=f"{label} ({len(curves)} seed{'s' if len(curves) > 1 else ''})")
            lows_highs = band(curves)
            if lows_highs is not None:
                ax.fill_between(xs, *lows_highs, color=line.get_color(), alpha=0.15)
        ax.set_title(title)
        ax.set_xlabel("RL step" if x == "step" else "sampled episodes")
        ax.set_ylabel("held-out success (greedy)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")  # beside the curves, never on them
    fig.text(0.5, 0.01, f"line: mean over seeds; {caption}", ha="center", fontsize="small")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(records: list[RunRecord], path: str | Path) -> None:
    """Mean held-out success vs RL step per algorithm, the band spanning its seeds."""
    plot_panels({"": records}, path)


# ------------------------------------------------------------------------- the HTML page
def html_page(title: str, above: str, below: str, plot_path: str | Path, path: str | Path,
              alt: str = "held-out success per method") -> None:
    """Write one self-contained HTML page: ``title``, the HTML fragment ``above`` (already
    escaped), the plot embedded, then ``below``."""
    image = base64.b64encode(Path(plot_path).read_bytes()).decode()
    Path(path).write_text(f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:72em;margin:2em auto}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:.3em .6em;text-align:right}}</style></head><body>
<h1>{html.escape(title)}</h1>
{above}
<p><img alt="{html.escape(alt)}" src="data:image/png;base64,{image}" style="max-width:100%"></p>
{below}</body></html>
""")


def html_report(records: list[RunRecord], title: str, plot_path: str | Path, path: str | Path) -> None:
    """One self-contained HTML page: the summary, the plot (embedded) and every run."""
    intro = ("<p>Held-out success is greedy decoding on the env's test split; \"after\" is the mean of the last\n"
             "3 evaluations, AUC the mean over all evaluations.</p>")
    summary = html_table(GRID_HEAD, [list(row.values()) for row in summary_rows(records)])
    runs = html_table(["algorithm", "seed", "before", "after", "AUC", "wall", "run dir"],
                      [[r.algorithm, r.seed, f"{r.before:.2f}", f"{r.after:.2f}", f"{r.auc:.2f}", f"{r.wall_s:.0f} s",
                        r.run_dir] for r in records])
    html_page(title, intro + summary, "<h2>Runs</h2>" + runs, plot_path, path)


# ------------------------------------------------------------------------- the suite's tables
SUITE_HEAD = ["method", "seeds", "final success [95% CI]", "diff vs {baseline} [95% CI] [corrected]",
              "seeds ahead / behind",
              "p: sign / exact paired / Holm", "detectable diff (80% power)",
              "episodes to {threshold:g} (seeds reached)", "AUC [95% CI]", "tokens / run", "wall time / run"]


def _count(value: float) -> str:
    """1234567 -> '1.23M', 12345 -> '12.3k', 123 -> '123'."""
    for size, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.0f}"


def suite_rows(summaries: Sequence[MethodSummary]) -> dict[str, list[list[str]]]:
    """Per env (first-seen order) the rows of its table, one per method, cells as ``SUITE_HEAD``
    says; the baseline's difference cell is "baseline"."""
    tables: dict[str, list[list[str]]] = {}
    for m in summaries:
        samples = "not reached" if m.samples_median is None else _count(m.samples_median)
        tables.setdefault(m.env, []).append([
            m.method, str(len(m.seeds)), m.final.format(),
            "baseline" if m.diff is None else m.diff.format(signed=True) + _corrected(m.diff_adjusted),
            "" if m.diff is None else f"{m.ahead} / {m.behind}",
            "" if m.p_exact is None else f"{m.p_sign:.3g} / {m.p_exact:.3g} / {m.p_holm:.3g}",
            format_detectable(m.detectable),
            f"{samples} ({m.reached}/{len(m.seeds)})", m.auc.format(), _count(m.tokens), f"{m.wall_s:.0f} s"])
    return tables


def _corrected(interval: Interval | None) -> str:
    """The Bonferroni-corrected interval of a difference, after its 95% one: " [-0.01, +0.17]"."""
    if interval is None or math.isnan(interval.low):
        return ""
    return f" [{interval.low:+.2f}, {interval.high:+.2f}]"


def format_detectable(value: float | None) -> str:
    """A detectable difference (``stats.detectable_effect`` x spread) as a table shows it: empty
    for the baseline, "none (too few seeds)" where no p-value can reach the level."""
    if value is None:
        return ""
    return "none (too few seeds)" if math.isinf(value) else f"±{value:.2f}"


def suite_head(baseline: str, threshold: float) -> list[str]:
    """``SUITE_HEAD`` with the baseline's name and the env's threshold filled in."""
    return [h.format(baseline=baseline, threshold=threshold) for h in SUITE_HEAD]


def suite_table(summaries: Sequence[MethodSummary], baseline: str) -> str:
    """The suite's markdown: one ``## env`` section and table per env."""
    thresholds = {m.env: m.threshold for m in summaries}
    return "\n\n".join(f"## {env}\n\n{markdown(suite_head(baseline, thresholds[env]), rows)}"
                       for env, rows in suite_rows(summaries).items())


RUN_COLUMNS = ["env", "method", "seed", "before", "final", "final_minus_baseline", "auc", "threshold",
               "episodes_to_threshold", "episodes_per_step", "sampled_episodes", "sampled_tokens", "wall_s", "run_dir"]


def run_rows(records: Sequence[RunRecord], baseline: str, thresholds: Mapping[str, float]) -> list[dict]:
    """Every run's figures, keys as ``RUN_COLUMNS``: ``final`` is held-out success after RL
    (mean of the last 3 evaluations), ``final_minus_baseline`` its difference to the baseline's
    run of the same env and seed (None for the baseline, or without that run),
    ``episodes_to_threshold`` None when never reached."""
    base = {(r.env, r.seed): r.after for r in records if r.algorithm == baseline}
    rows = []
    for r in records:
        paired = r.algorithm != baseline and (r.env, r.seed) in base
        rows.append({"env": r.env, "method": r.algorithm, "seed": r.seed, "before": r.before, "final": r.after,
                     "final_minus_baseline": r.after - base[(r.env, r.seed)] if paired else None, "auc": r.auc,
                     "threshold": thresholds[r.env],
                     "episodes_to_threshold": samples_to_threshold(r.evals, thresholds[r.env], r.episodes_per_step),
                     "episodes_per_step": r.episodes_per_step, "sampled_episodes": r.sampled_episodes,
                     "sampled_tokens": r.sampled_tokens, "wall_s": round(r.wall_s, 1), "run_dir": r.run_dir})
    return rows


EVAL_COLUMNS = ["env", "method", "seed", "step", "sampled_episodes", "success"]


def eval_rows(records: Sequence[RunRecord]) -> list[dict]:
    """One row per (env, method, seed, evaluation), keys as ``EVAL_COLUMNS``: the RL step, the
    episodes sampled by then (step x episodes per step) and held-out success there."""
    return [{"env": r.env, "method": r.algorithm, "seed": r.seed, "step": step,
             "sampled_episodes": step * r.episodes_per_step, "success": success}
            for r in records for step, success in r.evals]


def records_from_csv(runs_csv: str | Path, evals_csv: str | Path) -> list[RunRecord]:
    """The runs of a suite rebuilt from its two CSVs (``results.csv``: one row per run,
    ``RUN_COLUMNS``; ``evals.csv``: one row per evaluation, ``EVAL_COLUMNS``), so tables come
    from the committed per-seed results.

    Raises:
        ValueError: When a run has no evaluations in ``evals_csv``, or its final success is not
            the mean of its last 3 evaluations there (the two files are not of one suite run).
    """
    def read(path):
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))

    evals: dict[tuple[str, str, int], list[tuple[int, float]]] = {}
    for row in read(evals_csv):
        evals.setdefault((row["env"], row["method"], int(row["seed"])), []).append((int(row["step"]),
                                                                                    float(row["success"])))
    records = []
    for row in read(runs_csv):
        key = (row["env"], row["method"], int(row["seed"]))
        if key not in evals:
            raise ValueError(f"{evals_csv} has no evaluations of {key} from {runs_csv}")
        run = RunRecord(row["method"], key[2], float(row["before"]), float(row["final"]), sorted(evals[key]),
                        float(row["wall_s"]), row["run_dir"], key[0], int(row["episodes_per_step"]),
                        int(row["sampled_episodes"]), int(row["sampled_tokens"]))
        last = [v for _, v in run.evals[-3:]]
        if abs(statistics.fmean(last) - run.after) > 1e-9:
            raise ValueError(f"{key}: final {run.after} in {runs_csv} is not the mean of its last 3 evaluations "
                             f"in {evals_csv} ({last})")
        records.append(run)
    return records


def write_csv(rows: Sequence[Mapping[str, object]], columns: Sequence[str], path: str | Path) -> None:
    """``rows`` as CSV with a header line; None is written as an empty cell."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns))
        writer.writeheader()
        writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)


def summary_csv_rows(summaries: Sequence[MethodSummary]) -> list[dict]:
    """One row per (env, method): the ``MethodSummary`` as flat numbers (NaN bounds: one seed)."""
    def bounds(name: str, i) -> dict:
        if i is None:
            return {f"{name}_mean": None, f"{name}_low": None, f"{name}_high": None}
        return {f"{name}_mean": i.mean, f"{name}_low": i.low, f"{name}_high": i.high}

    return [{"env": m.env, "method": m.method, "seeds": len(m.seeds), **bounds("final", m.final),
             **bounds("diff", m.diff), **bounds("diff_corrected", m.diff_adjusted), "seeds_ahead": m.ahead, "seeds_behind": m.behind,
             "p_sign": m.p_sign, "p_exact": m.p_exact, "p_holm": m.p_holm, "detectable_diff": m.detectable,
             **bounds("auc", m.auc),
             "threshold": m.threshold,
             "episodes_to_threshold_median": m.samples_median, "seeds_reached": m.reached,
             "sampled_tokens_mean": m.tokens, "wall_s_mean": round(m.wall_s, 1)} for m in summaries]


def suite_html(summaries: Sequence[MethodSummary], records: Sequence[RunRecord], baseline: str,
               thresholds: Mapping[str, float], title: str, caption: str, plot_path: str | Path,
               path: str | Path) -> None:
    """The suite's self-contained page: how to read it, the plot, a table per env, every run."""
    intro = (f"<p>Held-out success is greedy decoding on each env's test split. Final success is the mean of a "
             f"run's last 3 evaluations; AUC the mean over all its evaluations. Every interval is a 95% percentile "
             f"bootstrap interval of the mean over seeds (n/a with one seed); the difference against "
             f"{html.escape(baseline)} pairs runs of the same seed; its second interval [corrected] is at 1 - 0.05/m "
             f"over the env's m comparisons (Bonferroni: all of them hold together with 95%). The seeds ahead / "
             f"behind count those pairs "
             f"whose final success is above / below {html.escape(baseline)}'s. p: the exact sign test, the exact "
             f"paired permutation (sign-flip) test, and the latter Holm-adjusted over the env's comparisons with "
             f"{html.escape(baseline)}. Detectable diff: the smallest mean difference these seeds would detect with "
             f"80% power at 0.05 after that correction, given the measured spread of the per-seed differences (a "
             f"power analysis: a method whose interval holds 0 differs by less than this, or the suite could not "
             f"tell). Episodes to the threshold: the median "
             f"over seeds of the episodes sampled until held-out success first reached it (a seed that never did "
             f"counts as infinitely many). Plot: {html.escape(caption)}.</p>")
    tables = "".join(f"<h2>{html.escape(env)}</h2>" + html_table(suite_head(baseline, thresholds[env]), rows)
                     for env, rows in suite_rows(summaries).items())
    runs = run_rows(records, baseline, thresholds)
    cell = lambda v: "" if v is None else f"{v:.3f}" if isinstance(v, float) and not math.isnan(v) else v  # noqa: E731
    every_run = "<h2>Runs</h2>" + html_table(RUN_COLUMNS, [[cell(row[c]) for c in RUN_COLUMNS] for row in runs])
    html_page(title, intro, tables + every_run, plot_path, path)
