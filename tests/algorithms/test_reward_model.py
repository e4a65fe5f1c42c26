"""Bradley-Terry reward model: the loss, learning real preferences, calibration, and the
env wrapper that rewards episodes with it."""

import math

import numpy as np
import pytest
import torch

from turnrl.rollout.scripted import scripted_episode
from turnrl.algorithms.pre_rl.dpo import PreferencePair
from turnrl.algorithms.pre_rl.reward_model import (RewardModel, RewardModelConfig, RewardModelTrainer,
                                            bradley_terry_loss, calibration)
from turnrl.envs import GuessNumberEnv
from turnrl.train.reward_model_env import RewardModelReward

from tests.tolerances import float_tol, head_bound, network_tol


def test_bradley_terry_loss_by_hand():
    # r_c - r_r = [1, -1]: (-log sigmoid(1) - log sigmoid(-1)) / 2
    expected = (math.log(1 + math.exp(-1)) + math.log(1 + math.exp(1))) / 2
    assert float(bradley_terry_loss(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))) == pytest.approx(expected)


@pytest.fixture(scope="module")
def preference_pairs(renderer):
    """Expert (wins) vs weak (loses) episodes of the same GuessNumber tasks."""
    env = GuessNumberEnv(n=32, max_turns=4)
    pairs = []
    for seed in range(200):
        good = scripted_episode(env, seed, renderer, "expert")
        bad = scripted_episode(env, seed, renderer, "weak", rng=np.random.default_rng(seed))
        if good.reward > bad.reward:
            pairs.append(PreferencePair(good, bad))
    return pairs


@pytest.mark.slow
def test_reward_model_learns_preferences_and_reports_calibration(preference_pairs, tiny_model, tokenizer):
    train, held_out = preference_pairs[: len(preference_pairs) * 3 // 4], preference_pairs[len(preference_pairs) * 3 // 4:]
    rm = RewardModel.from_policy(tiny_model, tokenizer.pad_token_id)
    before = calibration(rm, held_out)
    assert before["accuracy"] == 0.0 and before["margin"] == 0.0  # a zero head ties every pair
    history = RewardModelTrainer(rm, RewardModelConfig(lr=3e-3, batch_size=32)).train(train, 40, progress=False)
    after = calibration(rm, held_out)
    assert history[-1]["loss"] < history[0]["loss"]
    assert after["accuracy"] >= 0.8 and after["margin"] > 0 and 0.0 <= after["ece"] <= 1.0
    assert rm.backbone is not tiny_model.get_decoder()


def test_ece_of_a_perfectly_confident_correct_model_is_near_zero():
    class Fixed(RewardModel):
        def score(self, trajectories):
            return torch.tensor([50.0 if t.task_id == "c" else 0.0 for t in trajectories])

    from tests.algorithms.test_credit_estimators import traj

    c, r = traj([1], "a", 0), traj([0], "a", 0)
    c.task_id = "c"
    model = Fixed(torch.nn.Identity(), 4, 0)
    stats = calibration(model, [PreferencePair(c, r)] * 5)
    tol = float_tol(torch.float32, 5, 1.0)  # float32 means of 5 confidences <= 1 (exactly: ECE e^-50)
    assert stats["accuracy"] == 1.0 and stats["ece"] == pytest.approx(0.0, abs=tol)
    reversed_stats = calibration(model, [PreferencePair(r, c)] * 5)  # confidently wrong: ECE 1
    assert reversed_stats["accuracy"] == 0.0 and reversed_stats["ece"] == pytest.approx(1.0, abs=tol)


@pytest.mark.slow
def test_env_wrapper_rewards_with_the_model_and_keeps_the_verifier(preference_pairs, tiny_model, tokenizer, renderer):
    rm = RewardModel.from_policy(tiny_model, tokenizer.pad_token_id)
    RewardModelTrainer(rm, RewardModelConfig(lr=3e-3, batch_size=32)).train(preference_pairs, 20, progress=False)
    env = RewardModelReward(GuessNumberEnv(n=32, max_turns=6), rm, renderer)
    env.reset(seed=0)
    rewards = []
    while True:
        _, reward, terminated, truncated, info = env.step(env.unwrapped.expert_action())
        rewards.append(reward)
        if terminated or truncated:
            break
    assert all(r == 0.0 for r in rewards[:-1])
    expert = scripted_episode(GuessNumberEnv(n=32, max_turns=6), 0, renderer, "expert")
    score = float(rm.score([expert])[0])
    # the same rendering: rounding only, the decoder's bound at the size of the head's partial sums
    # (head_bound: the head after the decoder's final norm, tests/tolerances.py)
    tol = network_tol(tiny_model.config, torch.float32, head_bound(rm.head, rm.backbone.norm),
                      seq_len=len(expert.token_ids))
    assert rewards[-1] == pytest.approx(score, abs=tol)
    assert info["verifier_reward"] == 1.0 and info["proxy_reward"] == rewards[-1] and info["success"]
    with pytest.raises(RuntimeError, match="reset"):
        RewardModelReward(GuessNumberEnv(), rm, renderer).step("1")
