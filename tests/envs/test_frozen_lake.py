import math

import gymnasium
import numpy as np
import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

import turnrl.envs  # noqa: F401  (registers the envs)
from turnrl.train.factories import env_factory
from turnrl.conf.schema import register_configs
from turnrl.envs.check import check
from turnrl.envs.games.frozen_lake import (
    FrozenLakeEnv, local_solves, parse_map, path_bounds, shortest_path, slippery_plan,
)

SMALL = "S.O/.../O.G"  # start top-left, holes at (0, 2) and (2, 0), goal bottom-right


def fixed(map_text, **kwargs):
    """An env on one hand-built map, reset into that map's split."""
    env = FrozenLakeEnv(maps=[map_text], **kwargs)
    obs, info = env.reset(seed=0, options={"split": parse_map(map_text).split})
    return env, obs, info


def play(env, seed, split, policy):
    obs, info = env.reset(seed=seed, options={"split": split})
    steps = [(obs, info)]
    while True:
        steps.append(env.step(policy()))
        if steps[-1][2] or steps[-1][3]:
            return steps


def test_prompt_shows_legend_and_map():
    env, obs, info = fixed(SMALL)
    assert [m["role"] for m in obs] == ["system", "user"]
    assert "P player, . frozen ice (safe), O hole (falling in ends the game), G goal" in obs[0]["content"]
    assert "slippery" not in obs[0]["content"]
    assert obs[1]["content"] == "Map:\nP.O\n...\nO.G\nReply with one move: up, down, left or right."
    assert info["task_id"] == "frozen_lake-S.O/.../O.G" and info["state_key"] == (0, 0)
    assert "slippery" in FrozenLakeEnv(is_slippery=True).system_prompt()


def test_edge_hole_and_goal_rules():
    env, _, _ = fixed(SMALL)
    obs, reward, terminated, _, info = env.step("up")
    assert obs == ({"role": "user", "content": "up: blocked by the edge, stayed\nMap:\nP.O\n...\nO.G"},)
    assert (reward, terminated, info["state_key"]) == (0.0, False, (0, 0))
    obs, *_ , info = env.step("right")
    assert obs[0]["content"] == "right: moved\nMap:\n.PO\n...\nO.G"  # the start shows as ice
    obs, reward, terminated, truncated, info = env.step("right")
    assert obs[0]["content"] == "right: fell into a hole\nYou fell into a hole. Game over."
    assert (reward, terminated, truncated, info["success"]) == (0.0, True, False, False)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("left")

    env, _, _ = fixed(SMALL)
    for move in ("down", "right", "down"):
        env.step(move)
    obs, reward, terminated, _, info = env.step("right")
    assert obs[0]["content"] == "right: reached the goal\nYou reached the goal!"
    assert (reward, terminated, info["success"], info["turn"]) == (1.0, True, True, 4)


def test_local_view_shows_the_goal_offset_and_the_neighbours_instead_of_the_map():
    env, obs, info = fixed(SMALL, view="local")
    assert "You do not see the map" in obs[0]["content"] and "Legend" not in obs[0]["content"]
    assert obs[1]["content"] == ("Goal: 2 down, 2 right. Next to you: up edge, down ice, left edge, right ice.\n"
                                 "Reply with one move: up, down, left or right.")
    obs, *_ = env.step("right")
    assert obs[0]["content"] == "right: moved\nGoal: 2 down, 1 right. Next to you: up edge, down ice, left ice, right hole."
    obs, *_ = env.step("down")
    assert obs[0]["content"].endswith("Goal: 1 down, 1 right. Next to you: up ice, down ice, left ice, right ice.")
    obs, *_ = env.step("down")
    assert obs[0]["content"].endswith("Goal: 1 right. Next to you: up ice, down edge, left hole, right goal.")
    obs, reward, terminated, _, info = env.step("right")
    assert obs[0]["content"] == "right: reached the goal\nYou reached the goal!" and info["success"]
    # the same episode on the map view differs only in what each observation shows
    assert info["state_key"] == (2, 2) and info["turn"] == 4


def test_toward_view_lists_the_goal_directions_first_with_the_cell_each_way():
    env, obs, info = fixed(SMALL, view="toward")
    assert "You do not see the map" in obs[0]["content"]
    # a tie (2 and 2) lists the vertical offset first, as toward_action plays it
    assert obs[1]["content"].startswith("Goal: 2 down (ice), 2 right (ice). Else: up edge, left edge.\n")
    obs, *_ = env.step("right")
    assert obs[0]["content"] == "right: moved\nGoal: 2 down (ice), 1 right (hole). Else: up edge, left ice."
    obs, *_ = env.step("down")
    assert obs[0]["content"].endswith("Goal: 1 down (ice), 1 right (ice). Else: up ice, left ice.")
    obs, *_ = env.step("down")
    # one axis done: both of its moves are among the others
    assert obs[0]["content"].endswith("Goal: 1 right (goal). Else: up ice, down edge, left hole.")
    # the larger offset comes first whichever axis it is on
    env, obs, _ = fixed("S.../..../.O.G/....", view="toward")
    assert obs[1]["content"].startswith("Goal: 3 right (ice), 2 down (ice). Else:")
    # the same players as the local view: only what the observation shows differs
    env, _, _ = fixed("S../O../.G.", view="toward")
    assert env.toward_action() == "down" and env.local_action() == "right"
    assert {env.weak_expert_action(np.random.default_rng(s)) for s in range(50)} == {"down", "right"}


def test_local_player_heads_for_the_goal_around_holes_but_has_no_memory():
    env, _, _ = fixed(SMALL, view="local")
    moves = []
    while env.position != parse_map(SMALL).goal:
        moves.append(env.local_action())
        env.step(moves[-1])
    assert moves == ["down", "right", "down", "right"]
    # behind a wall of holes it walks back and forth: the local view alone does not solve every map
    env, _, _ = fixed("S.../OOO./.G../....", view="local")
    played = []
    for _ in range(4):
        played.append(env.local_action())
        env.step(played[-1])
    assert played == ["right", "left", "right", "left"] and env.position == (0, 0)


def test_local_view_weak_player_mostly_walks_into_the_hole_in_its_way():
    # the goal is 2 down and 1 right; straight down (the larger offset) is a hole
    env, _, _ = fixed("S../O../.G.", view="local")
    assert env.toward_action() == "down" and env.local_action() == "right"
    rng = np.random.default_rng(0)
    played = [env.weak_expert_action(rng) for _ in range(2000)]
    assert set(played) == {"down", "right"}
    assert abs(played.count("right") / 2000 - 0.3) < 0.04  # LOCAL_WEAK_AROUND_PROB, 4.4 sigma
    # the map view's weak player is still the noisy expert
    env, _, _ = fixed("S../O../.G.")
    assert {env.weak_expert_action(rng) for _ in range(200)} == {"up", "down", "left", "right"}


def test_weak_skill_sets_how_often_the_weak_player_plays_the_better_move():
    rng = np.random.default_rng(1)
    env, _, _ = fixed("S../O../.G.", view="toward", weak_skill=0.5)
    played = [env.weak_expert_action(rng) for _ in range(2000)]
    assert abs(played.count("right") / 2000 - 0.5) < 0.05  # 4.5 sigma
    env, _, _ = fixed("S../O../.G.", view="local", weak_skill=1)
    assert {env.weak_expert_action(rng) for _ in range(100)} == {"right"}
    env, _, _ = fixed("S../O../.G.", weak_skill=1.0)  # the map view's weak player: the expert
    assert {env.weak_expert_action(rng) for _ in range(100)} == {env.expert_action()}
    for bad in (-0.1, 1.5, True, "0.5"):
        with pytest.raises(ValueError, match="weak_skill must be None or a probability"):
            FrozenLakeEnv(weak_skill=bad)


def test_local_solves_tells_the_maps_the_memoryless_player_wins_from_its_loops():
    assert local_solves(parse_map(SMALL), max_turns=4) and not local_solves(parse_map(SMALL), max_turns=3)
    assert not local_solves(parse_map("S.../OOO./.G../...."), max_turns=50)  # the wall of the test above
    # the way round the wall is there: BFS finds it, the memoryless player does not
    assert len(shortest_path(parse_map("S.../OOO./.G../...."), (0, 0))) == 7


@pytest.mark.slow
def test_local_solvable_keeps_only_maps_the_local_player_wins():
    """Every map drawn under ``local_solvable`` is won by ``local_action`` (both splits), the
    maps are still long, and the knob drops maps: the same seed draws another map without it."""
    env = FrozenLakeEnv(size=7, min_path=9, hole_prob=0.15, view="toward", local_solvable=True)
    plain = FrozenLakeEnv(size=7, min_path=9, hole_prob=0.15, view="toward")
    differ = 0
    for split in ("train", "test"):
        for seed in range(40):
            steps = play(env, seed, split, env.local_action)
            assert steps[-1][-1]["success"] and len(steps) - 1 >= 9, (split, seed)
            plain.reset(seed=seed, options={"split": split})
            differ += plain._task != env._task
    assert differ > 10  # about 4 maps in 10 are dropped at 15% holes
    # fixed maps are filtered too, and a split left with none is an error that says why
    wall = "S.../OOO./.G../.O.."  # a test map the local player loops on; SMALL is a train map
    assert (parse_map(wall).split, parse_map(SMALL).split) == ("test", "train") and not local_solves(parse_map(wall), 50)
    env = FrozenLakeEnv(maps=[wall, SMALL], local_solvable=True)
    assert env.reset(seed=0, options={"split": "train"})[1]["task_id"] == f"frozen_lake-{SMALL}"
    with pytest.raises(ValueError, match="none of the 2 given maps that local_move solves"):
        env.reset(seed=0, options={"split": "test"})
    assert FrozenLakeEnv(maps=[wall]).reset(seed=0, options={"split": "test"})[1]["task_id"] == f"frozen_lake-{wall}"
    with pytest.raises(ValueError, match="needs firm ice"):
        FrozenLakeEnv(is_slippery=True, local_solvable=True)
    with pytest.raises(TypeError, match="local_solvable must be a bool"):
        FrozenLakeEnv(local_solvable="yes")


def test_show_safe_ends_the_view_with_the_moves_toward_the_goal_that_miss_the_holes():
    # the goal is 2 down and 1 right; down (the larger offset) is a hole, right is ice
    env, obs, _ = fixed("S../O../.G.", view="toward", show_safe=True)
    assert obs[1]["content"].startswith("Goal: 2 down (hole), 1 right (ice). Else: up edge, left edge. "
                                        "Safe toward the goal: right.\n")
    assert env.local_action() == "right" and env.toward_action() == "down"
    env.step("right")
    obs = env.step("down")[0]  # now at (1, 1): the goal is 1 down; both safe cells toward it listed
    assert obs[0]["content"].endswith("Goal: 1 down (goal). Else: up ice, left hole, right ice. Safe toward the goal: down.")
    env, obs, _ = fixed("...../.SO../.O.../...../....G", view="local", show_safe=True)  # both ways are holes
    assert obs[1]["content"].split("\n")[0] == ("Goal: 3 down, 3 right. Next to you: up ice, down hole, left ice, "
                                                "right hole. Safe toward the goal: none.")
    env, obs, _ = fixed("S../.../..G", view="toward", show_safe=True)
    assert "Safe toward the goal: down, right." in obs[1]["content"]
    assert "Safe" not in fixed("S../.../..G", view="toward")[1][1]["content"]  # off by default
    with pytest.raises(ValueError, match="show_safe=True needs view='local' or 'toward'"):
        FrozenLakeEnv(show_safe=True)
    with pytest.raises(TypeError, match="show_safe must be a bool"):
        FrozenLakeEnv(view="toward", show_safe=1)


@pytest.mark.slow
def test_copying_the_first_safe_move_is_the_local_player():
    """On ``frozen_lake_long``-like maps, the first move after "Safe toward the goal:" is
    ``local_action``'s move at every turn it names one: a player copying it (and stepping aside
    on "none") plays the local player, and under ``local_solvable`` wins every map."""
    env = FrozenLakeEnv(size=7, min_path=9, hole_prob=0.15, view="toward", show_safe=True, local_solvable=True)
    for seed in range(30):
        obs, _ = env.reset(seed=seed, options={"split": "test"})
        text = obs[-1]["content"]
        while True:
            named = text.split("Safe toward the goal: ")[1].split(".")[0].split(", ")[0]
            move = env.local_action()
            assert named == move or named == "none", (text, move)
            obs, _, terminated, truncated, info = env.step(move)
            text = obs[-1]["content"]
            if terminated or truncated:
                break
        assert info["success"]


@pytest.mark.slow
def test_local_view_players_leave_room_between_the_weak_one_and_the_local_one():
    """The long-horizon setting's players on 300 test maps (7x7, shortest path 9+, 10% holes):
    measured 0.34 straight to the goal, 0.44 weak, 0.78 local; the weak player is what the
    warm start imitates and the local one what RL can reach without memory."""
    env = FrozenLakeEnv(size=7, min_path=9, hole_prob=0.1, view="local")
    rng = np.random.default_rng(0)
    wins = {name: np.mean([play(env, seed, "test", policy)[-1][-1]["success"] for seed in range(300)])
            for name, policy in [("toward", env.toward_action), ("weak", lambda: env.weak_expert_action(rng)),
                                 ("local", env.local_action)]}
    assert 0.25 < wins["toward"] < wins["weak"] < 0.55 and wins["local"] > 0.7, wins


def test_several_moves_per_turn_stop_at_the_end_and_report_dropped_ones():
    env, _, _ = fixed(SMALL, moves_per_turn=4)
    *_, reward, terminated, _, info = env.step("down right down right")
    assert (reward, terminated, info["success"], info["turn"]) == (1.0, True, True, 1)

    env, _, _ = fixed(SMALL, moves_per_turn=2)
    obs, *_ = env.step("down, right, down")
    assert obs[0]["content"] == "down: moved\nright: moved\n(only the first 2 move(s) were played)\nMap:\n..O\n.P.\nO.G"
    env, _, _ = fixed(SMALL, moves_per_turn=3)
    obs, _, terminated, _, _ = env.step("right right down")  # the hole ends the turn early
    assert terminated and obs[0]["content"].endswith("right: fell into a hole\nYou fell into a hole. Game over.")


def test_garbage_counts_as_a_turn_and_truncates():
    env, _, _ = fixed(SMALL, max_turns=3)
    for text in ("hello", "", '<tool_call>{"name": "move", "arguments": '):
        obs, reward, terminated, truncated, info = env.step(text)
        assert obs[-1] == {"role": "user", "content": "No move found. Reply with one move: up, down, left or right."}
        assert reward == 0.0 and not terminated and info["state_key"] == (0, 0)
    assert truncated and info["turn"] == 3 and not info["success"]


def test_state_key_is_the_position_whatever_the_path():
    a, _, _ = fixed(SMALL, moves_per_turn=2)
    b, _, _ = fixed(SMALL, moves_per_turn=2)
    assert a.step("down, right")[-1]["state_key"] == b.step("right, down")[-1]["state_key"] == (1, 1)


@pytest.mark.slow
def test_generated_maps_are_solvable_within_bounds_and_the_expert_solves_both_splits():
    for size in (3, 4, 8):
        env = FrozenLakeEnv(size=size)
        low, high = path_bounds(size)
        assert env.max_turns == 2 * size + 4
        for split in ("train", "test"):
            for seed in range(100):
                steps = play(env, seed, split, env.expert_action)
                lake = env.task
                assert lake.split == split and lake.size == size
                path = shortest_path(lake, lake.start)
                assert low <= len(path) <= high and high <= env.max_turns
                *_, reward, terminated, truncated, info = steps[-1]
                assert terminated and info["success"] and reward == 1.0
                assert info["turn"] == len(path)  # the expert walks a shortest path
                assert sum(s[1] for s in steps[1:]) == 1.0


def test_min_path_makes_every_map_long_and_keeps_the_default():
    env = FrozenLakeEnv(size=5, min_path=8)
    assert env.max_turns == 14  # the turn limit still follows the path cap
    for split in ("train", "test"):
        for seed in range(40):
            steps = play(env, seed, split, env.expert_action)
            assert 8 <= len(shortest_path(env.task, env.task.start)) <= 12
            assert steps[-1][-1]["success"] and steps[-1][-1]["turn"] >= 8
    default, explicit = FrozenLakeEnv(size=5), FrozenLakeEnv(size=5, min_path=4)  # size - 1
    for seed in range(20):
        assert default.reset(seed=seed)[1]["task_id"] == explicit.reset(seed=seed)[1]["task_id"]
    assert default.min_path is None


def test_expert_with_several_moves_per_turn_needs_fewer_turns():
    env = FrozenLakeEnv(moves_per_turn=3)
    assert env.max_turns == math.ceil(10 / 3) + 2
    for seed in range(50):
        steps = play(env, seed, "test", env.expert_action)
        assert steps[-1][-1]["success"]
        assert steps[-1][-1]["turn"] == math.ceil(len(shortest_path(env.task, env.task.start)) / 3)


def test_same_seed_same_map_and_episode():
    env = FrozenLakeEnv(is_slippery=True)
    for seed in (0, 5):
        runs = []
        for _ in range(2):
            rng = np.random.default_rng(seed)
            runs.append(play(env, seed, "train", lambda: env.weak_expert_action(rng)))
        assert runs[0] == runs[1]
    maps = {FrozenLakeEnv().reset(seed=s)[1]["task_id"] for s in range(50)}
    assert len(maps) == 50


def test_splits_are_disjoint_by_map_hash():
    env = FrozenLakeEnv()
    ids = {split: {env.reset(seed=s, options={"split": split})[1]["task_id"] for s in range(300)}
           for split in ("train", "test")}
    assert len(ids["test"]) > 250 and not ids["train"] & ids["test"]
    for split, task_ids in ids.items():
        assert {parse_map(t.removeprefix("frozen_lake-")).split for t in task_ids} == {split}


def test_slips_go_each_way_a_third_of_the_time():
    outcomes = {}
    env, _, _ = fixed("S../.../..G", is_slippery=True)
    for seed in range(900):
        env.reset(seed=seed, options={"split": parse_map("S../.../..G").split})
        line = env.step("down")[0][0]["content"].splitlines()[0]
        outcomes[line] = outcomes.get(line, 0) + 1
    assert set(outcomes) == {"down: moved", "down (slipped left): blocked by the edge, stayed",
                             "down (slipped right): moved"}
    assert all(240 < n < 360 for n in outcomes.values()), outcomes


@pytest.mark.slow
def test_slippery_plan_values_by_hand_and_by_play():
    lake = parse_map("S./.G")
    plan = slippery_plan(lake, 4)
    assert plan[1][(0, 0)][0] == 0.0  # the goal is two cells away
    value, move = plan[2][(0, 0)]
    assert move == "down" and value == pytest.approx(2 / 9)  # 1/3 * (1/3 + 0 + 1/3)
    env, _, _ = fixed("S./.G", is_slippery=True, max_turns=4)
    split = lake.split
    wins = [play(env, seed, split, env.expert_action)[-1][-1]["success"] for seed in range(1500)]
    expected = plan[4][(0, 0)][0]
    assert abs(np.mean(wins) - expected) < 4 * math.sqrt(expected * (1 - expected) / 1500)


@pytest.mark.slow
def test_weak_player_has_headroom():
    env = FrozenLakeEnv()
    wins = []
    for seed in range(300):
        rng = np.random.default_rng(10_000 + seed)
        wins.append(play(env, seed, "test", lambda: env.weak_expert_action(rng))[-1][-1]["success"])
    random_wins = []
    for seed in range(300):
        rng = np.random.default_rng(10_000 + seed)
        random_wins.append(play(env, seed, "test", lambda: env.random_action(rng))[-1][-1]["success"])
    assert 0.3 < np.mean(wins) < 0.65 and np.mean(random_wins) < 0.2


def test_fixed_maps_accept_gymnasium_symbols():
    lake = parse_map("SFFF/FHFH/FFFH/HFFG")
    assert lake.rows == ("S...", ".O.O", "...O", "O..G") and len(shortest_path(lake, lake.start)) == 6


@pytest.mark.parametrize("kwargs, match", [
    ({"size": 2}, "size must be an int in"),
    ({"size": 9}, "size must be an int in"),
    ({"hole_prob": 0.9}, "hole_prob must be"),
    ({"moves_per_turn": 0}, "moves_per_turn must be"),
    ({"size": 5, "min_path": 13}, "min_path must be"),
    ({"size": 5, "min_path": 3}, "min_path must be"),
    ({"maps": "S./.G"}, "maps must be a non-empty sequence"),
    ({"maps": ["S./.X"]}, "has symbols"),
    ({"maps": ["SO/OG"]}, "unsolvable"),
    ({"maps": ["S../.G"]}, "must be square"),
    ({"maps": ["S./.."]}, "exactly one S and one G"),
    ({"view": "global"}, "view must be one of"),
])
def test_bad_kwargs_are_value_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FrozenLakeEnv(**kwargs)
    with pytest.raises(TypeError, match="is_slippery must be a bool"):
        FrozenLakeEnv(is_slippery="yes")


def test_registered_env_passes_the_checker():
    report = check("turnrl/FrozenLake-v0", seeds=30)
    assert report.ok, report.format()


def test_hydra_group_builds_the_env():
    register_configs()
    with initialize_config_module(config_module="turnrl.conf", version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name="config", overrides=["env=frozen_lake"]))
    assert cfg.env.id == "turnrl/FrozenLake-v0" and cfg.agent.max_new_tokens == 8
    env = env_factory(cfg)()
    assert isinstance(env.unwrapped, FrozenLakeEnv) and env.unwrapped.max_turns == 12
    assert gymnasium.spec("turnrl/FrozenLake-v0").entry_point == "turnrl.envs.games.frozen_lake:FrozenLakeEnv"


def test_hydra_long_horizon_config_builds_long_episodes():
    register_configs()
    with initialize_config_module(config_module="turnrl.conf", version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name="config", overrides=["env=frozen_lake_long"]))
    assert cfg.agent.warmstart.player == "weak" and cfg.agent.warmstart.steps == 500
    env = env_factory(cfg)().unwrapped
    assert (env.size, env.min_path, env.max_turns, env.view, env.weak_skill) == (7, 9, 18, "toward", 0.3)
    assert env.show_safe and env.local_solvable and env.hole_prob == 0.15
    obs, info = env.reset(seed=0)
    assert obs[1]["content"].startswith("Goal: ") and len(shortest_path(env._task, env.position)) >= 9
    assert "Safe toward the goal: " in obs[1]["content"] and local_solves(env._task, env.max_turns)
