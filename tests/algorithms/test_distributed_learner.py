"""The learner under ``accelerate launch`` with 2 CPU processes (gloo, DDP) gives the same
update as in one process, and each process trains only on its shard of the rows.

This file is also the worker script: ``accelerate launch ... test_distributed_learner.py OUT``
builds the tiny model and a fixed batch with the same builders as ``tests/conftest.py``, runs
3 updates per aggregation mode on its shard and saves parameters, metrics and the rows its
forward passes saw to ``OUT/<mode>.rank<r>.pt``.

The two runs are compared in float64. Two processes sum gradients in another order (and pad
other micro-batches) than one, so in float32 they differ by rounding, which Adam's
per-parameter normalisation amplifies where a gradient nearly cancels: 3 updates of ~6e-3
differed by up to 2.6e-6 here and 2e-5 on another CPU, as much as one process with another
micro-batch size differs from itself. In float64 that rounding is ~1e-14, while a wrong
normalisation (a local count where a global one belongs) moves parameters by the order of
the update itself.
"""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.tolerances import adam_first_step_tol, grad_tol, logprob_tol_for, rows_of

ROOT = Path(__file__).resolve().parents[2]
ACCELERATE_CONFIG = ROOT / "turnrl/conf/accelerate/cpu_2proc.yaml"
MODES = ("token-mean", "seq-mean-token-mean")
# turn-mean: each process's weights need the other processes' turn counts too
TURNS = "turn-mean"
# and Dr.GRPO's mode on the first 3 rows only: minibatches of 2 and 1 rows, so process 1 has
# no row of the second one and joins its all-reduce with a zero-weight stand-in
UNEVEN, UNEVEN_ROWS = "seq-mean-token-sum-norm", 3
RUNS = (*MODES, TURNS, UNEVEN)  # (UNEVEN last: it cuts the batch)
PLAYERS = ("expert", "weak", "weak", "weak")
UPDATES = 3
# num_minibatches=2 over 12 rows: 3 rows per process per minibatch, micro-batches of 2 and 1
LOSS = dict(num_minibatches=2)  # LossConfig fields of every learner here
OPTIM = dict(lr=1e-3, micro_batch_size=2)  # and OptimConfig fields
DTYPE = torch.float64  # of the compared runs' models (see the module docstring)


def parameter_tol(config, tokens: int, param: torch.Tensor, steps: int) -> torch.Tensor:
    """Elementwise bound on two runs' parameters after ``steps`` AdamW steps whose gradients
    differ by rounding alone: each step's gradient is clipped to ``max_grad_norm``, so no entry
    exceeds it, and its rounding is at most ``grad_tol`` at that size; one step moves by at most
    ``lr`` x that rounding / Adam's eps (a gradient at 0 is the most sensitive), ``steps`` times
    (tests/tolerances.py). In float64 ~5e-8 per step of lr = 1e-3, where a wrong normalisation
    moves parameters by the order of the update itself."""
    from turnrl.algorithms import OptimConfig

    rounding = grad_tol(config, param.dtype, OptimConfig().max_grad_norm, tokens)
    return steps * adam_first_step_tol(torch.zeros(()), rounding, OPTIM["lr"], param)


def fixed_batch(tokenizer, renderer, model):
    """3 tasks x 4 scripted players of GuessNumber (mixed lengths and outcomes), scored by
    ``model``, and fixed advantages (a seeded value per row on its sampled tokens)."""
    from turnrl.rollout.scripted import scripted_episode
    from turnrl.algorithms import collate, token_logprobs
    from turnrl.envs import GuessNumberEnv

    env = GuessNumberEnv(n=32, max_turns=6)
    trajs = []
    for group, seed in enumerate((0, 1, 2)):
        for k, player in enumerate(PLAYERS):
            t = scripted_episode(env, seed, renderer, player, rng=np.random.default_rng(100 * seed + k))
            t.group_id = group
            trajs.append(t)
    batch = collate(trajs, tokenizer.pad_token_id)
    with torch.no_grad():
        lp, _, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, score_mask=batch.loss_mask)
    batch.old_logprobs = lp * batch.loss_mask
    advantages = torch.randn(len(batch), generator=torch.Generator().manual_seed(0))[:, None] * batch.loss_mask
    return batch, advantages


def run_updates(model, batch, advantages, mode, accelerator=None, on_learner=None):
    """``UPDATES`` learner updates (``on_learner(learner)`` called before them); returns the
    last update's metrics."""
    from turnrl.algorithms import Learner, LossConfig, OptimConfig

    learner = Learner(model, LossConfig(loss_agg=mode, **LOSS), OptimConfig(**OPTIM), accelerator=accelerator)
    if on_learner is not None:
        on_learner(learner)
    for _ in range(UPDATES):
        metrics = learner.update(batch, advantages)
    return metrics


def worker(out: Path) -> None:
    """One process of the 2-process run (under ``accelerate launch``)."""
    from accelerate import Accelerator
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from turnrl.chat.renderer import ChatRenderer
    from turnrl.models.causal_lm import TinyModelConfig, build_tiny_model
    from turnrl.chat.tokenizer import build_tokenizer
    from turnrl.rollout.scripted import corpus_texts
    from turnrl.algorithms.distributed import shard_rows
    from turnrl.envs import CalcMathEnv, GuessNumberEnv

    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    rank, world = accelerator.process_index, accelerator.num_processes
    corpus = corpus_texts(GuessNumberEnv(), range(30)) + corpus_texts(CalcMathEnv(), range(30))
    tokenizer = build_tokenizer(corpus, vocab_size=3000, max_number=255)  # as tests/conftest.py
    renderer = ChatRenderer(tokenizer)
    tiny = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
    base = build_tiny_model(tiny, tokenizer, seed=0).to(DTYPE)
    batch, advantages = fixed_batch(tokenizer, renderer, base)
    rows = shard_rows(len(batch), LOSS["num_minibatches"], world, rank)
    for mode in RUNS:
        if mode == UNEVEN:
            batch, advantages = batch.rows(slice(0, UNEVEN_ROWS)), advantages[:UNEVEN_ROWS]
            rows = shard_rows(len(batch), LOSS["num_minibatches"], world, rank)
        model = copy.deepcopy(base)
        seen = []  # every row a training forward saw (its unpadded ids)
        model.model.embed_tokens.register_forward_hook(
            lambda mod, args, output: seen.extend(args[0].tolist()))
        allreduces = []  # DDP gradient all-reduces (one per bucket per synced backward)

        def count_allreduces(learner):
            def hook(state, bucket):
                allreduces.append(bucket.index())
                return allreduce_hook(state, bucket)

            learner._forward.register_comm_hook(None, hook)

        metrics = run_updates(model, batch.rows(rows), advantages[rows], mode, accelerator, count_allreduces)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        torch.save({"rows": rows, "seen": seen, "metrics": metrics, "state": state, "world": world,
                    "allreduces": allreduces}, out / f"{mode}.rank{rank}.pt")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    """The worker launched by ``accelerate launch`` with 2 CPU processes; its saved results."""
    out = tmp_path_factory.mktemp("ddp")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ACCELERATE_CONFIG),
           "--main_process_port", str(free_port()), __file__, str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"accelerate launch failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return {(mode, r): torch.load(out / f"{mode}.rank{r}.pt", weights_only=False) for mode in RUNS for r in (0, 1)}


@pytest.fixture(scope="module")
def single_process(tiny_model, tokenizer, renderer):
    """The same batch and 3 updates in this one process, without an accelerator; and the
    model they started from (the tiny model in ``DTYPE``)."""
    base = copy.deepcopy(tiny_model).to(DTYPE)
    batch, advantages = fixed_batch(tokenizer, renderer, base)
    out = {}
    for mode in RUNS:
        model = copy.deepcopy(base)
        rows = slice(0, UNEVEN_ROWS) if mode == UNEVEN else slice(None)
        out[mode] = (model, run_updates(model, batch.rows(rows), advantages[rows], mode))
    return batch, out, base


@pytest.mark.slow
@pytest.mark.parametrize("mode", RUNS)
def test_two_processes_give_the_single_process_update(two_process_run, single_process, mode):
    batch, results, base = single_process
    model, metrics = results[mode]
    rows = slice(0, UNEVEN_ROWS) if mode == UNEVEN else slice(None)
    tokens, steps = int(batch.rows(rows).attention_mask.sum()), UPDATES * LOSS["num_minibatches"]
    start = base.state_dict()
    update = max(float((p - start[name]).abs().max()) for name, p in model.state_dict().items())
    assert update > 1e-4  # Adam's steps of lr = 1e-3
    for rank in (0, 1):
        run = two_process_run[mode, rank]
        assert run["world"] == 2
        for name, p in model.state_dict().items():
            assert p.dtype == run["state"][name].dtype == DTYPE or "rotary" in name, name
            assert not torch.equal(p, start[name]) or "rotary" in name, f"{name} did not move"
            difference = float((run["state"][name] - p).abs().max())
            tol = parameter_tol(base.config, tokens, p, steps)
            assert bool(((run["state"][name] - p).abs() <= tol).all()), (mode, rank, name, difference, update)
        for key in ("pg_loss", "entropy", "ratio", "clip_frac", "approx_kl", "grad_norm", "ratio_max", "ratio_min"):
            assert run["metrics"][key] == pytest.approx(metrics[key], rel=1e-4, abs=1e-6), key


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_each_process_trains_only_on_its_shard(two_process_run, single_process, tokenizer, mode):
    batch, _, _ = single_process
    shards = [two_process_run[mode, r]["rows"].tolist() for r in (0, 1)]
    assert sorted(shards[0] + shards[1]) == list(range(len(batch))) and not set(shards[0]) & set(shards[1])
    # the shard of every global minibatch (rows 0-5 and 6-11) is split between the processes
    assert shards == [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9, 10, 11]]

    def unpadded(ids):
        while ids and ids[-1] == tokenizer.pad_token_id:
            ids = ids[:-1]
        return tuple(ids)

    for rank, shard in enumerate(shards):
        seen = sorted(unpadded(ids) for ids in two_process_run[mode, rank]["seen"])
        expected = sorted(unpadded(batch.input_ids[i].tolist()) for i in shard for _ in range(UPDATES))
        assert seen == expected


@pytest.mark.slow
def test_a_process_without_rows_in_a_minibatch_still_takes_the_step(two_process_run, single_process):
    batch, _, _ = single_process
    # global minibatches [0, 1] and [2]: process 1 holds row 1 only
    assert [two_process_run[UNEVEN, r]["rows"].tolist() for r in (0, 1)] == [[0, 2], [1]]
    # its one real forward per update, and the zero-weight stand-in (its own row) for the second
    row = batch.input_ids[1, : int(batch.attention_mask[1].sum())].tolist()
    seen = [ids[: len(row)] for ids in two_process_run[UNEVEN, 1]["seen"]]
    assert seen == [row] * (2 * UPDATES)
    assert two_process_run[UNEVEN, 1]["metrics"]["grad_norm"] == two_process_run[UNEVEN, 0]["metrics"]["grad_norm"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", RUNS)
def test_gradients_are_all_reduced_once_per_optimizer_step(two_process_run, mode):
    # on every process each minibatch's micro-batches (2 and 1 rows) but the last run under no_sync
    for rank in (0, 1):
        buckets = two_process_run[mode, rank]["allreduces"]
        steps = UPDATES * LOSS["num_minibatches"]
        assert len(buckets) == steps * len(set(buckets)), buckets


def test_shard_rows_reproduces_every_global_minibatch():
    from turnrl.algorithms.distributed import minibatch_splits, shard_rows

    for n in range(1, 40):
        for k in range(1, 6):
            for world in (1, 2, 3, 4):
                global_mbs = minibatch_splits(n, min(k, n))
                shards = [shard_rows(n, k, world, r) for r in range(world)]
                local = [[shard[i] for i in minibatch_splits(len(shard), min(k, n))] for shard in shards]
                for m, rows in enumerate(global_mbs):
                    assert sorted(torch.cat([loc[m] for loc in local]).tolist()) == rows.tolist()
    with pytest.raises(ValueError, match="rank"):
        shard_rows(4, 1, 2, 2)


@pytest.mark.slow
def test_gradient_checkpointing_and_bf16_switches(tiny_model, tokenizer, renderer):
    from turnrl.algorithms import Learner, LossConfig, OptimConfig

    batch, advantages = fixed_batch(tokenizer, renderer, tiny_model)
    reference = copy.deepcopy(tiny_model)
    Learner(reference, LossConfig(**LOSS), OptimConfig(**OPTIM)).update(batch, advantages)
    # compared in DTYPE (float64), as the 2-process runs and for the same reason (module docstring)
    reference64, checkpointed = copy.deepcopy(tiny_model).to(DTYPE), copy.deepcopy(tiny_model).to(DTYPE)
    Learner(reference64, LossConfig(**LOSS), OptimConfig(**OPTIM)).update(batch, advantages)
    Learner(checkpointed, LossConfig(**LOSS), OptimConfig(gradient_checkpointing=True, **OPTIM)).update(batch,
                                                                                                       advantages)
    assert checkpointed.is_gradient_checkpointing
    tokens = int(batch.attention_mask.sum())
    for (name, p), q in zip(checkpointed.named_parameters(), reference64.parameters()):
        assert bool(((p - q).abs() <= parameter_tol(tiny_model.config, tokens, q, LOSS["num_minibatches"])).all()), name
    bf16 = copy.deepcopy(tiny_model)
    metrics = Learner(bf16, LossConfig(**LOSS), OptimConfig(mixed_precision="bf16", **OPTIM)).update(batch, advantages)
    assert all(p.dtype == torch.float32 for p in bf16.parameters())  # fp32 master weights
    assert np.isfinite(metrics["pg_loss"]) and metrics["grad_norm"] > 0
    # bf16 rounding, not a different update: the step points the same way as the fp32 one
    step = torch.cat([(p - q).flatten() for p, q in zip(bf16.parameters(), tiny_model.parameters())])
    step_fp32 = torch.cat([(p - q).flatten() for p, q in zip(reference.parameters(), tiny_model.parameters())])
    assert torch.nn.functional.cosine_similarity(step, step_fp32, dim=0) > 0.9
    with pytest.raises(ValueError, match="mixed_precision"):
        Learner(copy.deepcopy(tiny_model), LossConfig(), OptimConfig(mixed_precision="fp8"))



@pytest.mark.slow
def test_lora_trains_only_the_adapters(tiny_model, tokenizer, renderer):
    pytest.importorskip("peft", reason="LoRA needs peft (the optional 'lora' extra: pip install 'turnrl[lora]')")
    from turnrl.algorithms import Learner, LossConfig, OptimConfig

    batch, advantages = fixed_batch(tokenizer, renderer, tiny_model)
    model = copy.deepcopy(tiny_model)
    learner = Learner(model, LossConfig(kl_coef=0.1, **LOSS), OptimConfig(lora_rank=4, **OPTIM))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    tol = logprob_tol_for(tiny_model, rows_of(batch))  # rounding only: adapters start at zero
    assert learner.logprobs(batch).sub(batch.old_logprobs).abs().max() <= tol
    metrics = learner.update(batch, advantages)
    assert np.isfinite(metrics["pg_loss"]) and metrics["grad_norm"] > 0
    base = dict(tiny_model.named_parameters())
    for name, p in model.named_parameters():
        if name in trainable:
            assert "lora_B" not in name or p.abs().max() > 0, name  # B left zero
        else:  # the frozen weights, under peft's names for wrapped layers
            original = name.replace(".base_layer", "")
            assert torch.equal(p, base[original]), name
    assert learner.logprobs(batch).sub(batch.old_logprobs).abs().max() > tol  # the policy moved beyond rounding
    assert all(not p.requires_grad for p in learner.ref_model.parameters())
    assert not any("lora_" in n for n, _ in learner.ref_model.named_parameters())  # the reference is the base


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    worker(Path(sys.argv[1]))
