"""Load and faults, run against the real parts on loopback: one table, a JSON record, a docs page.

    python scripts/reliability_report.py                    # every case, full size (about 6 min on 2 busy cores)
    python scripts/reliability_report.py --quick            # 32 sessions x 5 s, shorter runs
    python scripts/reliability_report.py --cases tools,hostile_clients --quick --json out.json --markdown out.md

A full run of every case writes docs/reliability/record.json and docs/reliability.md; a run
with --quick or --cases writes to outputs/reliability/ unless --json / --markdown say where.

Cases (``CASES``; each bounded in count and time, every server on 127.0.0.1):

* ``load``: N concurrent ``RemoteEnv`` sessions against a ``serve-env`` subprocess for D seconds,
  each playing GuessNumber episodes with a scripted player; every transcript is replayed on a
  local env with the same seed and actions and must be equal (no lost or crossed episode).
* ``server_restart``: ``python -m turnrl.train env=remote`` while its ``serve-env`` is SIGKILLed
  at step k and restarted on the same port seconds later: the run completes, the steps of the
  outage count ``env_error_rate``, the steps after it are clean and use the new server.
* ``flaky_env``: runs whose env's reset and step raise part of the time, whose every step
  raises, whose every reset raises once RL begins: each completes, counts
  ``infra_failure_rate``, and the last two leave the weights as they were.
* ``tools``: an env with a hanging, a raising, a 10 MB and an unavailable tool, rolled out by the
  collector in a subprocess: each episode's termination and message, and how fast the process
  exits with the hung tool's thread still blocked.
* ``checkpoint_kill``: runs SIGKILLed while writing a later and their first checkpoint,
  resumed with ``trainer.resume=true``: their metrics and weights equal an uninterrupted run's.
* ``nan``: a run whose env returns NaN rewards, and a learner batch with a NaN advantage: the
  weights stay finite, ``nonfinite_updates`` / ``skipped_updates`` count the skipped step.
* ``hostile_clients``: requests a client must not get away with (execution kwargs, a short body,
  a bad ``Content-Length``, 100k-deep JSON, a 5,000-digit seed, 50 idle connections) against a
  ``serve-env`` subprocess: each refused or dropped, and the server still answers ``/health``.

Progress (one line as each case starts and ends, a few within) goes to stderr; the table to
stdout. The exit status is 1 when any case failed. Subprocesses of this script run it again with
``--worker NAME`` (the training runs, the tool rollouts, the load clients).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import random
import re
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve()
if str(ROOT) not in sys.path:  # the package, when it is not installed
    sys.path.insert(1, str(ROOT))

from turnrl.envs import GuessNumberEnv, MultiTurnEnv, TurnOutcome  # noqa: E402  (light: no torch)
from turnrl.tools import ToolUnavailableError, tool  # noqa: E402

GUESS = "turnrl/GuessNumber-v0"
MODULE = "reliability_report"  # this file as the workers import it (scripts/ on their path)
DEFAULT_JSON = ROOT / "docs" / "reliability" / "record.json"
DEFAULT_MARKDOWN = ROOT / "docs" / "reliability.md"
QUICK_OUT = ROOT / "outputs" / "reliability"
TIMING = ("step_time", "rollout_time", "rollout_wait")  # wall-clock metrics: the only ones that may differ


# ============================================================ envs the cases use
class FlakyGuessNumber(GuessNumberEnv):
    """GuessNumber whose ``reset`` raises with probability ``p_reset`` and ``step`` with
    ``p_step`` (an RNG of its own per instance, so the failures do not move the task draws)."""

    _made = 0
    armed = False
    """Set when RL begins (``train_worker``); an env made with ``in_rl_only`` fails only after that."""

    def __init__(self, p_reset: float = 0.3, p_step: float = 0.3, in_rl_only: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        FlakyGuessNumber._made += 1
        self.p_reset, self.p_step, self.in_rl_only = p_reset, p_step, in_rl_only
        self.failures = random.Random(FlakyGuessNumber._made)

    def _fails(self, p: float) -> bool:
        return (FlakyGuessNumber.armed or not self.in_rl_only) and self.failures.random() < p

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if self._fails(self.p_reset):
            raise RuntimeError("flaky env: reset failed")
        return super().reset(seed=seed, options=options)

    def step(self, action: str):
        if self._fails(self.p_step):
            raise RuntimeError("flaky env: step failed")
        return super().step(action)


class NanRewardGuessNumber(GuessNumberEnv):
    """GuessNumber whose ``step`` returns a NaN reward with probability ``p_nan``."""

    _made = 0

    def __init__(self, p_nan: float = 0.3, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        NanRewardGuessNumber._made += 1
        self.p_nan = p_nan
        self.draws = random.Random(1000 + NanRewardGuessNumber._made)

    def step(self, action: str):
        obs, reward, terminated, truncated, info = super().step(action)
        if self.draws.random() < self.p_nan:
            reward = float("nan")
        return obs, reward, terminated, truncated, info


FLOOD_CHARS = 10_000_000


@tool
def hang(query: str) -> str:
    """Ask a service that never answers.

    Args:
        query: What to ask.
    """
    threading.Event().wait()  # forever: only the executor's timeout ends the call
    return query


@tool
def explode(query: str) -> str:
    """A tool that refuses every input.

    Args:
        query: What to ask.
    """
    raise ValueError(f"explode cannot handle {query!r}")


@tool
def flood(query: str) -> str:
    """A tool whose answer is 10 MB of text.

    Args:
        query: What to ask.
    """
    return "x" * FLOOD_CHARS


@tool
def down(query: str) -> str:
    """A tool whose backend is gone.

    Args:
        query: What to ask.
    """
    raise ToolUnavailableError("down", "its backend is gone")


TOOL_CASES = ("hang", "explode", "flood", "down")


class ToolFaultsEnv(MultiTurnEnv):
    """Each task names one tool to call (``TOOL_CASES[seed % 4]``); a turn after the call that
    says ``done`` ends the episode with reward 1."""

    tools = (hang, explode, flood, down)
    default_max_turns = 3

    _seed: int | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self._seed = seed
        return super().reset(seed=seed, options=options)

    def _new_task(self, rng, split):
        index = self._seed if self._seed is not None else int(rng.integers(len(TOOL_CASES)))
        return TOOL_CASES[index % len(TOOL_CASES)]

    def _task_id(self, task):
        return task

    def _start_episode(self, task):
        return [{"role": "user", "content": f"Call the tool {task} once, then reply done."}]

    def _on_turn(self, action, parse, tool_results):
        if tool_results:
            return TurnOutcome()
        done = "done" in action
        return TurnOutcome(reward=float(done), terminated=done, success=done)

    def _state_key(self):
        return None


# ============================================================ results
@dataclass
class Result:
    """One case's outcome: a line of the table and its figures."""

    name: str
    happened: str = ""
    figure: str = ""
    checks: list[dict] = field(default_factory=list)
    figures: dict = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None

    def check(self, what: str, ok: bool) -> bool:
        self.checks.append({"check": what, "passed": bool(ok)})
        return bool(ok)

    @property
    def passed(self) -> bool:
        return self.error is None and bool(self.checks) and all(c["passed"] for c in self.checks)

    def record(self) -> dict:
        return {"case": self.name, "title": CASES[self.name].title, "what_it_does": CASES[self.name].what,
                "happened": self.happened, "figure": self.figure, "passed": self.passed,
                "seconds": round(self.seconds, 1), "checks": self.checks, "figures": self.figures,
                "error": self.error}


class Progress:
    """Progress lines on stderr: what is happening, and the time since the report began."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.case = ""

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def __call__(self, message: str) -> None:
        print(f"[{self.elapsed():6.1f} s] {self.case}: {message}", file=sys.stderr, flush=True)


# ============================================================ processes
def child_env(**extra: str) -> dict:
    path = os.pathsep.join([str(ROOT), str(SCRIPT.parent), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path, **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_env(env_id: str, *args: str, timeout_s: float = 60.0) -> tuple[subprocess.Popen, str]:
    """Start ``python -m turnrl serve-env ENV_ID ARGS`` on loopback; ``(process, url)`` once it
    prints its address (its stderr goes to a temporary file, read on failure)."""
    err = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "turnrl", "serve-env", env_id, *args], cwd=ROOT, env=child_env(),
                            stdout=subprocess.PIPE, stderr=err, text=True)
    proc.stderr_file = err  # type: ignore[attr-defined]
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    line = ""
    while time.monotonic() < deadline and proc.poll() is None:
        if sel.select(timeout=0.2):
            line = proc.stdout.readline()
            break
    sel.close()
    match = re.search(r"at (http://[\d.]+:\d+)", line)
    if match is None:
        proc.kill()
        proc.wait(10)
        err.seek(0)
        raise RuntimeError(f"serve-env did not start (printed {line!r}): {err.read().decode()[-2000:]}")
    return proc, match.group(1)


def stop(proc: subprocess.Popen | None, sig: int = signal.SIGKILL) -> None:
    """Signal one process this script started, and reap it."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=15)


def start_worker(name: str, args: dict, out: Path) -> subprocess.Popen:
    log = open(out.with_suffix(".log"), "wb")
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--worker", name, json.dumps(args), str(out)], cwd=ROOT,
                            env=child_env(), stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return proc


def finish_workers(workers: dict[str, tuple[subprocess.Popen, str, Path]], timeout_s: float = 600) -> dict[str, dict]:
    """Wait for every ``label -> (process, worker name, out)`` (all within ``timeout_s``); their
    results. Whatever happens, none is left running."""
    deadline = time.monotonic() + timeout_s
    try:
        for proc, _, _ in workers.values():
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stop(proc)
        return {label: finish_worker(proc, name, out) for label, (proc, name, out) in workers.items()}
    finally:
        for proc, _, _ in workers.values():
            stop(proc)


def finish_worker(proc: subprocess.Popen, name: str, out: Path) -> dict:
    if proc.returncode != 0 or not out.exists():
        tail = out.with_suffix(".log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"worker {name} exited with {proc.returncode}: {tail}")
    return json.loads(out.read_text())


def train_steps(run_dir: Path) -> list[dict]:
    """The train rows of ``run_dir/metrics.jsonl`` written so far (a half-written last line skipped)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("kind") == "train":
            rows.append(row)
    return rows


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> tuple[float, float]:
    """``(busy, total)`` CPU jiffies of the whole machine so far (``/proc/stat``)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return float(sum(values) - idle), float(sum(values))


def thread_count(pid: int) -> int:
    match = re.search(r"^Threads:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.M)
    return int(match.group(1)) if match else -1


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


# ============================================================ case 1: load
LOAD_N, LOAD_MAX_TURNS = 1024, 10  # GuessNumber(n=1024): 1024 secrets per upper bound, bisection in 10 turns


def load_player(message: str, n: int, rng) -> str:
    """The scripted player: bisection of the interval the last hint states, a random guess
    (15%) or no number at all (5%)."""
    draw = rng.random()
    if draw < 0.05:
        return "no idea"
    if draw < 0.2:
        return str(int(rng.integers(1, n + 1)))
    found = re.findall(r"between (\d+) and (\d+)", message)
    lo, hi = map(int, found[-1]) if found else (1, n)
    return str((lo + hi) // 2)


def load_worker(args: dict) -> dict:
    """Client process of the load case: ``count`` sessions, one thread each, from ``start_at``
    for ``seconds``; then every transcript replayed on a local env."""
    import gymnasium
    import numpy as np

    from turnrl.envs.remote import RemoteEnv

    url, first, count = args["url"], args["first"], args["count"]
    envs = [RemoteEnv(url, GUESS, timeout_s=120, retries=0, max_turns=LOAD_MAX_TURNS) for _ in range(count)]
    for env in envs:
        assert env.max_turns == LOAD_MAX_TURNS  # opens the session before the clock starts
    episodes: list[list] = [[] for _ in range(count)]
    latencies: list[list[float]] = [[] for _ in range(count)]
    errors: list[str] = []
    Path(args["ready"]).write_text("ready")  # sessions open: wait for the parent's start time
    go, waited = Path(args["go"]), time.monotonic()
    while not go.exists() and time.monotonic() - waited < 600:
        time.sleep(0.01)
    start_at = float(go.read_text())
    end_at = start_at + args["seconds"]
    hard_end = end_at + 60  # no episode runs on past this, whatever the server does

    def play(i: int) -> None:
        env, lat, sid = envs[i], latencies[i], first + i
        e = 0
        while time.time() < end_at:
            seed, split = sid * 100_000 + e, "test" if e % 4 == 3 else "train"
            e += 1
            rng = np.random.default_rng(seed)
            try:
                t = time.perf_counter()
                reset = env.reset(seed=seed, options={"split": split})
                lat.append(time.perf_counter() - t)
                steps, obs = [], reset[0]
                while time.time() < hard_end:
                    action = load_player(obs[-1]["content"], LOAD_N, rng)
                    t = time.perf_counter()
                    result = env.step(action)
                    lat.append(time.perf_counter() - t)
                    steps.append((action, result))
                    obs = result[0]
                    if result[2] or result[3]:
                        break
                episodes[i].append((seed, split, reset, steps, None))
            except Exception as exc:  # a lost episode
                episodes[i].append((seed, split, None, [], repr(exc)))
                errors.append(repr(exc)[:300])

    time.sleep(max(0.0, start_at - time.time()))
    cpu0, t0 = time.process_time(), time.time()
    threads = [threading.Thread(target=play, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1.0, hard_end + 30 - time.time()))
    wall, cpu = time.time() - t0, time.process_time() - cpu0
    stuck = sum(t.is_alive() for t in threads)
    for env in envs:
        env.close()
    # replay every transcript on a local env: same seed, same actions, same everything
    local = gymnasium.make(GUESS, disable_env_checker=True, n=LOAD_N, max_turns=LOAD_MAX_TURNS)
    played = lost = mismatched = steps_total = 0
    examples = []
    for per_session in episodes:
        for seed, split, reset, steps, error in per_session:
            if error is not None:
                lost += 1
                continue
            played += 1
            steps_total += len(steps)
            same = local.reset(seed=seed, options={"split": split}) == reset
            for action, result in steps:
                same = same and local.step(action) == result
            if not same:
                mismatched += 1
                if len(examples) < 3:
                    examples.append({"seed": seed, "split": split})
    return {"latencies": [x for lat in latencies for x in lat], "episodes": played, "lost": lost,
            "mismatched": mismatched, "mismatch_examples": examples, "steps": steps_total, "errors": errors[:5],
            "wall": wall, "cpu": cpu, "stuck_threads": stuck}


def case_load(res: Result, opts, progress: Progress, tmp: Path) -> None:
    sessions, seconds, procs = opts.sessions, opts.seconds, opts.client_procs
    server, url = serve_env(GUESS, f"--kwarg=n={LOAD_N}", "--max-sessions", str(sessions + 64))
    workers: list[tuple[subprocess.Popen, Path]] = []
    try:
        progress(f"serve-env pid {server.pid} at {url}; {procs} client process(es) opening {sessions} sessions")
        shares = [sessions // procs + (i < sessions % procs) for i in range(procs)]
        first, go = 0, tmp / "go"
        for i, count in enumerate(shares):
            args = {"url": url, "first": first, "count": count, "seconds": seconds, "ready": str(tmp / f"ready{i}"),
                    "go": str(go)}
            workers.append((start_worker("load", args, tmp / f"load{i}.json"), tmp / f"load{i}.json"))
            first += count
        deadline = time.monotonic() + 300
        while not all((tmp / f"ready{i}").exists() for i in range(procs)):
            if time.monotonic() > deadline or any(p.poll() is not None for p, _ in workers):
                raise RuntimeError("the client processes did not open their sessions: " + " | ".join(
                    out.with_suffix(".log").read_text(errors="replace")[-1000:] for _, out in workers))
            time.sleep(0.05)
        start_at = time.time() + 0.5
        (tmp / "go.tmp").write_text(repr(start_at))
        os.replace(tmp / "go.tmp", go)
        time.sleep(max(0.0, start_at - time.time()))
        cpu0, t0, busy0 = cpu_seconds(server.pid), time.monotonic(), machine_busy()
        progress(f"{sessions} sessions playing for {seconds:g} s")
        time.sleep(seconds)
        server_cpu = (cpu_seconds(server.pid) - cpu0) / (time.monotonic() - t0)
        busy1 = machine_busy()
        machine_cpu = (busy1[0] - busy0[0]) / max(busy1[1] - busy0[1], 1.0) * (os.cpu_count() or 1)
        server_threads = thread_count(server.pid)
        progress("window over: sessions finish their episodes, then every transcript is replayed locally")
        outs = []
        for proc, out in workers:
            try:
                proc.wait(timeout=seconds + 300)
            except subprocess.TimeoutExpired:
                stop(proc)
            outs.append(finish_worker(proc, "load", out))
        import httpx

        left = httpx.get(f"{url}/info", timeout=10).json()["sessions"]
        health = httpx.get(f"{url}/health", timeout=10).status_code
    finally:
        for proc, _ in workers:
            stop(proc)
        stop(server, signal.SIGTERM)
    latencies = [x for o in outs for x in o["latencies"]]
    wall = max(o["wall"] for o in outs)
    requests = len(latencies)
    episodes, lost = sum(o["episodes"] for o in outs), sum(o["lost"] for o in outs)
    mismatched = sum(o["mismatched"] for o in outs)
    client_cpu = sum(o["cpu"] for o in outs) / wall
    rps, p50, p99 = requests / wall, 1000 * percentile(latencies, 50), 1000 * percentile(latencies, 99)
    server_ms, client_ms = 1000 * server_cpu / rps, 1000 * client_cpu / rps
    other_cpu = max(0.0, machine_cpu - server_cpu - client_cpu)
    cores = os.cpu_count() or 1
    if server_cpu >= 0.85:
        bottleneck = "the server (one Python process: one core at most)"
    elif other_cpu >= 0.25 * cores:
        bottleneck = (f"the machine: other work took {other_cpu:.2f} of its {cores} cores, and RemoteEnv spends "
                      f"{client_ms / server_ms:.1f}x the server's CPU per request")
    elif client_ms > server_ms and server_cpu + client_cpu >= 0.6 * cores:
        bottleneck = (f"the clients: RemoteEnv spends {client_ms / server_ms:.1f}x the server's CPU per request, "
                      f"and the {cores} cores are shared")
    else:
        bottleneck = "neither process's CPU (the cores are shared with other work)"
    res.figures.update(sessions=sessions, seconds=seconds, client_processes=procs, requests=requests,
                       wall_s=round(wall, 2), req_per_s=round(rps, 1), p50_ms=round(p50, 1), p99_ms=round(p99, 1),
                       max_ms=round(1000 * max(latencies, default=0), 1), episodes=episodes,
                       steps=sum(o["steps"] for o in outs), lost_episodes=lost, mismatched_episodes=mismatched,
                       mismatch_examples=[e for o in outs for e in o["mismatch_examples"]],
                       errors=[e for o in outs for e in o["errors"]][:5],
                       server_cpu_cores=round(server_cpu, 2), client_cpu_cores=round(client_cpu, 2),
                       server_cpu_ms_per_request=round(server_ms, 3), client_cpu_ms_per_request=round(client_ms, 3),
                       other_processes_cpu_cores=round(other_cpu, 2),
                       server_threads=server_threads, sessions_left_open=left,
                       stuck_client_threads=sum(o["stuck_threads"] for o in outs))
    res.check("every episode completed (none lost)", lost == 0 and episodes > 0)
    res.check("every transcript equals the local env's for its seed and actions", mismatched == 0)
    res.check("every session was closed on the server", left == 0)
    res.check("the server answers /health after the load", health == 200)
    res.check("no client thread hung", res.figures["stuck_client_threads"] == 0)
    res.happened = (f"{sessions} sessions x {seconds:g} s: {episodes} episodes, {requests} requests; "
                    f"{lost} lost, {mismatched} differ from the local env; CPU per request: server "
                    f"{server_ms:.2f} ms, clients {client_ms:.2f} ms")
    res.figure = f"{rps:,.0f} req/s, p50 {p50:.0f} ms, p99 {p99:.0f} ms"
    res.figures["bottleneck"] = bottleneck


# ============================================================ case 2: server restart
def case_server_restart(res: Result, opts, progress: Progress, tmp: Path) -> None:
    port, kill_at, down_s, steps = free_port(), opts.kill_step, opts.down_seconds, opts.restart_steps
    run_dir = tmp / "restart_run"
    server, url = serve_env(GUESS, "--port", str(port))
    command = [sys.executable, "-m", "turnrl.train", "env=remote", f"env.url={url}", f"env.id={GUESS}",
               f"trainer.steps={steps}", "trainer.tasks_per_step=2", "trainer.group_size=4",
               "trainer.eval_episodes=4", "trainer.eval_every=1000", "trainer.threads=1", "trainer.progress=false",
               "trainer.tensorboard=false", "trainer.save_checkpoint=false", "agent.warmstart.steps=0",
               "agent.tokenizer.corpus_episodes=10", "agent.max_new_tokens=6", f"hydra.run.dir={run_dir}"]
    res.figures["command"] = " ".join(shlex.quote(a) for a in ["python", *command[1:]])
    log = open(tmp / "restart_train.log", "wb")
    train = subprocess.Popen(command, cwd=ROOT, env=child_env(), stdout=log, stderr=subprocess.STDOUT)
    new_server = None
    started = time.monotonic()
    try:
        progress(f"training {steps} steps against serve-env at {url}; kill -9 once step {kill_at} is logged")
        deadline = started + 300
        while len(train_steps(run_dir)) < kill_at:
            if train.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the run ended or stalled before step {kill_at} "
                                   f"(exit {train.poll()}): {(tmp / 'restart_train.log').read_text()[-2000:]}")
            time.sleep(0.02)
        server.kill()
        server.wait(10)
        killed_after = len(train_steps(run_dir))
        progress(f"serve-env SIGKILLed after step {killed_after}; restarting it on port {port} in {down_s:g} s")
        time.sleep(down_s)
        new_server, new_url = serve_env(GUESS, "--port", str(port))
        restarted_after = len(train_steps(run_dir))
        progress(f"serve-env restarted ({new_url}) while step {restarted_after + 1} ran; waiting for the run to end")
        import httpx

        most_sessions = 0
        while train.poll() is None and time.monotonic() < deadline:
            try:
                most_sessions = max(most_sessions, httpx.get(f"{new_url}/info", timeout=5).json()["sessions"])
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        if train.poll() is None:
            stop(train)
        code = train.returncode
    finally:
        stop(train)
        log.close()
        stop(server)
        stop(new_server, signal.SIGTERM)
    rows = train_steps(run_dir)
    crash = None
    if code != 0:  # the exception that ended the run, and where
        text = (tmp / "restart_train.log").read_text(errors="replace")
        errors = re.findall(r"^(\w+(?:Error|Exception): .*)$", text, re.M)
        frames = re.findall(r'File "([^"]+)", line (\d+)', text)
        crash = (errors[-1][:200] if errors else "no exception in the log") + (
            f" (at {Path(frames[-1][0]).name}:{frames[-1][1]})" if frames else "")
    rates = {r["step"]: r["env_error_rate"] for r in rows}
    infra = {r["step"]: r["infra_failure_rate"] for r in rows}
    affected = [s for s, v in rates.items() if v > 0]
    after = [s for s in rates if s > restarted_after + 1]
    res.figures.update(steps=steps, killed_after_step=killed_after, down_s=down_s,
                       restarted_after_step=restarted_after, exit_code=code, env_error_rate=rates,
                       infra_failure_rate=infra, affected_steps=affected, clean_steps_after_restart=after,
                       new_server_most_sessions=most_sessions, run_s=round(time.monotonic() - started, 1),
                       crash=crash)
    res.check("the run exits 0", code == 0)
    res.check("the run logged every step", sorted(rates) == list(range(1, steps + 1)))
    res.check("the steps before the kill had no env error", all(rates[s] == 0 for s in rates if s <= killed_after))
    res.check("a step during the outage counts env_error_rate > 0 (and infra_failure_rate)",
              bool(affected) and all(infra[s] >= rates[s] for s in affected))
    res.check("the outage's steps lie between the kill and the restart",
              all(killed_after < s <= restarted_after + 1 for s in affected))
    res.check("at least 2 steps after the restart, all with env_error_rate 0",
              len(after) >= 2 and all(rates[s] == 0 for s in after))
    res.check("the steps after the restart opened sessions on the new server", most_sessions > 0)
    res.happened = (f"server killed after step {killed_after}, back {down_s:g} s later (after step "
                    f"{restarted_after}); run exit {code}" + (f" ({crash})" if crash else "")
                    + (f"; steps {affected} had env errors" if affected else "; no step with env errors logged")
                    + f", {len(after)} later steps clean")
    if code != 0:
        res.figure = f"run exited {code} in step {max(rates, default=0) + 1}"
    elif affected:
        res.figure = (f"env_error_rate {', '.join(f'{rates[s]:.2f}' for s in affected)} in steps "
                      f"{affected[0]}-{affected[-1]}, then 0")
    else:
        res.figure = "no step affected"


# ============================================================ training workers
def tiny_config(**overrides: Any):
    """A small CPU run (the tiny model, a short warm start, few tasks) with ``overrides`` (dotted keys)."""
    from omegaconf import OmegaConf

    from turnrl.conf.schema import Config

    cfg = OmegaConf.structured(Config)
    cfg.agent.max_new_tokens = 6
    cfg.agent.warmstart.steps = 10
    cfg.agent.tokenizer.corpus_episodes = 20
    cfg.trainer.update(dict(steps=3, tasks_per_step=2, group_size=4, eval_episodes=4, eval_every=1000, threads=1,
                            env_workers=1, progress=False, tensorboard=False, save_checkpoint=False))
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    return cfg


def custom_env(cls: type, **kwargs: Any) -> dict:
    return {"env.id": None, "env._target_": f"{MODULE}.{cls.__name__}", "env.kwargs": kwargs}


def weights_report(model, start: dict | None = None) -> dict:
    import torch

    params = dict(model.named_parameters())
    out = {"parameters": len(params), "finite": all(bool(torch.isfinite(p).all()) for p in params.values())}
    if start is not None:
        out["moved"] = sorted(n for n, p in params.items() if not torch.equal(p, start[n]))
    return out


def train_worker(args: dict) -> dict:
    """One training run in this process: ``args["overrides"]`` on ``tiny_config``; the train
    metrics, the weights (finite? which moved since RL began?), and the exception that ended
    the run, if one did."""
    import importlib
    import traceback

    from omegaconf import OmegaConf

    from turnrl.train.loop import train

    cfg = tiny_config(**args["overrides"])
    start: dict = {}

    def rl_starts(model) -> None:
        start.update({n: p.detach().clone() for n, p in model.named_parameters()})
        importlib.import_module(MODULE).FlakyGuessNumber.armed = True

    try:
        result = train(OmegaConf.to_object(cfg), args["run_dir"], on_rl_start=rl_starts)
    except Exception as exc:  # the run died: say where, and keep what it logged
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        return {"train": train_steps(Path(args["run_dir"])), "weights": None,
                "error": f"{type(exc).__name__}: {exc} (at {Path(frame.filename).name}:{frame.lineno})"}
    return {"train": result.train, "weights": weights_report(result.model, start), "error": None}


def case_flaky_env(res: Result, opts, progress: Progress, tmp: Path) -> None:
    steps = opts.train_steps
    runs = {
        "flaky": {**custom_env(FlakyGuessNumber, p_reset=0.1, p_step=0.15, n=16, max_turns=3), "trainer.steps": steps},
        "every_step": {**custom_env(FlakyGuessNumber, p_reset=0.0, p_step=1.0, n=16, max_turns=3),
                       "trainer.steps": 2},
        "every_reset": {**custom_env(FlakyGuessNumber, p_reset=1.0, p_step=0.0, in_rl_only=True, n=16, max_turns=3),
                        "trainer.steps": 2},
    }
    progress(f"three runs at once: reset raising 10% and step 15% of the time ({steps} steps); every step raising "
             "(2 steps); every reset raising once RL begins (2 steps)")
    procs = {name: start_worker("train", {"overrides": o, "run_dir": str(tmp / name)}, tmp / f"{name}.json")
             for name, o in runs.items()}
    outs = finish_workers({name: (proc, "train", tmp / f"{name}.json") for name, proc in procs.items()})
    for name, out in outs.items():
        rows = out["train"]
        res.figures[name] = {"steps_logged": len(rows), "error": out["error"],
                             "infra_failure_rate": [r["infra_failure_rate"] for r in rows],
                             "env_error_rate": [r["env_error_rate"] for r in rows],
                             "pg_loss": [r["pg_loss"] for r in rows], "grad_norm": [r["grad_norm"] for r in rows],
                             "weights_finite": out["weights"] and out["weights"]["finite"],
                             "tensors_moved": None if out["weights"] is None else len(out["weights"]["moved"]),
                             "tensors": None if out["weights"] is None else out["weights"]["parameters"]}
    flaky, every_step, every_reset = (res.figures[n] for n in runs)
    rates = flaky["infra_failure_rate"]
    mean_rate = sum(rates) / max(len(rates), 1)
    res.check(f"flaky: the run completes its {steps} steps", flaky["error"] is None and len(rates) == steps)
    res.check("flaky: its failed episodes are counted (0 < infra_failure_rate < 1)", 0 < mean_rate < 1)
    res.check("flaky: its losses and weights stay finite", bool(flaky["weights_finite"])
              and all(math.isfinite(x) for x in flaky["pg_loss"] + flaky["grad_norm"]))
    for name, figures in (("every step raising", every_step), ("every reset raising", every_reset)):
        res.check(f"{name}: the run completes", figures["error"] is None and figures["steps_logged"] == 2)
        res.check(f"{name}: every episode counted (infra_failure_rate 1.0)",
                  figures["infra_failure_rate"] == [1.0, 1.0])
        res.check(f"{name}: no weight moved (no gradient from failures)",
                  figures["tensors_moved"] == 0 and all(g == 0 for g in figures["grad_norm"]))

    def outcome(figures: dict) -> str:
        if figures["error"] is not None:
            return f"crashed after {figures['steps_logged']} step(s): {figures['error'][:160]}"
        return f"{figures['tensors_moved']} of {figures['tensors']} weight tensors moved"

    res.happened = (f"reset 10% / step 15% failing: {flaky['steps_logged']} of {steps} steps, infra_failure_rate "
                    f"{', '.join(f'{r:.2f}' for r in rates)}; every step failing: {outcome(every_step)}; every reset "
                    f"failing: {outcome(every_reset)}")
    res.figure = (f"infra_failure_rate {mean_rate:.2f} (mean); 1.00 -> "
                  + ("weights unchanged" if every_step["tensors_moved"] == 0 else "weights moved")
                  + ("" if every_reset["error"] is None else "; all-reset-failed step crashes"))


# ============================================================ case 4: tools
def tools_worker(args: dict) -> dict:
    """Roll out ``ToolFaultsEnv`` episodes (one per tool) with a scripted policy through the
    real collector; report each episode; the parent times this process's exit."""
    from turnrl.chat.renderer import ChatRenderer
    from turnrl.policies.sampling import Generation, SamplingParams
    from turnrl.chat.tokenizer import build_tokenizer
    from turnrl.rollout import RolloutCollector, Task
    from turnrl.rollout.metrics import rollout_metrics

    timeout = args["tool_timeout_s"]
    corpus = ["Call the tool hang once, then reply done.", "done", '<tool_call>{"name": "hang"}</tool_call>']
    tokenizer = build_tokenizer(corpus, vocab_size=400, max_number=9)
    renderer = ChatRenderer(tokenizer)

    class ScriptedCaller:
        """Calls the tool the prompt names on the first turn, says done on the next."""

        def generate(self, prompts, params):
            out = []
            for ids in prompts:
                text = tokenizer.decode(ids, skip_special_tokens=False)
                name = re.findall(r"Call the tool (\w+)", text)[-1]
                if text.count("<|im_start|>assistant") <= 1:
                    reply = f'<tool_call>{{"name": "{name}", "arguments": {{"query": "q"}}}}</tool_call>'
                else:
                    reply = "done"
                ids = tokenizer(reply, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                out.append(Generation(ids, [0.0] * len(ids), "stop"))
            return out

    def make():
        return ToolFaultsEnv(executor_options={"inprocess": {"timeout_s": timeout}})

    collector = RolloutCollector(make, ScriptedCaller(), renderer, max_context_tokens=1 << 20, env_workers=4)
    started = time.perf_counter()
    trajectories = collector.collect([Task(seed) for seed in range(len(TOOL_CASES))], 1,
                                     SamplingParams(max_new_tokens=64))
    seconds = time.perf_counter() - started
    collector.close()
    episodes = {}
    for traj in trajectories:
        tool_messages = [m["content"] for m in traj.messages if m.get("role") == "tool"]
        episodes[traj.task_id] = {"termination": traj.termination, "turns": traj.num_turns,
                                  "success": traj.success, "tool_errors": traj.tool_errors,
                                  "error": (traj.error or "")[:300],
                                  "tool_message": (tool_messages[0][:200] if tool_messages else None)}
    return {"episodes": episodes, "metrics": rollout_metrics(trajectories), "collect_s": seconds,
            "done_at": time.time(), "live_threads": [t.name for t in threading.enumerate()]}


def case_tools(res: Result, opts, progress: Progress, tmp: Path) -> None:
    timeout = 2.0
    progress(f"rolling out hang / explode / flood (10 MB) / down tool episodes in a subprocess "
             f"(in-process executor timeout_s={timeout:g})")
    out = tmp / "tools.json"
    proc = start_worker("tools", {"tool_timeout_s": timeout}, out)
    try:
        proc.wait(timeout=180)
    except subprocess.TimeoutExpired:
        stop(proc)
    exited_at = time.time()
    got = finish_worker(proc, "tools", out)
    exit_s = exited_at - got["done_at"]
    ep = got["episodes"]
    res.figures.update(episodes=ep, collect_s=round(got["collect_s"], 2), exit_after_s=round(exit_s, 2),
                       threads_at_exit=got["live_threads"],
                       tool_error_rate=got["metrics"]["tool_error_rate"],
                       env_error_rate=got["metrics"]["env_error_rate"], tool_timeout_s=timeout)
    res.check("hang: ends with tool_error once the executor's timeout passes",
              ep["hang"]["termination"] == "tool_error" and "took longer than" in ep["hang"]["error"])
    res.check("explode: the model's error, shown as the tool message, and the episode goes on to its end",
              ep["explode"]["termination"] == "terminated" and ep["explode"]["turns"] == 2
              and ep["explode"]["tool_errors"] == 1
              and "explode cannot handle" in (ep["explode"]["tool_message"] or ""))
    res.check("flood (10 MB): ends with env_error naming MAX_TEXT_CHARS",
              ep["flood"]["termination"] == "env_error" and "MAX_TEXT_CHARS" in ep["flood"]["error"])
    res.check("down (ToolUnavailableError): ends with tool_error",
              ep["down"]["termination"] == "tool_error" and "backend is gone" in ep["down"]["error"])
    res.check("the rollout took about the timeout, not forever", got["collect_s"] < timeout + 30)
    res.check("the process exits within 10 s of its last episode, the hung thread still blocked",
              proc.returncode == 0 and exit_s < 10 and any("hang" in t for t in got["live_threads"]))
    res.happened = ("hang -> " + ep["hang"]["termination"] + f" after {timeout:g} s; explode -> error message, "
                    f"episode {ep['explode']['termination']}; flood -> {ep['flood']['termination']}; down -> "
                    f"{ep['down']['termination']}; process exit {proc.returncode}")
    res.figure = f"rollout {got['collect_s']:.1f} s, exit {exit_s:.1f} s after"


# ============================================================ case 5: SIGKILL in a checkpoint write
def resume_config(steps: int, warm: int) -> dict:
    return {"env.id": GUESS, "env.kwargs": {"n": 16}, "agent.max_new_tokens": 8, "agent.warmstart.steps": warm,
            "agent.warmstart.batch_size": 8, "agent.tokenizer.corpus_episodes": 30,
            "agent.model.hidden_size": 64, "agent.model.intermediate_size": 128, "trainer.steps": steps,
            "trainer.tasks_per_step": 4, "trainer.group_size": 4, "trainer.eval_episodes": 8,
            "trainer.eval_every": 3, "trainer.checkpoint_every": 2, "trainer.save_checkpoint": True}


def checkpoint_worker(args: dict) -> dict:
    """A run (``resume_config``) whose checkpoint write of step ``args["hold_step"]`` (if any)
    stops after the model and before the optimizers, writes ``args["marker"]`` and waits to be
    killed; ``args["resume"]`` resumes from the run dir's latest checkpoint."""
    import hashlib

    from omegaconf import OmegaConf

    import turnrl.train.checkpoint as checkpoint
    from turnrl.train.loop import train

    hold = args.get("hold_step")
    if hold is not None:
        original = checkpoint.write_checkpoint

        def write_checkpoint(run_dir, state, *a, **kw):
            if state.step == hold:
                def after_write(path):
                    if path.name == "optimizers.pt":
                        Path(args["marker"]).write_text(str(path))
                        time.sleep(600)  # the parent SIGKILLs us here, mid-save
                kw["after_write"] = after_write
            return original(run_dir, state, *a, **kw)

        checkpoint.write_checkpoint = write_checkpoint
    overrides, found = resume_config(args["steps"], args["warm"]), None
    if args.get("resume"):
        overrides["trainer.resume"] = "true"
        root = Path(args["run_dir"]) / checkpoint.CHECKPOINTS_DIR  # what the kill left
        found = {"complete": sorted(checkpoint.checkpoint_steps(args["run_dir"])),
                 "half_written": sorted(p.name for p in root.iterdir() if p.name.startswith(".tmp-"))}
    result = train(OmegaConf.to_object(tiny_config(**overrides)), args["run_dir"])
    digest = hashlib.sha256()
    for name, p in sorted(result.model.state_dict().items()):
        digest.update(name.encode() + p.detach().cpu().numpy().tobytes())
    return {"weights_sha256": digest.hexdigest(), "weights": weights_report(result.model), "found": found}


def comparable_rows(run_dir: Path) -> list[str]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [json.dumps({k: v for k, v in row.items() if k not in TIMING}) for row in rows]


def case_checkpoint_kill(res: Result, opts, progress: Progress, tmp: Path) -> None:
    steps, late = opts.resume_steps, opts.resume_late
    holds = {"later": late, "first": 2}  # the checkpoint write each run is killed in
    progress(f"three {steps}-step runs at once (a checkpoint every 2 steps): one SIGKILLed inside its step-{late} "
             "checkpoint write, one inside its first (step-2) one, and an uninterrupted twin")
    ref_dir = tmp / "reference"
    base = {"steps": steps, "warm": opts.resume_warm}
    ref = start_worker("checkpoint", {**base, "run_dir": str(ref_dir)}, tmp / "reference.json")
    runs = {}
    for label, hold in holds.items():
        run_dir, marker = tmp / f"killed_{label}", tmp / f"saving_{label}.marker"
        runs[label] = (start_worker("checkpoint", {**base, "run_dir": str(run_dir), "hold_step": hold,
                                                   "marker": str(marker)}, tmp / f"killed_{label}.json"),
                       run_dir, marker)
    killed: dict[str, dict] = {}
    try:
        deadline = time.monotonic() + 500
        while len(killed) < len(runs):
            for label, (proc, run_dir, marker) in runs.items():
                if label in killed:
                    continue
                if marker.exists():
                    proc.send_signal(signal.SIGKILL)
                    proc.wait(15)
                    killed[label] = {"exit": proc.returncode, "logged": [r["step"] for r in train_steps(run_dir)]}
                    progress(f"{label}: SIGKILLed inside its step-{holds[label]} checkpoint write, steps "
                             f"{killed[label]['logged']} logged")
                elif proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the {label} run ended or stalled before its step-{holds[label]} checkpoint: "
                                       f"{(tmp / f'killed_{label}.log').read_text(errors='replace')[-2000:]}")
            time.sleep(0.02)
    except BaseException:
        stop(ref)
        raise
    finally:
        for proc, _, _ in runs.values():
            stop(proc)
    progress("resuming both with trainer.resume=true")
    resumes = {label: start_worker("checkpoint", {**base, "run_dir": str(run_dir), "resume": True},
                                   tmp / f"resumed_{label}.json") for label, (_, run_dir, _) in runs.items()}
    outs = finish_workers({**{label: (proc, "checkpoint", tmp / f"resumed_{label}.json")
                              for label, proc in resumes.items()},
                           "reference": (ref, "checkpoint", tmp / "reference.json")})
    reference_rows = comparable_rows(ref_dir)
    summary = []
    for label, hold in holds.items():
        run_dir, found = runs[label][1], outs[label]["found"]
        rows = comparable_rows(run_dir)
        logged = [r["step"] for r in train_steps(run_dir)]
        same_rows, same_weights = rows == reference_rows, outs[label]["weights_sha256"] == outs["reference"][
            "weights_sha256"]
        expected = [s for s in range(2, hold, 2)]  # the complete checkpoints before the one killed
        res.figures[label] = {"killed_in_checkpoint_of_step": hold, "exit_signal": -killed[label]["exit"],
                              "steps_logged_when_killed": killed[label]["logged"],
                              "complete_checkpoints_when_killed": found["complete"],
                              "half_written": found["half_written"], "train_steps_after_resume": logged,
                              "same_metrics": same_rows, "same_weights": same_weights}
        name = f"killed in the {'first' if label == 'first' else f'step-{hold}'} checkpoint write"
        res.check(f"{name}: the run died by SIGKILL mid-save",
                  killed[label]["exit"] == -signal.SIGKILL and bool(found["half_written"]))
        res.check(f"{name}: the half-written checkpoint is not taken for one (complete: {expected or 'none'})",
                  found["complete"] == expected)
        res.check(f"{name}: after trainer.resume=true the log has each step once", logged == list(range(1, steps + 1)))
        res.check(f"{name}: every metrics row (wall-clock times aside) equals the uninterrupted run's", same_rows)
        res.check(f"{name}: the final weights equal the uninterrupted run's, bit for bit", same_weights)
        start = f"resumed from step {found['complete'][-1]}" if found["complete"] else "started afresh (no checkpoint)"
        verdict = "identical" if same_rows and same_weights else (
            f"log steps {logged}" if logged != list(range(1, steps + 1)) else "metrics differ")
        summary.append(f"killed in the step-{hold} save: {start}, {verdict}")
    res.figures.update(steps=steps, metrics_rows=len(reference_rows),
                       weights_sha256=outs["reference"]["weights_sha256"][:16])
    res.happened = "; ".join(summary)
    res.figure = " / ".join(("identical" if res.figures[label]["same_metrics"] and res.figures[label]["same_weights"]
                             else "differs") + f" (step-{hold} save)" for label, hold in holds.items())


# ============================================================ case 6: NaN
def nan_batch_worker(args: dict) -> dict:
    """A learner update on a sampled batch whose advantages hold a NaN, between two finite ones."""
    import copy

    import torch

    from turnrl.chat.renderer import ChatRenderer
    from turnrl.policies.sampling import SamplingParams
    from turnrl.policies.hf.policy import TransformersPolicy
    from turnrl.models.causal_lm import TinyModelConfig, build_tiny_model
    from turnrl.rollout.scripted import corpus_texts
    from turnrl.chat.tokenizer import build_tokenizer
    from turnrl.algorithms import Learner, LossConfig, OptimConfig, collate
    from turnrl.rollout import RolloutCollector, Task

    torch.set_num_threads(1)
    tokenizer = build_tokenizer(corpus_texts(GuessNumberEnv(), range(5)), vocab_size=600, max_number=255)
    model = build_tiny_model(TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                             intermediate_size=128), tokenizer, seed=0)
    collector = RolloutCollector(lambda: GuessNumberEnv(max_turns=3), TransformersPolicy(model, tokenizer, seed=3),
                                 ChatRenderer(tokenizer))
    batch = collate(collector.collect([Task(0), Task(1)], 2, SamplingParams(max_new_tokens=6)), tokenizer.pad_token_id)
    advantages = torch.tensor([1.0, -1.0, 0.5, -2.0])[:, None] * batch.loss_mask
    learner = Learner(model, LossConfig(), OptimConfig(lr=1e-3))
    first = learner.update(batch, advantages)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    moments = copy.deepcopy(learner.optimizer.state_dict()["state"])
    poisoned = advantages.clone()
    row = 1
    poisoned[row, int((batch.loss_mask[row] != 0).nonzero()[0])] = float("nan")
    bad = learner.update(batch, poisoned)
    unchanged = all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    after_state = learner.optimizer.state_dict()["state"]
    same_moments = all(torch.equal(torch.as_tensor(after_state[k][f]), torch.as_tensor(v))
                       for k, entry in moments.items() for f, v in entry.items())
    finite_after_bad = weights_report(model)["finite"]
    nxt = learner.update(batch, advantages)
    moved = weights_report(model, before)["moved"]
    return {"first": {k: first[k] for k in ("nonfinite_updates", "skipped_updates", "grad_norm")},
            "poisoned": {k: bad[k] for k in ("nonfinite_updates", "skipped_updates", "grad_norm", "pg_loss")},
            "next": {k: nxt[k] for k in ("nonfinite_updates", "skipped_updates", "grad_norm")},
            "unchanged_by_poisoned": unchanged, "optimizer_state_unchanged": same_moments,
            "finite_after_poisoned": finite_after_bad, "finite_at_end": weights_report(model)["finite"],
            "moved_by_next": len(moved), "parameters": len(before),
            "metrics_finite": all(v == v for v in bad.values())}


def case_nan(res: Result, opts, progress: Progress, tmp: Path) -> None:
    steps = opts.train_steps
    progress(f"a {steps}-step run whose env returns a NaN reward on 15% of steps, and a learner batch with a NaN "
             "advantage, at once")
    run_args = {"overrides": {**custom_env(NanRewardGuessNumber, p_nan=0.15, n=16, max_turns=3),
                              "trainer.steps": steps}, "run_dir": str(tmp / "nan_run")}
    a = start_worker("train", run_args, tmp / "nan_run.json")
    b = start_worker("nan_batch", {}, tmp / "nan_batch.json")
    got = finish_workers({"run": (a, "train", tmp / "nan_run.json"), "batch": (b, "nan_batch", tmp / "nan_batch.json")})
    outs = [got["run"], got["batch"]]
    rows, lb = outs[0]["train"], outs[1]
    if outs[0]["error"] is not None:
        raise RuntimeError(f"the NaN-reward run died: {outs[0]['error']}")
    env_rates = [r["env_error_rate"] for r in rows]
    res.figures.update(run_env_error_rate=env_rates, run_pg_loss=[r["pg_loss"] for r in rows],
                       run_nonfinite_updates_total=rows[-1].get("nonfinite_updates_total") if rows else None,
                       run_weights_finite=outs[0]["weights"]["finite"],
                       run_tensors_moved=len(outs[0]["weights"]["moved"]), learner=lb)
    res.check(f"the NaN-reward run completes its {steps} steps", len(rows) == steps)
    res.check("its NaN-reward episodes end as env errors (env_error_rate > 0), out of the loss",
              any(v > 0 for v in env_rates))
    res.check("its losses and weights stay finite",
              outs[0]["weights"]["finite"] and all(math.isfinite(r["pg_loss"]) for r in rows))
    res.check("the NaN-advantage update is counted: nonfinite_updates 1, skipped_updates 1",
              lb["poisoned"]["nonfinite_updates"] == 1.0 and lb["poisoned"]["skipped_updates"] == 1.0)
    res.check("it leaves the weights and the optimizer state as they were",
              lb["unchanged_by_poisoned"] and lb["optimizer_state_unchanged"] and lb["finite_after_poisoned"])
    res.check("its reported metrics hold no NaN", lb["metrics_finite"])
    res.check("the next finite batch updates every weight, all finite",
              lb["next"]["nonfinite_updates"] == 0.0 and lb["moved_by_next"] == lb["parameters"]
              and lb["finite_at_end"])
    res.happened = (f"NaN rewards: env_error_rate {', '.join(f'{v:.2f}' for v in env_rates)}, weights finite; "
                    f"NaN advantage: step skipped, {lb['parameters']} parameters unchanged, next step moves all")
    res.figure = (f"nonfinite_updates {lb['poisoned']['nonfinite_updates']:g}, skipped_updates "
                  f"{lb['poisoned']['skipped_updates']:g}")


# ============================================================ case 7: hostile clients
def raw_request(port: int, data: bytes, timeout_s: float) -> tuple[int | None, float, bytes]:
    """Send ``data`` on a fresh connection and read until the server closes it (or
    ``timeout_s``); ``(status or None, seconds until closed, what came back)``."""
    started = time.monotonic()
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(data)
        try:
            while time.monotonic() - started < timeout_s:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
                if b"\r\n\r\n" in got and b"Connection: close" not in got and _whole(got):
                    break  # a keep-alive reply: the server keeps the connection
        except (TimeoutError, ConnectionResetError):
            pass
    match = re.match(rb"HTTP/1\.[01] (\d{3})", got)
    return (int(match.group(1)) if match else None), time.monotonic() - started, got


def _whole(reply: bytes) -> bool:
    head, _, body = reply.partition(b"\r\n\r\n")
    match = re.search(rb"Content-Length: (\d+)", head)
    return match is not None and len(body) >= int(match.group(1))


def post(path: str, body: bytes, *headers: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json", *headers]
    if not any(h.lower().startswith("content-length") for h in headers):
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def burst_health(port: int, count: int) -> dict:
    """``count`` connections opened at once, each sending ``GET /health``: how many were
    answered and when (the slowest waits on the server's listen backlog, if it overflows)."""
    started = time.monotonic()
    times: list[float] = []

    def one() -> None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                if s.recv(1024).startswith(b"HTTP/1.1 200"):
                    times.append(time.monotonic() - started)
        except OSError:
            pass

    threads = [threading.Thread(target=one, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=40)
    return {"answered": len(times), "median_s": round(percentile(times, 50), 2),
            "slowest_s": round(max(times, default=float("nan")), 2)}


def case_hostile_clients(res: Result, opts, progress: Progress, tmp: Path) -> None:
    import httpx

    read_timeout, idle = opts.read_timeout, 50
    server, url = serve_env(GUESS, "--read-timeout", f"{read_timeout:g}")
    port = int(url.rsplit(":", 1)[1])
    statuses: dict[str, Any] = {}
    try:
        progress(f"serve-env at {url} (--read-timeout {read_timeout:g}); forbidden kwargs, broken bodies, "
                 f"{idle} idle connections")
        threads_before = thread_count(server.pid)
        for name, kwargs in (("executor_options", {"executor_options": {"sandbox": {"run_as": 0}}}),
                             ("executors", {"executors": {"calculator": "inprocess"}}), ("run_as", {"run_as": 0})):
            reply = httpx.post(f"{url}/sessions", json={"kwargs": kwargs}, timeout=10)
            statuses[f"kwarg {name}"] = reply.status_code
        statuses["sessions after the refused kwargs"] = httpx.get(f"{url}/info", timeout=10).json()["sessions"]
        sid = httpx.post(f"{url}/sessions", json={}, timeout=10).json()["session_id"]
        code, took, _ = raw_request(port, post("/sessions", b'{"kwargs": {', "Content-Length: 1000"),
                                    read_timeout + 10)
        statuses["short body"], statuses["short body closed after s"] = code, round(took, 2)
        statuses["Content-Length: abc"] = raw_request(port, post("/sessions", b"{}", "Content-Length: abc"), 10)[0]
        deep = b"[" * 100_000 + b"]" * 100_000
        statuses["100k-deep JSON"] = raw_request(port, post(f"/sessions/{sid}/reset", deep), 30)[0]
        big_seed = b'{"seed": 1' + b"0" * 4999 + b"}"
        statuses["5,000-digit seed"] = raw_request(port, post(f"/sessions/{sid}/reset", big_seed), 30)[0]
        statuses["5,000-digit seed in a reset option"] = raw_request(
            port, post(f"/sessions/{sid}/reset", b'{"options": {"split": 1' + b"0" * 4999 + b"}}"), 30)[0]
        # idle connections, nothing sent: the server must close each after the read timeout
        burst = burst_health(port, idle)
        socks, connected, closed_after = [], {}, []
        for _ in range(idle):  # one at a time (20 ms apart), so each is accepted as it connects
            s = socket.create_connection(("127.0.0.1", port), timeout=read_timeout + 30)
            s.setblocking(False)
            socks.append(s)
            connected[s] = time.monotonic()
            time.sleep(0.02)
        threads_with_idle = thread_count(server.pid)
        health_during = httpx.get(f"{url}/health", timeout=10).status_code
        sel = selectors.DefaultSelector()
        for s in socks:
            sel.register(s, selectors.EVENT_READ)
        deadline = time.monotonic() + read_timeout + 30
        while sel.get_map() and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.5):
                try:
                    data = key.fileobj.recv(1)  # b"": the server closed it
                except OSError:
                    data = b""
                if not data:
                    closed_after.append(time.monotonic() - connected[key.fileobj])
                    sel.unregister(key.fileobj)
        left_open = len(sel.get_map())
        sel.close()
        for s in socks:
            s.close()
        time.sleep(min(2.0, read_timeout))
        threads_after = thread_count(server.pid)
        health = httpx.get(f"{url}/health", timeout=10).status_code
        works = httpx.post(f"{url}/sessions/{sid}/reset", json={"seed": 3}, timeout=10).status_code
    finally:
        stop(server, signal.SIGTERM)
    res.figures.update(statuses=statuses, read_timeout_s=read_timeout, idle_connections=idle,
                       idle_closed_after_s_max=round(max(closed_after, default=-1), 2),
                       idle_closed_after_s_min=round(min(closed_after, default=-1), 2), idle_left_open=left_open,
                       burst=burst, server_threads_before=threads_before,
                       server_threads_with_idle=threads_with_idle, server_threads_after=threads_after,
                       health_during_idle=health_during, health_after=health, reset_after=works)
    for name in ("executor_options", "executors", "run_as"):
        res.check(f"kwarg {name}: 403", statuses[f"kwarg {name}"] == 403)
    res.check("no session was opened for a refused kwarg", statuses["sessions after the refused kwargs"] == 0)
    res.check("short body: the connection is dropped after the read timeout (a 4xx or nothing)",
              (statuses["short body"] is None or 400 <= statuses["short body"] < 500)
              and read_timeout - 0.5 <= statuses["short body closed after s"] <= read_timeout + 5)
    for name in ("Content-Length: abc", "100k-deep JSON", "5,000-digit seed", "5,000-digit seed in a reset option"):
        res.check(f"{name}: 4xx", statuses[name] is not None and 400 <= statuses[name] < 500)
    res.check(f"{idle} idle connections all closed by the server, each the read timeout (+1.5 s) after it was "
              "accepted", left_open == 0 and read_timeout - 0.5 <= min(closed_after)
              and max(closed_after) <= read_timeout + 1.5)
    res.check("their threads are gone afterwards", threads_after <= threads_before + 2)
    res.check("/health answers during and after; the session still plays",
              health_during == 200 and health == 200 and works == 200)
    codes = [statuses[k] for k in ("kwarg executor_options", "kwarg executors", "kwarg run_as", "Content-Length: abc",
                                   "100k-deep JSON", "5,000-digit seed")]
    res.happened = (f"kwargs {codes[0]}/{codes[1]}/{codes[2]}, Content-Length abc {codes[3]}, deep JSON {codes[4]}, "
                    f"huge seed {codes[5]}, short body {statuses['short body'] or 'no reply'} and dropped; "
                    f"{idle - left_open} of {idle} idle connections dropped; "
                    f"{burst['answered']} of {idle} GET /health sent at once answered, the slowest after "
                    f"{burst['slowest_s']:.1f} s; "
                    f"/health {health}")
    res.figure = (f"short body dropped at {statuses['short body closed after s']:.1f} s, idle ones at "
                  f"{min(closed_after, default=-1):.1f}-{max(closed_after, default=-1):.1f} s (read timeout "
                  f"{read_timeout:g} s)")


# ============================================================ the report
@dataclass(frozen=True)
class Case:
    title: str
    what: str
    run: Callable[[Result, Any, Progress, Path], None]


CASES: dict[str, Case] = {
    "load": Case(
        "Load: concurrent remote sessions",
        "N `RemoteEnv` sessions (one thread each, spread over `--client-procs` client processes) play GuessNumber "
        "episodes (`n=1024`, 10 turns) against a `serve-env` subprocess for D seconds (`--sessions`, `--seconds`); "
        "a scripted player bisects the interval the last hint states, guesses at random (15%) or writes no number "
        "(5%). Each session's episodes use seeds of their own. Afterwards every transcript (observations, rewards, "
        "flags, info) is replayed on a local env with the same seed and actions and must be equal: an episode lost "
        "or answered with another session's state would show.", case_load),
    "server_restart": Case(
        "Env server killed and restarted during training",
        "`python -m turnrl.train env=remote` trains against a `serve-env` subprocess on a fixed port; the server is "
        "SIGKILLed once `metrics.jsonl` shows step k and started again on the same port seconds later. The run must "
        "exit 0, the steps of the outage must count `env_error_rate` (and `infra_failure_rate`), and the steps after "
        "it must be clean, on sessions of the new server.", case_server_restart),
    "flaky_env": Case(
        "Env whose reset and step raise",
        "Three runs of `turnrl.train.loop.train` on a GuessNumber subclass (`env._target_`): reset raises 10% of the "
        "time and step 15%; every step raises; every reset raises once RL has begun, as when an env server is down "
        "for a whole step. Each must complete, count its failures in `infra_failure_rate`, and the last two must "
        "leave every weight as it was before RL: a failed episode carries no gradient.", case_flaky_env),
    "tools": Case(
        "Hanging, raising, huge and unavailable tools",
        "An env with four in-process tools, one that blocks forever, one that raises `ValueError`, one that returns "
        "10 MB of text and one that raises `ToolUnavailableError`, rolled out through the rollout collector by a "
        "scripted caller in a subprocess (the in-process executor's `timeout_s` set to 2 s); each episode's "
        "termination and message are checked, and the subprocess's exit is timed while the hung tool's thread "
        "is still blocked.", case_tools),
    "checkpoint_kill": Case(
        "SIGKILL during a checkpoint write",
        "Two runs (a checkpoint every 2 steps) are SIGKILLed inside a checkpoint write, after the model is written "
        "and before the optimizer state: one in a later checkpoint, one in its first. Each is then run again in "
        "its run dir with `trainer.resume=true` and compared with an uninterrupted twin that ran alongside: "
        "`metrics.jsonl` row for row (wall-clock times aside) and the final weights bit for bit.",
        case_checkpoint_kill),
    "nan": Case(
        "NaN rewards and a NaN advantage",
        "A run whose env returns a NaN reward on 15% of steps; and a learner update (`turnrl.algorithms.Learner`) "
        "whose batch holds one NaN advantage, between two finite updates. The weights must stay finite, the "
        "poisoned step must be skipped and counted (`nonfinite_updates`, `skipped_updates`) with the weights and "
        "the optimizer state untouched, and the next finite batch must update again.", case_nan),
    "hostile_clients": Case(
        "Hostile clients of serve-env",
        "Raw HTTP against a `serve-env` subprocess (`--read-timeout` 3 s; 2 s with `--quick`): session kwargs a "
        "client may never choose (`executor_options`, `executors`, `run_as`), a body shorter than its "
        "`Content-Length`, `Content-Length: abc`, 100,000-deep JSON, a 5,000-digit seed, 50 `GET /health` sent at "
        "once, and 50 idle connections that send nothing. Each must be refused (4xx) or dropped after the read "
        "timeout, and the server must go on answering.", case_hostile_clients),
}

WORKERS: dict[str, Callable[[dict], dict]] = {"load": load_worker, "train": train_worker, "tools": tools_worker,
                                             "checkpoint": checkpoint_worker, "nan_batch": nan_batch_worker}


def machine() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    cpu = platform.processor() or ""
    try:
        cpu = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M).group(1).strip()
    except (OSError, AttributeError):
        pass
    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = None
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {"cores": os.cpu_count(), "cpu_model": cpu, "python": platform.python_version(), "torch": torch_version,
            "platform": platform.platform(), "load_average_at_start": load}


def git_commit() -> dict:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain", "--", "turnrl"))}


def table(results: list[Result]) -> str:
    rows = [("case", "what happened", "figure", "result")]
    rows += [(r.name, r.happened or (r.error or "")[:200], r.figure, "pass" if r.passed else "FAIL") for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[i]) if i < 3 else cell for i, cell in enumerate(row)))
        if n == 0:
            lines.append("  ".join("-" * w for w in [*widths, 6]))
    return "\n".join(lines)


def md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(record: dict) -> str:
    m, cases = record["machine"], record["cases"]
    minutes, seconds = divmod(round(record["seconds"]), 60)
    passed = sum(c["passed"] for c in cases)
    failing = [c["case"] for c in cases if not c["passed"]]
    lines = [
        "# Reliability: load and faults, measured",
        "",
        "`scripts/reliability_report.py` runs turnrl's real parts (the env server and `RemoteEnv`, the trainer, the "
        "rollout collector, tools, the learner, checkpoints) under load and under faults, on loopback only, every "
        "loop bounded in count and time. It prints the table below, writes this page and the JSON record "
        "[reliability/record.json](reliability/record.json) (the command, commit, machine, and each case's "
        "figures and checks), and exits with status 1 when a case fails. What each failure should lead to: "
        "[episodes the infrastructure ended](algorithms.md#episodes-the-infrastructure-ended), [whose failure is "
        "it](sandbox.md#whose-failure-is-it), [remote environments](envs.md#remote-environments) and "
        "[checkpoints and exact resume](scale.md#checkpoints-and-exact-resume).",
        "",
        "```bash",
        "python scripts/reliability_report.py                 # every case at full size: 200 sessions x 60 s",
        "python scripts/reliability_report.py --quick         # 32 sessions x 5 s, shorter runs",
        "python scripts/reliability_report.py --cases load,hostile_clients --sessions 100 --seconds 30",
        "```",
        "",
        "Only a full run of every case writes this page and its record; `--quick` or `--cases` write to "
        "`outputs/reliability/` unless `--json` / `--markdown` say where.",
        "",
        "## Measured",
        "",
        f"`{record['command']}` on {record['date'][:10]}: {m['cores']} cores ({m['cpu_model']}) shared with other "
        f"work (load average {_load(m.get('load_average_at_start'))} at the start, "
        f"{_load(m.get('load_average_at_end'))} at the end), Python {m['python']}, torch {m['torch']}, commit "
        f"`{(record['git']['commit'] or 'unknown')[:10]}`"
        + (" with uncommitted changes under turnrl/" if record["git"]["dirty"] else "")
        + f"; the whole run took {minutes} min {seconds:02d} s. "
        f"{passed} of {len(cases)} cases pass" + (f"; the failing checks of {', '.join(failing)} are listed under "
                                                   "each case below." if failing else "."),
        "",
        "| case | what happened | figure | result |",
        "|---|---|---|---|",
    ]
    for c in cases:
        lines.append(f"| `{c['case']}` | {md(c['happened'] or c['error'] or '')} | {md(c['figure'])} | "
                     f"{'pass' if c['passed'] else '**fail**'} |")
    lines += ["", "## What each case does", ""]
    for c in cases:
        lines += [f"### {c['title']}", "", f"`{c['case']}` ({c['seconds']:.0f} s). {c['what_it_does']}", ""]
        note = CASE_NOTES.get(c["case"])
        text = note(c) if note is not None and c["error"] is None else ""
        if text:
            lines += [text, ""]
        lines += [f"- {'pass' if k['passed'] else '**fail**'}: {k['check']}" for k in c["checks"]]
        if c["error"]:
            lines.append(f"- **error**: {md(c['error'][:500])}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _load(values: list | None) -> str:
    return "unknown" if not values else " / ".join(f"{v:g}" for v in values)


def _load_note(c: dict) -> str:
    f = c["figures"]
    procs = f"{f['client_processes']} client process" + ("es" if f["client_processes"] > 1 else "")
    return (f"Measured: {f['requests']:,} requests ({f['episodes']:,} episodes, {f['steps']:,} steps, the rest "
            f"resets) in {f['wall_s']:g} s from {f['sessions']} sessions in {procs}: {f['req_per_s']:,.0f} "
            f"requests/s, latency p50 {f['p50_ms']:g} ms, p99 {f['p99_ms']:g} ms, max {f['max_ms']:g} ms, as the "
            "clients time `RemoteEnv.reset` and `RemoteEnv.step` (JSON and HTTP included). CPU over the window: "
            f"the server {f['server_cpu_cores']} cores ({f['server_cpu_ms_per_request']:g} ms per request), the "
            f"clients {f['client_cpu_cores']} ({f['client_cpu_ms_per_request']:g} ms per request), the machine's "
            f"other processes {f['other_processes_cpu_cores']}; "
            f"bound by {f['bottleneck']}. The server is one Python process (uvicorn's event loop, env calls in a "
            "pool of worker threads), so it uses one core at most. The clients are threads, one `RemoteEnv` each: `RemoteEnv.astep` runs `step` "
            "on asyncio's default thread pool, whose few workers (cores + 4) would cap the concurrency.")


def _restart_note(c: dict) -> str:
    f = c["figures"]
    rates = ", ".join(f"step {s}: {v:.2f}" for s, v in f["env_error_rate"].items())
    command = re.sub(r"http://127\.0\.0\.1:\d+", "http://127.0.0.1:PORT",
                     re.sub(r" hydra\.run\.dir=\S+", "", f["command"]))
    crash = f" It ended with {f['crash']}." if f["crash"] else ""
    return (f"Run: `{command}`; the server was killed after step {f['killed_after_step']} and restarted "
            f"{f['down_s']:g} s later. `env_error_rate` per step: {rates}. The run exited {f['exit_code']} after "
            f"{f['run_s']:g} s; the new server held up to {f['new_server_most_sessions']} of its sessions.{crash}")


def _flaky_note(c: dict) -> str:
    parts = []
    for name, label in (("flaky", "reset 10% / step 15%"), ("every_step", "every step"),
                        ("every_reset", "every reset once RL began")):
        f = c["figures"].get(name)
        if f is None:
            continue
        rates = ", ".join(f"{r:.2f}" for r in f["infra_failure_rate"]) or "none logged"
        end = (f"ended by {f['error']}" if f["error"] else
               f"completed; {f['tensors_moved']} of {f['tensors']} weight tensors moved during RL")
        parts.append(f"{label} failing: `infra_failure_rate` {rates}; {end}")
    return "Per run: " + "; ".join(parts) + "."


def _tools_note(c: dict) -> str:
    f = c["figures"]
    parts = []
    for name, ep in f["episodes"].items():
        shown = ep["error"] or ep["tool_message"] or ""
        unwrapped = re.fullmatch(r"\w+\((['\"])(.*)\1\)", shown, re.S)  # ExcType("message") -> message
        shown = (unwrapped.group(2) if unwrapped else shown).replace("`", "'")
        parts.append(f"`{name}` {ep['termination']} after {ep['turns']} turn(s) (\"{md(shown[:150])}\")")
    return ("Episodes: " + "; ".join(parts) + f". The rollout took {f['collect_s']:g} s and the subprocess exited "
            f"{f['exit_after_s']:g} s after its last episode with the hung tool's thread still running (a daemon "
            "thread). A 10 MB tool result is over `turnrl.envs.messages.MAX_TEXT_CHARS`, so the env's step raises "
            "and the episode ends as the infrastructure's failure; sandboxed executors bound a program's output "
            "instead (`limit`, the model's).")


def _checkpoint_note(c: dict) -> str:
    f = c["figures"]
    parts = []
    for label in ("later", "first"):
        g = f.get(label)
        if g is None:
            continue
        parts.append(f"The run killed in its step-{g['killed_in_checkpoint_of_step']} write had steps "
                     f"{g['steps_logged_when_killed']} logged, complete checkpoints "
                     f"{g['complete_checkpoints_when_killed']}"
                     f" and the half-written folder {g['half_written']}; after the resume the log's train steps are "
                     f"{g['train_steps_after_resume']}, metrics {'equal' if g['same_metrics'] else 'different'}, "
                     f"weights {'equal' if g['same_weights'] else 'different'}")
    return f"Each run has {f['steps']} steps. " + ". ".join(parts) + "."


def _nan_note(c: dict) -> str:
    f, lb = c["figures"], c["figures"]["learner"]
    rates = ", ".join(f"{r:.2f}" for r in f["run_env_error_rate"])
    return (f"The NaN-reward run: `env_error_rate` {rates} (the rollout collector ends an episode whose step "
            "returns a non-finite reward as an env error, so the NaN never reaches the loss); "
            f"`nonfinite_updates_total` {f['run_nonfinite_updates_total']:g}; weights finite. The learner: "
            f"`grad_norm` {lb['first']['grad_norm']:.3g} before, the poisoned update `nonfinite_updates` "
            f"{lb['poisoned']['nonfinite_updates']:g} and `skipped_updates` {lb['poisoned']['skipped_updates']:g} "
            f"with {lb['parameters']} weight tensors and the optimizer state unchanged, then `grad_norm` "
            f"{lb['next']['grad_norm']:.3g} moving all {lb['moved_by_next']}.")


def _hostile_note(c: dict) -> str:
    f = c["figures"]
    st = f["statuses"]
    codes = ", ".join(f"{k} {v}" for k, v in st.items() if k not in ("sessions after the refused kwargs",
                                                                    "short body closed after s"))
    b = f["burst"]
    return (f"Replies: {codes} (a short body: 408, then the connection closed {st['short body closed after s']:g} s "
            f"after it opened). 50 `GET /health` at once: {b['answered']} answered, median {b['median_s']:g} s, "
            f"slowest {b['slowest_s']:g} s (the server listens with socketserver's default backlog of 5, so "
            "connections past it wait for the kernel's SYN retry). 50 idle connections: each closed "
            f"{f['idle_closed_after_s_min']:.1f}-{f['idle_closed_after_s_max']:.1f} s after it opened; server threads "
            f"{f['server_threads_before']} before, {f['server_threads_with_idle']} with them open, "
            f"{f['server_threads_after']} after.")


CASE_NOTES: dict[str, Callable[[dict], str]] = {
    "load": _load_note, "server_restart": _restart_note, "flaky_env": _flaky_note, "tools": _tools_note,
    "checkpoint_kill": _checkpoint_note, "nan": _nan_note, "hostile_clients": _hostile_note}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="32 sessions x 5 s and shorter runs")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated cases (default: all: {','.join(CASES)})")
    p.add_argument("--sessions", type=int, default=None, help="load: concurrent sessions (default 200; quick 32)")
    p.add_argument("--seconds", type=float, default=None, help="load: seconds of load (default 60; quick 5)")
    p.add_argument("--client-procs", type=int, default=None,
                   help="load: client processes sharing the sessions (default 2; quick 1)")
    p.add_argument("--json", type=Path, default=None,
                   help=f"the JSON record (default {DEFAULT_JSON.relative_to(ROOT)}; with --quick or --cases "
                        f"{QUICK_OUT.relative_to(ROOT)}/record.json)")
    p.add_argument("--markdown", type=Path, default=None,
                   help=f"the markdown page (default {DEFAULT_MARKDOWN.relative_to(ROOT)}; with --quick or --cases "
                        f"{QUICK_OUT.relative_to(ROOT)}/reliability.md)")
    p.add_argument("--keep", action="store_true", help="keep the work folder (servers' and runs' logs)")
    opts = p.parse_args(argv)
    opts.cases = [c.strip() for c in opts.cases.split(",") if c.strip()]
    unknown = [c for c in opts.cases if c not in CASES]
    if unknown:
        p.error(f"unknown case(s) {unknown}; the cases: {', '.join(CASES)}")
    full = not opts.quick and opts.cases == list(CASES)
    opts.sessions = opts.sessions or (32 if opts.quick else 200)
    opts.seconds = opts.seconds or (5.0 if opts.quick else 60.0)
    opts.client_procs = opts.client_procs or (1 if opts.quick else 2)
    opts.json = opts.json or (DEFAULT_JSON if full else QUICK_OUT / "record.json")
    opts.markdown = opts.markdown or (DEFAULT_MARKDOWN if full else QUICK_OUT / "reliability.md")
    opts.train_steps = 3 if opts.quick else 4
    opts.restart_steps, opts.kill_step, opts.down_seconds = (8, 2, 2.0) if opts.quick else (12, 2, 3.0)
    opts.resume_steps, opts.resume_late, opts.resume_warm = (4, 4, 0) if opts.quick else (6, 4, 20)
    opts.read_timeout = 2.0 if opts.quick else 3.0
    if opts.sessions < 1 or opts.seconds <= 0 or opts.client_procs < 1:
        p.error("--sessions, --seconds and --client-procs must be positive")
    return opts


def main(argv: list[str]) -> int:
    if argv[:1] == ["--worker"]:  # a subprocess of a case
        name, args, out = argv[1], json.loads(argv[2]), Path(argv[3])
        result = WORKERS[name](args)
        out.write_text(json.dumps(result, default=str))
        return 0
    opts = parse_args(argv)
    command = "python scripts/reliability_report.py" + "".join(f" {shlex.quote(a)}" for a in argv)
    progress = Progress()
    record = {"command": command, "git": git_commit(), "machine": machine(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "quick": opts.quick, "cases": []}
    work = Path(tempfile.mkdtemp(prefix="turnrl-reliability-"))
    results = []
    try:
        for i, name in enumerate(opts.cases, 1):
            progress.case = f"[{i}/{len(opts.cases)} {name}]"
            progress(f"start: {CASES[name].title}")
            res, started = Result(name), time.monotonic()
            tmp = work / name
            tmp.mkdir()
            try:
                CASES[name].run(res, opts, progress, tmp)
            except Exception as exc:  # one case's failure is its row, the others still run
                res.error = f"{type(exc).__name__}: {exc}"
            res.seconds = time.monotonic() - started
            results.append(res)
            progress(f"{'pass' if res.passed else 'FAIL'} in {res.seconds:.1f} s: {res.figure or res.error}")
    finally:
        if opts.keep:
            print(f"work folder kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    record["seconds"] = round(progress.elapsed(), 1)
    record["machine"]["load_average_at_end"] = machine()["load_average_at_start"]
    record["cases"] = [r.record() for r in results]
    record["passed"] = all(r.passed for r in results)
    print(table(results))
    print(f"\n{sum(r.passed for r in results)}/{len(results)} cases passed in {record['seconds']:.0f} s; "
          f"record: {opts.json}, page: {opts.markdown}")
    opts.json.parent.mkdir(parents=True, exist_ok=True)
    opts.json.write_text(json.dumps(record, indent=1, default=str) + "\n")
    opts.markdown.parent.mkdir(parents=True, exist_ok=True)
    opts.markdown.write_text(markdown(record))
    return 0 if record["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
