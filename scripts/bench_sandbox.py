"""Sandboxed tool calls per second: bare ``python3 -c`` subprocesses against the bubblewrap
sandbox started per call (``pool="off"``) and its warm pools (``pool="call"``, ``"episode"``,
``"recycle"``).

    .venv/bin/python scripts/bench_sandbox.py [--snippets 200] [--concurrency 16] [--repeats 3] [--json out.json]

``--snippets`` small programs (``print(1)``, and every tenth a slightly bigger one: a loop, a
sort, JSON, a file written and read back), grouped into episodes of ``--episode-calls``
consecutive calls (one sandbox session each, closed at its end, as an env does). Each side runs
them sequentially (one call at a time) and concurrently (``--concurrency`` episodes in flight,
the calls of one episode one after another): the sandbox sides through the ``run_python`` tool
(``SandboxExecutor.arun``, default ``Limits``, ``max_concurrency=--concurrency``), the bare
side as ``/usr/bin/python3 -c CODE`` subprocesses with their output captured. Sides alternate,
after one warm-up round; the median calls per second over ``--repeats`` rounds is kept, with
the 95% bootstrap interval of the mean (``turnrl.bench.stats.bootstrap_ci``). Every call's
output is checked: a wrong one stops the run. Printed: versions, the memory bound, and calls/s
of each side with its ratio to bare subprocesses.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from turnrl.bench.record import emit  # noqa: E402
from turnrl.bench.stats import bootstrap_ci  # noqa: E402
from turnrl.tools import ToolCall, run_python, run_sync  # noqa: E402
from turnrl.tools.executors import Limits, SandboxExecutor  # noqa: E402

PYTHON = "/usr/bin/python3"
SIDES = ("bare", "off", "call", "episode", "recycle")
BIGGER = [
    ("total = 0\nfor i in range(20000):\n    total += i * i\nprint(total)", str(sum(i * i for i in range(20000)))),
    ("import random\nrandom.seed(0)\nxs = sorted(random.random() for _ in range(5000))\nprint(xs == sorted(xs))", "True"),
    ("import json\nprint(json.dumps({'a': [1, 2, 3], 'b': {'c': None}}, sort_keys=True))",
     '{"a": [1, 2, 3], "b": {"c": null}}'),
    ("with open('notes.txt', 'w') as f:\n    f.write('hello ' * 100)\nprint(len(open('notes.txt').read()))", "600"),
]


def snippets(n: int) -> list[tuple[str, str]]:
    """``n`` (code, expected stdout) pairs: ``print(1)``, every tenth a bigger program."""
    return [BIGGER[(i // 10) % len(BIGGER)] if i % 10 == 9 else ("print(1)", "1") for i in range(n)]


async def bare_call(code: str) -> str:
    proc = await asyncio.create_subprocess_exec(PYTHON, "-c", code, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                cwd="/tmp", env={"PATH": "/usr/bin:/bin"})
    out, err = await proc.communicate()
    return f"Exit code: {proc.returncode}\nstdout:\n{out.decode().rstrip()}" + (f"\nstderr:\n{err.decode()}" if err else "")


async def sandbox_call(executor: SandboxExecutor, code: str, session: str) -> str:
    return (await executor.arun(run_python, ToolCall("run_python", {"code": code}), session)).content


async def play(side: str, executor: SandboxExecutor | None, episodes: list[list[tuple[str, str]]], in_flight: int,
               tag: str) -> float:
    """Run every episode, ``in_flight`` at a time; calls per second. Raises on a wrong output."""
    queue: asyncio.Queue = asyncio.Queue()
    for index, episode in enumerate(episodes):
        queue.put_nowait((f"{tag}-{index}", episode))

    async def worker() -> None:
        while not queue.empty():
            session, episode = queue.get_nowait()
            try:
                for code, expected in episode:
                    got = await (bare_call(code) if executor is None else sandbox_call(executor, code, session))
                    if got != f"Exit code: 0\nstdout:\n{expected}":
                        raise RuntimeError(f"{side}: {code!r} gave {got!r}, expected {expected!r}")
            finally:
                if executor is not None:
                    executor.close_session(session)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return sum(len(e) for e in episodes) / (time.perf_counter() - start)


def versions() -> dict[str, str]:
    def first_line(cmd: list[str]) -> str:
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            return (done.stdout or done.stderr).strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            return "unknown"

    return {"host python": platform.python_version(), "sandbox python": first_line([PYTHON, "--version"]),
            "bubblewrap": first_line(["bwrap", "--version"]), "kernel": platform.release(),
            "cpus": str(len(os.sched_getaffinity(0)))}


def run(args) -> dict:
    programs = snippets(args.snippets)
    episodes = [programs[i:i + args.episode_calls] for i in range(0, len(programs), args.episode_calls)]
    executors: dict[str, SandboxExecutor | None] = {"bare": None}
    for side in args.sides:
        if side != "bare":
            executors[side] = SandboxExecutor(Limits(), max_concurrency=args.concurrency, pool=side,
                                              pool_size=args.pool_size)
    sides = [side for side in SIDES if side in args.sides]
    rates: dict[str, dict[str, list[float]]] = {side: {"sequential": [], "concurrent": []} for side in sides}
    try:
        for repeat in range(args.repeats + 1):  # the first round warms up
            for side in sides:
                for how, in_flight in (("sequential", 1), ("concurrent", args.concurrency)):
                    rate = run_sync(play(side, executors[side], episodes, in_flight, f"{repeat}-{how}"))
                    if repeat:
                        rates[side][how].append(rate)
            print(f"  round {repeat}{' (warm-up)' if repeat == 0 else ''} done", flush=True)
        memory_mode = next((ex.memory_mode for ex in executors.values() if ex is not None), "")
        pools = {side: {"started": ex.pool.started, "recycled": ex.pool.recycled}
                 for side, ex in executors.items() if ex is not None and ex.pool is not None}
    finally:
        for ex in executors.values():
            if ex is not None:
                ex.close()
    rows = {}
    for side in sides:
        row = {}
        for how, values in rates[side].items():
            interval = bootstrap_ci(values)
            row[how] = {"median": statistics.median(values), "mean": interval.mean, "low": interval.low,
                        "high": interval.high, "rounds": values}
        rows[side] = row
    if "bare" in rows:
        for side, row in rows.items():
            for how in ("sequential", "concurrent"):
                row[how]["vs_bare"] = row[how]["median"] / rows["bare"][how]["median"]
    setup = {"snippets": args.snippets, "episode_calls": args.episode_calls, "concurrency": args.concurrency,
             "pool_size": args.pool_size, "repeats": args.repeats, "memory_mode": memory_mode, **versions()}
    return {"setup": setup, "rows": rows, "pools": pools}


LABELS = {"bare": "bare python3 -c subprocess", "off": "sandbox, cold (pool=off)",
          "call": "sandbox, warm per call (pool=call)", "episode": "sandbox, warm per episode (pool=episode)",
          "recycle": "sandbox, warm, recycled (pool=recycle)"}


def print_table(result: dict) -> None:
    s = result["setup"]
    print(f"sandboxed tool calls: {s['snippets']} snippets in episodes of {s['episode_calls']} calls, "
          f"{s['concurrency']} episodes in flight when concurrent, pool_size {s['pool_size']}, median of "
          f"{s['repeats']} rounds; {s['cpus']} CPUs, host python {s['host python']}, sandbox {s['sandbox python']}, "
          f"{s['bubblewrap']}, kernel {s['kernel']}, memory bound: {s['memory_mode']}")
    print(f"{'side':<42} {'sequential calls/s':>19} {'vs bare':>8} {'concurrent calls/s':>19} {'vs bare':>8}")
    for side, row in result["rows"].items():
        cells = []
        for how in ("sequential", "concurrent"):
            cells.append(f"{row[how]['median']:>19.1f}")
            cells.append(f"{row[how]['vs_bare']:>7.2f}x" if "vs_bare" in row[how] else f"{'':>8}")
        print(f"{LABELS[side]:<42} {' '.join(cells)}")
    print("warm sandboxes over all rounds: " + "; ".join(
        f"{side} {p['started']} started, {p['recycled']} recycled" for side, p in result["pools"].items()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snippets", type=int, default=200, help="programs per side and round")
    parser.add_argument("--episode-calls", type=int, default=8, help="calls per episode (sandbox session)")
    parser.add_argument("--concurrency", type=int, default=16, help="episodes in flight in the concurrent runs")
    parser.add_argument("--pool-size", type=int, default=4, help="fresh warm sandboxes kept started")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per side, after a warm-up round")
    parser.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated, of {','.join(SIDES)}")
    parser.add_argument("--json", default=None, help="also write the result to this file")
    args = parser.parse_args(argv)
    args.sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if min(args.snippets, args.episode_calls, args.concurrency, args.repeats) < 1 or args.pool_size < 0:
        parser.error("--snippets, --episode-calls, --concurrency and --repeats must be >= 1, --pool-size >= 0")
    if not args.sides or set(args.sides) - set(SIDES):
        parser.error(f"--sides must name some of {SIDES}, got {args.sides}")
    emit(run(args), print_table, args.json)


if __name__ == "__main__":
    main()
