import itertools
import pickle

import gymnasium
import numpy as np
import pytest

import turnrl.envs  # noqa: F401  (registers the envs)
from turnrl.envs import check
from turnrl.envs.games.mastermind import MastermindEnv, code_space, is_held_out, pegs

FORMAT = "Reply with 4 colours, e.g. 1 2 3 4."


def _play(env, secret, player=None, max_steps=100):
    """Play ``player`` (default the expert) on a chosen secret code; returns (success, turns).

    The secret is set on the env after a reset (the env draws tasks only from seeds).
    """
    env.reset(seed=0)
    env._task = tuple(secret)
    for turn in range(1, max_steps + 1):
        action = env.expert_action() if player is None else player(env)
        *_, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return info["success"], turn
    raise AssertionError("episode did not end")


@pytest.mark.parametrize(("guess", "secret", "expected"), [
    ((0, 0, 1, 1), (1, 1, 0, 0), (0, 4)),
    ((0, 0, 0, 0), (0, 1, 2, 3), (1, 0)),   # one secret 1 matches one guess peg only
    ((0, 1, 2, 3), (3, 2, 1, 0), (0, 4)),
    ((0, 0, 1, 1), (0, 1, 1, 1), (3, 0)),   # the black 1s use up the secret's 1s
    ((0, 1, 1, 2), (1, 0, 0, 1), (0, 3)),
    ((4, 4, 5, 5), (0, 1, 2, 3), (0, 0)),
    ((2, 3, 4, 5), (2, 3, 4, 5), (4, 0)),
])
def test_black_and_white_pegs_on_hand_cases(guess, secret, expected):
    assert pegs(guess, secret) == expected


def test_vectorised_feedback_matches_pegs_on_every_pair():
    space = code_space(3, 4, True)
    rows = np.arange(len(space.codes))
    for guess in itertools.product(range(4), repeat=3):
        keys = space.feedback_keys(guess, rows)
        expected = [space.key(*pegs(guess, tuple(int(c) for c in code))) for code in space.codes]
        assert keys.tolist() == expected


def test_prompt_feedback_and_history_messages():
    env = MastermindEnv()
    obs, info = env.reset(seed=0)
    assert obs[0] == {"role": "system", "content": "You are playing Mastermind."}
    assert obs[1]["content"] == (
        "I picked a secret code of 4 pegs, each one of 6 colours 1-6 (colours may repeat). Guess it in 10 tries. "
        "After each guess I tell you how many pegs are black (right colour, right place) and white (right colour, "
        f"wrong place). {FORMAT}")
    assert info["state_key"] == () and info["task_id"].startswith("mastermind-4x6-")
    env._task = (0, 2, 4, 1)  # secret 1 3 5 2
    obs, reward, terminated, truncated, info = env.step("1 1 2 2")
    assert obs == ({"role": "user", "content": "1 1 2 2 -> 2 black, 0 white (9 guesses left)\n"
                                               "History:\n1. 1 1 2 2 -> 2 black, 0 white"},)
    assert (reward, terminated, truncated, info["success"]) == (0.0, False, False, False)
    obs, *_ = env.step("2 5 3 1")
    assert obs[0]["content"] == ("2 5 3 1 -> 0 black, 4 white (8 guesses left)\nHistory:\n"
                                 "1. 1 1 2 2 -> 2 black, 0 white\n2. 2 5 3 1 -> 0 black, 4 white")
    expert = tuple(int(c) - 1 for c in env.expert_action().split())
    assert pegs((0, 0, 1, 1), expert) == (2, 0) and pegs((1, 4, 2, 0), expert) == (0, 4)  # consistent
    obs, reward, terminated, truncated, info = env.step("1 3 5 2")
    assert obs[0]["content"] == "1 3 5 2 -> 4 black, 0 white. Solved in 3 guesses."
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)


def test_out_of_guesses_reveals_the_code():
    env = MastermindEnv(max_turns=2)
    env.reset(seed=0)
    env._task = (5, 5, 5, 5)
    env.step("1111")
    obs, reward, terminated, truncated, info = env.step("2222")
    assert obs[0]["content"].startswith("2 2 2 2 -> 0 black, 0 white Out of guesses; the code was 6 6 6 6.\nHistory:")
    assert (reward, terminated, truncated, info["success"]) == (0.0, False, True, False)


@pytest.mark.parametrize("reply", ["1352", "1 3 5 2", "[1, 3, 5, 2]", "Guess 3: 1-3-5-2", "1/3/5/2.",
                                   "guess 2 was 1122, now 1352"])
def test_liberal_parsing_reads_the_last_group_of_four(reply):
    env = MastermindEnv()
    env.reset(seed=0)
    env._task = (0, 0, 0, 0)
    obs, *_, info = env.step(reply)
    assert obs[0]["content"].startswith("1 3 5 2 -> 1 black, 0 white")
    assert info["state_key"] == (("1352", 1, 0),)


@pytest.mark.parametrize(("reply", "message"), [
    ("no idea", "I found no guess in your reply."),
    ("", "I found no guess in your reply."),
    ("1 2 3", "'123' has 3 colours; the code has 4."),
    ("1 2 3 4 5", "'12345' has 5 colours; the code has 4."),
    ("7 1 2 3", "'7' is not a colour; the colours are 1-6."),
    ("0123", "'0' is not a colour; the colours are 1-6."),
    ("<tool_call>{\"name\": \"x\"}</tool_call>", "I found no guess in your reply."),
])
def test_invalid_replies_get_a_message_count_as_turns_and_teach_nothing(reply, message):
    env = MastermindEnv(max_turns=2)
    _, info = env.reset(seed=1)
    before = (info["state_key"], env.expert_action())
    obs, reward, terminated, truncated, info = env.step(reply)
    assert obs[-1] == {"role": "user", "content": f"{message} {FORMAT}"}
    assert (reward, terminated, truncated, info["turn"]) == (0.0, False, False, 1)
    assert (info["state_key"], env.expert_action()) == before
    *_, truncated, info = env.step(reply)
    assert truncated and not info["success"]


def test_repeats_are_refused_when_the_game_has_none():
    env = MastermindEnv(allow_repeats=False)
    obs, _ = env.reset(seed=0)
    assert "(no colour repeats)" in obs[1]["content"]
    assert len(set(env.task)) == 4
    obs, *_, info = env.step("1 1 2 3")
    assert obs[0]["content"] == f"'1 1 2 3' repeats a colour; the code has no repeated colours. {FORMAT}"
    assert info["state_key"] == ()


def test_letter_colours_above_nine():
    env = MastermindEnv(code_length=3, num_colors=10)
    obs, _ = env.reset(seed=0)
    assert "10 colours A-J" in obs[1]["content"] and "e.g. A B C." in obs[1]["content"]
    env._task = (0, 1, 9)
    obs, *_ = env.step("I guess A J B")
    assert obs[0]["content"].startswith("A J B -> 1 black, 2 white")
    obs, *_ = env.step("A B K")
    assert obs[0]["content"].startswith("'K' is not a colour; the colours are A-J.")
    assert env.step("ABJ")[1] == 1.0


def test_state_key_is_the_set_of_feedback():
    env = MastermindEnv()
    keys = []
    for order in (["1122", "3456"], ["3456", "1122"], ["3456", "1122", "1122", "junk"]):
        env.reset(seed=0)
        env._task = (0, 2, 4, 1)
        for guess in order:
            info = env.step(guess)[-1]
        keys.append(info["state_key"])
    assert keys[0] == keys[1] == keys[2] == (("1122", 2, 0), ("3456", 1, 1))
    env.reset(seed=0)
    env._task = (0, 2, 4, 2)  # other secret, other feedback, other key
    env.step("1122")
    assert env.step("3456")[-1]["state_key"] != keys[0]


@pytest.mark.slow
@pytest.mark.parametrize(("size", "worst"), [((4, 6, True), 6), ((4, 6, False), 6), ((3, 4, True), 5),
                                             ((3, 4, False), 4)])
def test_expert_solves_every_code_exhaustively(size, worst):
    env = MastermindEnv(*size)
    turns = []
    for code in env.space.codes:
        success, n = _play(env, [int(c) for c in code])
        assert success, f"expert failed on {env.space.text(code)}"
        turns.append(n)
    assert max(turns) == worst


def test_splits_are_disjoint_hash_buckets_and_resets_respect_them():
    env = MastermindEnv()
    train, test = set(env.split_tasks("train")), set(env.split_tasks("test"))
    assert not train & test and len(train) + len(test) == 1296
    assert 0.15 < len(test) / 1296 < 0.35 and all(is_held_out(c) for c in test)
    for seed in range(50):
        env.reset(seed=seed, options={"split": "test"})
        assert env.space.text(env.task, sep="") in test
        env.reset(seed=seed, options={"split": "train"})
        assert env.space.text(env.task, sep="") in train


def test_same_seed_same_episode_and_seeds_vary():
    env = MastermindEnv()

    def episode(seed):
        obs, _ = env.reset(seed=seed)
        record = [obs]
        while not env.done:
            record.append(env.step(env.expert_action())[0])
        return env.task, record

    assert episode(7) == episode(7)
    assert len({episode(s)[0] for s in range(20)}) > 10


def test_scripted_players_are_well_formed():
    env = MastermindEnv()
    rng = np.random.default_rng(0)
    for _ in range(20):
        env.reset(seed=int(rng.integers(1000)))
        while not env.done:
            action = env.weak_expert_action(rng) if rng.random() < 0.5 else env.random_action(rng)
            obs, *_ = env.step(action)
            assert " -> " in obs[0]["content"], obs
    # the weak player heeds at least the latest feedback
    env.reset(seed=0)
    env.step("1122")
    guess, black, white = env._history[-1]
    for _ in range(20):
        weak = tuple(int(c) - 1 for c in env.weak_expert_action(rng).split())
        assert pegs(guess, weak) == (black, white)


def test_constructor_rejects_bad_sizes():
    with pytest.raises(ValueError, match="code_length"):
        MastermindEnv(code_length=0)
    with pytest.raises(ValueError, match="num_colors"):
        MastermindEnv(num_colors=27)
    with pytest.raises(ValueError, match="at least code_length"):
        MastermindEnv(code_length=5, num_colors=4, allow_repeats=False)
    with pytest.raises(ValueError, match="MAX_CODES"):
        MastermindEnv(code_length=8, num_colors=9)
    with pytest.raises(TypeError, match="allow_repeats"):
        MastermindEnv(allow_repeats="yes")


def test_registered_env_passes_the_checker():
    report = check("turnrl/Mastermind-v0", seeds=20)
    assert report.ok, report.format()
    assert gymnasium.make("turnrl/Mastermind-v0", code_length=3, num_colors=4).unwrapped.space.codes.shape == (64, 3)


def test_env_pickles_mid_episode():
    env = MastermindEnv()
    env.reset(seed=3)
    env.step("1122")
    clone = pickle.loads(pickle.dumps(env))
    assert clone.task == env.task and clone.expert_action() == env.expert_action()
    assert clone.step("3456")[0] == env.step("3456")[0]
