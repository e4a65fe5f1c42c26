import importlib
import warnings

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import turnrl.envs
from turnrl.envs import registered_env_ids
from turnrl.envs.base import MultiTurnEnv
from turnrl.envs.mixture import MixtureEnv


def test_ids_listed():
    assert {"turnrl/GuessNumber-v0", "turnrl/CalcMath-v0"} <= set(registered_env_ids())


def test_registration_is_idempotent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importlib.reload(turnrl.envs)
        turnrl.envs.register_envs()
    assert registered_env_ids().count("turnrl/CalcMath-v0") == 1


@pytest.mark.parametrize("env_id", registered_env_ids())
def test_check_env_and_make_without_warnings(env_id):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env = gymnasium.make(env_id, max_turns=3)
        assert isinstance(env.unwrapped, (MultiTurnEnv, MixtureEnv)) and env.unwrapped.max_turns == 3
        check_env(env.unwrapped)
        obs, info = env.reset(seed=0)
        assert obs in env.observation_space
        for _ in range(3):
            obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
            assert obs in env.observation_space
            if terminated or truncated:
                break
        env.close()
