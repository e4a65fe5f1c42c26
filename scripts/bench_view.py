"""How fast a long run's page opens: ``view.html`` of a run with ``--steps`` kept steps of
``--episodes`` episodes each, loaded in Chromium.

    .venv/bin/python scripts/bench_view.py [--steps 200] [--episodes 64] [--source RUN_DIR] [--json out.json]

The episodes are real: one step of a ``make train`` run (its defaults: 8 tasks x 8 samples a step;
trained here for one step unless ``--source`` names a run dir that kept rollouts), whose step file
is written again as each of ``--steps`` steps (the step numbers rewritten), then the page of them
all is built (``turnrl.runs.view.build_view``). Chromium (Debian's, driven by Playwright) opens it
``--repeats`` times: the time from navigation to the first step drawn, and to another step drawn
after a click (its episodes decoded on demand). Prints the medians and the page's size;
``--json`` writes the record (``turnrl.bench.record``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from turnrl.bench.record import emit  # noqa: E402
from turnrl.runs.store import rollout_steps, step_path  # noqa: E402
from turnrl.runs.view import build_view  # noqa: E402


def source_run(tmp: Path, source: Path | None) -> Path:
    """A run dir that kept at least one training step: ``source``, or a one-step ``make train`` run."""
    if source is not None:
        return source
    out = tmp / "source"
    cmd = [sys.executable, "-m", "turnrl.train", "trainer.steps=1", "trainer.eval_every=1", "trainer.progress=false",
           f"hydra.run.dir={out}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the source run failed (exit {done.returncode}): {done.stderr[-3000:]}")
    return out


def long_run(tmp: Path, source: Path, steps: int, episodes: int) -> Path:
    """A run dir holding ``steps`` training steps of ``episodes`` real episodes each."""
    first = rollout_steps(source)[0]
    lines = gzip.decompress(step_path(source, "train", first).read_bytes()).decode().splitlines()
    records = [json.loads(line) for line in lines if line]
    records = (records * (episodes // len(records) + 1))[:episodes]
    run = tmp / "long"
    folder = step_path(run, "train", 1).parent
    folder.mkdir(parents=True)
    for step in range(1, steps + 1):
        text = "".join(json.dumps({**r, "step": step, "index": i}, separators=(",", ":")) + "\n"
                       for i, r in enumerate(records))
        step_path(run, "train", step).write_bytes(gzip.compress(text.encode(), compresslevel=1))
    if (source / "config.yaml").is_file():
        shutil.copy(source / "config.yaml", run / "config.yaml")
    return run


def load_times(page: Path, repeats: int, chromium: str) -> tuple[list[float], list[float]]:
    """Seconds from navigation to the first step drawn, and from a click to another step drawn."""
    from playwright.sync_api import sync_playwright

    first, other = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        for _ in range(repeats):
            tab = browser.new_page(viewport={"width": 1400, "height": 1000})
            start = time.perf_counter()
            tab.goto(f"file://{page}")
            tab.wait_for_selector("body[data-rendered]", timeout=120_000)
            first.append(time.perf_counter() - start)
            before = tab.get_attribute("body", "data-rendered")
            start = time.perf_counter()
            tab.click("#prev")
            tab.wait_for_function(f"document.body.dataset.rendered !== '{before}'")
            other.append(time.perf_counter() - start)
            tab.close()
        browser.close()
    return first, other


def run(args) -> dict:
    chromium = args.chromium or shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium on PATH: apt-get install chromium, or pass --chromium PATH")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        print("  the source run ...", flush=True)
        run_dir = long_run(tmp, source_run(tmp, args.source), args.steps, args.episodes)
        start = time.perf_counter()
        page = build_view(run_dir)
        build_s = time.perf_counter() - start
        print("  loading in chromium ...", flush=True)
        first, other = load_times(page, args.repeats, chromium)
        size = page.stat().st_size
    return {"setup": {"steps": args.steps, "episodes": args.episodes, "repeats": args.repeats,
                      "source": str(args.source) if args.source else "make train, 1 step"},
            "page_mib": size / 2**20, "build_s": build_s, "first_step_s": statistics.median(first),
            "other_step_s": statistics.median(other), "first_step_runs": first, "other_step_runs": other}


def print_table(result: dict) -> None:
    s = result["setup"]
    print(f"view.html of {s['steps']} steps x {s['episodes']} episodes: {result['page_mib']:.1f} MiB, built in "
          f"{result['build_s']:.1f} s")
    print(f"opens (first step drawn) in {result['first_step_s']:.2f} s, another step in {result['other_step_s']:.2f} s "
          f"(medians of {s['repeats']} loads in Chromium)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--source", type=Path, default=None, help="a run dir that kept rollouts (default: train one)")
    parser.add_argument("--chromium", default=None, help="the chromium binary (default: chromium on PATH)")
    parser.add_argument("--json", default=None, help="also write the record to this file")
    args = parser.parse_args(argv)
    if args.steps < 2 or args.episodes < 1 or args.repeats < 1:
        parser.error("--steps must be >= 2, --episodes and --repeats >= 1")
    emit(run(args), print_table, args.json)


if __name__ == "__main__":
    main()
