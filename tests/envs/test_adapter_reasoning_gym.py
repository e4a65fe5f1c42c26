"""ReasoningGymEnv on real reasoning-gym datasets (the ``reasoning`` / ``dev`` extra)."""

import numpy as np
import pytest

reasoning_gym = pytest.importorskip(
    "reasoning_gym", reason="reasoning-gym is not installed (pip install 'turnrl[reasoning]')")

import gymnasium  # noqa: E402

import turnrl.envs  # noqa: E402,F401  (registers the envs)
from turnrl.envs import check  # noqa: E402
from turnrl.envs.adapters import ReasoningGymEnv  # noqa: E402
from turnrl.envs.adapters.reasoning_gym import BLOCK_SIZE, extract_answer, is_held_out  # noqa: E402


def play_expert(env, seed, split):
    obs, info = env.reset(seed=seed, options={"split": split})
    while True:
        obs, reward, terminated, truncated, info = env.step(env.expert_action())
        if terminated or truncated:
            return reward, info


@pytest.mark.parametrize("dataset,kwargs,fmt", [
    ("basic_arithmetic", None, "answer_tag"),
    ("chain_sum", {"min_terms": 2, "max_terms": 3}, "answer_line"),
    ("leg_counting", None, "raw"),
    ("spell_backward", None, "answer_tag"),
    ("number_sorting", None, "answer_line"),
])
@pytest.mark.slow
def test_expert_solves_both_splits(dataset, kwargs, fmt):
    env = ReasoningGymEnv(dataset, kwargs, answer_format=fmt)
    for split in ("train", "test"):
        for seed in range(15):
            reward, info = play_expert(env, seed, split)
            assert reward == 1.0 and info["success"] and info["turn"] == 1 and info["split"] == split


def test_task_is_the_datasets_entry_and_prompt_names_the_format():
    env = ReasoningGymEnv("leg_counting", max_turns=2)
    obs, info = env.reset(seed=4)
    task = env.task
    block = reasoning_gym.create_dataset("leg_counting", seed=task.block_seed, size=BLOCK_SIZE)
    assert block[task.index] == task.entry and 0 <= task.index < BLOCK_SIZE
    assert obs == (
        {"role": "system", "content": "Solve the problem. Write your final answer as <answer>...</answer>. "
                                      "You have 2 attempts; a wrong answer gets feedback."},
        {"role": "user", "content": task.entry["question"].strip()},
    )
    assert info == {"task_id": f"leg_counting-{task.digest}", "state_key": (task.digest, 0), "turn": 0,
                    "split": "train", "tools": []}
    assert env.expert_action() == f"<answer>{task.entry['answer']}</answer>"


def test_same_seed_same_task_across_instances_and_seeds_vary():
    a, b = ReasoningGymEnv("chain_sum"), ReasoningGymEnv("chain_sum")
    ids = set()
    for seed in range(20):
        for split in ("train", "test"):
            obs_a, info_a = a.reset(seed=seed, options={"split": split})
            obs_b, info_b = b.reset(seed=seed, options={"split": split})
            assert obs_a == obs_b and info_a == info_b
            ids.add(info_a["task_id"])
    assert len(ids) >= 35


def test_splits_are_disjoint_by_question_hash():
    env = ReasoningGymEnv("basic_arithmetic")
    questions = {"train": set(), "test": set()}
    for split in questions:
        for seed in range(150):
            env.reset(seed=seed, options={"split": split})
            question = env.task.entry["question"]
            assert is_held_out(question) == (split == "test")
            questions[split].add(question)
    assert not questions["train"] & questions["test"]
    raw = [e["question"] for e in reasoning_gym.create_dataset("basic_arithmetic", seed=7, size=2000)]
    assert 0.15 < np.mean([is_held_out(q) for q in raw]) < 0.25  # one hash bucket in five


def test_single_turn_wrong_garbage_and_tool_call_replies():
    env = ReasoningGymEnv("basic_arithmetic")
    env.reset(seed=0)
    gold = env.task.entry["answer"]
    obs, reward, terminated, truncated, info = env.step(f"<answer>{int(gold) + 1}</answer>")
    assert obs == ({"role": "user", "content": "Incorrect."},)
    assert reward == 0.0 and terminated and not truncated and not info["success"]
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("I have no idea \x00\x01" * 300)
    assert obs == ({"role": "user", "content": "No answer found. Write your final answer as <answer>...</answer>."},)
    assert reward == 0.0 and terminated and not info["success"]
    env.reset(seed=0)
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "1 + 1"}}</tool_call>'
    obs, reward, terminated, _, info = env.step(f"{call}\n<answer>{gold}</answer>")
    assert obs[0]["role"] == "tool" and "unknown tool 'calculator'" in obs[0]["content"]
    assert obs[1] == {"role": "user", "content": "Correct."} and reward == 1.0 and info["tool_errors"] == 1


def test_retries_with_feedback_and_state_keys():
    env = ReasoningGymEnv("basic_arithmetic", max_turns=3)
    _, info = env.reset(seed=1)
    digest, gold = env.task.digest, env.task.entry["answer"]
    keys = [info["state_key"]]
    obs, reward, terminated, truncated, info = env.step("<answer>banana</answer>")
    assert obs == ({"role": "user", "content": "Incorrect, try again."},) and reward == 0.0
    assert not terminated and not truncated
    keys.append(info["state_key"])
    obs, reward, terminated, truncated, info = env.step("thinking...")
    assert "No answer found" in obs[0]["content"] and not terminated and not truncated
    keys.append(info["state_key"])
    obs, reward, terminated, truncated, info = env.step(f"so <answer>{gold}</answer>")
    assert obs == ({"role": "user", "content": "Correct."},) and reward == 1.0 and terminated and info["success"]
    assert keys == [(digest, 0), (digest, 1), (digest, 2)] and info["state_key"] == (digest, 3)
    # a different wrong answer at the same attempt gives the same state
    env.reset(seed=1)
    assert env.step("<answer>12345678</answer>")[-1]["state_key"] == (digest, 1)


def test_partial_credit_is_the_datasets_score_on_the_final_turn():
    env = ReasoningGymEnv("spell_backward", max_turns=2, answer_format="answer_line")
    env.reset(seed=2)
    entry = env.task.entry
    near = entry["answer"][:-1]
    expected = reasoning_gym.create_dataset("spell_backward", seed=0, size=1).score_answer(near, entry)
    assert 0.0 < expected < 1.0
    obs, reward, terminated, _, info = env.step(f"Answer: {near}")
    assert reward == 0.0 and not terminated  # partial credit is shown, not paid, before the last attempt
    assert obs[0]["content"] == f"Incorrect, try again. Your answer scored {expected:.2f} of 1."
    obs, reward, terminated, _, info = env.step(f"Answer: {near}")
    assert obs[0]["content"] == f"Incorrect. Your answer scored {expected:.2f} of 1."
    assert reward == pytest.approx(expected) and terminated and not info["success"]
    # reasoning-gym's default scorer: an answer that contains the gold answer gets len(gold) / len(answer)
    env = ReasoningGymEnv("chain_sum")
    env.reset(seed=0)
    gold = env.task.entry["answer"]
    _, reward, terminated, _, info = env.step(f"<answer>= {gold}</answer>")
    assert reward == pytest.approx(len(gold) / (len(gold) + 2)) and terminated and not info["success"]


def test_answer_extraction_formats():
    assert extract_answer("a <answer>1</answer> b <answer> 2 </answer>", "answer_tag") == "2"
    assert extract_answer("<answer>\n[[1, 2],\n [3, 4]]\n</answer>", "answer_tag") == "[[1, 2],\n [3, 4]]"
    assert extract_answer("<answer>unclosed", "answer_tag") is None
    assert extract_answer("Answer: 3\nno wait. Answer:  4 5\n6 ", "answer_line") == "4 5\n6"
    assert extract_answer("answer: 3", "answer_line") is None
    assert extract_answer("  42 \n", "raw") == "42" and extract_answer("   ", "raw") is None
    with pytest.raises(ValueError, match="answer_format"):
        extract_answer("x", "json")


def test_dataset_kwargs_reach_the_generator():
    env = ReasoningGymEnv("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})
    for seed in range(20):
        env.reset(seed=seed)
        expression = env.task.entry["metadata"]["expression"]
        assert env.task.entry["metadata"]["num_terms"] == 2 and len(expression.split()) == 3
        assert all(len(t) == 1 for t in expression.split()[::2])


def test_random_answers_come_from_other_entries_and_rarely_win():
    env = ReasoningGymEnv("basic_arithmetic")
    rng = np.random.default_rng(0)
    wins = 0
    for seed in range(50):
        env.reset(seed=seed)
        action = env.random_action(rng)
        assert extract_answer(action, "answer_tag") in env.answer_pool
        wins += env.step(action)[-1]["success"]
    assert len(env.answer_pool) > 20 and wins <= 3


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="known: ab, acre"):
        ReasoningGymEnv("no_such_dataset")
    with pytest.raises(ValueError, match=r"must not set \['seed'\]"):
        ReasoningGymEnv("chain_sum", {"seed": 3})
    with pytest.raises(ValueError, match="could not build 'chain_sum'"):
        ReasoningGymEnv("chain_sum", {"min_terms": 5, "max_terms": 2})
    with pytest.raises(ValueError, match="answer_format"):
        ReasoningGymEnv(answer_format="xml")
    with pytest.raises(TypeError, match="dataset_kwargs"):
        ReasoningGymEnv("chain_sum", [("min_terms", 2)])


def test_dataset_without_gold_answers_has_no_expert():
    env = ReasoningGymEnv("graph_color")
    env.reset(seed=0)
    with pytest.raises(NotImplementedError, match="no gold answer"):
        env.expert_action()
    _, reward, terminated, _, info = env.step("<answer>{}</answer>")  # the dataset's own checker judges it
    assert terminated and reward < 1.0 and not info["success"]


def test_registered_env_passes_the_checker():
    env = gymnasium.make("turnrl/ReasoningGym-v0")
    assert isinstance(env.unwrapped, ReasoningGymEnv) and env.unwrapped.dataset == "basic_arithmetic"
    report = check("turnrl/ReasoningGym-v0", seeds=20)
    assert report.ok, report.format()
