import pickle
import time

import gymnasium
import numpy as np
import pytest

import turnrl.envs  # noqa: F401  (registers the envs)
from turnrl.envs import check
from turnrl.envs.games.wordle import (
    ABSENT,
    CORRECT,
    PRESENT,
    WordleEnv,
    feedback,
    format_feedback,
    is_held_out,
    marks_code,
    pattern_matrix,
    solver_for,
)
from turnrl.envs.games.wordlist import WORDS

A, P, C = ABSENT, PRESENT, CORRECT


def _play(env, secret, max_steps=100):
    """Play the expert on a chosen secret word; returns (success, turns).

    The secret is set on the env after a reset (the env draws tasks only from seeds).
    """
    env.reset(seed=0)
    env._task = secret
    for turn in range(1, max_steps + 1):
        *_, terminated, truncated, info = env.step(env.expert_action())
        if terminated or truncated:
            return info["success"], turn
    raise AssertionError("episode did not end")


def test_word_list_is_clean():
    assert len(WORDS) == 1200 and len(set(WORDS)) == 1200
    assert all(len(w) == 5 and w.isascii() and w.isalpha() and w.islower() for w in WORDS)
    assert WORDS[:3] == ("about", "their", "there")  # most frequent first


@pytest.mark.parametrize(("guess", "answer", "marks"), [
    ("speed", "abide", (A, A, P, A, P)),   # only one e in the answer: the second e is absent
    ("geese", "those", (A, A, A, C, C)),   # the green e uses up the answer's only e
    ("lolly", "hello", (A, P, C, C, A)),   # greens first, so the first l finds no l left
    ("eerie", "crane", (A, A, P, A, C)),   # the green e takes the answer's only e
    ("crane", "crane", (C, C, C, C, C)),
    ("abbey", "babes", (P, P, C, C, A)),
    ("mamma", "maxim", (C, C, P, A, A)),
])
def test_feedback_duplicate_letter_rule_on_hand_cases(guess, answer, marks):
    assert feedback(guess, answer) == marks


def test_vectorised_patterns_match_the_rule():
    words = WORDS[::7]
    matrix = pattern_matrix(words, words)
    for i, g in enumerate(words):
        for j, a in enumerate(words):
            assert matrix[i, j] == marks_code(feedback(g, a))


def test_feedback_text_and_episode_messages():
    assert format_feedback("speed", feedback("speed", "abide")) == \
        "speed -> s:absent p:absent e:present e:absent d:present"
    env = WordleEnv()
    obs, info = env.reset(seed=0)
    assert obs[0] == {"role": "system", "content": "You are playing Wordle."}
    assert obs[1]["content"].startswith("Guess my secret 5-letter English word in 6 tries.")
    assert info["state_key"] == () and info["task_id"] == f"wordle-{env.task}"
    env._task = "abide"
    obs, reward, terminated, truncated, info = env.step("speed")
    assert obs == ({"role": "user", "content": "speed -> s:absent p:absent e:present e:absent d:present "
                                               "(5 guesses left)"},)
    assert (reward, terminated, truncated, info["success"]) == (0.0, False, False, False)
    assert info["state_key"] == (("speed", "__Y_Y"),)
    obs, reward, terminated, truncated, info = env.step("ABIDE")
    assert obs[0]["content"] == "abide -> a:correct b:correct i:correct d:correct e:correct. Solved in 2 guesses."
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)


def test_last_turn_reveals_the_word():
    env = WordleEnv(max_turns=6)
    env.reset(seed=0)
    env._task = "abide"
    for _ in range(5):
        env.step("about")
    obs, reward, terminated, truncated, info = env.step("there")
    assert obs[0]["content"] == ("there -> t:absent h:absent e:absent r:absent e:correct. "
                                 "Out of guesses; the word was abide.")
    assert (reward, terminated, truncated, info["success"]) == (0.0, False, True, False)


@pytest.mark.parametrize("reply", ["crane", "CRANE", "My guess: crane.", "I'll go with 'Crane'", "1. crane"])
def test_liberal_parsing_reads_the_last_five_letter_word(reply):
    env = WordleEnv()
    env.reset(seed=0)
    env._task = "abide"
    obs, *_, info = env.step(reply)
    assert obs[0]["content"].startswith("crane -> ")
    assert info["state_key"] == (("crane", "__Y_G"),)


@pytest.mark.parametrize(("reply", "message"), [
    ("xyzzy", "'xyzzy' is not in the word list; guess a common 5-letter English word."),
    ("Zzzzz!", "'zzzzz' is not in the word list; guess a common 5-letter English word."),
    ("no idea", "Reply with one 5-letter word."),
    ("cranes", "Reply with one 5-letter word."),
    ("", "Reply with one 5-letter word."),
    ("<tool_call>{\"name\": \"x\"}</tool_call>", "Reply with one 5-letter word."),
])
def test_invalid_replies_get_a_message_count_as_turns_and_teach_nothing(reply, message):
    env = WordleEnv(max_turns=6)
    _, info = env.reset(seed=1)
    before = (info["state_key"], env.expert_action())
    obs, reward, terminated, truncated, info = env.step(reply)
    assert obs[-1] == {"role": "user", "content": message}
    assert (reward, terminated, truncated, info["turn"]) == (0.0, False, False, 1)
    assert (info["state_key"], env.expert_action()) == before


def test_state_key_is_the_set_of_feedback():
    env = WordleEnv()
    keys = []
    for order in (["crane", "moist"], ["moist", "crane"], ["moist", "crane", "crane", "qwert"]):
        env.reset(seed=0)
        env._task = "abide"
        for guess in order:
            info = env.step(guess)[-1]
        keys.append(info["state_key"])
    assert keys[0] == keys[1] == keys[2] == (("crane", "__Y_G"), ("moist", "__G__"))
    env.reset(seed=0)
    env._task = "aside"  # other secret, other marks, other key
    env.step("crane")
    assert env.step("moist")[-1]["state_key"] != keys[0]


@pytest.mark.slow
def test_expert_solves_every_word_within_five_guesses_fast():
    env = WordleEnv()
    turns = []
    start = time.perf_counter()
    for word in WORDS:
        success, n = _play(env, word)
        assert success, f"expert failed on {word}"
        turns.append(n)
    per_episode = (time.perf_counter() - start) / len(WORDS)
    assert max(turns) == 5 and 3.0 < np.mean(turns) < 3.6
    assert per_episode < 0.05, f"an expert episode takes {per_episode * 1000:.1f} ms"


def test_small_vocabulary_and_answers_limited_to_what_the_expert_solves():
    env = WordleEnv(vocab_size=100)
    assert env.words == WORDS[:100]
    assert set(env.split_tasks("train")) | set(env.split_tasks("test")) == set(WORDS[:100])
    assert all(_play(env, w)[0] for w in env.words)
    env.reset(seed=0)
    obs, *_ = env.step("crane")  # a word of the full list but not of this vocabulary
    assert obs[0]["content"] == "'crane' is not in the word list; guess a common 5-letter English word."
    short = WordleEnv(max_turns=3)
    depths = solver_for(len(WORDS)).depths()
    answers = set(short.split_tasks("train")) | set(short.split_tasks("test"))
    assert answers == {WORDS[i] for i, d in depths.items() if d <= 3} and 700 < len(answers) < 1200
    assert all(_play(short, w) == (True, depths[WORDS.index(w)]) for w in sorted(answers)[::10])


def test_splits_are_disjoint_hash_buckets_and_resets_respect_them():
    env = WordleEnv()
    train, test = set(env.split_tasks("train")), set(env.split_tasks("test"))
    assert not train & test and train | test == set(WORDS)
    assert 0.15 < len(test) / len(WORDS) < 0.35 and all(is_held_out(w) for w in test)
    for seed in range(50):
        env.reset(seed=seed, options={"split": "test"})
        assert env.task in test
        env.reset(seed=seed, options={"split": "train"})
        assert env.task in train


def test_same_seed_same_episode_and_seeds_vary():
    env = WordleEnv()

    def episode(seed):
        obs, _ = env.reset(seed=seed)
        record = [obs]
        while not env.done:
            record.append(env.step(env.expert_action())[0])
        return env.task, record

    assert episode(7) == episode(7)
    assert len({episode(s)[0] for s in range(20)}) > 15


def test_scripted_players_are_well_formed():
    env = WordleEnv()
    rng = np.random.default_rng(0)
    for _ in range(20):
        env.reset(seed=int(rng.integers(1000)))
        while not env.done:
            action = env.weak_expert_action(rng) if rng.random() < 0.5 else env.random_action(rng)
            assert action in env.solver.index
            obs, *_ = env.step(action)
            assert " -> " in obs[0]["content"], obs


def test_constructor_rejects_bad_sizes():
    with pytest.raises(ValueError, match="vocab_size"):
        WordleEnv(vocab_size=5)
    with pytest.raises(ValueError, match="vocab_size"):
        WordleEnv(vocab_size=5000)
    with pytest.raises(ValueError, match="empty"):
        WordleEnv(vocab_size=10, max_turns=1)


def test_registered_env_passes_the_checker():
    report = check("turnrl/Wordle-v0", seeds=20)
    assert report.ok, report.format()
    assert gymnasium.make("turnrl/Wordle-v0", vocab_size=50).unwrapped.words == WORDS[:50]


def test_env_pickles_mid_episode():
    env = WordleEnv(vocab_size=200)
    env.reset(seed=3)
    env.step("there")
    clone = pickle.loads(pickle.dumps(env))
    assert clone.task == env.task and clone.expert_action() == env.expert_action()
    assert clone.step("about")[0] == env.step("about")[0]
