"""A NaN or inf in the loss or the gradient skips that optimizer step: every parameter and
the optimizer's state stay bit for bit as they were, the gradient is zeroed, the step is
counted (``nonfinite_updates``, also in ``skipped_updates``) and logged; the next finite batch
updates as usual. Under ``accelerate launch`` every process skips the step when any one saw a
non-finite loss. The same for a separate critic's update.

This file is also the worker script of the 2-process check: ``accelerate launch ...
test_nonfinite_updates.py OUT`` (see ``worker``)."""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.helpers import learner_settings  # noqa: E402
from turnrl.algorithms import Learner, collate  # noqa: E402
from turnrl.algorithms.learner.critic import Critic, CriticLearner  # noqa: E402
from turnrl.algorithms.learner.critic import new_value_head  # noqa: E402

pytestmark = pytest.mark.slow
ACCELERATE_CONFIG = ROOT / "turnrl/conf/accelerate/cpu_2proc.yaml"


def snapshot(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Copies of every parameter and of the optimizer's state (moments, step counts)."""
    params = {name: p.detach().clone() for name, p in module.named_parameters()}
    state = copy.deepcopy(optimizer.state_dict())
    return params, state


def assert_untouched(module: torch.nn.Module, optimizer: torch.optim.Optimizer, before: tuple[dict, dict]) -> None:
    params, state = before
    for name, p in module.named_parameters():
        assert torch.equal(p, params[name]), f"{name} moved"
        assert p.grad is None, f"{name} kept a gradient"
    after = optimizer.state_dict()
    assert after["state"].keys() == state["state"].keys()
    for key, entry in state["state"].items():
        for field, value in entry.items():
            assert torch.equal(torch.as_tensor(after["state"][key][field]), torch.as_tensor(value)), (key, field)


def moved(module: torch.nn.Module, before: tuple[dict, dict]) -> list[str]:
    return [name for name, p in module.named_parameters() if not torch.equal(p, before[0][name])]


@pytest.fixture(scope="module")
def rl_batch(rollouts):
    """Four sampled GuessNumber episodes and fixed advantages of both signs."""
    trajectories, _ = rollouts("guess_number", 1.0)
    batch = collate(trajectories, pad_id=0)
    return batch, torch.tensor([1.0, -1.0, 0.5, -2.0])[:, None] * batch.loss_mask


def poisoned(batch, advantages, how: str):
    """The batch and advantages with one NaN or inf where the loss reads it."""
    row = 1
    col = int((batch.loss_mask[row] != 0).nonzero()[0])  # its first sampled token
    advantages, old = advantages.clone(), batch.old_logprobs.clone()
    if how == "nan advantage":
        advantages[row, col] = float("nan")
    elif how == "inf advantage":
        advantages[row, col] = float("inf")
    elif how == "nan old logprob":  # a NaN ratio
        old[row, col] = float("nan")
    return replace(batch, old_logprobs=old), advantages


@pytest.mark.parametrize("how", ["nan advantage", "inf advantage", "nan old logprob"])
def test_a_nonfinite_loss_skips_the_step_leaving_weights_and_optimizer_state(fresh_model, rl_batch, how, caplog):
    batch, advantages = rl_batch
    learner = Learner(fresh_model, *learner_settings(lr=1e-3))
    first = learner.update(batch, advantages)  # moments and a step count to keep
    assert first["nonfinite_updates"] == 0.0 and first["skipped_updates"] == 0.0
    before = snapshot(fresh_model, learner.optimizer)
    with caplog.at_level("WARNING", logger="turnrl.algorithms.learner.learner"):
        metrics = learner.update(*poisoned(batch, advantages, how))
    assert_untouched(fresh_model, learner.optimizer, before)
    assert metrics["nonfinite_updates"] == 1.0 and metrics["skipped_updates"] == 1.0
    assert all(v == v for v in metrics.values()), metrics  # the skipped minibatch adds no NaN figure
    assert any("non-finite loss or gradient" in r.getMessage() for r in caplog.records)
    after = learner.update(batch, advantages)  # a finite batch updates again
    assert after["nonfinite_updates"] == 0.0 and after["grad_norm"] > 0
    assert len(moved(fresh_model, before)) == len(before[0])


def test_only_the_minibatch_that_is_not_finite_is_skipped(fresh_model, rl_batch):
    """Two minibatches (rows 0-1, 2-3): a NaN in row 1 skips the first step, the second is taken."""
    batch, advantages = rl_batch
    # in float64: an Adam step normalises each gradient element, so a float32 rounding
    # difference (the two runs pad their rows differently) can flip a near-zero element's step
    model = fresh_model.double()
    learner = Learner(model, *learner_settings(lr=1e-3, num_minibatches=2))
    reference = copy.deepcopy(model)
    bad_batch, bad_advantages = poisoned(batch, advantages, "nan advantage")
    metrics = learner.update(bad_batch, bad_advantages)
    assert metrics["nonfinite_updates"] == 1.0 and metrics["skipped_updates"] == 1.0
    # the same as the second minibatch's step alone
    Learner(reference, *learner_settings(lr=1e-3)).update(batch.rows(slice(2, 4)), advantages[2:4])
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        # a float64 rounding difference moves a step by far less than 1e-9; a wrong or missing
        # step moves parameters by about lr = 1e-3
        assert (p - q).abs().max() <= 1e-9, name


def test_a_zero_advantage_batch_is_a_normal_step_not_a_nonfinite_one(fresh_model, rl_batch):
    batch, advantages = rl_batch
    learner = Learner(fresh_model, *learner_settings(lr=1e-3))
    metrics = learner.update(batch, torch.zeros_like(advantages))
    assert metrics["nonfinite_updates"] == 0.0 and metrics["grad_norm"] == 0.0 and metrics["skipped_updates"] == 1.0
    assert all(v == v for v in metrics.values())


def test_a_nonfinite_value_loss_of_a_shared_value_head_skips_the_step(fresh_model, rl_batch):
    batch, advantages = rl_batch
    head = new_value_head(fresh_model.config.hidden_size)
    learner = Learner(fresh_model, *learner_settings(lr=1e-3), value_head=head)
    batch = replace(batch, values=learner.values(batch))
    returns = torch.ones_like(advantages) * batch.loss_mask
    learner.update(batch, advantages, returns)
    before = snapshot(learner.forward_module, learner.optimizer)
    bad = returns.clone()
    bad[batch.loss_mask != 0] = float("nan")
    metrics = learner.update(batch, advantages, bad)
    assert metrics["nonfinite_updates"] == 1.0
    assert_untouched(learner.forward_module, learner.optimizer, before)


def test_a_nonfinite_critic_loss_skips_the_critics_step(fresh_model, rl_batch):
    batch, _ = rl_batch
    critic = CriticLearner(Critic.from_policy(fresh_model), *learner_settings(critic_lr=1e-3))
    old = critic.values(batch)
    returns = torch.ones_like(old) * batch.loss_mask
    assert critic.update(batch, returns, old)["critic_nonfinite_updates"] == 0.0
    before = snapshot(critic.critic, critic.optimizer)
    bad = returns.clone()
    bad[0, int((batch.loss_mask[0] != 0).nonzero()[0])] = float("inf")
    assert critic.update(batch, bad, old)["critic_nonfinite_updates"] == 1.0
    assert_untouched(critic.critic, critic.optimizer, before)
    critic.update(batch, returns, old)
    assert moved(critic.critic, before)


def test_the_run_log_counts_nonfinite_updates_since_the_start():
    from turnrl.train.recorder import nonfinite_total

    history = []
    for step, (policy, critic) in enumerate([(0.0, 0.0), (1.0, 0.0), (0.0, 1.0), (2.0, 0.0)]):
        metrics = {"nonfinite_updates": policy, "critic_nonfinite_updates": critic}
        history.append({"step": step, **metrics, "nonfinite_updates_total": nonfinite_total(history, metrics)})
    assert [h["nonfinite_updates_total"] for h in history] == [0.0, 1.0, 2.0, 4.0]
    assert nonfinite_total([], {"nonfinite_updates": 1.0}) == 1.0  # no critic


# ---------------------------------------------------------------- two processes
# With DDP a NaN gradient on one process reaches every process through the gradient all-reduce,
# but a loss that is not finite on one process alone (its gradient finite) reaches no other: the
# learner all-reduces its verdict so every process skips the same step. The worker makes process
# 0's first micro-batch report a non-finite loss and checks both skip.


def worker(out: Path) -> None:
    """One process of the 2-process run (under ``accelerate launch``)."""
    from accelerate import Accelerator

    from turnrl.chat.renderer import ChatRenderer
    from turnrl.models.causal_lm import TinyModelConfig, build_tiny_model
    from turnrl.chat.tokenizer import build_tokenizer
    from turnrl.rollout.scripted import corpus_texts, scripted_episode
    from turnrl.envs import CalcMathEnv, GuessNumberEnv

    import numpy as np

    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    corpus = corpus_texts(GuessNumberEnv(), range(30)) + corpus_texts(CalcMathEnv(), range(30))
    tokenizer = build_tokenizer(corpus, vocab_size=3000, max_number=255)  # as tests/conftest.py
    renderer = ChatRenderer(tokenizer)
    tiny = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
    model = build_tiny_model(tiny, tokenizer, seed=0)
    env = GuessNumberEnv(n=32, max_turns=6)
    trajs = [scripted_episode(env, seed, renderer, player, rng=np.random.default_rng(seed))
             for seed, player in ((0, "expert"), (1, "weak"), (2, "weak"), (3, "expert"))]
    batch = collate(trajs, tokenizer.pad_token_id).rows(slice(2 * rank, 2 * rank + 2))  # this process's shard
    advantages = torch.tensor([1.0, -1.0])[:, None] * batch.loss_mask
    learner = Learner(model, *learner_settings(lr=1e-3), accelerator=accelerator)
    results = {"first": learner.update(batch, advantages)}
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    real_backward = learner._backward
    calls = []

    def backward(*args, **kwargs):  # process 0 alone: a loss that is not finite, its gradient finite
        finite = real_backward(*args, **kwargs)
        calls.append(1)
        return finite and not (rank == 0 and len(calls) == 1)

    learner._backward = backward
    results["poisoned"] = learner.update(batch, advantages)
    results["unchanged"] = all(torch.equal(p, before[name]) for name, p in model.named_parameters())
    results["third"] = learner.update(batch, advantages)
    results["moved"] = not all(torch.equal(p, before[name]) for name, p in model.named_parameters())
    torch.save(results, out / f"rank{rank}.pt")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_process_skips_the_step_one_process_found_not_finite(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ACCELERATE_CONFIG),
           "--main_process_port", str(free_port()), __file__, str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"accelerate launch failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    for rank in (0, 1):
        results = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        assert results["first"]["nonfinite_updates"] == 0.0
        assert results["poisoned"]["nonfinite_updates"] == 1.0 and results["unchanged"], rank
        assert results["third"]["nonfinite_updates"] == 0.0 and results["moved"], rank


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
