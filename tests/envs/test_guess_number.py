import pytest

from turnrl.envs import GuessNumberEnv
from turnrl.envs.games.guess_number import is_held_out


def test_prompt_and_hints():
    env = GuessNumberEnv()
    obs, info = env.reset(seed=0)
    assert obs == (
        {"role": "system", "content": "You are playing a guessing game."},
        {"role": "user", "content": "Guess my number between 1 and 32. Reply with a number."},
    )
    upper, secret = env.task
    assert upper == 32
    assert info == {"task_id": f"guess-32-{secret}", "state_key": (1, 32), "turn": 0, "split": "train",
                    "tools": []}
    below, above = secret - 1, secret + 1
    if below >= 1:
        obs, reward, terminated, _, info = env.step(f"My guess is {below}, or {above}")
        assert obs == ({"role": "user", "content": f"higher, between {below + 1} and 32"},)
        assert reward == 0.0 and not terminated
        assert info["state_key"] == (below + 1, 32)
    if above <= 32:
        obs, *_ , info = env.step(str(above))
        lo = below + 1 if below >= 1 else 1
        assert obs == ({"role": "user", "content": f"lower, between {lo} and {above - 1}"},)
    obs, reward, terminated, truncated, info = env.step(str(secret))
    assert obs == ({"role": "user", "content": "correct"},)
    assert reward == 1.0 and terminated and not truncated and info["success"]
    assert info["state_key"] == (secret, secret)


def test_invalid_replies_count_as_turns():
    env = GuessNumberEnv(max_turns=3)
    env.reset(seed=0)
    for text in ["no idea", "0", "33"]:
        obs, reward, terminated, truncated, info = env.step(text)
        assert obs == ({"role": "user", "content": "Reply with one number between 1 and 32."},)
        assert info["state_key"] == (1, 32)
    assert truncated and not terminated and info["turn"] == 3


def test_split_definition_and_state_key_sharing():
    env = GuessNumberEnv(n=32, n_min=16)
    train, test = set(env.split_tasks("train")), set(env.split_tasks("test"))
    assert not train & test and len(train) + len(test) == sum(range(16, 33))
    assert 0.15 < len(test) / (len(train) + len(test)) < 0.35
    assert all(is_held_out(u, s) for u, s in test)
    keys = {}
    for seed in range(200):
        env.reset(seed=seed, options={"split": "test"})
        assert env.task in test
        upper, secret = env.task
        if upper == 32 and secret > 16:
            keys[secret] = env.step("16")[-1]["state_key"]
    assert len(keys) >= 2 and set(keys.values()) == {(17, 32)}  # same hints, same key


def test_range_of_upper_bounds_shows_in_prompt_and_bounds_guesses():
    env = GuessNumberEnv(n=32, n_min=16)
    uppers = set()
    for seed in range(100):
        obs, _ = env.reset(seed=seed)
        upper = env.task[0]
        uppers.add(upper)
        assert obs[1]["content"] == f"Guess my number between 1 and {upper}. Reply with a number."
        obs, *_ = env.step(str(upper + 1))
        assert obs[0]["content"] == f"Reply with one number between 1 and {upper}."
    assert min(uppers) >= 16 and max(uppers) <= 32 and len(uppers) > 8


@pytest.mark.slow
def test_binary_search_solves_every_secret_in_6_turns():
    env = GuessNumberEnv(n=32, n_min=16)
    solved = set()
    for seed in range(3000):
        obs, info = env.reset(seed=seed, options={"split": "train" if seed % 2 else "test"})
        for turn in range(6):
            *_, terminated, truncated, info = env.step(env.expert_action())
            if terminated:
                break
        assert info["success"]
        solved.add(env.task)
    assert solved == set(env.split_tasks("train")) | set(env.split_tasks("test"))


@pytest.mark.slow  # composes the config (Hydra) and plays 400 episodes: seconds
def test_the_long_horizon_config_needs_8_or_more_turns_of_the_warm_started_player():
    """``env=guess_number_long``: binary search needs up to 8 guesses on ranges 128..255, and
    the scan-leaning weak player it warm-starts on takes most of the 12 turns."""
    import numpy as np
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from turnrl.train.factories import env_factory
    from turnrl.conf.schema import register_configs

    register_configs()
    with initialize_config_module(config_module="turnrl.conf", version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name="config", overrides=["env=guess_number_long"]))
    assert cfg.agent.warmstart.steps == 400 and cfg.agent.warmstart.player == "weak"
    env = env_factory(cfg)().unwrapped
    assert (env.n, env.n_min, env.max_turns) == (255, 128, 12)
    rng = np.random.default_rng(0)
    turns = {"expert": [], "weak": []}
    for seed in range(200):
        for player in turns:
            env.reset(seed=seed, options={"split": "test"})
            for turn in range(1, 13):
                action = env.expert_action() if player == "expert" else env.weak_expert_action(rng)
                *_, terminated, truncated, info = env.step(action)
                if terminated or truncated:
                    break
            assert info["success"] or player == "weak"
            turns[player].append(turn)
    assert max(turns["expert"]) == 8 and np.mean(turns["expert"]) > 6
    assert np.mean(turns["weak"]) > 10


@pytest.mark.slow
def test_show_middle_states_the_expert_guess_and_copying_it_solves_every_task():
    """With ``show_middle`` every prompt and hint ends with the feasible interval's midpoint: a
    player that copies the last number of the last message plays binary search, and one that
    copies the first number of the interval plays the scan (the weak player's two moves)."""
    env = GuessNumberEnv(n=255, n_min=128, max_turns=12, show_middle=True)
    obs, _ = env.reset(seed=3)
    upper = env.task[0]
    assert obs[1]["content"] == f"Guess my number between 1 and {upper}, middle {(1 + upper) // 2}. Reply with a number."
    if env.task[1] > 1:
        assert env.step("1")[0][0]["content"] == f"higher, between 2 and {upper}, middle {(2 + upper) // 2}"
    for split in ("train", "test"):
        for seed in range(60):
            obs, _ = env.reset(seed=seed, options={"split": split})
            text, turns = obs[-1]["content"], 0
            while True:
                middle = int(text.rsplit("middle ", 1)[1].split(".")[0])
                assert str(middle) == env.expert_action()
                obs, reward, terminated, truncated, info = env.step(str(middle))
                turns, text = turns + 1, obs[-1]["content"]
                if terminated or truncated:
                    break
                lo, hi = info["state_key"]
                assert text.endswith(f"between {lo} and {hi}, middle {(lo + hi) // 2}")
            assert info["success"] and turns <= 8, (split, seed)
    assert GuessNumberEnv().reset(seed=0)[0][1]["content"].endswith("and 32. Reply with a number.")  # off by default
    with pytest.raises(TypeError, match="show_middle must be a bool"):
        GuessNumberEnv(show_middle=1)
