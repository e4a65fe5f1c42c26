"""What the credit lab shows: CSV of every figure, markdown tables, one plot, one HTML page.

Tables are per sweep: a row per method, a column per cell, each entry the scale-free mean
squared error per batch (``nmse``: lower is better), marked ``*`` where the test of the
gradient's direction rejects unbiasedness (``p_direction < ALPHA``), plus one table of every
figure for a chosen cell and, for chosen cells, the error against batch size (``batch_table``:
``bias2 + variance / k`` at ``k`` times the batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from turnrl.bench.report import html_page, html_table, markdown, write_csv
from turnrl.bench.credit_lab.lab import fmt
from turnrl.bench.credit_lab.stats import nmse_at

ALPHA = 1e-3
"""Level of the bias tests in the tables: each flags an unbiased method with probability 1e-3."""
COLUMNS = ("sweep", "x", "method", "advantage", "loss_agg", "mdp", "group_size", "staleness", "infra_rate",
           "infra_model", "infra_policy", "failed", "batches", "objective", "success",
           "mean_turns", "cosine", "angle", "scale", "snr", "nmse", "bias2", "variance", "step_cosine", "uphill",
           "p_scale", "p_direction", "p_unbiased", "seconds")
BATCH_MULTIPLES = (1, 4, 16, 64)
"""Multiples of the batch the batch-size tables extrapolate the error to."""
BATCH_CELLS = (("horizon", "key_door H=32"), ("horizon", "corridor H=32"), ("rewards", "0/0.1/1 G=4"))
"""The ``(sweep, x)`` cells whose error against batch size the report shows (those it has)."""
PLOTTED = ("grpo", "rloo", "turn_returns", "gigpo", "mt_grpo", "ppo", "ppo_raw", "gspo", "cispo", "reinforce")


def _ordered(values):
    return list(dict.fromkeys(values))


def read_results(path: str | Path) -> list[dict]:
    """The rows of a ``results.csv`` (numbers as numbers), e.g. to redraw a report."""
    import csv

    text = ("sweep", "x", "method", "advantage", "loss_agg", "mdp", "infra_model", "infra_policy")
    with open(path, newline="", encoding="utf-8") as f:
        return [{k: v if k in text else float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def sweep_table(rows: Sequence[dict], sweep: str) -> tuple[list[str], list[list[str]]]:
    """``(head, rows)`` of one sweep's table: nmse per method and cell, ``*`` = biased direction."""
    mine = [r for r in rows if r["sweep"] == sweep]
    xs = _ordered(r["x"] for r in mine)
    head = ["method", *xs]
    out = []
    for method in _ordered(r["method"] for r in mine):
        cells = {r["x"]: r for r in mine if r["method"] == method}
        out.append([method, *(fmt(cells[x]["nmse"]) + ("*" if cells[x]["p_direction"] < ALPHA else "")
                              if x in cells else "" for x in xs)])
    return head, out


def cell_table(rows: Sequence[dict], sweep: str, x: str) -> tuple[list[str], list[list[str]]]:
    """``(head, rows)``: every figure of every method in one cell."""
    keys = ("cosine", "angle", "scale", "snr", "nmse", "bias2", "variance", "step_cosine", "uphill", "p_scale",
            "p_direction")
    head = ["method", *(k.replace("_", " ") for k in keys)]
    return head, [[r["method"], *(fmt(r[k]) for k in keys)] for r in rows if r["sweep"] == sweep and r["x"] == x]


def batch_table(rows: Sequence[dict], sweep: str, x: str,
                multiples: Sequence[int] = BATCH_MULTIPLES) -> tuple[list[str], list[list[str]]]:
    """``(head, rows)``: each method's bias (angle, scale, ``bias2``), variance and error at
    ``multiples`` of the batch in one cell, the error extrapolated as ``bias2 + variance / k``
    from the measured bias and variance (``stats.nmse_at``)."""
    head = ["method", "angle", "scale", "bias2", "variance", *(f"nmse {k}x" for k in multiples)]
    return head, [[r["method"], f"{r['angle']:.1f}", fmt(r["scale"]), fmt(r["bias2"]), fmt(r["variance"]),
                   *(fmt(nmse_at(r, k)) for k in multiples)]
                  for r in rows if r["sweep"] == sweep and r["x"] == x]


def plot(rows: Sequence[dict], path: str | Path) -> None:
    """One panel per (sweep, MDP family): nmse per cell, a line per plotted method, an ``x``
    marker where the direction test rejects unbiasedness."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = _ordered((r["sweep"], r["x"].split(" ")[0] if r["sweep"] in ("horizon", "group", "sparsity", "infra") else "")
                      for r in rows)
    cols = 3
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.6 * nrows), squeeze=False)
    for ax, (sweep, family) in zip(axes.flat, panels):
        mine = [r for r in rows if r["sweep"] == sweep and r["x"].startswith(family)]
        xs = _ordered(r["x"] for r in mine)
        for method in [m for m in PLOTTED if any(r["method"] == m for r in mine)]:
            ys = {r["x"]: r for r in mine if r["method"] == method}
            line, = ax.plot(range(len(xs)), [ys[x]["nmse"] for x in xs], marker="o", ms=3, label=method)
            biased = [i for i, x in enumerate(xs) if ys[x]["p_direction"] < ALPHA]
            ax.plot(biased, [ys[xs[i]]["nmse"] for i in biased], "x", ms=9, color=line.get_color())
        ax.set_xticks(range(len(xs)), [x[len(family):].strip() or x for x in xs], rotation=20, fontsize=8)
        ax.set_yscale("log")
        ax.set_title(f"{sweep}{': ' + family if family else ''}", fontsize=10)
        ax.set_ylabel("nmse per batch (lower is better)", fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    spare = len(panels) < axes.size
    fig.legend(handles, labels, loc="lower right" if spare else "upper right", ncol=2 if spare else 1,
               fontsize=9 if spare else 7, bbox_to_anchor=(0.95, 0.08) if spare else None)
    fig.suptitle("gradient error per batch vs the exact gradient (x: direction biased, p < 1e-3)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


BATCH_CAPTION = ("nmse at k times the batch, extrapolated from the measured bias and variance: bias2 + variance / k "
                 "(angle in degrees between the mean gradient and the true one)")


def sections(rows: Sequence[dict], highlight: tuple[str, str] | None = None,
             batch_cells: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str, list, list]]:
    """The report's tables as ``(title, caption, head, body)``: every figure of the ``highlight``
    cell ``(sweep, x)`` (default: the first row's), the error against batch size in each of
    ``batch_cells`` present in ``rows``, then one nmse table per sweep."""
    out = []
    if highlight is None and rows:
        highlight = (rows[0]["sweep"], rows[0]["x"])
    if highlight:
        out.append((f"every figure: {highlight[0]}, {highlight[1]}", "", *cell_table(rows, *highlight)))
    present = {(r["sweep"], r["x"]) for r in rows}
    for cell in batch_cells:
        if tuple(cell) in present:
            out.append((f"batch size: {cell[0]}, {cell[1]}", BATCH_CAPTION, *batch_table(rows, *cell)))
    for sweep in _ordered(r["sweep"] for r in rows):
        out.append((sweep, f"nmse per batch (`*`: direction biased, p < {ALPHA:g})", *sweep_table(rows, sweep)))
    return out


def tables_markdown(rows: Sequence[dict], highlight: tuple[str, str] | None = None, level: int = 3,
                    batch_cells: Sequence[tuple[str, str]] = ()) -> str:
    """``sections`` as Markdown, each under a heading of ``level``."""
    return "\n\n".join(f"{'#' * level} {title}\n\n" + (f"{caption}\n\n" if caption else "") + markdown(head, body)
                       for title, caption, head, body in sections(rows, highlight, batch_cells))


def write_report(rows: Sequence[dict], out: str | Path, highlight: tuple[str, str] | None = None,
                 batch_cells: Sequence[tuple[str, str]] = BATCH_CELLS) -> str:
    """Write ``results.csv``, ``tables.md``, ``lab.png`` and ``report.html`` into ``out``;
    returns the markdown. ``highlight``: the ``(sweep, x)`` cell whose every figure is shown;
    ``batch_cells``: those whose error against batch size is shown."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, COLUMNS, out / "results.csv")
    text = tables_markdown(rows, highlight, batch_cells=batch_cells) + "\n"
    (out / "tables.md").write_text(text)
    plot(rows, out / "lab.png")
    html = [f"<h2>{title}</h2>" + html_table(head, body)
            for title, _, head, body in sections(rows, highlight, batch_cells)]
    html_page("turnrl credit lab", "".join(html[:1]), "".join(html[1:]), out / "lab.png", out / "report.html",
              alt="gradient error per method")
    return text
