"""End-to-end training on the tiny model: the real env, renderer, collector, GRPO and learner."""

import json
import math

import pytest
import torch
from omegaconf import OmegaConf

from turnrl.chat.formats import detect
from turnrl.chat.tokenizer import CHAT_TEMPLATE

from turnrl.conf.schema import Config
from turnrl.train.loop import train

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def _config(env_id: str, env_kwargs: dict, max_new_tokens: int = 8, **trainer) -> Config:
    cfg = OmegaConf.structured(Config)
    cfg.env.id, cfg.env.kwargs = env_id, env_kwargs
    cfg.agent.max_new_tokens = max_new_tokens
    cfg.algorithm.loss_agg = "seq-mean-token-mean"
    cfg.agent.warmstart.steps = 60
    cfg.agent.tokenizer.corpus_episodes = 50
    cfg.trainer.update(dict(eval_episodes=32, eval_every=10, progress=False, tensorboard=True) | trainer)
    return OmegaConf.to_object(cfg)


# Whether an update learns is asserted exactly, on a fixed batch, in
# tests/algorithms/test_learner.py (the step is Adam's along the exact policy gradient; a
# trajectory's log-likelihood moves with its advantage's sign). A reward curve of one seeded
# run is not asserted here: "the last 10 of 40 steps beat the first 10" held on one machine
# and failed on another (0.209 -> 0.203) once the floating-point path changed.
@pytest.mark.parametrize(
    "env_id, env_kwargs, max_new_tokens",
    [
        ("turnrl/GuessNumber-v0", {"n": 32, "n_min": 16}, 8),
        # the tool-using env: one calculator call, then the answer
        ("turnrl/CalcMath-v0", {"num_ops": 1, "max_operand": 4}, 40),
    ],
)
def test_grpo_run_moves_every_parameter_and_leaves_its_outputs(tmp_path, env_id, env_kwargs, max_new_tokens):
    # a parameter moves once a step's rewards differ within a group: after the warm start ~5%
    # (CalcMath) to ~20% (GuessNumber) of 64 episodes a step succeed, so 4 steps without it
    # have a probability below 1e-5
    start, steps = {}, 4

    def snapshot(model):
        start.update({n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad})

    cfg = _config(env_id, env_kwargs, max_new_tokens, steps=steps, lr=5e-4, eval_every=2, eval_episodes=16)
    result = train(cfg, tmp_path, on_rl_start=snapshot)

    unchanged = [n for n, p in result.model.named_parameters() if p.requires_grad and torch.equal(p, start[n])]
    assert not unchanged, f"parameters not updated by RL: {unchanged}"
    assert all(math.isfinite(m["pg_loss"]) for m in result.train)

    # what a run leaves behind
    for name in ("metrics.jsonl", "curves.png", "summary.txt", "checkpoint/config.json",
                 "checkpoint/model.safetensors", "checkpoint/tokenizer.json"):
        assert (tmp_path / name).exists(), name
    assert not (tmp_path / "checkpoint" / "trainer_state.pt").exists()  # resumable state is in checkpoints/
    assert list((tmp_path / "tb").iterdir()), "no TensorBoard events written"
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_rows = [row for row in lines if row["kind"] == "train"]
    assert len(train_rows) == steps
    for key in ("reward", "success", "turns", "gen_tokens", "tool_parse_error_rate", "tool_exec_error_rate",
                "truncation_rate", "entropy", "kl", "clip_frac", "unique_ngram_rate", "step_time"):
        assert key in train_rows[0], key
    assert (tmp_path / "summary.txt").read_text().strip().splitlines()[-1].startswith("held-out success: before ")
    # what `auto` chose for the tiny model's template (a Qwen-style one: hermes calls)
    chat = json.loads((tmp_path / "chat.json").read_text())
    assert chat["asked"] == {"chat_format": "auto", "tool_parser": "auto"}
    detected = detect(CHAT_TEMPLATE)
    assert (chat["chat_format"], chat["tool_parser"]) == (detected.name, detected.tool_parser), chat


def test_training_from_a_saved_checkpoint_path_uses_the_same_code_path(tmp_path):
    """``agent.path`` loads any HF causal LM; here the checkpoint a first run saved."""
    first = train(_config("turnrl/GuessNumber-v0", {"n": 32}, steps=2), tmp_path / "first")
    cfg = OmegaConf.structured(_config("turnrl/GuessNumber-v0", {"n": 32}, steps=2))
    cfg.agent.path = str(tmp_path / "first" / "checkpoint")
    cfg.agent.warmstart.steps = 0
    second = train(OmegaConf.to_object(cfg), tmp_path / "second")
    assert second.tokenizer.get_vocab() == first.tokenizer.get_vocab()
    # the loaded model starts where the first run ended: same greedy held-out result
    assert second.evals[0][1] == first.evals[-1][1]


def test_a_cached_warm_start_gives_the_run_a_fresh_warm_start_gives(tmp_path, caplog):
    """``agent.warmstart.cache``: the first run saves its warm-started model, the next loads it
    instead of warm-starting, and trains exactly as a run without the cache; a changed warm
    start setting is a new entry. ``agent.warmstart.seed`` makes runs of other seeds share it."""
    from turnrl.train.warm_start import cache_key

    def run(name, cache=True, **changes):
        cfg = OmegaConf.structured(_config("turnrl/GuessNumber-v0", {"n": 32, "n_min": 16}, steps=2,
                                           eval_every=2, eval_episodes=16))
        cfg.agent.warmstart.steps = 20
        cfg.agent.warmstart.cache = str(tmp_path / "cache") if cache else None
        for key, value in changes.items():
            OmegaConf.update(cfg, key, value)
        cfg = OmegaConf.to_object(cfg)
        return cfg, train(cfg, tmp_path / name)

    def figures(result):
        return [(row["reward"], row["entropy"], row["grad_norm"]) for row in result.train], result.evals

    plain_cfg, plain = run("plain", cache=False)
    assert not (tmp_path / "cache").exists()
    first_cfg, first = run("first")
    entries = list((tmp_path / "cache").iterdir())
    assert [e.name for e in entries] == [cache_key(first_cfg)]
    assert json.loads((entries[0] / "warmstart.json").read_text())["losses"][-1] < 3
    caplog.set_level("INFO", logger="turnrl")
    caplog.clear()
    second_cfg, second = run("second")
    assert f"warm start: reusing {entries[0]}" in caplog.text
    assert "warm start: 20 steps" not in caplog.text
    assert figures(first) == figures(plain) == figures(second)
    # a new warm start setting, or another seed, is another entry; a shared warm start seed is not
    assert cache_key(OmegaConf.to_object(OmegaConf.merge(first_cfg, {"agent": {"warmstart": {"lr": 1e-4}}}))) \
        != cache_key(first_cfg)
    assert cache_key(OmegaConf.to_object(OmegaConf.merge(first_cfg, {"seed": 1}))) != cache_key(first_cfg)
    # how RL samples does not change the warm start
    assert cache_key(OmegaConf.to_object(OmegaConf.merge(first_cfg, {"agent": {"temperature": 0.7}}))) \
        == cache_key(first_cfg)
    shared = OmegaConf.to_object(OmegaConf.merge(first_cfg, {"agent": {"warmstart": {"seed": 0}}}))
    assert cache_key(OmegaConf.to_object(OmegaConf.merge(shared, {"seed": 1}))) == cache_key(shared)
    # the seed counts as resolved: run seed 0 with no warm start seed is warm start seed 0's model
    assert first_cfg.seed == 0 and first_cfg.agent.warmstart.seed is None
    assert cache_key(shared) == cache_key(first_cfg)
    assert cache_key(OmegaConf.to_object(OmegaConf.merge(first_cfg, {"agent": {"warmstart": {"seed": 1}}}))) \
        != cache_key(first_cfg)


def test_kl_in_reward_adaptive_kl_tis_dual_clip_and_schedules_run_end_to_end(tmp_path):
    cfg = OmegaConf.structured(_config("turnrl/GuessNumber-v0", {"n": 32}, steps=4, tasks_per_step=3,
                                       group_size=3))
    cfg.agent.warmstart.steps = 20
    cfg.algorithm.update(dict(advantage="gigpo", advantage_kwargs={"omega": 1.0, "gamma": 0.9},
                              kl_coef=0.05, kl_target=0.001, kl_horizon=20, kl_placement="reward",
                              kl_estimator="k2", tis="token", dual_clip=3.0, entropy_coef=0.01,
                              entropy_schedule="linear", entropy_coef_end=0.0))
    cfg.agent.update(dict(temperature=1.2, temperature_schedule="linear", temperature_end=0.8))
    train(OmegaConf.to_object(cfg), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "temperature" in r]
    assert [r["temperature"] for r in rows] == pytest.approx([1.2, 1.1, 1.0, 0.9])
    assert [r["entropy_coef"] for r in rows] == pytest.approx([0.01, 0.0075, 0.005, 0.0025])
    assert rows[0]["kl_coef"] == 0.05 and rows[-1]["kl_coef"] != 0.05  # the controller moved it
    assert all("kl_reward_penalty" in r and "tis_weight" in r and "mismatch_abs" in r for r in rows)
    assert all(math.isfinite(v) for r in rows for v in r.values() if isinstance(v, float))


@pytest.mark.parametrize("algorithm", ["gspo", "cispo", "turn_ppo"])
def test_the_gspo_cispo_and_turn_ppo_configs_train_end_to_end(tmp_path, algorithm):
    from hydra import compose, initialize_config_module

    from turnrl.conf.schema import register_configs

    register_configs()
    with initialize_config_module(config_module="turnrl.conf", version_base="1.3"):
        shipped = compose(config_name="config", overrides=[f"algorithm={algorithm}"]).algorithm
    cfg = OmegaConf.structured(_config("turnrl/GuessNumber-v0", {"n": 32}, steps=2, tasks_per_step=3, group_size=3,
                                       eval_episodes=8))
    cfg.agent.warmstart.steps = 20
    cfg.algorithm = shipped  # turnrl/conf/algorithm/<algorithm>.yaml as it is
    result = train(OmegaConf.to_object(cfg), tmp_path)
    assert result.train and all(math.isfinite(m["pg_loss"]) and math.isfinite(m["grad_norm"]) for m in result.train)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["kind"] == "train"]
    assert len(rows) == 2 and all("clip_frac" in r and "ratio" in r for r in rows)
    assert all(math.isfinite(v) for r in rows for v in r.values() if isinstance(v, float))


@pytest.mark.parametrize("advantage, critic", [("gae", "separate"), ("turn_gae", "separate"), ("gae", "shared")])
def test_critic_based_ppo_trains_the_critic_beside_the_policy(tmp_path, advantage, critic):
    # secrets in 1..6: even a barely warm-started policy wins often, so the value targets are not all 0
    cfg = OmegaConf.structured(_config("turnrl/GuessNumber-v0", {"n": 6, "n_min": 4}, steps=3, tasks_per_step=4,
                                       group_size=2))
    cfg.agent.warmstart.steps = 40
    cfg.algorithm.update(dict(advantage=advantage, advantage_kwargs={"gamma": 1.0, "lam": 0.9}, critic=critic))
    train(OmegaConf.to_object(cfg), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "value_loss" in r]
    assert len(rows) == 3 and all(math.isfinite(r["value_loss"]) for r in rows)
    assert rows[0]["value_mean"] == 0.0  # the value head starts at zero
    # once a step had rewards to fit, the next step's values are no longer 0: the critic learned
    assert any(r["reward"] > 0 for r in rows[:-1])
    assert all(nxt["value_mean"] != 0.0 for prev, nxt in zip(rows, rows[1:]) if prev["reward"] > 0)


def test_dpo_stage_then_rl_in_one_config(tmp_path):
    from hydra import compose, initialize_config_module

    from turnrl.conf.schema import register_configs

    register_configs()
    with initialize_config_module(config_module="turnrl.conf", version_base="1.3"):
        composed = compose(config_name="config", overrides=[
            "+experiment=dpo_then_grpo", "dpo.steps=3", "dpo.rollout_tasks=8", "trainer.steps=2",
            "trainer.tasks_per_step=2", "trainer.group_size=2", "trainer.eval_every=2", "trainer.eval_episodes=8",
            "agent.warmstart.steps=40", "agent.tokenizer.corpus_episodes=30", "trainer.progress=false",
            "trainer.tensorboard=false", "trainer.threads=1", "trainer.save_checkpoint=false"])
    cfg = OmegaConf.to_object(composed)
    assert cfg.dpo.steps == 3 and cfg.algorithm.advantage == "grpo"
    train(cfg, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    dpo = [r for r in rows if r["kind"] == "dpo"]
    assert len(dpo) == 3 and dpo[0]["pairs"] > 0 and all(math.isfinite(r["loss"]) for r in dpo)
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2]


def test_rlhf_path_rewards_rl_with_a_learned_reward_model_and_logs_the_gap(tmp_path):
    cfg = OmegaConf.structured(_config("turnrl/GuessNumber-v0", {"n": 32}, steps=2, tasks_per_step=2,
                                       group_size=2))
    cfg.agent.warmstart.steps = 20
    cfg.reward_model.update(dict(steps=20, scripted_episodes=64, batch_size=16))
    train(OmegaConf.to_object(cfg), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    (report,) = [r for r in rows if r["kind"] == "reward_model"]
    assert report["pairs"] > 5 and 0.0 <= report["heldout_ece"] <= 1.0 and 0.0 <= report["heldout_accuracy"] <= 1.0
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert len(train_rows) == 2
    for r in train_rows:  # the RL reward is the proxy; the verifier's is logged beside it
        assert r["proxy_verifier_gap"] == pytest.approx(r["reward"] - r["verifier_reward"])


def test_training_runs_data_parallel_under_accelerate_launch(tmp_path):
    """The README's command: 2 CPU processes (gloo), the main one writes the run's outputs."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    accelerate = Path(sys.executable).parent / "accelerate"
    command = [str(accelerate), "launch", "--config_file", str(root / "turnrl/conf/accelerate/cpu_2proc.yaml"),
               "-m", "turnrl.train", "trainer.accelerate=true", "trainer.steps=2", "trainer.eval_every=2",
               "trainer.eval_episodes=8", "trainer.tasks_per_step=2", "trainer.group_size=2",
               "agent.warmstart.steps=5", "agent.tokenizer.corpus_episodes=20", "trainer.threads=1",
               "trainer.progress=false", "trainer.tensorboard=false", f"hydra.run.dir={tmp_path}"]
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2]
    assert (tmp_path / "summary.txt").exists() and (tmp_path / "rank1").is_dir()
    assert not (tmp_path / "rank1" / "summary.txt").exists()  # only the main process writes
