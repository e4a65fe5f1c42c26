"""``python -m turnrl view RUN_DIR``: one self-contained HTML page of a run's kept episodes
(``RUN/view.html``; no server, opens offline).

The page holds an index of every kept step (per episode: group, task, reward, success,
termination, env) and each step's rollout file as it is on disk (gzip, base64), decoded by the
browser only when that step is shown: a page of many steps opens as fast as one. Pick a step (or
the held-out evaluations), see its episodes grouped by task, the best and the worst of each group
side by side, turn by turn, every sampled token coloured by its advantage (or the learner/sampler
logprob gap, the importance weight, the entropy), the tokens outside the loss mask greyed,
segment boundaries marked, each turn's reward; filter by outcome, env and termination; follow one
task step over step. Model and env text is put in the page as text, never as markup.

The trainer rewrites the page every ``trainer.rollouts.view_every`` steps and at the end
(``ViewCache`` keeps each step's part, so a rewrite reads only the new steps).
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from turnrl.runs.rollouts import KINDS
from turnrl.runs.store import rollout_steps, step_path
from turnrl.runs.watch import WARNINGS_FILE, load_warnings

VIEW_FILE = "view.html"


@dataclass
class _StepPart:
    stamp: tuple[int, int]  # (size, mtime_ns) of the file it was read from
    blob: str  # the file's bytes, base64
    episodes: list[list]  # per episode: [group_id, task_id, reward, success, termination, env_id]


@dataclass
class ViewCache:
    """Each step file's part of the page, kept between rewrites (a file that changed is read again)."""

    parts: dict[tuple[str, int], _StepPart] = field(default_factory=dict)
    title: str | None = None  # the page's title, once read from the run's config

    def part(self, run_dir: Path, kind: str, step: int) -> _StepPart:
        path = step_path(run_dir, kind, step)
        st = path.stat()
        stamp = (st.st_size, st.st_mtime_ns)
        cached = self.parts.get((kind, step))
        if cached is None or cached.stamp != stamp:
            raw = path.read_bytes()
            episodes = [[r["group_id"], r["task_id"], r["reward"], bool(r["success"]), r["termination"], r["env_id"]]
                        for r in map(json.loads, gzip.decompress(raw).decode("utf-8").splitlines()) if r]
            cached = self.parts[(kind, step)] = _StepPart(stamp, base64.b64encode(raw).decode("ascii"), episodes)
        return cached


def _script_json(value) -> str:
    """JSON that cannot end the ``<script>`` element it sits in (model text may hold "</script>")."""
    return json.dumps(value, ensure_ascii=False).replace("<", "\\u003c").replace(">", "\\u003e").replace(
        "&", "\\u0026")


def _run_title(run_dir: Path) -> str | None:
    """"turnrl run DIR: env, algorithm", from the run's config (None: it has none yet)."""
    for name in ("config.yaml", ".hydra/config.yaml"):
        path = run_dir / name
        if path.is_file():
            cfg = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            env = (cfg.get("env") or {}).get("id", "?")
            algorithm = (cfg.get("algorithm") or {}).get("advantage", "?")
            return f"turnrl run {run_dir.name}: {env}, {algorithm}"
    return None


def build_view(run_dir: str | Path, out: str | Path | None = None, *, warnings: list[dict] | None = None,
               checks: str = "", cache: ViewCache | None = None) -> Path:
    """Write the page of ``run_dir``'s kept episodes (atomically) to ``out`` (default
    ``RUN/view.html``); returns its path.

    Args:
        warnings: what to show first, each ``{"step", "title", "detail"}``; None: the run's
            ``warnings.json`` (``turnrl.runs.watch``).
        checks: a line saying what was checked (shown when there is no warning).
        cache: the parts of an earlier call, to read only the steps that are new.

    Raises:
        FileNotFoundError: When ``run_dir`` is not a folder.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is not a folder: pass a run's output folder (it holds rollouts/)")
    cache = ViewCache() if cache is None else cache
    if warnings is None:
        warnings = [asdict(w) for w in load_warnings(run_dir)]
        checks = checks or ("No warnings in warnings.json." if (run_dir / WARNINGS_FILE).exists() else
                            "This run wrote no warnings.json: no collapse watch ran, or nothing warned.")
    steps = {kind: rollout_steps(run_dir, kind) for kind in KINDS}
    if cache.title is None:  # read again until the run has a config
        cache.title = _run_title(run_dir)
    index = {"title": cache.title or f"turnrl run {run_dir.name}", "steps": steps, "warnings": list(warnings or []), "checks": checks,
             "episodes": {kind: {} for kind in KINDS}}
    scripts = []
    for kind in KINDS:
        for step in steps[kind]:
            part = cache.part(run_dir, kind, step)
            index["episodes"][kind][str(step)] = part.episodes
            scripts.append(f'<script type="text/plain" data-kind="{kind}" data-step="{step}">{part.blob}</script>')
    template = resources.files("turnrl.runs").joinpath("view.html").read_text(encoding="utf-8")
    fills = {"__TITLE__": _html_text(index["title"]), "__INDEX__": _script_json(index), "__STEPS__": "\n".join(scripts)}
    page = re.sub("__(?:TITLE|INDEX|STEPS)__", lambda m: fills[m.group(0)], template)  # one pass: no fill is read again
    out = run_dir / VIEW_FILE if out is None else Path(out)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, out)
    return out


def _html_text(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
