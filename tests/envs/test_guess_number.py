from turnrl.envs import GuessNumberEnv


def test_prompt_and_hints():
    env = GuessNumberEnv()
    obs, info = env.reset(seed=0)
    assert obs == (
        {"role": "system", "content": "You are playing a guessing game."},
        {"role": "user", "content": "Guess my number between 1 and 32. Reply with a number."},
    )
    secret = env.task
    assert info == {"task_id": f"guess-{secret}", "state_key": (1, 32), "turn": 0, "split": "train"}
    below, above = secret - 1, secret + 1
    if below >= 1:
        obs, reward, terminated, _, info = env.step(f"My guess is {below}, or {above}")
        assert obs == ({"role": "user", "content": "higher"},) and reward == 0.0 and not terminated
        assert info["state_key"] == (below + 1, 32)
    if above <= 32:
        obs, *_ , info = env.step(str(above))
        assert obs == ({"role": "user", "content": "lower"},)
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
    env = GuessNumberEnv()
    assert env.split_secrets("test") == tuple(range(4, 33, 4))
    assert len(env.split_secrets("train")) == 24
    keys = {}
    for seed in range(60):
        env.reset(seed=seed, options={"split": "test"})
        assert env.task % 4 == 0
        if env.task > 16:
            keys[env.task] = env.step("16")[-1]["state_key"]
    assert len(keys) >= 2 and set(keys.values()) == {(17, 32)}  # same hints, same key


def test_binary_search_solves_every_secret_in_6_turns():
    env = GuessNumberEnv()
    solved = set()
    for seed in range(400):
        obs, info = env.reset(seed=seed, options={"split": "train" if seed % 2 else "test"})
        for turn in range(6):
            *_, terminated, truncated, info = env.step(env.expert_action())
            if terminated:
                break
        assert info["success"]
        solved.add(env.task)
    assert solved == set(range(1, 33))
