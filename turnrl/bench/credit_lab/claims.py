"""Sentences about the credit lab written from its record, each naming the cells it reads.

A claim in the README or the docs is not typed by hand: a spec below (``Ratio``, ``Crossover``,
``Growth``, ``Summary``, ``Flagged``) reads the lab's rows (``lab.run_cell``'s, as the record
``docs/results/credit_lab.json`` keeps them) and writes the sentence, with the numbers, the
words that follow from them ("below" or "above", "flags" or not) and the cell: sweep, ``x``,
MDP, group size and batches. ``DOC_CLAIMS`` holds the specs of each generated block of the
pages (``scripts/doc_tables.py`` renders them between ``<!-- record-table NAME -->`` markers
and ``tests/test_docs_records.py`` fails when a page's text and the record differ).

Every spec raises ``KeyError`` naming the cell when the rows lack it, so a claim cannot
outlive the cell it cites.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from turnrl.bench.credit_lab.lab import UNBIASED_AGG, fmt
from turnrl.bench.credit_lab.report import ALPHA
from turnrl.bench.credit_lab.stats import nmse_at


def find(rows: Sequence[dict], sweep: str, x: str, method: str) -> dict:
    """The row of ``method`` in cell ``(sweep, x)``; ``KeyError`` naming the cell if absent."""
    for r in rows:
        if r["sweep"] == sweep and r["x"] == x and r["method"] == method:
            return r
    raise KeyError(f"the credit lab's rows have no {method!r} in cell {sweep!r} / {x!r}")


def cell_name(row: dict) -> str:
    """``[SWEEP sweep, X: MDP, G=N, B batches]``: where a figure comes from."""
    return f"[{row['sweep']} sweep, `{row['x']}`: {row['mdp']}, G={int(row['group_size'])}, {int(row['batches'])} batches]"


def _m(method: str) -> str:
    return f"`{method}`"


def _p(p: float) -> str:
    return f"{p:.2g}"


def _x(ratio: float) -> str:
    """A ratio of errors: ``0.33x``, ``1.04x``, ``27x``."""
    return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.2f}x" if ratio >= 0.1 else f"{ratio:.2g}x"


def direction(row: dict) -> str:
    """How far the row's mean gradient is from the true one, and what the test says."""
    if row["p_direction"] < ALPHA:
        return (f"{_m(row['method'])}'s mean gradient is {row['angle']:.0f} degrees off the true one (cosine "
                f"{row['cosine']:.2f}; direction test p = {_p(row['p_direction'])})")
    return f"no bias in {_m(row['method'])}'s direction is detected (p = {_p(row['p_direction'])})"


@dataclass(frozen=True)
class Ratio:
    """``method``'s error (nmse) against ``versus``' in one cell, and whether each is biased."""

    sweep: str
    x: str
    method: str
    versus: str

    def text(self, rows: Sequence[dict]) -> str:
        a, b = find(rows, self.sweep, self.x, self.method), find(rows, self.sweep, self.x, self.versus)
        biased = [r for r in (a, b) if r["p_direction"] < ALPHA] or [a]
        return (f"{_m(self.method)}'s error is {_x(a['nmse'] / b['nmse'])} {_m(self.versus)}'s (nmse {fmt(a['nmse'])} "
                f"against {fmt(b['nmse'])}); " + "; ".join(direction(r) for r in biased) + f" {cell_name(a)}.")


@dataclass(frozen=True)
class Crossover:
    """Where, as the batch grows, a biased ``method``'s error meets ``versus``' (extrapolated
    from the measured bias and variance: ``stats.nmse_at``)."""

    sweep: str
    x: str
    method: str
    versus: str
    at: int = 16

    def text(self, rows: Sequence[dict]) -> str:
        a, b = find(rows, self.sweep, self.x, self.method), find(rows, self.sweep, self.x, self.versus)
        head = (f"At k times the batch the error is bias2 + variance / k (extrapolated from the measured ones): "
                f"{_m(self.method)} {fmt(a['bias2'])} + {fmt(a['variance'])} / k, {_m(self.versus)} "
                f"{fmt(b['bias2'])} + {fmt(b['variance'])} / k")
        at = f"at {self.at}x: {_m(self.method)} {fmt(nmse_at(a, self.at))}, {_m(self.versus)} {fmt(nmse_at(b, self.at))}"
        gap_bias, gap_var = a["bias2"] - b["bias2"], b["variance"] - a["variance"]
        if gap_bias <= 0 and gap_var >= 0:
            tail = f"{_m(self.method)}'s stays lower at every batch size ({at})"
        elif gap_bias >= 0 and gap_var <= 0:
            tail = f"{_m(self.versus)}'s is lower at every batch size ({at})"
        else:
            k = gap_var / gap_bias
            low, high = (self.versus, self.method) if gap_bias > 0 else (self.method, self.versus)
            tail = (f"{_m(low)}'s falls below {_m(high)}'s from k = {k:.2g} on ({at})" if k > 1 else
                    f"{_m(low)}'s is lower from 1x on ({at})")
        return f"{head}: {tail} {cell_name(a)}."


@dataclass(frozen=True)
class Growth:
    """How ``method``'s error changes from the first to the last of ``xs`` in one sweep."""

    sweep: str
    method: str
    xs: tuple[str, ...]

    def text(self, rows: Sequence[dict]) -> str:
        got = [find(rows, self.sweep, x, self.method) for x in self.xs]
        first, last = got[0], got[-1]
        ratio = last["nmse"] / first["nmse"]
        way = f"grows {_x(ratio)}" if ratio >= 1 else f"falls to {_x(ratio)}"
        path = " -> ".join(fmt(r["nmse"]) for r in got)
        return (f"{_m(self.method)}'s error {way} from `{self.xs[0]}` to `{self.xs[-1]}` ({path}) [{self.sweep} sweep, "
                + ", ".join(f"`{r['x']}`: {r['mdp']}, G={int(r['group_size'])}" for r in (first, last))
                + f", {int(first['batches'])} batches].")


@dataclass(frozen=True)
class Summary:
    """Over a set of cells, each method's scale range and how often each test rejects.

    The cells: those of ``sweeps`` whose ``x`` matches the regular expression ``match``; with
    ``on_policy``, only fresh samples (no staleness), no infrastructure failures and the
    unbiased aggregation (``lab.UNBIASED_AGG``). A setting that several sweeps share (the same
    MDP, group, aggregation, staleness and failures: the same batches) counts once.
    """

    methods: tuple[str, ...]
    sweeps: tuple[str, ...]
    match: str = ""
    on_policy: bool = False

    def cells(self, rows: Sequence[dict]) -> list[dict]:
        out = [r for r in rows if r["sweep"] in self.sweeps and re.search(self.match, r["x"])]
        if self.on_policy:
            out = [r for r in out if not r["staleness"] and not r["infra_rate"] and r["loss_agg"] == UNBIASED_AGG]
        setting = ("mdp", "group_size", "loss_agg", "staleness", "infra_rate", "infra_model", "infra_policy", "method")
        out = list({tuple(r[k] for k in setting): r for r in reversed(out)}.values())[::-1]  # the first of each
        if not out:
            raise KeyError(f"the credit lab's rows have no cell of {self.sweeps} matching {self.match!r}")
        return out

    def text(self, rows: Sequence[dict]) -> str:
        cells = self.cells(rows)
        count = len({(r["sweep"], r["x"]) for r in cells})
        parts = []
        for method in self.methods:
            mine = [r for r in cells if r["method"] == method]
            if not mine:
                raise KeyError(f"the credit lab's rows have no {method!r} in {self.sweeps}")
            if count == 1:
                r = mine[0]
                parts.append(f"{_m(method)} scale {fmt(r['scale'])} (scale test p = {_p(r['p_scale'])}), direction "
                             f"{r['angle']:.0f} degrees off (p = {_p(r['p_direction'])})")
                continue
            low, high = min(mine, key=lambda r: r["scale"]), max(mine, key=lambda r: r["scale"])
            flags = sum(r["p_direction"] < ALPHA for r in mine)
            scale_flags = sum(r["p_scale"] < ALPHA for r in mine)
            parts.append(f"{_m(method)} scale {fmt(low['scale'])} ({low['sweep']} `{low['x']}`) to "
                         f"{fmt(high['scale'])} ({high['sweep']} `{high['x']}`), the scale test rejecting in "
                         f"{scale_flags} and the direction test in {flags} of {len(mine)} cells")
        if count == 1:
            return "; ".join(parts) + f" {cell_name(cells[0])}."
        batches = "/".join(map(str, sorted({int(r["batches"]) for r in cells})))
        where = (f"[{', '.join(self.sweeps)} sweep{'s' if len(self.sweeps) > 1 else ''}"
                 + (f", cells matching `{self.match}`" if self.match else "")
                 + (", on-policy" if self.on_policy else "") + f": {count} cells, {batches} batches]")
        return "; ".join(parts) + f" (at p < {ALPHA:g}, about {count * ALPHA:.2g} false alarms per method are " \
            f"expected by chance) {where}."


@dataclass(frozen=True)
class Flagged:
    """Which methods the direction test flags in one cell."""

    sweep: str
    x: str

    def text(self, rows: Sequence[dict]) -> str:
        mine = [r for r in rows if r["sweep"] == self.sweep and r["x"] == self.x]
        if not mine:
            raise KeyError(f"the credit lab's rows have no cell {self.sweep!r} / {self.x!r}")
        flagged = [r["method"] for r in mine if r["p_direction"] < ALPHA]
        clean = [r["method"] for r in mine if r["p_direction"] >= ALPHA]
        listed = lambda names: ", ".join(map(_m, names)) or "none"  # noqa: E731
        return (f"In `{self.x}` the direction test flags {len(flagged)} of {len(mine)} methods (p < {ALPHA:g}): "
                f"{listed(flagged)}; not flagged: {listed(clean)} {cell_name(mine[0])}.")


Spec = Ratio | Crossover | Growth | Summary | Flagged


def claims_markdown(rows: Sequence[dict], specs: Sequence[Spec]) -> str:
    """The specs' sentences as a Markdown list."""
    return "\n".join(f"- {spec.text(rows)}" for spec in specs)


ON_POLICY = ("horizon", "group", "sparsity", "ragged", "rewards", "aggregation", "staleness", "infra")
UNBIASED = ("rloo", "turn_returns", "reinforce", "turn_loo_padded", "ppo_raw", "turn_gae_raw")

DOC_CLAIMS: dict[str, tuple[Spec, ...]] = {
    "credit_lab_readme": (
        Summary(("rloo", "turn_returns", "ppo_raw"), ON_POLICY, on_policy=True),
        Ratio("horizon", "key_door H=32", "gigpo", "grpo"),
        Ratio("horizon", "corridor H=32", "gigpo", "grpo"),
        Crossover("horizon", "key_door H=32", "gigpo", "grpo"),
        Ratio("horizon", "key_door H=32", "ppo", "grpo"),
        Ratio("rewards", "0/0.1/1 G=4", "grpo", "rloo"),
    ),
    "credit_lab_unbiased": (
        Summary(UNBIASED, ON_POLICY, on_policy=True),
        Summary(("dr_grpo", "grpo"), ON_POLICY, on_policy=True),
    ),
    "credit_lab_caught": (
        Summary(("turn_mean_incl_self",), ON_POLICY, on_policy=True),
        Ratio("horizon", "key_door H=32", "turn_loo_padded", "turn_returns"),
        Ratio("ragged", "stop=0.2", "turn_loo_padded", "turn_returns"),
    ),
    "credit_lab_horizon": (
        Growth("horizon", "grpo", ("corridor H=2", "corridor H=32")),
        Growth("horizon", "grpo", ("key_door H=2", "key_door H=32")),
        Ratio("horizon", "corridor H=32", "turn_returns", "grpo"),
        Ratio("horizon", "key_door H=32", "turn_returns", "grpo"),
        Ratio("horizon", "key_door H=16", "gigpo", "grpo"),
        Ratio("horizon", "key_door H=32", "gigpo", "grpo"),
        Ratio("horizon", "corridor H=32", "gigpo", "grpo"),
        Crossover("horizon", "key_door H=32", "gigpo", "grpo"),
        Crossover("horizon", "key_door H=32", "gigpo", "rloo"),
        Ratio("horizon", "key_door H=32", "ppo", "grpo"),
        Ratio("horizon", "corridor H=32", "ppo", "grpo"),
        Ratio("horizon", "key_door H=32", "ppo_raw", "grpo"),
        Ratio("horizon", "key_door H=32", "turn_gae", "grpo"),
        Ratio("horizon", "key_door H=32", "bilevel_gae", "grpo"),
        Ratio("horizon", "key_door H=32", "turn_ppo", "grpo"),
        Ratio("horizon", "bandit H=32", "reinforce", "grpo"),
        Ratio("horizon", "bandit H=32", "mt_grpo", "grpo"),
        Summary(("mt_grpo",), ("sparsity",), match="shaped"),
    ),
    "credit_lab_rewards": (
        Ratio("rewards", "0/1 G=4", "grpo", "rloo"),
        Ratio("rewards", "0/0.1/1 G=4", "grpo", "rloo"),
        Ratio("rewards", "0/0.1/1 G=8", "grpo", "rloo"),
        Ratio("rewards", "0/0.1/1 G=4", "dr_grpo", "rloo"),
        Crossover("rewards", "0/0.1/1 G=4", "grpo", "rloo"),
        Ratio("rewards", "0/0.1/1 G=4", "gigpo", "grpo"),
    ),
    "credit_lab_group": (
        Growth("group", "grpo", ("corridor G=2", "corridor G=4", "corridor G=8", "corridor G=16")),
        Ratio("group", "corridor G=2", "grpo", "gigpo"),
        Ratio("group", "key_door G=2", "grpo", "gigpo"),
        Ratio("group", "corridor G=2", "grpo", "ppo"),
        Ratio("group", "key_door G=2", "grpo", "ppo"),
    ),
    "credit_lab_aggregation": (
        Flagged("aggregation", "seq-mean-token-mean"),
        Flagged("aggregation", "token-mean"),
        Flagged("aggregation", "seq-mean-token-sum-norm"),
    ),
    "credit_lab_staleness": (
        Flagged("staleness", "stale=0.3"),
        Flagged("staleness", "stale=1"),
    ),
    "credit_lab_infra": (
        Summary(("rloo",), ("infra",), match="^corridor reset=0.1 keep$"),
        Summary(("rloo", "turn_returns", "ppo_raw", "reinforce"), ("infra",), match="step=0.02 keep$"),
        Summary(("rloo", "turn_returns", "ppo_raw", "reinforce"), ("infra",), match="^bandit step=0.02 (drop|refill)$"),
        Summary(("rloo", "turn_returns", "ppo_raw", "reinforce"), ("infra",),
                match="^corridor step=0.02 (drop|refill)$"),
        Growth("infra", "rloo", ("bandit none", "bandit step=0.02 keep", "bandit step=0.02 drop",
                                 "bandit step=0.02 refill")),
        Summary(("rloo", "turn_returns"), ("infra",), match="^corridor step=0.15 drop$"),
    ),
}
"""The specs of each generated claim block of the pages, by block name."""

