"""TextGymEnv on a real Text-space game written here, and ToyTextEnv on gymnasium's toy-text games."""

import string
import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env as gymnasium_check_env

import turnrl.envs  # noqa: F401  (registers the envs)
from turnrl.envs import check
from turnrl.envs.adapters import TextGymEnv, ToyTextEnv, ToyTextGame
from turnrl.envs.adapters.text_gym import DEFAULT_MAX_TURNS, hash_split

WORDS = ("apple", "river", "stone", "cloud", "tiger", "maple", "ocean", "piano", "robot", "lemon",
         "candle", "forest", "garden", "hammer", "island", "jungle", "kitten", "ladder", "mirror", "needle",
         "orange", "pencil", "rabbit", "saddle", "turtle", "violin", "window", "yellow", "zipper", "bridge")


class ReverseWordEnv(gymnasium.Env):
    """Reverse a word within ``max_tries`` tries; a wrong try tells how many leading letters are right.

    Observations and actions are strings; running out of tries truncates the episode.
    """

    metadata = {"render_modes": []}

    def __init__(self, words=WORDS, max_tries=3):
        self.words, self.max_tries = tuple(words), max_tries
        self.observation_space = spaces.Text(max_length=80, charset=string.ascii_lowercase + string.digits + " :,")
        self.action_space = spaces.Text(max_length=12, min_length=1, charset=string.ascii_lowercase)
        self.word, self.tries = "", 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.word, self.tries = self.words[int(self.np_random.integers(len(self.words)))], 0
        return f"reverse: {self.word}", {"tries": 0}

    def step(self, action):
        assert self.action_space.contains(action), f"action {action!r} is outside the action space"
        self.tries += 1
        target = self.word[::-1]
        if action == target:
            return "correct", 1.0, True, False, {"tries": self.tries}
        right = next((i for i, (a, b) in enumerate(zip(action, target)) if a != b), min(len(action), len(target)))
        left = self.max_tries - self.tries
        return f"wrong: {right} leading letters right, {left} tries left", 0.0, False, left == 0, {"tries": self.tries}


def reverse_expert(env, observation):
    return env.unwrapped.word[::-1]


def make_reverse(**kwargs):
    kwargs.setdefault("expert", reverse_expert)
    return TextGymEnv(ReverseWordEnv(), system_prompt="Reverse the word.", **kwargs)


# ------------------------------------------------------------------ TextGymEnv
def test_hand_played_episode_transcript():
    env = make_reverse()
    obs, info = env.reset(seed=0)
    word = env.env.word
    assert obs == ({"role": "system", "content": "Reverse the word."}, {"role": "user", "content": f"reverse: {word}"})
    assert info == {"tries": 0, "task_id": f"ReverseWordEnv-seed{env.task.seed}", "state_key": f"reverse: {word}",
                    "turn": 0, "split": "train", "tools": []}
    wrong = word[::-1][:2] + "zz"
    obs, reward, terminated, truncated, info = env.step(f"  {wrong}\n")
    assert obs == ({"role": "user", "content": "wrong: 2 leading letters right, 2 tries left"},)
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["tries"] == 1 and info["state_key"] == obs[0]["content"] and not info["success"]
    obs, reward, terminated, truncated, info = env.step(word[::-1])
    assert obs == ({"role": "user", "content": "correct"},)
    assert (reward, terminated, truncated) == (1.0, True, False) and info["success"] and info["turn"] == 2


def test_replies_outside_the_action_space_get_a_message_and_no_step():
    env = make_reverse()
    env.reset(seed=1)
    cases = {
        "Hello World!": "Invalid action: characters ' ', '!', 'H', 'W' are not allowed; "
                        "use only 'abcdefghijklmnopqrstuvwxyz'.",
        "a" * 13: "Invalid action: your reply has 13 characters; it must have 1 to 12.",
        "   ": "Invalid action: your reply has 0 characters; it must have 1 to 12.",
    }
    for text, message in cases.items():
        obs, reward, terminated, truncated, info = env.step(text)
        assert obs == ({"role": "user", "content": message},) and reward == 0.0
        assert not terminated and not truncated and env.env.tries == 0
    assert info["turn"] == 3 and info["state_key"] == f"reverse: {env.env.word}"


def test_wrapped_truncation_passes_through_and_ends_the_episode():
    env = make_reverse()
    env.reset(seed=2)
    for left in (2, 1, 0):
        obs, reward, terminated, truncated, info = env.step("zzz")
        assert obs[0]["content"].endswith(f"{left} tries left") and not terminated
    assert truncated and not info["success"] and env.done
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("zzz")


def test_max_turns_truncates_and_defaults_from_the_spec():
    env = make_reverse(max_turns=2)
    env.reset(seed=3)
    env.step("Q")
    assert env.step("Q")[3] and env.env.tries == 0
    assert make_reverse().max_turns == DEFAULT_MAX_TURNS
    env_id = "turnrl-test/ReverseWord-v0"
    if env_id not in gymnasium.registry:
        gymnasium.register(env_id, entry_point=ReverseWordEnv, max_episode_steps=2, kwargs={"max_tries": 9})
    made = TextGymEnv(env_id, expert=reverse_expert)
    assert made.max_turns == 2 and made.name == env_id
    made.reset(seed=0)
    assert made.step("zzz")[3] is False
    obs, _, terminated, truncated, _ = made.step("zzz")  # gymnasium's TimeLimit truncates the wrapped env
    assert truncated and not terminated and made.env.unwrapped.tries == 2


def test_splits_auto_callable_and_none():
    env = make_reverse()
    words = {"train": set(), "test": set()}
    for split in words:
        for seed in range(60):
            obs, info = env.reset(seed=seed, options={"split": split})
            assert hash_split(obs[-1]["content"]) == split == info["split"]
            words[split].add(env.env.word)
    assert words["test"] and words["train"] and not words["train"] & words["test"]

    vowel = make_reverse(split_fn=lambda obs, info: "test" if obs.split()[-1][0] in "aeiou" else "train")
    for seed in range(20):
        vowel.reset(seed=seed, options={"split": "test"})
        assert vowel.env.word[0] in "aeiou"

    single = make_reverse(split_fn=None)
    assert single.splits == ("train",)
    train_obs, _ = single.reset(seed=5)
    test_obs, test_info = single.reset(seed=5, options={"split": "test"})
    assert train_obs == test_obs and test_info["split"] == "test"


def test_split_errors_are_clear():
    one_word = TextGymEnv(ReverseWordEnv(words=("stone",)))
    missing = "test" if hash_split("reverse: stone") == "train" else "train"
    with pytest.raises(ValueError, match="pass split_fn=None"):
        one_word.reset(seed=0, options={"split": missing})
    with pytest.raises(ValueError, match="split_fn must return one of"):
        make_reverse(split_fn=lambda obs, info: "dev").reset(seed=0)
    with pytest.raises(ValueError, match="split_fn must be 'auto'"):
        make_reverse(split_fn="crc")


def test_wrapped_info_keys_take_precedence_for_task_id_state_key_and_success():
    class Keyed(ReverseWordEnv):
        def reset(self, *, seed=None, options=None):
            obs, info = super().reset(seed=seed)
            return obs, {**info, "task_id": f"word-{self.word}", "state_key": ("tries", 0), "split": "test"}

        def step(self, action):
            obs, reward, terminated, truncated, info = super().step(action)
            return obs, reward, terminated, truncated, {**info, "state_key": ("tries", self.tries), "success": True}

    env = TextGymEnv(Keyed(), expert=reverse_expert)
    obs, info = env.reset(seed=0, options={"split": "test"})  # the wrapped info's split decides
    assert info["task_id"] == f"word-{env.env.word}" and info["state_key"] == ("tries", 0)
    _, reward, terminated, _, info = env.step("zzz")
    assert info["state_key"] == ("tries", 1) and info["success"] and not terminated and reward == 0.0
    keyed = make_reverse(state_key_fn=lambda obs, info: info["tries"])
    keyed.reset(seed=0)
    assert keyed.step("zzz")[-1]["state_key"] == 1


def test_players_and_constructor_errors():
    env = make_reverse(expert=None)
    env.reset(seed=0)
    with pytest.raises(NotImplementedError, match="pass expert="):
        env.expert_action()
    rng = np.random.default_rng(0)
    for _ in range(50):
        action = env.random_action(rng)
        assert env.env.action_space.contains(action)
    with pytest.raises(TypeError, match="observation_space is gymnasium.spaces.Text"):
        TextGymEnv("CartPole-v1")
    with pytest.raises(ValueError, match="env_kwargs only applies"):
        TextGymEnv(ReverseWordEnv(), env_kwargs={"max_tries": 2})
    with pytest.raises(TypeError, match="expert must be callable"):
        TextGymEnv(ReverseWordEnv(), expert="enots")


def test_wrapped_text_game_passes_the_checker():
    report = check(make_reverse(), seeds=20)
    assert report.ok, report.format()


# ------------------------------------------------------------------ ToyTextEnv
def play(env, seed, split="train", player="expert", rng=None):
    obs, info = env.reset(seed=seed, options={"split": split})
    turns = 0
    while True:
        action = env.expert_action() if player == "expert" else env.random_action(rng)
        obs, reward, terminated, truncated, info = env.step(action)
        turns += 1
        if terminated or truncated:
            return info["success"], reward, turns


@pytest.mark.slow
def test_taxi_expert_solves_every_start_state_of_both_splits():
    env = ToyTextEnv("Taxi-v4")
    starts = {"train": set(), "test": set()}
    for split in starts:
        for seed in range(150):
            success, reward, turns = play(env, seed, split)
            assert success and reward == 1.0 and turns <= 18
            starts[split].add(env.task.info["state_key"])
    assert not starts["train"] & starts["test"] and len(starts["test"]) > 40


@pytest.mark.parametrize("game,turns", [("FrozenLake-v1", 6), ("FrozenLake8x8-v1", 14), ("CliffWalking-v1", 13)])
def test_grid_experts_take_the_shortest_path(game, turns):
    env = ToyTextEnv(game)
    assert env.splits == ("train",)
    for seed in range(5):
        assert play(env, seed) == (True, 1.0, turns)


@pytest.mark.slow
def test_slippery_frozen_lake_expert_beats_random():
    env = ToyTextEnv("FrozenLake-v1", {"is_slippery": True}, max_turns=100)
    rng = np.random.default_rng(0)
    expert = np.mean([play(env, seed)[0] for seed in range(100)])
    random = np.mean([play(env, seed, player="random", rng=rng)[0] for seed in range(100)])
    assert expert > 0.5 and random < 0.1
    assert env.reset(seed=0)[1]["task_id"] == f"FrozenLake-v1-seed{env.task.seed}"  # stochastic: seed-based ids


def test_frozen_lake_transcript_and_hole():
    env = ToyTextEnv("FrozenLake-v1")
    obs, info = env.reset(seed=0)
    assert obs[0]["role"] == "system" and "left, down, right or up" in obs[0]["content"]
    assert obs[1]["content"] == "@FFF\nFHFH\nFFFH\nHFFG\nYou are at row 1, column 1."
    assert info["task_id"] == "FrozenLake-v1-s0" and info["state_key"] == 0
    obs, reward, terminated, _, info = env.step("Left!")
    assert obs[0]["content"] == "You cannot move left.\n@FFF\nFHFH\nFFFH\nHFFG\nYou are at row 1, column 1."
    obs, *_ = env.step("go right")
    assert obs[0]["content"] == "S@FF\nFHFH\nFFFH\nHFFG\nYou are at row 1, column 2."
    obs, reward, terminated, truncated, info = env.step("down")
    assert obs[0]["content"].startswith("You fell into a hole.\nSFFF\nF@FH")
    assert (reward, terminated, truncated, info["success"]) == (0.0, True, False, False)


def test_taxi_rules_messages_and_rewards():
    env = ToyTextEnv("Taxi-v4", reward="native")
    game = env.env
    env.reset(seed=0)
    start = env.task.info["state_key"]
    row, col, passenger, destination = game.base.decode(start)
    assert f"Taxi at row {row + 1}, column {col + 1}. Passenger at {'RGYB'[passenger]}." in env.observation_text
    obs, reward, terminated, _, info = env.step("dropoff")  # no passenger aboard: illegal
    assert obs[0]["content"].startswith("Illegal dropoff.\n+---------+") and reward == -10.0 and not terminated
    obs, reward, *_ = env.step("south or north")
    assert obs[0]["content"].startswith("Unknown action 'south or north'. Reply with one of: south, north, east,")
    assert reward == 0.0 and info["state_key"] == start
    rows = obs[0]["content"].splitlines()[2:7]
    assert rows[row][2 * col + 1] == "T"
    path_rewards = []
    while not env.done:
        path_rewards.append(env.step(env.expert_action())[1])
    assert path_rewards[-1] == 20.0 and set(path_rewards[:-1]) == {-1.0}


def test_taxi_state_key_is_the_state_whatever_the_path():
    env = ToyTextEnv()
    for seed in range(30):
        _, info = env.reset(seed=seed)
        row = env.env.base.decode(info["state_key"])[0]
        if 0 < row < 4:
            start = info["state_key"]
            first = env.step("north")[-1]["state_key"]
            assert first != start and env.step("south")[-1]["state_key"] == start
            return
    pytest.fail("no start state in rows 2-4 among 30 seeds")


def test_cliff_sends_back_to_start():
    env = ToyTextEnv("CliffWalking-v1", reward="native")
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step("right")
    assert obs[0]["content"].startswith("You stepped on the cliff and are back at the start.\n")
    assert reward == -100.0 and not terminated and info["state_key"] == 36


def test_blackjack_plays_real_hands():
    env = ToyTextEnv("Blackjack-v1")
    obs, info = env.reset(seed=0)
    player, dealer = env.env.base.player, env.env.base.dealer
    assert obs[1]["content"].startswith(f"Your cards: {', '.join('A' if c == 1 else str(c) for c in player)} (sum ")
    obs, reward, terminated, _, info = env.step("stick")
    assert terminated and obs[0]["content"].startswith("You stick. The dealer's cards: ")
    assert info["success"] == (reward == 1.0) and len(env.env.base.dealer) >= len(dealer)
    wins = np.mean([play(env, seed)[0] for seed in range(300)])
    assert 0.3 < wins < 0.5  # a threshold strategy wins about 41% of hands


def test_toy_text_parse_and_errors():
    game = ToyTextGame("Taxi-v4")
    assert game.parse_action("south") == 0 and game.parse_action("Go WEST.") == 3
    assert game.parse_action("pickup the passenger") == 4
    assert game.parse_action("north then south") is None and game.parse_action("wait") is None
    with pytest.raises(ValueError, match="game must be one of"):
        ToyTextGame("Taxi-v3")
    with pytest.raises(ValueError, match="reward must be"):
        ToyTextGame("Taxi-v4", reward="shaped")


@pytest.mark.parametrize("game", ["Taxi-v4", "FrozenLake-v1", "CliffWalking-v1", "Blackjack-v1"])
def test_toy_text_games_are_valid_text_space_gymnasium_envs(game):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gymnasium_check_env(ToyTextGame(game), skip_render_check=True)


def test_registered_taxi_passes_the_checker():
    env = gymnasium.make("turnrl/Taxi-v0")
    assert isinstance(env.unwrapped, ToyTextEnv) and env.unwrapped.name == "Taxi-v4"
    report = check("turnrl/Taxi-v0", seeds=20)
    assert report.ok, report.format()
