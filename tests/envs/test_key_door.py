import gymnasium
import numpy as np
import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

import turnrl.envs  # noqa: F401  (registers the envs)
from turnrl.chat.tokenizer import build_tokenizer
from turnrl.conf.schema import register_configs
from turnrl.envs.check import check
from turnrl.envs.games.key_door import KeyDoorEnv, is_held_out, start_cells, tasks
from turnrl.rollout.scripted import corpus_texts
from turnrl.train.factories import env_factory

LONG = {"length": 19, "min_length": 15, "start_band": (0.4, 0.7), "max_turns": 40}
"""``env=key_door_long``'s kwargs."""


def at(env, task):
    """Reset ``env`` into ``task`` ``(L, start)`` (the first seed of its split that draws it)."""
    split = "test" if is_held_out(*task) else "train"
    for seed in range(1000):
        obs, info = env.reset(seed=seed, options={"split": split})
        if env.task == task:
            return obs, info
    raise AssertionError(f"no seed draws {task}")


def play(env, policy):
    """Play until the episode ends; the list of ``step`` results."""
    steps = []
    while not steps or not (steps[-1][2] or steps[-1][3]):
        steps.append(env.step(policy()))
    return steps


def text(step) -> str:
    return step[0][-1]["content"]


def test_prompt_and_state_line():
    env = KeyDoorEnv(**LONG)
    obs, info = at(env, (16, 7))
    assert [m["role"] for m in obs] == ["system", "user"]
    assert obs[0]["content"].startswith("You are in a corridor of cells 0 to 16. The key lies at cell 0. The door at "
                                        "cell 16 opens only with the key.")
    assert obs[1]["content"] == "Cell 7 of 0-16. No key."
    assert info == {"task_id": "key_door-16-7", "state_key": "cell7", "turn": 0, "split": "test", "tools": []}
    assert (env.cell, env.has_key) == (7, False)


def test_key_wall_locked_door_and_opening():
    env = KeyDoorEnv(**{**LONG, "max_turns": 60})
    at(env, (16, 7))
    for cell in range(8, 16):
        step = env.step("right")
        assert text(step) == f"Cell {cell} of 0-16. No key." and step[1] == 0.0
    step = env.step("Right!")  # the door is a wall without the key
    assert text(step) == "Locked. Cell 15 of 0-16. No key." and step[-1]["state_key"] == "cell15"
    for cell in range(14, 0, -1):
        assert text(env.step("left")) == f"Cell {cell} of 0-16. No key."
    step = env.step("left")
    assert text(step) == "Took the key. Cell 0 of 0-16. Key held." and step[1] == 0.0
    assert step[-1]["state_key"] == "cell0+key" and env.has_key
    step = env.step("left")
    assert text(step) == "Wall. Cell 0 of 0-16. Key held." and step[-1]["state_key"] == "cell0+key"
    for cell in range(1, 16):
        assert text(env.step("right")) == f"Cell {cell} of 0-16. Key held."
    obs, reward, terminated, truncated, info = env.step("right")
    assert obs == ({"role": "user", "content": "You opened the door!"},)
    assert (reward, terminated, truncated, info["success"], info["state_key"]) == (1.0, True, False, True, "open")
    assert info["turn"] == 8 + 1 + 14 + 1 + 1 + 15 + 1
    with pytest.raises(RuntimeError, match="reset"):
        env.step("left")


def test_invalid_replies_count_as_turns_and_the_limit_truncates():
    env = KeyDoorEnv(**{**LONG, "max_turns": 4})
    at(env, (16, 7))
    for reply in ("up", "", "I go leftward"):
        obs, reward, terminated, truncated, info = env.step(reply)
        assert obs == ({"role": "user", "content": "Reply with left or right. Cell 7 of 0-16. No key."},)
        assert (reward, terminated, truncated, info["state_key"]) == (0.0, False, False, "cell7")
    obs, reward, terminated, truncated, info = env.step("LEFT, then right")  # the first move word counts
    assert text((obs,)) == "Cell 6 of 0-16. No key."
    assert truncated and not terminated and not info["success"] and info["turn"] == 4


def test_slip_sends_the_move_the_other_way():
    env = KeyDoorEnv(**LONG, slip=1.0)
    at(env, (16, 7))
    assert text(env.step("right")) == "Slipped left. Cell 6 of 0-16. No key."
    env = KeyDoorEnv(**LONG, slip=0.25)
    slips = 0
    for seed in range(400):
        env.reset(seed=seed)
        slips += text(env.step("left")).startswith("Slipped right.")
    assert 70 < slips < 130


def test_progress_reward_pays_once_for_the_key():
    env = KeyDoorEnv(**LONG, progress_reward=0.5)
    at(env, (16, 7))
    # left onto the key (0.5), one step right and back onto the key's cell (nothing), then to the door (1.0)
    rewards = [env.step(move)[1] for move in ["left"] * 7 + ["right", "left"] + ["right"] * 16]
    assert rewards[6] == 0.5 and rewards[-1] == 1.0 and sum(rewards) == 1.5
    assert KeyDoorEnv(**LONG).progress_reward == 0.0


def test_state_keys_recur_within_an_episode_and_across_a_group():
    env = KeyDoorEnv(**LONG)
    _, info = at(env, (17, 9))
    keys = [info["state_key"]] + [step[-1]["state_key"] for step in play(env, env.expert_action)]
    assert keys[:9] == [f"cell{c}" for c in range(9, 0, -1)]
    assert keys[9:-1] == [f"cell{c}+key" for c in range(17)] and keys[-1] == "open"
    assert {"cell9", "cell9+key"} <= set(keys)  # the start cell, passed without and with the key

    paths = []
    for path in (["right", "left", "left"], ["left", "right", "left"], ["left", "left", "right"]):
        at(env, (17, 9))
        paths.append([env.step(move)[-1]["state_key"] for move in path])
    assert {p[-1] for p in paths} == {"cell8"}  # three orders of the same moves meet in one state


@pytest.mark.parametrize("kwargs", [{}, LONG], ids=["default", "long"])
def test_the_expert_solves_every_task_in_start_plus_length_turns(kwargs):
    env = KeyDoorEnv(**kwargs)
    for split in ("train", "test"):
        for task in env.split_tasks(split):
            at(env, task)
            steps = play(env, env.expert_action)
            assert steps[-1][-1]["success"] and len(steps) == task[0] + task[1] <= env.max_turns, task


def test_long_tasks_take_21_to_32_moves():
    env = KeyDoorEnv(**LONG)
    moves = [n + s for split in ("train", "test") for n, s in env.split_tasks(split)]
    assert (min(moves), max(moves)) == (21, 32) and 26 <= np.mean(moves) <= 27
    assert env.max_turns == 40 and KeyDoorEnv(length=19).max_turns == 40  # default: 2 * length + 2


def success_rate(env, player, split, episodes):
    wins = 0
    for seed in range(episodes):
        rng = np.random.default_rng(10_000 + seed)
        env.reset(seed=seed, options={"split": split})
        act = {"weak": lambda: env.weak_expert_action(rng), "random": lambda: env.random_action(rng),
               "near_end": env.near_end_action}[player]
        wins += play(env, act)[-1][-1]["success"]
    return wins / episodes


def test_weak_player_succeeds_sometimes_and_its_greedy_plan_only_from_the_middle_or_before():
    """The figures of the module docstring (env=key_door_long's kwargs): the weak player wins
    0.44 of held-out episodes (0.54 of training ones); its wrong plan alone wins exactly the
    starts at or before the middle (2 of the 8 held-out tasks); the random player never gets
    there in 40 turns."""
    env = KeyDoorEnv(**LONG)
    assert 0.35 < success_rate(env, "weak", "test", 300) < 0.52
    assert 0.45 < success_rate(env, "weak", "train", 300) < 0.62
    assert success_rate(env, "random", "test", 50) == 0.0
    for split in ("train", "test"):
        for task in env.split_tasks(split):
            at(env, task)
            assert play(env, env.near_end_action)[-1][-1]["success"] == (2 * task[1] <= task[0]), task
    short = [task for task in env.split_tasks("test") if 2 * task[1] <= task[0]]
    assert len(short) == 2 and len(env.split_tasks("test")) == 8


def test_weak_player_mixes_the_expert_and_the_near_end_plan():
    env = KeyDoorEnv(**LONG, weak_skill=0.3)
    rng = np.random.default_rng(0)
    at(env, (16, 11))  # past the middle without the key: the two disagree
    assert (env.expert_action(), env.near_end_action()) == ("left", "right")
    lefts = sum(env.weak_expert_action(rng) == "left" for _ in range(1000))
    assert 250 < lefts < 350
    at(env, (16, 7))  # before the middle: both go for the key
    assert {env.weak_expert_action(rng) for _ in range(50)} == {"left"}
    assert {KeyDoorEnv(**LONG, weak_skill=1.0).weak_skill, KeyDoorEnv(**LONG).weak_skill} == {1.0, 0.3}

    noisy = KeyDoorEnv(**LONG, weak_random=1.0)  # every move random: before the middle too
    at(noisy, (16, 7))
    lefts = sum(noisy.weak_expert_action(rng) == "left" for _ in range(1000))
    assert 430 < lefts < 570 and KeyDoorEnv(**LONG).weak_random == 0.0


def test_splits_are_a_stable_hash_of_length_and_start():
    assert tasks(range(15, 20), (0.4, 0.7), "test") == (
        (15, 8), (15, 10), (16, 7), (16, 11), (17, 9), (19, 8), (19, 10), (19, 12))
    assert list(start_cells(16, (0.4, 0.7))) == list(range(7, 12))
    assert list(start_cells(4, (0.0, 1.0))) == [1, 2, 3]  # clipped to 1..L-1
    env = KeyDoorEnv(**LONG)
    train, test = set(env.split_tasks("train")), set(env.split_tasks("test"))
    assert len(train) == 18 and len(test) == 8 and not train & test
    assert all(is_held_out(*t) for t in test) and not any(is_held_out(*t) for t in train)
    ids = {split: {env.reset(seed=s, options={"split": split})[1]["task_id"] for s in range(200)}
           for split in ("train", "test")}
    assert ids["test"] == {f"key_door-{n}-{s}" for n, s in test} and not ids["train"] & ids["test"]


@pytest.mark.parametrize("kwargs, match", [
    ({"length": 1}, "length must be an int >= 2"),
    ({"length": 10, "min_length": 11}, "min_length must be None or an int"),
    ({"start_band": (0.7, 0.4)}, "start_band must be two fractions"),
    ({"start_band": (0.4, 1.5)}, "start_band must be two fractions"),
    ({"slip": 1.5}, "slip must be a probability"),
    ({"weak_skill": -0.1}, "weak_skill must be a probability"),
    ({"weak_random": 2}, "weak_random must be a probability"),
    ({"progress_reward": 1.0}, "progress_reward must be a number in"),
    ({"length": 4, "min_length": None, "start_band": (0.5, 0.5)}, "has no 'train' task|has no 'test' task"),
])
def test_bad_kwargs_are_value_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        KeyDoorEnv(**kwargs)


@pytest.mark.parametrize("kwargs", [{}, LONG], ids=["default", "long"])
def test_registered_env_passes_the_checker(kwargs):
    report = check("turnrl/KeyDoor-v0", seeds=20, env_kwargs=kwargs)
    assert report.ok, report.format()


def compose_env(name):
    register_configs()
    with initialize_config_module(config_module="turnrl.conf", version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="config", overrides=[f"env={name}"]))


def test_hydra_groups_build_the_env():
    cfg = compose_env("key_door")
    env = env_factory(cfg)().unwrapped
    assert isinstance(env, KeyDoorEnv) and (env.length, env.min_length, env.max_turns) == (10, 6, 22)
    assert gymnasium.spec("turnrl/KeyDoor-v0").entry_point == "turnrl.envs.games.key_door:KeyDoorEnv"
    cfg = compose_env("key_door_long")
    assert cfg.agent.warmstart.player == "weak" and cfg.agent.max_new_tokens == 8
    assert (cfg.agent.warmstart.steps, cfg.agent.warmstart.batch_size) == (300, 16)
    assert (cfg.trainer.steps, cfg.trainer.eval_every) == (12, 2)
    env = env_factory(cfg)().unwrapped
    assert (env.length, env.min_length, env.start_band, env.max_turns, env.weak_skill) == (19, 15, (0.4, 0.7), 40, 0.3)
    assert (env.slip, env.progress_reward, env.weak_random) == (0.0, 0.0, 0.0)


@pytest.mark.slow  # trains the run's tokenizer on 800 scripted episodes: seconds
def test_the_long_setting_fits_the_agents_context():
    """Every turn of a 40-turn episode of moves (the chat template's role lines, the state lines
    and their events) fits ``agent.max_context_tokens`` of ``env=key_door_long`` with room for a
    reply; the default 1,024 would cut them."""
    cfg = compose_env("key_door_long")
    env = env_factory(cfg)().unwrapped
    corpus = corpus_texts(env, range(200), "expert") + corpus_texts(env, range(200), "weak")
    tokenizer = build_tokenizer(corpus, cfg.agent.tokenizer.vocab_size, cfg.agent.tokenizer.max_number)
    rng, longest = np.random.default_rng(0), 0
    for seed in range(30):
        obs, _ = at(env, (19, 13)) if seed == 0 else env.reset(seed=seed)
        messages = list(obs)
        while True:  # the wrong plan mostly ("Locked." at the door), random moves else
            action = env.near_end_action() if seed == 0 or rng.random() < 0.7 else env.random_action(rng)
            messages.append({"role": "assistant", "content": action})
            obs, _, terminated, truncated, _ = env.step(action)
            messages += obs
            if terminated or truncated:
                break
        rendered = tokenizer.apply_chat_template(messages, tokenize=False)
        longest = max(longest, len(tokenizer(rendered, add_special_tokens=False)["input_ids"]))
    assert 1024 < longest <= cfg.agent.max_context_tokens - cfg.agent.max_new_tokens
    assert cfg.agent.model.max_positions >= cfg.agent.max_context_tokens
