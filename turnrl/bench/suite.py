"""``python -m turnrl bench --suite credit``: a benchmark suite defined as data, run cell by
cell, resumable, and reported with intervals over seeds.

A suite (``turnrl/conf/suite/NAME.yaml``, format in ``credit.yaml``) names envs, methods (an
algorithm config plus overrides), seeds, a baseline method and a success threshold. Every
(env, method, seed) is a *cell*: one ``turnrl.train.loop.train`` run in ``OUT/ENV/METHOD/seedN``.
``plan_cells`` composes and validates every cell's config before any trains, and checks that
the methods of an env share the sample budget, the evaluation and every other setting but their
credit method (``METHOD_KEYS``) and the suite's declared ``factors``. Warm starts are made once
per (env, seed) into ``OUT/warm_start`` (``agent.warmstart.cache``) and loaded by every method's
run, so the methods of a seed start RL from the same model; ``agent.warmstart.seed=N`` in the
suite's overrides makes every seed share one. ``run_suite`` trains the
cells not finished yet (a finished cell holds ``bench_record.json``; a rerun of the same command
skips it), then writes into the out dir:

- ``results.csv``: one row per run, every figure (``turnrl.bench.report.RUN_COLUMNS``);
- ``evals.csv``: one row per run and evaluation (``EVAL_COLUMNS``): with results.csv, what
  ``records_from_csv`` rebuilds the tables from; ``suite.yaml``: the suite as it ran;
- ``summary.csv``: one row per (env, method): means, interval bounds, medians;
- ``table.md``: per env, per method: final held-out success, the paired difference against the
  baseline, episodes to the threshold, AUC (intervals: ``turnrl.bench.stats``), tokens, wall time;
- ``curves.png``: per env a panel, mean held-out success vs sampled episodes per method with a
  pointwise 95% bootstrap band;
- ``report.html``: all of it on one self-contained page, with every run.
"""

from __future__ import annotations

import copy
import json
import multiprocessing
import os
import re
import shutil
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import yaml
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from turnrl.bench import record as bench_record
from turnrl.bench.grid import compose_config, train_cell
from turnrl.bench.report import (EVAL_COLUMNS, RUN_COLUMNS, RunRecord, eval_rows, markdown, plot_panels, run_rows,
                                 suite_head, suite_html, suite_rows, suite_table, summary_csv_rows, write_csv)
from turnrl.bench.stats import MethodSummary, pointwise_band, summarize
from turnrl.conf.schema import Config
from turnrl.algorithms.distributed import LOCAL_PROCESSES_ENV, set_torch_threads
from turnrl.train.warm_start import cache_path, cached, save_to_cache, warm_start_as_configured
from turnrl.chat.renderer import ChatRenderer
from turnrl.conf.validate import validate
from turnrl.train.factories import build_agent, env_factory, scripted_env
from turnrl.train.setup import config_changes
from turnrl.train.setup import config_yaml

CONF = Path(__file__).resolve().parents[1] / "conf"
SUITES = CONF / "suite"
# file a finished cell's run dir holds: its RunRecord and the config it ran
RECORD_FILE = "bench_record.json"
# the out dir's folder of warm-started models (agent.warmstart.cache of every cell that sets none):
# the cells of one seed and env share a warm start, made once, so methods start RL from the same model
WARM_START_DIR = "warm_start"
# trainer fields every method of an env must share: the sample budget (steps x tasks_per_step x
# group_size episodes) and the held-out evaluation the figures are read from
BUDGET_KEYS = ("steps", "tasks_per_step", "group_size", "eval_every", "eval_episodes")
TOP_KEYS = ("shared", "factors", "seeds", "baseline", "threshold", "envs", "methods")
# config keys (dotted, prefixes) that make up a credit method: the estimator and its arguments, the
# policy loss and its own clip, the critic. The methods of an env may differ in these; every other
# key is held fixed across them unless the suite declares it a factor (``factors``)
METHOD_KEYS = ("algorithm.advantage", "algorithm.advantage_kwargs.", "algorithm.policy_loss", "algorithm.gspo_",
               "algorithm.cispo_", "algorithm.turn_ratio", "algorithm.critic", "algorithm.value_clip",
               "algorithm.vf_coef", "algorithm.state_similarity")
NAME = re.compile(r"[A-Za-z0-9][\w-]*")
BAND_CAPTION = "band: pointwise 95% bootstrap interval of the mean over seeds"


class SuiteError(ValueError):
    """A suite file, a selection or a cell's config that cannot run (the message says why and
    how to fix it)."""


@dataclass(frozen=True)
class SuiteEnv:
    """An env of the suite: its Hydra overrides (``env=NAME`` among them) and success threshold."""

    name: str
    overrides: tuple[str, ...]
    threshold: float


@dataclass(frozen=True)
class SuiteMethod:
    """A method: an algorithm config (``algorithm=NAME`` among the overrides) plus overrides."""

    name: str
    overrides: tuple[str, ...]

    @property
    def algorithm(self) -> str:
        """The algorithm config the method runs (its last ``algorithm=`` override)."""
        return [o.split("=", 1)[1] for o in self.overrides if _key(o) == "algorithm"][-1]


@dataclass(frozen=True)
class Suite:
    """A suite as its file states it (see ``turnrl/conf/suite/credit.yaml``)."""

    name: str
    envs: tuple[SuiteEnv, ...]
    methods: tuple[SuiteMethod, ...]
    seeds: tuple[int, ...]
    # the method paired differences are taken against; one of methods
    baseline: str
    # overrides of every cell, before the env's and the method's
    shared: tuple[str, ...] = ()
    # config keys (dotted) beside the credit method (METHOD_KEYS) that methods may set differently:
    # crossed as factors and shown beside each method; every other key is held fixed
    factors: tuple[str, ...] = ()

    @property
    def thresholds(self) -> dict[str, float]:
        """Env name -> its success threshold."""
        return {e.name: e.threshold for e in self.envs}

    def select(self, envs: Sequence[str] | None = None, methods: Sequence[str] | None = None,
               seeds: Sequence[int] | None = None) -> Suite:
        """The suite cut down to some envs, methods or seeds (None: all of the file's). The
        baseline always stays, for the paired differences; order is the file's.

        Raises:
            SuiteError: On a name the suite does not hold, or no seeds.
        """
        for kind, chosen, have in (("env", envs, [e.name for e in self.envs]),
                                   ("method", methods, [m.name for m in self.methods])):
            unknown = sorted(set(chosen or ()) - set(have))
            if unknown:
                raise SuiteError(f"suite {self.name!r} has no {kind} {unknown}; its {kind}s: {have}")
        if seeds is not None and not seeds:
            raise SuiteError("--seeds needs at least one seed")
        keep = None if methods is None else {*methods, self.baseline}
        return replace(self, envs=tuple(e for e in self.envs if envs is None or e.name in envs),
                       methods=tuple(m for m in self.methods if keep is None or m.name in keep),
                       seeds=self.seeds if seeds is None else tuple(dict.fromkeys(seeds)))


@dataclass
class Cell:
    """One (env, method, seed) of a suite: its composed config, its run dir, and its record if
    it has finished already."""

    env: str
    method: str
    seed: int
    cfg: Config
    run_dir: Path
    record: RunRecord | None = field(default=None)


# ------------------------------------------------------------------------- the suite file
def suite_path(suite: str | Path) -> Path:
    """The file of a suite: a name in ``turnrl/conf/suite`` (``credit``) or a YAML path.

    Raises:
        SuiteError: When neither exists (the message lists the built-in suites).
    """
    path = Path(suite)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    if NAME.fullmatch(str(suite)) and (SUITES / f"{suite}.yaml").is_file():
        return SUITES / f"{suite}.yaml"
    raise SuiteError(f"no suite {str(suite)!r}: give a suite name ({', '.join(available_suites())}) or the path of "
                     "a suite YAML file")


def available_suites() -> list[str]:
    """The names of the suites in ``turnrl/conf/suite``."""
    return sorted(p.stem for p in SUITES.glob("*.yaml"))


def load_suite(suite: str | Path) -> Suite:
    """Read and check a suite file (``suite_path`` finds it; ``parse_suite`` checks it)."""
    path = suite_path(suite)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise SuiteError(f"{path}: not valid YAML: {e}") from e
    return parse_suite(data, path.stem, str(path))


def parse_suite(data: object, name: str, source: str = "<suite>") -> Suite:
    """A ``Suite`` from a suite file's parsed YAML, checked: types, names, every ``env=`` and
    ``algorithm=`` naming a config that exists, a baseline among the methods, no seed or
    env/algorithm choice where it does not belong.

    Raises:
        SuiteError: Naming the file, the entry and what to write instead.
    """
    def fail(message: str) -> SuiteError:
        return SuiteError(f"{source}: {message}")

    if not isinstance(data, dict):
        raise fail(f"a suite file is a mapping with keys {list(TOP_KEYS)}, got {type(data).__name__}")
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise fail(f"unknown keys {unknown}; a suite has {list(TOP_KEYS)}")
    missing = [k for k in ("seeds", "baseline", "threshold", "envs", "methods") if k not in data]
    if missing:
        raise fail(f"missing keys {missing}")
    shared = _overrides(data.get("shared") or [], "shared", fail)
    _refuse(shared, ("seed", "env", "algorithm"), "shared", "set them per env, per method, or with --seeds", fail)
    seeds = data["seeds"]
    if (not isinstance(seeds, list) or not seeds or not all(type(s) is int for s in seeds)
            or len(set(seeds)) != len(seeds)):
        raise fail(f"seeds must be a non-empty list of distinct integers, got {seeds!r}")
    threshold = _threshold(data["threshold"], "threshold", fail)

    envs = []
    for env_name, entry in _entries(data["envs"], "envs", fail):
        env_threshold = threshold
        if isinstance(entry, dict):
            extra = sorted(set(entry) - {"overrides", "threshold"})
            if extra or "overrides" not in entry:
                raise fail(f"envs.{env_name}: a mapping entry has keys overrides (required) and threshold, got "
                           f"{sorted(entry)}")
            env_threshold = _threshold(entry.get("threshold", threshold), f"envs.{env_name}.threshold", fail)
            entry = entry["overrides"]
        overrides = _overrides(entry, f"envs.{env_name}", fail)
        _refuse(overrides, ("seed", "algorithm"), f"envs.{env_name}", "seeds and methods are the suite's own", fail)
        choices = [o.split("=", 1)[1] for o in overrides if _key(o) == "env"]
        if not choices:
            raise fail(f"envs.{env_name}: choose the env's config with env=NAME, one of {_configs('env')}")
        _config_exists("env", choices[-1], f"envs.{env_name}", fail)
        envs.append(SuiteEnv(env_name, overrides, env_threshold))

    methods = []
    for method_name, entry in _entries(data["methods"], "methods", fail):
        overrides = _overrides(entry or [], f"methods.{method_name}", fail)
        _refuse(overrides, ("seed", "env"), f"methods.{method_name}",
                "a method runs on every env with every seed", fail)
        if not any(_key(o) == "algorithm" for o in overrides):
            overrides = (f"algorithm={method_name}", *overrides)
        method = SuiteMethod(method_name, overrides)
        _config_exists("algorithm", method.algorithm, f"methods.{method_name}", fail)
        methods.append(method)

    baseline = data["baseline"]
    if baseline not in [m.name for m in methods]:
        raise fail(f"baseline {baseline!r} is not one of the methods {[m.name for m in methods]}; the paired "
                   "differences are taken against it")
    factors = data.get("factors") or []
    if not isinstance(factors, list) or not all(isinstance(f, str) and f and "=" not in f for f in factors):
        raise fail(f"factors must be a list of dotted config keys (e.g. algorithm.loss_agg), got {factors!r}")
    return Suite(name, tuple(envs), tuple(methods), tuple(seeds), baseline, shared, tuple(factors))


def _key(override: str) -> str:
    """The key an override sets: ``trainer.steps`` of ``+trainer.steps=3``, ``env`` of ``env=x``."""
    return override.split("=", 1)[0].lstrip("+~")


def _entries(value: object, where: str, fail) -> list[tuple[str, object]]:
    if not isinstance(value, dict) or not value:
        raise fail(f"{where} must be a non-empty mapping of name: overrides, got {value!r}")
    for name in value:
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise fail(f"{where}: {name!r} is no valid name (letters, digits, _ or -; it names a folder)")
    return list(value.items())


def _overrides(value: object, where: str, fail) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(o, str) and ("=" in o or o.startswith("~")) for o in value):
        raise fail(f"{where} must be a list of Hydra overrides (key=value strings), got {value!r}")
    return tuple(value)


def _refuse(overrides: Sequence[str], keys: Sequence[str], where: str, why: str, fail) -> None:
    bad = [o for o in overrides if _key(o) in keys]
    if bad:
        raise fail(f"{where} may not set {' or '.join(keys)} ({bad}): {why}")


def _threshold(value: object, where: str, fail) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise fail(f"{where} must be a held-out success rate in [0, 1], got {value!r}")
    return float(value)


def _configs(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _config_exists(group: str, name: str, where: str, fail) -> None:
    if not (CONF / group / f"{name}.yaml").is_file():
        raise fail(f"{where}: no {group} config {name!r} (turnrl/conf/{group}/{name}.yaml); the {group} configs: "
                   f"{_configs(group)}")


# ------------------------------------------------------------------------- planning
def plan_cells(suite: Suite, out: str | Path, overrides: Sequence[str] = ()) -> list[Cell]:
    """Every cell of ``suite`` (env, then method, then seed), its config composed and validated,
    and its record loaded when ``out`` holds it finished: all before any training.

    Args:
        suite: the suite (``load_suite``, maybe ``select``-ed).
        out: the output folder.
        overrides: the command line's overrides, last (they apply to every cell).

    Raises:
        SuiteError: On a config that does not compose or validate (naming the cell), methods of
            one env with different sample budgets or evaluations, or a finished run in ``out``
            whose config differs from its cell's now.
    """

    _refuse(overrides, ("seed", "env", "algorithm"), "the command line's overrides",
            "use --seeds, --envs, --methods or the suite file", SuiteError)
    out = Path(out)
    cells = []
    for env in suite.envs:
        budgets: dict[tuple, list[str]] = {}
        composed_by_method: dict[str, Config] = {}
        for method in suite.methods:
            try:  # composed once per (env, method): the seeds' configs differ in seed alone (no interpolation)
                composed = compose_config([*suite.shared, *env.overrides, *method.overrides, f"seed={suite.seeds[0]}",
                                           *overrides])
                validate(composed)
                if composed.agent.warmstart.cache is None:  # methods of a seed share its warm start
                    composed.agent.warmstart.cache = str(out / WARM_START_DIR)
            except Exception as e:  # Hydra's and validate's errors, with the cell they are about
                raise SuiteError(f"env {env.name}, method {method.name}: {e}") from e
            composed_by_method[method.name] = composed
            for seed in suite.seeds:
                where = f"env {env.name}, method {method.name}, seed {seed}"
                cfg = copy.deepcopy(composed)
                cfg.seed = seed
                budgets.setdefault(tuple(getattr(cfg.trainer, k) for k in BUDGET_KEYS), []).append(method.name)
                cell = Cell(env.name, method.name, seed, cfg, out / env.name / method.name / f"seed{seed}")
                saved = _read_record(cell.run_dir)
                if saved is not None:
                    changed = config_changes(saved["config"], cfg)
                    if changed:
                        raise SuiteError(f"{where}: {cell.run_dir} holds a finished run whose config differs in "
                                         f"{changed}; use another --out, or delete that folder to run it again")
                    cell.record = saved["record"]
                cells.append(cell)
        if len(budgets) > 1:
            shown = "; ".join(f"{sorted(set(names))}: " + ", ".join(f"trainer.{k}={v}" for k, v in zip(BUDGET_KEYS, b))
                              for b, names in budgets.items())
            raise SuiteError(f"env {env.name}: the methods differ in sample budget or evaluation ({shown}); set "
                             "those in shared or in the env's overrides, not in a method's")
        uncontrolled = uncontrolled_keys(composed_by_method, suite.baseline, suite.factors)
        if uncontrolled:
            shown = "; ".join(f"{m}: {', '.join(keys)}" for m, keys in uncontrolled.items())
            raise SuiteError(f"env {env.name}: methods change settings beside their credit method, so their "
                             f"differences would not be the credit method's alone ({shown}, against "
                             f"{suite.baseline}); set them for every method in shared, or declare the keys under "
                             "factors: to compare them on purpose")
    return cells


def _flat(node, prefix: str = "") -> dict[str, object]:
    if isinstance(node, dict) and node:
        return {k: v for key, child in node.items() for k, v in _flat(child, f"{prefix}{key}.").items()}
    return {prefix[:-1]: node}


def flat_config(cfg: Config) -> dict[str, object]:
    """``cfg`` as dotted keys: ``{"algorithm.loss_agg": "token-mean", ...}``."""
    return _flat(OmegaConf.to_container(OmegaConf.create(config_yaml(cfg))))


def _is_factor(key: str, factors: Sequence[str]) -> bool:
    return any(key == f or key.startswith(f + ".") for f in factors)


def uncontrolled_keys(configs: dict[str, Config], baseline: str, factors: Sequence[str] = ()) -> dict[str, list[str]]:
    """Per method, the keys its config sets differently from the baseline's besides its credit
    method (``METHOD_KEYS``) and the declared ``factors`` (``"key: baseline's -> method's"``);
    methods without any are left out. The suite runs only when this is empty: then two methods'
    difference is their credit method's (and the declared factors')."""
    base = flat_config(configs[baseline])
    out = {}
    for name, cfg in configs.items():
        mine = flat_config(cfg)
        keys = sorted(k for k in base.keys() | mine.keys() if base.get(k) != mine.get(k)
                      and not k.startswith(METHOD_KEYS) and not _is_factor(k, factors))
        if keys:
            out[name] = [f"{k}: {base.get(k)!r} -> {mine.get(k)!r}" for k in keys]
    return out


def factor_values(cfg: Config, factors: Sequence[str]) -> dict[str, object]:
    """The declared factors' values in ``cfg`` (a factor naming a mapping gives its dotted keys)."""
    return {k: v for k, v in flat_config(cfg).items() if _is_factor(k, factors)}


def _read_record(run_dir: Path) -> dict | None:
    """``{"record": RunRecord, "config": yaml}`` of a finished cell, or None."""
    path = run_dir / RECORD_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    record = data["record"]
    return {"record": RunRecord(**{**record, "evals": [tuple(e) for e in record["evals"]]}), "config": data["config"]}


def _write_record(run_dir: Path, record: RunRecord, cfg) -> None:
    """Mark the cell finished (written whole, then renamed: a crash leaves no half record)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / (RECORD_FILE + ".tmp")
    tmp.write_text(json.dumps({"record": asdict(record), "config": config_yaml(cfg)}, indent=1), encoding="utf-8")
    os.replace(tmp, run_dir / RECORD_FILE)


# ------------------------------------------------------------------------- running and reporting
def run_suite(suite: Suite, out: str | Path, overrides: Sequence[str] = (), progress: bool = True,
              workers: int = 1) -> list[RunRecord]:
    """Train every cell not finished yet, then write the reports; returns every cell's record.

    A cell's run dir without a record (an interrupted run) is cleared and trained again, unless
    the overrides resume runs (``trainer.resume=true`` with ``trainer.checkpoint_every``), in
    which case it continues from its last checkpoint (its wall time then counts the part run
    since). Each finished run is recorded at once, so an interrupted suite loses at most the runs
    in progress. The warm starts the cells keep (``agent.warmstart.cache``) are made first, once
    per entry (``fill_warm_start_cache``, by the workers when there are several), so no two runs
    make the same one.

    Args:
        workers: cells trained at once, each in a process of its own (spawned). Each run takes
            ``trainer.threads`` torch threads, by default (null) ``cores // workers``.

    Raises:
        SuiteError: As ``plan_cells``, before any training.
        KeyboardInterrupt: On Ctrl-C (the runs in progress are not recorded).
    """
    out = Path(out)
    cells = plan_cells(suite, out, overrides)
    out.mkdir(parents=True, exist_ok=True)
    (out / "suite.json").write_text(json.dumps({**asdict(suite), "overrides": list(overrides)}, indent=1))
    # seed by seed (each env's first seed for every method, then the next): a suite stopped early
    # leaves whole seeds, with every method paired
    env_order = [e.name for e in suite.envs]
    todo = sorted((c for c in cells if c.record is None), key=lambda c: (env_order.index(c.env), c.seed))
    entries: dict[Path, Config] = {}  # each warm start to make, with the config of its first cell
    for cell in todo:
        path = cache_path(cell.cfg)
        if path is not None and cached(cell.cfg) is None:
            entries.setdefault(path, cell.cfg)
    warm = list(entries.values())
    bar = tqdm(total=len(cells), initial=len(cells) - len(todo), desc=f"suite {suite.name}", unit="run",
               disable=not progress)
    for cell in todo:
        if cell.run_dir.exists() and not cell.cfg.trainer.resume:
            shutil.rmtree(cell.run_dir)  # an unfinished run's leftovers (its log would be appended to)
    try:
        if workers <= 1:
            for cfg in warm:
                bar.set_postfix_str(f"warm start: env {cfg.env.id} seed {cfg.seed}")
                fill_warm_start_cache(cfg, progress)
            for cell in todo:
                bar.set_postfix_str(f"{cell.env} {cell.method} seed {cell.seed}")
                cell.record = _train_and_record(cell)
                bar.update()
        else:
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                     initializer=_share_cores, initargs=(workers,)) as pool:
                try:
                    bar.set_postfix_str(f"{len(warm)} warm start(s)")
                    for done in as_completed([pool.submit(fill_warm_start_cache, cfg, False) for cfg in warm]):
                        done.result()
                    running = {pool.submit(_train_and_record, cell): cell for cell in todo}
                    for done in as_completed(running):
                        cell = running[done]
                        cell.record = done.result()
                        bar.set_postfix_str(f"done: {cell.env} {cell.method} seed {cell.seed}")
                        bar.update()
                except BaseException:
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise
    finally:
        bar.close()
    records = [c.record for c in cells]
    write_reports(suite, records, out, overrides, cell_settings(suite, cells))
    return records


def cell_settings(suite: Suite, cells: Sequence[Cell]) -> dict[str, dict[str, dict]]:
    """env -> method -> the declared factors' values of its cells' config."""
    out: dict[str, dict[str, dict]] = {}
    for cell in cells:
        per_env = out.setdefault(cell.env, {})
        if cell.method not in per_env:  # the seeds of a method share its settings: read its first
            per_env[cell.method] = factor_values(cell.cfg, suite.factors)
    return out


def _share_cores(workers: int) -> None:
    """A worker's initializer: its runs' default ``trainer.threads`` is its share of the cores."""
    os.environ[LOCAL_PROCESSES_ENV] = str(workers)


def _train_and_record(cell: Cell) -> RunRecord:
    """Train one cell and write its record (in a worker process when the suite has several)."""
    record = train_cell(cell.cfg, cell.run_dir, cell.method, cell.env)
    if record.evals[-1][0] != cell.cfg.trainer.steps:  # train() stops early, and returns, on Ctrl-C
        raise KeyboardInterrupt(f"interrupted in {cell.run_dir}")
    _write_record(cell.run_dir, record, cell.cfg)
    return record


def fill_warm_start_cache(cfg: Config, progress: bool = True) -> Path | None:
    """Make the ``agent.warmstart.cache`` entry of ``cfg`` unless it exists: build the agent and
    warm-start it exactly as a run of ``cfg`` would (``turnrl.train.factories.build_agent``,
    ``turnrl.train.warm_start.warm_start_as_configured``), then save it. Returns the entry (None: ``cfg``
    keeps no warm start)."""

    if cache_path(cfg) is None:
        return None
    if cached(cfg) is not None:
        return cache_path(cfg)
    set_torch_threads(cfg.trainer.threads)
    env_fn = env_factory(cfg)
    model, tokenizer = build_agent(cfg, env_fn)
    renderer = ChatRenderer(tokenizer, cfg.agent.chat_format, cfg.agent.template_kwargs)
    losses = warm_start_as_configured(cfg, model, renderer, scripted_env(cfg, env_fn), progress=progress)
    return save_to_cache(cfg, model, tokenizer, losses)


def write_reports(suite: Suite, records: Sequence[RunRecord], out: str | Path,
                  overrides: Sequence[str] = (), settings: dict[str, dict[str, dict]] | None = None
                  ) -> list[MethodSummary]:
    """Write results.csv (a row per run), evals.csv (a row per run and evaluation), suite.yaml
    (the suite as it ran), summary.csv, table.md, curves.png and report.html into ``out``;
    returns the per-(env, method) summaries.

    Args:
        settings: env -> method -> the declared factors' values (``factor_values``), shown
            under the tables and kept in suite.yaml.
    """
    out = Path(out)
    summaries = summarize(records, suite.baseline, suite.thresholds)
    write_csv(run_rows(records, suite.baseline, suite.thresholds), RUN_COLUMNS, out / "results.csv")
    write_csv(eval_rows(records), EVAL_COLUMNS, out / "evals.csv")
    (out / "suite.yaml").write_text(yaml.safe_dump(suite_as_run(suite, overrides, settings), sort_keys=False))
    rows = summary_csv_rows(summaries)
    write_csv(rows, list(rows[0]), out / "summary.csv")
    title = (f"turnrl suite {suite.name}: {len(suite.envs)} env(s) x {len(suite.methods)} methods x "
             f"{len(suite.seeds)} seeds" + (f" ({' '.join(overrides)})" if overrides else ""))
    controls = controls_note(suite, settings)
    (out / "table.md").write_text(f"# {title}\n\n{suite_table(summaries, suite.baseline)}\n\n{controls}\n")
    panels = {env.name: [r for r in records if r.env == env.name] for env in suite.envs}
    plot_panels(panels, out / "curves.png", x="episodes", band=pointwise_band, caption=BAND_CAPTION)
    suite_html(summaries, records, suite.baseline, suite.thresholds, title, BAND_CAPTION, out / "curves.png",
               out / "report.html")
    return summaries


def suite_as_run(suite: Suite, overrides: Sequence[str] = (), settings: dict | None = None) -> dict:
    """The suite as it ran, in its file's format plus the command line's overrides and each
    method's factor values: what ``suite.yaml`` beside the per-seed CSVs holds."""
    return {"suite": suite.name, "shared": list(suite.shared), "factors": list(suite.factors),
            "seeds": list(suite.seeds), "baseline": suite.baseline,
            "envs": {e.name: {"overrides": list(e.overrides), "threshold": e.threshold} for e in suite.envs},
            "methods": {m.name: list(m.overrides) for m in suite.methods}, "overrides": list(overrides),
            "factor_values": settings or {}}


def controls_note(suite: Suite, settings: dict[str, dict[str, dict]] | None = None) -> str:
    """What the methods share and what they do not, in a sentence under the tables."""
    note = ("Held fixed across methods: every setting but the credit method (the advantage estimator and its "
            "arguments, the policy loss and its own clip, the critic)")
    if not suite.factors:
        return note + "."
    values: dict[str, dict[str, list[str]]] = {}
    for per_method in (settings or {}).values():
        for method, factors in per_method.items():
            for key, value in factors.items():
                names = values.setdefault(key, {}).setdefault(str(value), [])
                if method not in names:
                    names.append(method)
    shown = "; ".join(f"`{key}` " + ", ".join(f"{v} ({', '.join(ms)})" for v, ms in by_value.items())
                      for key, by_value in values.items())
    return note + f", and the declared factors: {shown or ', '.join(suite.factors)}."


def report_suite(suite: Suite, out: str | Path, overrides: Sequence[str] = ()) -> tuple[list[RunRecord], list[str]]:
    """Rebuild the reports of ``out`` from its finished cells, training nothing; returns their
    records and the cells without one (``"env/method/seedN"``).

    Unlike a rerun, a finished cell counts whatever its saved config (a later code or schema
    change, such as a new field, does not block its report): the reports are the runs as they
    ran, and each run's own config stays in its record. Cells not run are left out of the
    tables (paired differences use the seeds both methods have).

    Raises:
        SuiteError: When ``out`` holds no finished cell of ``suite``.
    """
    out = Path(out)
    records, missing, settings = [], [], {}
    for env in suite.envs:
        for method in suite.methods:
            for seed in suite.seeds:
                saved = _read_record(out / env.name / method.name / f"seed{seed}")
                if saved is None:
                    missing.append(f"{env.name}/{method.name}/seed{seed}")
                else:
                    records.append(saved["record"])
                    per_env = settings.setdefault(env.name, {})
                    if method.name not in per_env:  # the seeds of a method share its settings
                        flat = _flat(OmegaConf.to_container(OmegaConf.create(saved["config"])))
                        per_env[method.name] = {k: v for k, v in flat.items() if _is_factor(k, suite.factors)}
    if not records:
        raise SuiteError(f"{out} holds no finished run of suite {suite.name!r} ({len(missing)} cells, none with "
                         f"{RECORD_FILE}); run it first, without --report-only")
    write_reports(suite, records, out, overrides, settings)
    return records, missing


def write_record(path: str | Path, suite: Suite, records: Sequence[RunRecord], overrides: Sequence[str] = (),
                 missing: Sequence[str] = ()) -> None:
    """Write the suite's runs as a benchmark record (``turnrl.bench.record``) at ``path``: every
    run's figures, the baseline and thresholds, each env's overrides (its budget and evaluation),
    the overrides and the cells not run, from which ``record_table`` rebuilds the suite's tables.

    Raises:
        SuiteError: When the methods of an env ran different seeds (a record compares methods on
            the same seeds: run the missing cells, or select the seeds every method has).
    """
    uneven = unequal_seeds(records)
    if uneven:
        raise SuiteError(f"no record written: the methods ran different seeds ({uneven}); run the missing cells, or "
                         "pass --seeds with the seeds every method has")
    bench_record.write(path, {"suite": suite.name, "baseline": suite.baseline, "thresholds": suite.thresholds,
                              "seeds": list(suite.seeds), "shared": list(suite.shared), "factors": list(suite.factors),
                              "envs": {e.name: list(e.overrides) for e in suite.envs},
                              "overrides": list(overrides), "missing": list(missing),
                              "runs": [asdict(r) for r in records]})


def unequal_seeds(records: Sequence[RunRecord]) -> dict[str, dict[str, list[int]]]:
    """Per env whose methods do not all have the same seeds, each method's seeds (empty when every
    method of every env ran the same seeds: a table that compares methods needs that)."""
    seeds: dict[str, dict[str, set[int]]] = {}
    for r in records:
        seeds.setdefault(r.env, {}).setdefault(r.algorithm, set()).add(r.seed)
    return {env: {m: sorted(s) for m, s in by_method.items()} for env, by_method in seeds.items()
            if len({frozenset(s) for s in by_method.values()}) > 1}


def record_table(result: dict, env: str | None = None) -> str:
    """The suite's Markdown table(s) from a record's ``result`` (``write_record``): every env's
    section as ``table.md`` shows it, or only ``env``'s table."""
    records = [RunRecord(**{**run, "evals": [tuple(e) for e in run["evals"]]}) for run in result["runs"]]
    return records_table(records, result["baseline"], result["thresholds"], env)


def records_table(records: Sequence[RunRecord], baseline: str, thresholds: dict[str, float],
                  env: str | None = None) -> str:
    """``record_table`` of runs (e.g. ``turnrl.bench.report.records_from_csv`` of the committed
    per-seed CSVs).

    Raises:
        ValueError: When the methods of an env ran different seeds (no method may have fewer
            seeds than another in a published table: finish the suite, or select common seeds).
    """
    uneven = unequal_seeds(records)
    if uneven:
        raise ValueError(f"the methods ran different seeds ({uneven}); a table compares methods on the same seeds: "
                         "run the missing cells, or pass --seeds with the seeds every method has")
    summaries = summarize(records, baseline, thresholds)
    if env is None:
        return suite_table(summaries, baseline)
    return markdown(suite_head(baseline, thresholds[env]), suite_rows(summaries)[env])


def run_from_args(args) -> int:
    """The ``bench`` subcommand of ``turnrl.cli``: 0 done, 2 a bad suite or selection (before
    any training), 130 interrupted (rerun the same command to continue)."""
    import sys

    try:
        suite = load_suite(args.suite).select(args.envs, args.methods, args.seeds)
    except SuiteError as e:
        print(f"turnrl bench: error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out or f"bench-{suite.name}")
    if getattr(args, "report_only", False):
        try:
            records, missing = report_suite(suite, out, args.overrides)
        except SuiteError as e:
            print(f"turnrl bench: error: {e}", file=sys.stderr)
            return 2
        if missing:
            print(f"turnrl bench: {len(missing)} cell(s) not run, left out: {', '.join(missing)}", file=sys.stderr)
        if getattr(args, "json", None):
            try:
                write_record(args.json, suite, records, args.overrides, missing)
            except SuiteError as e:
                print(f"turnrl bench: error: {e}", file=sys.stderr)
                return 2
        print((out / "table.md").read_text(), end="")
        print(f"report: {out / 'report.html'} ({len(records)} runs)")
        return 0
    try:
        records = run_suite(suite, out, args.overrides, progress=args.progress, workers=args.workers)
    except SuiteError as e:
        print(f"turnrl bench: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"turnrl bench: interrupted; the finished runs are kept in {out}: run the same command again to go on",
              file=sys.stderr)
        return 130
    if getattr(args, "json", None):
        write_record(args.json, suite, records, args.overrides)
    print((out / "table.md").read_text(), end="")
    print(f"report: {out / 'report.html'}")
    return 0
