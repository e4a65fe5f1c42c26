"""The credit lab: every method's gradient against the exact one, as one knob varies.

A cell is an MDP (with its knobs), a group size, a policy point and a loss aggregation; the
lab samples ``batches`` independent batches in it, computes every method's gradient on each
(``estimate.gradients``) and summarises them against the exact gradient (``stats.summarize``).
A sweep varies one knob over cells; ``SWEEPS`` holds the ones the docs show:

* ``horizon``: corridor, key-door and bandit chain at 2 to 32 turns;
* ``group``: group size 2 to 16 (corridor, key-door);
* ``sparsity``: outcome-only vs shaped per-turn rewards (corridor, key-door);
* ``rewards``: graded outcomes on a key-door whose door also opens without the key for a
  lesser reward (0 / x / 1 instead of 0 / 1), at group sizes 4 and 8: where dividing by a
  group's std (GRPO) weighs a group whose episodes differ by 0.1 as one that differs by 1;
* ``ragged``: the chance that an episode stops at each turn, 0 to 0.2 (corridor);
* ``aggregation``: the four loss aggregations on ragged corridors;
* ``staleness``: samples from an older policy than the one being updated (asynchronous RL),
  where the policy losses (PPO's clip, GSPO's sequence ratio, CISPO's clipped weight) differ;
* ``infra``: episodes the infrastructure ends (a failed reset, or a step that raises), about 10
  to 15% of them, trained on with reward 0 (``keep``), dropped (``drop``) or sampled again once
  (``refill``): ``trainer.infra_failures``' three policies, on ragged corridors (whose long
  episodes meet more failing steps) and fixed-length bandit chains, and one corridor whose
  steps fail at 15%.

Unless a sweep says otherwise the aggregation is ``seq-mean-token-sum`` (each episode's token
sum, over the number of episodes), the one under which plain REINFORCE is exactly unbiased,
so the tables measure the estimators and not their configs' aggregations.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import torch

from turnrl.bench.credit_lab.episodes import InfraFailures, lab_batches
from turnrl.bench.credit_lab.estimate import Method, batch_local, gradients, lab_methods
from turnrl.bench.credit_lab.exact import exact, policy_point
from turnrl.bench.credit_lab.mdp import make_mdp
from turnrl.bench.credit_lab.stats import summarize
from turnrl.registry import Registry

UNBIASED_AGG = "seq-mean-token-sum"
SWEEPS: Registry[Callable[[], list["Cell"]]] = Registry("credit-lab sweep")


@dataclass(frozen=True)
class Cell:
    """One setting the lab measures every method in.

    Attributes:
        sweep: the sweep it belongs to; ``x`` its value of the swept knob (a table column).
        mdp: a name in ``turnrl.bench.credit_lab.mdp.MDPS``; ``mdp_kwargs`` its knobs.
        group_size: samples per task (every task of the MDP is in every batch).
        aggregation: the loss aggregation every method is run with.
        competence / noise / policy_seed: the policy point (``exact.policy_point``).
        staleness: the sampler's policy is ``theta + staleness * N(0, 1)`` (seeded by
            ``policy_seed + 1``) while the gradient is taken at ``theta``: stale samples, their
            logprobs the sampler's (the critic's exact values are the sampler's too).
        infra_rate / infra_model / infra_policy: episodes the infrastructure ends and what is
            done with them (``episodes.InfraFailures``; rate 0: none).
    """

    sweep: str
    x: str
    mdp: str
    mdp_kwargs: dict = field(default_factory=dict)
    group_size: int = 8
    aggregation: str = UNBIASED_AGG
    competence: float = 1.0
    noise: float = 0.5
    policy_seed: int = 0
    staleness: float = 0.0
    infra_rate: float = 0.0
    infra_model: str = "step"
    infra_policy: str = "drop"


@SWEEPS.register("horizon")
def horizon_sweep() -> list[Cell]:
    cells = []
    for h in (2, 4, 8, 16, 32):
        cells.append(Cell("horizon", f"corridor H={h}", "corridor", {"length": max(2, h // 2), "horizon": h}))
        cells.append(Cell("horizon", f"key_door H={h}", "key_door", {"length": max(2, h // 3), "horizon": h}))
        cells.append(Cell("horizon", f"bandit H={h}", "bandit_chain", {"horizon": h}))
    return cells


@SWEEPS.register("group")
def group_sweep() -> list[Cell]:
    return [Cell("group", f"{name} G={g}", name, kwargs, group_size=g)
            for name, kwargs in (("corridor", {"length": 4, "horizon": 8}), ("key_door", {"length": 3, "horizon": 12}))
            for g in (2, 4, 8, 16)]


@SWEEPS.register("sparsity")
def sparsity_sweep() -> list[Cell]:
    return [Cell("sparsity", f"{name} {'shaped' if shaped else 'outcome'}", name, {**kwargs, "shaped": shaped})
            for name, kwargs in (("corridor", {"length": 4, "horizon": 8}), ("key_door", {"length": 3, "horizon": 12}))
            for shaped in (False, True)]


@SWEEPS.register("rewards")
def rewards_sweep() -> list[Cell]:
    cells = []
    for g in (4, 8):
        cells.append(Cell("rewards", f"0/1 G={g}", "key_door", {"length": 4, "horizon": 8}, group_size=g))
        cells += [Cell("rewards", f"0/{x:g}/1 G={g}", "key_door", {"length": 4, "horizon": 8, "bare_door": x},
                       group_size=g) for x in (0.6, 0.3, 0.1)]
    return cells


@SWEEPS.register("ragged")
def ragged_sweep() -> list[Cell]:
    return [Cell("ragged", f"stop={p:g}", "corridor", {"length": 4, "horizon": 12, "stop_prob": p})
            for p in (0.0, 0.1, 0.2)]


@SWEEPS.register("aggregation")
def aggregation_sweep() -> list[Cell]:
    return [Cell("aggregation", agg, "corridor", {"length": 4, "horizon": 12, "stop_prob": 0.1}, aggregation=agg)
            for agg in ("seq-mean-token-sum", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")]


@SWEEPS.register("staleness")
def staleness_sweep() -> list[Cell]:
    return [Cell("staleness", f"stale={z:g}", "corridor", {"length": 4, "horizon": 12, "stop_prob": 0.1},
                 staleness=z) for z in (0.0, 0.3, 1.0)]


@SWEEPS.register("infra")
def infra_sweep() -> list[Cell]:
    cells = []
    for name, mdp, kwargs, failures in (
            ("corridor", "corridor", {"length": 4, "horizon": 12, "stop_prob": 0.1}, (("reset", 0.1), ("step", 0.02))),
            ("bandit", "bandit_chain", {"horizon": 8}, (("step", 0.02),))):
        cells.append(Cell("infra", f"{name} none", mdp, kwargs))
        cells += [Cell("infra", f"{name} {model}={rate:g} {policy}", mdp, kwargs, infra_rate=rate, infra_model=model,
                       infra_policy=policy) for model, rate in failures for policy in ("keep", "drop", "refill")]
    # failing steps at a high rate: long episodes fail more, so those trained on lean short
    cells.append(Cell("infra", "corridor step=0.15 drop", "corridor", {"length": 4, "horizon": 12, "stop_prob": 0.1},
                      infra_rate=0.15, infra_model="step", infra_policy="drop"))
    return cells


def run_cell(cell: Cell, batches: int, seed: int = 0, methods: Sequence[Method] | None = None) -> list[dict]:
    """Every method's summary in ``cell`` over ``batches`` batches: one row (dict) each, with
    the cell's settings, the exact objective and success, and ``stats.summarize``'s figures."""
    torch.set_num_threads(1)
    start = time.perf_counter()
    mdp = make_mdp(cell.mdp, **cell.mdp_kwargs)
    theta = policy_point(mdp, cell.competence, cell.noise, cell.policy_seed)
    ex = exact(mdp, theta)
    sampler = theta
    if cell.staleness:
        generator = torch.Generator().manual_seed(cell.policy_seed + 1)
        sampler = theta + cell.staleness * torch.randn(theta.shape, generator=generator, dtype=theta.dtype)
    pi = torch.softmax(sampler, dim=1).numpy()
    sampler_values = ex.values if sampler is theta else exact(mdp, sampler).values
    methods = list(methods or lab_methods())
    grads: dict[str, list[torch.Tensor]] = {m.label: [] for m in methods}
    local: dict[str, bool] = {}
    mean_turns, failed = [], []
    infra = InfraFailures(cell.infra_rate, cell.infra_model, cell.infra_policy) if cell.infra_rate else None
    for lab_batch in lab_batches(mdp, pi, cell.group_size, batches, sampler_values, seed, infra=infra):
        if not local:
            local = {m.label: batch_local(m, lab_batch) for m in methods}
        mean_turns.append(float(lab_batch.batch.num_turns.double().mean()))
        failed.append(lab_batch.failed)
        for m in methods:
            grads[m.label].append(gradients(m, lab_batch, theta, cell.aggregation, per_batch=not local[m.label]))
    seconds = time.perf_counter() - start
    rows = []
    for m in methods:
        row = {"sweep": cell.sweep, "x": cell.x, "method": m.label, "advantage": m.advantage,
               "loss_agg": cell.aggregation, "mdp": mdp.name, "group_size": cell.group_size, "staleness": cell.staleness,
               "infra_rate": cell.infra_rate, "infra_model": cell.infra_model, "infra_policy": cell.infra_policy,
               "failed": sum(failed) / len(failed),
               "batches": batches,
               "objective": ex.objective, "success": ex.success, "mean_turns": sum(mean_turns) / len(mean_turns),
               "seconds": seconds}
        row.update(summarize(torch.cat(grads[m.label]).flatten(1), ex.gradient))
        rows.append(row)
    return rows


def _run(args: tuple[Cell, int, int]) -> list[dict]:
    return run_cell(*args)


def run_sweeps(names: Sequence[str], batches: int, seed: int = 0, workers: int = 1,
               progress: bool = True) -> list[dict]:
    """Rows of every cell of the named sweeps (cells run in ``workers`` processes)."""
    from tqdm.auto import tqdm

    cells = [cell for name in names for cell in SWEEPS.get(name)()]
    for cell in cells:  # every cell's MDP is valid before any runs
        make_mdp(cell.mdp, **cell.mdp_kwargs)
    jobs = [(cell, batches, seed) for cell in cells]
    rows: list[dict] = []
    bar = tqdm(total=len(jobs), desc="credit lab", unit="cell", disable=not progress)
    if workers <= 1:
        for job in jobs:
            rows += _run(job)
            bar.update()
    else:
        with ProcessPoolExecutor(workers) as pool:
            for result in pool.map(_run, jobs):
                rows += result
                bar.update()
    bar.close()
    return rows


def fmt(value: float, digits: int = 3) -> str:
    """A figure for a table (``inf`` and ``nan`` spelled out)."""
    if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
        return str(value)
    return f"{value:.{digits}g}"

