"""How many torch threads a process takes (``turnrl.algorithms.distributed.torch_threads``): its share of the
machine's cores, under ``accelerate launch`` and in the suite's workers."""

import multiprocessing
import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from turnrl.bench import suite as bench_suite
from turnrl.algorithms import distributed
from turnrl.algorithms.distributed import LOCAL_PROCESSES_ENV, local_processes, torch_threads

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cores(monkeypatch):
    """Pretend this process may run on 8 cores, launched alone."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv(LOCAL_PROCESSES_ENV, raising=False)
    return 8


def test_the_default_is_this_process_share_of_the_cores(cores, monkeypatch):
    assert local_processes() == 1 and torch_threads(None) == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # accelerate launch / torchrun
    assert local_processes() == 4 and torch_threads(None) == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")  # more processes than cores: one thread each
    assert torch_threads(None) == 1
    # the suite's workers win over a LOCAL_WORLD_SIZE left behind (an in-process vLLM engine sets 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv(LOCAL_PROCESSES_ENV, "3")
    assert local_processes() == 3 and torch_threads(None) == 2


def test_a_set_value_is_kept_and_zero_leaves_torch_default(cores, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert torch_threads(3) == 3 and torch_threads(0) is None
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "not a number")  # ignored
    assert local_processes() == 1


def _threads_in_worker() -> int | None:
    return torch_threads(None)


@pytest.mark.slow
def test_suite_workers_and_accelerate_processes_each_take_their_share(tmp_path):
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    # the suite's pool of 2 spawned workers (its initializer)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"),
                             initializer=bench_suite._share_cores, initargs=(2,)) as pool:
        assert pool.submit(_threads_in_worker).result() == share
    # 2 processes of the accelerate config the docs launch
    script = tmp_path / "threads.py"
    script.write_text("from turnrl.algorithms.distributed import torch_threads\nprint('threads', torch_threads(None))\n")
    out = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                          str(ROOT / "turnrl/conf/accelerate/cpu_2proc.yaml"), str(script)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert [line for line in out.stdout.splitlines() if line.startswith("threads")] == [f"threads {share}"] * 2
    assert distributed.local_processes() == 1  # this process is launched alone
