import math
import time

import gymnasium
import numpy as np
import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

import turnrl.envs  # noqa: F401  (registers the envs)
from turnrl.train.factories import env_factory
from turnrl.conf.schema import register_configs
from turnrl.envs.check import check
from turnrl.envs.games.sokoban import SokobanEnv
from turnrl.envs.games.sokoban_levels import dead_cells, generate_level, parse_level, push, solve

CORRIDOR = "######/#P_XO#/######"  # push the box right twice
ROOM = "######/#P___#/#_X_O#/#____#/######"  # optimal: down, right, right
TWO = "########/#P_XO__#/#__*___#/########"  # one box already on its target
STACKED = "#######/#P____#/#_X_O_#/#_X_O_#/#_____#/#######"  # two boxes one above the other
JAMMED = "#######/#PXX_O#/#____O#/#######"  # the two boxes can never move: unsolvable


def fixed(level_text, **kwargs):
    """An env on one hand-built level, reset into that level's split."""
    env = SokobanEnv(levels=[level_text], **kwargs)
    obs, info = env.reset(seed=0, options={"split": parse_level(level_text).split})
    return env, obs, info


def play(env, seed, split, policy):
    obs, info = env.reset(seed=seed, options={"split": split})
    steps = [(obs, info)]
    while True:
        steps.append(env.step(policy()))
        if steps[-1][2] or steps[-1][3]:
            return steps


def test_prompt_shows_legend_and_level():
    env, obs, info = fixed(ROOM)
    assert "Legend: # wall, _ floor, O target, X box, * box on a target, P player, S player on a target." \
        in obs[0]["content"]
    assert obs[1]["content"] == ("Level:\n######\n#P___#\n#_X_O#\n#____#\n######\n"
                                 "Reply with one move: up, down, left or right.")
    assert info["task_id"] == "sokoban-" + ROOM and info["state_key"] == (7, (14,))


def test_levels_parse_and_render_back():
    for text in (CORRIDOR, ROOM, TWO):
        assert parse_level(text).text == text
    level = parse_level(TWO)
    assert level.boxes == level.targets - {12} | {11} and level.solution == ("right", "right")


def test_push_rules_walls_and_blocked_boxes():
    env, _, _ = fixed(CORRIDOR)
    obs, reward, terminated, _, info = env.step("up")
    assert obs[0]["content"] == "up: blocked by a wall\nLevel:\n######\n#P_XO#\n######"
    assert (reward, terminated, info["state_key"]) == (0.0, False, (7, (9,)))
    obs, *_ = env.step("right")
    assert obs[0]["content"] == "right: moved\nLevel:\n######\n#_PXO#\n######"
    obs, reward, terminated, truncated, info = env.step("right")
    assert obs[0]["content"] == "right: pushed a box\nAll boxes are on targets. Solved!"
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)

    level = parse_level(ROOM)
    state = (level.player, level.boxes)
    assert push(level, state, "left") == (state, "wall")
    env, _, _ = fixed(ROOM, moves_per_turn=4)
    obs, *_ = env.step("down down right up")  # the box goes up against the top wall
    assert obs[0]["content"].splitlines()[3:5] == ["up: pushed a box", "Level:"]
    obs, *_, info = env.step("up")
    assert obs[0]["content"].startswith("up: blocked, the box cannot move\nLevel:\n######\n#_X__#\n#_P_O#")
    env, _, _ = fixed(STACKED, moves_per_turn=2)
    obs, *_, info = env.step("right down")  # a box cannot push another box
    assert obs[0]["content"].splitlines()[:2] == ["right: moved", "down: blocked, the box cannot move"]


def test_player_and_box_on_target_symbols():
    env, _, _ = fixed(ROOM, moves_per_turn=4)
    obs, *_ = env.step("right right right down")
    assert obs[0]["content"].endswith("Level:\n######\n#____#\n#_X_S#\n#____#\n######")
    assert "#__*___#" in parse_level(TWO).render()


def test_stuck_states_do_not_end_the_episode_and_the_expert_plays_up():
    env, _, _ = fixed(ROOM, max_turns=5)
    env.step("right")
    *_, terminated, _, info = env.step("down")  # the box goes against the bottom wall
    level = env.task
    assert not terminated and solve(level, *env.state) is None
    assert env.expert_action() == "up"
    for _ in range(3):
        *_, terminated, truncated, info = env.step(env.expert_action())
        assert not terminated
    assert truncated and not info["success"] and info["turn"] == 5


def test_garbage_counts_as_a_turn():
    env, _, info0 = fixed(ROOM)
    for text in ("hello", "", "<tool_call>{oops"):
        obs, reward, terminated, _, info = env.step(text)
        assert obs[-1] == {"role": "user", "content": "No move found. Reply with one move: up, down, left or right."}
        assert reward == 0.0 and not terminated and info["state_key"] == info0["state_key"]
    assert info["turn"] == 3


def test_shaped_rewards_follow_ragen():
    env, _, _ = fixed(TWO, shaped=True)
    rewards = [env.step(text)[1] for text in ("down", "right", "right", "what?")]
    assert rewards == pytest.approx([-0.1, -0.1, -1.1, -0.1])  # the third push moves a box off its target
    env, _, _ = fixed(TWO, shaped=True)
    assert env.step("right")[1] == pytest.approx(-0.1)
    _, reward, terminated, _, info = env.step("right")
    assert reward == pytest.approx(-0.1 + 1.0 + 10.0) and terminated and info["success"]
    env, _, _ = fixed(TWO)
    assert [env.step("right")[1] for _ in range(2)] == [0.0, 1.0]  # outcome only by default


def test_solver_is_optimal_and_prunes_dead_cells():
    level = parse_level(ROOM)
    assert solve(level) == ("down", "right", "right") == level.solution
    assert dead_cells(level.width, level.height, level.walls, level.targets) == (
        frozenset(range(7, 11)) | {13} | frozenset(range(19, 23)))  # all floor but the row of the target
    with pytest.raises(ValueError, match="unsolvable"):
        parse_level(JAMMED)
    assert solve(level, max_moves=2) is None


@pytest.mark.slow
def test_generated_levels_are_solvable_in_bounds_and_fast():
    rng = np.random.default_rng(0)
    for num_boxes in (1, 2):
        levels, start = [], time.perf_counter()
        while len(levels) < 100:
            level = generate_level(rng, 6, num_boxes, 6, 20)
            if level is not None:
                levels.append(level)
        per_level = (time.perf_counter() - start) / len(levels)
        assert per_level < 0.02, f"{1000 * per_level:.1f} ms per level"
        for level in levels:
            assert len(level.boxes) == len(level.targets) == num_boxes and not level.boxes & level.targets
            assert 6 <= len(level.solution) <= 20 and len(solve(level)) == len(level.solution)
            state = (level.player, level.boxes)
            for move in level.solution:
                state = push(level, state, move)[0]
            assert state[1] == level.targets
            rows = level.render().splitlines()
            assert set(rows[0] + rows[-1] + "".join(r[0] + r[-1] for r in rows)) == {"#"}
            assert len(rows) <= 8 and all(len(r) <= 8 for r in rows)


@pytest.mark.slow
def test_expert_solves_both_splits_optimally_within_max_turns():
    env = SokobanEnv()
    assert env.max_turns == 30
    for split in ("train", "test"):
        for seed in range(60):
            steps = play(env, seed, split, env.expert_action)
            *_, reward, terminated, _, info = steps[-1]
            assert env.task.split == split and terminated and info["success"] and reward == 1.0
            assert info["turn"] == len(env.task.solution) <= 20


def test_expert_replans_after_random_moves():
    env = SokobanEnv()
    replanned = 0
    for seed in range(40):
        env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        for _ in range(4):
            env.step(env.random_action(rng))
        if env.done:
            continue
        plan = solve(env.task, *env.state)
        if plan is None:
            assert env.expert_action() == "up"
            continue
        replanned += 1
        for turn in range(len(plan)):
            *_, terminated, _, info = env.step(env.expert_action())
        assert terminated and info["success"]  # optimal from the new state: exactly len(plan) moves
    assert replanned > 20


def test_several_moves_per_turn_and_box_ranges():
    env, _, _ = fixed(ROOM, moves_per_turn=3)
    assert env.expert_action() == "down, right, right"
    assert env.step(env.expert_action())[-1]["success"]
    env = SokobanEnv(moves_per_turn=5)
    assert env.max_turns == 6
    for seed in range(20):
        steps = play(env, seed, "test", env.expert_action)
        assert steps[-1][-1]["success"] and steps[-1][-1]["turn"] == math.ceil(len(env.task.solution) / 5)
    env = SokobanEnv(num_boxes=2, min_boxes=1)
    counts = {len(env.reset(seed=s)[1]["state_key"][1]) for s in range(30)}
    assert counts == {1, 2}


def test_same_seed_same_episode_and_state_keys():
    env = SokobanEnv()
    for seed in (0, 3):
        runs = []
        for _ in range(2):
            rng = np.random.default_rng(seed)
            runs.append(play(env, seed, "test", lambda: env.weak_expert_action(rng)))
        assert runs[0] == runs[1]
    env, _, info = fixed(ROOM, moves_per_turn=2)
    assert env.step("right, left")[-1]["state_key"] == info["state_key"]  # same state, same key
    a, _, _ = fixed(ROOM, moves_per_turn=4)
    b, _, _ = fixed(ROOM, moves_per_turn=4)
    key = a.step("right right right down")[-1]["state_key"]
    assert key == b.step("right right down right")[-1]["state_key"] == (16, (14,))


@pytest.mark.slow
def test_splits_are_disjoint_by_level_hash():
    env = SokobanEnv()
    ids = {split: {env.reset(seed=s, options={"split": split})[1]["task_id"] for s in range(200)}
           for split in ("train", "test")}
    assert len(ids["test"]) > 190 and not ids["train"] & ids["test"]
    for split, task_ids in ids.items():
        assert {parse_level(t.removeprefix("sokoban-")).split for t in task_ids} == {split}


@pytest.mark.slow
def test_weak_player_has_headroom():
    env = SokobanEnv()
    weak, rand = [], []
    for seed in range(150):
        rng = np.random.default_rng(10_000 + seed)
        weak.append(play(env, seed, "test", lambda: env.weak_expert_action(rng))[-1][-1]["success"])
        rng = np.random.default_rng(10_000 + seed)
        rand.append(play(env, seed, "test", lambda: env.random_action(rng))[-1][-1]["success"])
    assert 0.25 < np.mean(weak) < 0.65 and np.mean(rand) < 0.15


@pytest.mark.parametrize("kwargs, match", [
    ({"size": 3}, "size must be an int in"),
    ({"num_boxes": 0}, "num_boxes must be an int in"),
    ({"num_boxes": 1, "min_boxes": 2}, "min_boxes must be an int in"),
    ({"min_moves": 8, "max_moves": 5}, "max_moves must be an int >= 8"),
    ({"moves_per_turn": 0}, "moves_per_turn must be"),
    ({"levels": CORRIDOR}, "levels must be a non-empty sequence"),
    ({"levels": ["#####/#P_XO#/#####"]}, "one length"),
    ({"levels": ["######/#P_XO_/######"]}, "must be closed"),
    ({"levels": ["######/#P_Xo#/######"]}, "unknown symbols"),
    ({"levels": ["######/#P_XX#/#__O_#/######"]}, "as many targets as boxes"),
])
def test_bad_kwargs_are_value_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SokobanEnv(**kwargs)
    with pytest.raises(TypeError, match="shaped must be a bool"):
        SokobanEnv(shaped=1)


@pytest.mark.slow
def test_registered_env_passes_the_checker():
    report = check("turnrl/Sokoban-v0", seeds=30)
    assert report.ok, report.format()


def test_hydra_group_builds_the_env():
    register_configs()
    with initialize_config_module(config_module="turnrl.conf", version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name="config", overrides=["env=sokoban"]))
    assert cfg.env.id == "turnrl/Sokoban-v0" and cfg.agent.max_new_tokens == 8
    env = env_factory(cfg)()
    assert isinstance(env.unwrapped, SokobanEnv) and env.unwrapped.max_turns == 30
    assert gymnasium.spec("turnrl/Sokoban-v0").entry_point == "turnrl.envs.games.sokoban:SokobanEnv"
