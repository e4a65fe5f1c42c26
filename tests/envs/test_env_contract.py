"""Contract tests shared by every MultiTurnEnv: determinism, splits, limits, robustness."""

import numpy as np
import pytest

from turnrl.envs import CalcMathEnv, GuessNumberEnv

ENVS = {"guess": GuessNumberEnv, "calc": CalcMathEnv}
RESET_KEYS = {"task_id", "state_key", "turn", "split", "tools"}
STEP_KEYS = RESET_KEYS - {"tools"} | {"success", "parse_status", "tool_calls", "tool_errors", "parse_error"}


def play(env, seed, split, policy):
    """Run one episode; returns the list of (obs, reward, terminated, truncated, info)."""
    obs, info = env.reset(seed=seed, options={"split": split})
    transcript = [(obs, info)]
    while True:
        step = env.step(policy())
        transcript.append(step)
        if step[2] or step[3]:
            return transcript


@pytest.fixture(params=sorted(ENVS))
def env(request):
    return ENVS[request.param]()


@pytest.mark.parametrize("split", ["train", "test"])
def test_expert_solves_50_seeds(env, split):
    for seed in range(50):
        transcript = play(env, seed, split, env.expert_action)
        obs, reward, terminated, truncated, info = transcript[-1]
        assert terminated and not truncated and info["success"] and reward == 1.0
        assert sum(t[1] for t in transcript[1:]) == 1.0  # outcome reward only
        assert info["turn"] == len(transcript) - 1 <= env.max_turns


def test_same_seed_same_episode(env):
    for seed in (0, 7):
        rng_a, rng_b = np.random.default_rng(seed), np.random.default_rng(seed)
        a = play(env, seed, "train", lambda: env.weak_expert_action(rng_a))
        b = play(env, seed, "train", lambda: env.weak_expert_action(rng_b))
        assert a == b
        assert play(env, seed, "test", env.expert_action) == play(env, seed, "test", env.expert_action)


def test_splits_are_disjoint(env):
    ids = {split: {env.reset(seed=s, options={"split": split})[1]["task_id"] for s in range(300)}
           for split in ("train", "test")}
    assert len(ids["train"]) > 10 and len(ids["test"]) > 5
    assert not ids["train"] & ids["test"]


@pytest.mark.parametrize("split", ["train", "test"])
def test_weak_expert_success_rate(env, split):
    wins = 0
    for seed in range(200):
        rng = np.random.default_rng(10_000 + seed)
        wins += play(env, seed, split, lambda: env.weak_expert_action(rng))[-1][-1]["success"]
    assert 0.05 <= wins / 200 <= 0.6


def test_info_keys(env):
    obs, info = env.reset(seed=3)
    assert RESET_KEYS <= set(info) and info["turn"] == 0
    assert [m["role"] for m in obs] == ["system", "user"]
    _, _, _, _, info = env.step("hello")
    assert STEP_KEYS <= set(info) and info["turn"] == 1
    hash(info["state_key"])


def test_truncation_at_max_turns_and_step_after_end(env):
    env.reset(seed=1)
    for turn in range(1, env.max_turns + 1):
        obs, reward, terminated, truncated, info = env.step("I am not sure.")
        assert not terminated and reward == 0.0
        assert truncated == (turn == env.max_turns)
    assert not info["success"]
    with pytest.raises(RuntimeError, match="reset"):
        env.step("1")
    with pytest.raises(RuntimeError, match="reset"):
        env.expert_action()
    env.reset(seed=1)
    env.step("again")  # a new episode works


def test_step_before_reset_raises():
    with pytest.raises(RuntimeError, match="before reset"):
        GuessNumberEnv().step("1")


def test_random_actions_never_raise(env):
    env.action_space.seed(0)
    for seed in range(20):
        obs, info = env.reset(seed=seed)
        done = False
        while not done:
            obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
            assert obs in env.observation_space and (len(obs) >= 1 or terminated)
            done = terminated or truncated
    for weird in ["", "\x00\u00e9\r\n", "<tool_call>", "</tool_call>", "9" * 5000, "Answer: " + "9" * 5000]:
        env.reset(seed=0)
        obs, *_ = env.step(weird)
        assert obs in env.observation_space


def test_bad_options_and_kwargs(env):
    with pytest.raises(ValueError, match="split"):
        env.reset(options={"split": "val"})
    with pytest.raises(ValueError, match="max_turns"):
        type(env)(max_turns=0)
    with pytest.raises(KeyError, match="hermes"):
        type(env)(tool_parser="no_such_parser")
