"""Household-v0: rules on hand-built houses, partial observations, the searching expert on many
seeds of both splits, splits, state keys, hints, garbage commands, players and the checker."""

import zlib

import gymnasium
import numpy as np
import pytest

import turnrl.envs  # noqa: F401  (registers the ids)
from turnrl.envs.check import check
from turnrl.envs.games.household import (
    FAMILIES,
    Goal,
    HouseConfig,
    HouseholdEnv,
    Layout,
    Receptacle,
    Task,
    World,
    draw_task,
    expert_command,
    normalize,
)
from turnrl.envs.games.household.env import DONE, FORMAT_HINT
from turnrl.envs.games.household.game import NOTHING_HAPPENS

HINTS = "\n\nAdmissible commands: "


def house(goal: Goal, placement=(("apple 1", "fridge 1"), ("mug 1", "countertop 1"), ("mug 2", "drawer 1"),
                                  ("book 1", "drawer 1")), start="kitchen") -> Task:
    """A two-room house: kitchen (fridge, microwave, sinkbasin, countertop, cabinet) - bedroom
    (desk with the desklamp, drawer)."""
    kitchen = ("fridge", "microwave", "sinkbasin", "countertop", "cabinet")
    receps = tuple(Receptacle(f"{k} 1", k, "kitchen") for k in kitchen) + (
        Receptacle("desk 1", "desk", "bedroom"), Receptacle("drawer 1", "drawer", "bedroom"))
    objects = tuple((name, name.split()[0]) for name, _ in placement)
    layout = Layout(("kitchen", "bedroom"), (("kitchen", "bedroom"),), receps, objects, "desk 1")
    return Task(layout, tuple(placement), start, goal)


def run(world: World, *commands: str) -> list:
    return [world.execute(c) for c in commands]


def text(obs) -> str:
    return obs[-1]["content"].split(HINTS)[0]


# ------------------------------------------------------------------ rules
def test_closed_containers_hide_their_content_until_opened():
    w = World(house(Goal("pick", "apple", "cabinet")))
    assert w.room_text() == ("You are in the kitchen. Looking around, you see a fridge 1, a microwave 1, "
                             "a sinkbasin 1, a countertop 1 and a cabinet 1. Doors lead to the bedroom.")
    assert w.execute("go to fridge 1") == "You arrive at the fridge 1. The fridge 1 is closed."
    assert "apple" not in " ".join(w.admissible())
    assert w.execute("take apple 1 from fridge 1") is None
    assert w.execute("open fridge 1") == "You open the fridge 1. The fridge 1 is open. In it, you see an apple 1."
    assert w.execute("go to countertop 1") == "You arrive at the countertop 1. On the countertop 1, you see a mug 1."
    assert w.execute("look") == "You are at the countertop 1 in the kitchen. On the countertop 1, you see a mug 1."


def test_carrying_one_object_and_putting_needs_an_open_receptacle():
    w = World(house(Goal("pick", "apple", "cabinet")))
    assert run(w, "go to fridge 1", "open fridge 1", "take apple 1 from fridge 1")[-1] == (
        "You pick up the apple 1 from the fridge 1.")
    assert w.held == "apple 1" and w.execute("inventory") == "You are carrying: an apple 1."
    assert w.execute("go to countertop 1") is not None
    assert w.execute("take mug 1 from countertop 1") is None  # hands full
    assert w.execute("go to cabinet 1") == "You arrive at the cabinet 1. The cabinet 1 is closed."
    assert w.execute("put apple 1 in cabinet 1") is None  # closed
    w.execute("open cabinet 1")
    assert w.execute("  PUT Apple 1   in/on Cabinet 1. ") == "You put the apple 1 in the cabinet 1."
    assert w.where["apple 1"] == "cabinet 1" and w.held is None
    assert w.execute("inventory") == "You are not carrying anything."
    assert w.goal_met()


def test_put_accepts_either_preposition_and_admissible_lists_the_natural_one():
    w = World(house(Goal("pick", "mug", "cabinet")))
    run(w, "go to countertop 1", "take mug 1 from countertop 1")
    assert "put mug 1 on countertop 1" in w.admissible()
    assert w.execute("put mug 1 in countertop 1") == "You put the mug 1 on the countertop 1."
    w.execute("take mug 1 from countertop 1")
    assert w.execute("> put mug 1 on countertop 1") == "You put the mug 1 on the countertop 1."


def test_rooms_are_reached_through_doors_and_receptacles_only_in_their_room():
    w = World(house(Goal("pick", "apple", "cabinet")))
    assert w.execute("go to desk 1") is None  # in the bedroom
    assert w.execute("go to bathroom") is None  # no such room
    assert w.execute("go to bedroom").startswith("You are in the bedroom. Looking around, you see a desk 1 and a "
                                                  "drawer 1. Doors lead to the kitchen.")
    assert w.room == "bedroom" and w.at is None
    assert w.execute("go to fridge 1") is None
    assert w.execute("go to desk 1") == "You arrive at the desk 1. On the desk 1, you see a desklamp 1."
    assert "take desklamp 1 from desk 1" not in w.admissible()  # the lamp is fixed


def test_clean_heat_cool_need_the_appliance_and_change_the_state():
    w = World(house(Goal("heat", "apple", "countertop")))
    run(w, "go to fridge 1", "open fridge 1", "take apple 1 from fridge 1")
    assert w.execute("heat apple 1 with fridge 1") is None
    assert w.execute("heat apple 1 with microwave 1") is None  # not at the microwave
    assert w.execute("cool apple 1 with fridge 1") == "You cool the apple 1 using the fridge 1."
    w.execute("go to microwave 1")
    assert w.execute("heat apple 1 with microwave 1") == "You heat the apple 1 using the microwave 1."
    assert w.states["hot"] == {"apple 1"} and w.states["cool"] == set()  # heating undoes cooling
    w.execute("go to sinkbasin 1")
    assert w.execute("clean apple 1 with sinkbasin 1") == "You clean the apple 1 using the sinkbasin 1."
    assert w.execute("examine apple 1") == "This is a clean and hot apple 1."
    assert not w.goal_met()
    run(w, "go to countertop 1", "put apple 1 on countertop 1")
    assert w.goal_met()


def test_state_goals_need_the_state_and_the_kind_of_receptacle():
    w = World(house(Goal("clean", "mug", "cabinet")))
    run(w, "go to countertop 1", "take mug 1 from countertop 1", "go to cabinet 1", "open cabinet 1",
        "put mug 1 in cabinet 1")
    assert not w.goal_met()  # not clean
    run(w, "take mug 1 from cabinet 1", "go to sinkbasin 1", "clean mug 1 with sinkbasin 1")
    assert not w.goal_met()  # clean but held
    run(w, "go to countertop 1", "put mug 1 on countertop 1")
    assert not w.goal_met()  # clean but on the wrong kind
    run(w, "take mug 1 from countertop 1", "go to cabinet 1", "put mug 1 in cabinet 1")
    assert w.goal_met()


def test_look_goal_needs_the_object_in_hand_at_the_lit_desklamp():
    w = World(house(Goal("look", "book")))
    run(w, "go to bedroom", "go to desk 1")
    assert w.execute("use desklamp 1") == "You turn on the desklamp 1." and not w.goal_met()
    assert w.execute("use desklamp 1") == "The desklamp 1 is already on."
    run(w, "go to drawer 1", "open drawer 1", "take book 1 from drawer 1")
    assert not w.goal_met()  # lit lamp, but not at it
    assert w.execute("go to desk 1") is not None and w.goal_met()


def test_pick_two_needs_two_objects_in_target_receptacles():
    w = World(house(Goal("pick_two", "mug", "cabinet")))
    run(w, "go to countertop 1", "take mug 1 from countertop 1", "go to cabinet 1", "open cabinet 1",
        "put mug 1 in cabinet 1")
    assert not w.goal_met()
    run(w, "go to bedroom", "go to drawer 1", "open drawer 1", "take mug 2 from drawer 1", "go to kitchen",
        "go to cabinet 1", "put mug 2 in cabinet 1")
    assert w.goal_met()


def test_normalize_is_case_space_and_preposition_insensitive():
    assert normalize("  Go   To  Fridge 1.\nsecond line") == "go to fridge 1"
    assert normalize('"open drawer 2"') == "open drawer 2"
    assert normalize("put apple 1 on shelf 1") == normalize("put apple 1 in/on shelf 1") == "put apple 1 in shelf 1"
    assert normalize("") == ""


# ------------------------------------------------------------------ expert
@pytest.mark.slow
def test_expert_solves_every_task_of_both_splits_within_the_window():
    env = HouseholdEnv()
    for split in ("train", "test"):
        turns = []
        for seed in range(600):
            _, info = env.reset(seed=seed, options={"split": split})
            assert info["split"] == split
            rewards = []
            while True:
                _, reward, terminated, truncated, info = env.step(env.expert_action())
                rewards.append(reward)
                if terminated or truncated:
                    break
            assert terminated and info["success"], (split, seed, info["task_id"])
            assert rewards == [0.0] * (len(rewards) - 1) + [1.0]
            turns.append(len(rewards))
        assert 8 <= min(turns) and max(turns) <= 30 and 10 <= np.mean(turns) <= 25


def test_expert_only_takes_objects_it_has_been_shown():
    env = HouseholdEnv()
    for seed in range(60):
        obs, _ = env.reset(seed=seed)
        seen = text(obs)
        while True:
            action = env.expert_action()
            if action.startswith("take "):
                obj = action.removeprefix("take ").split(" from ")[0]
                assert f" {obj}" in seen, (seed, action)
            obs, _, terminated, truncated, _ = env.step(action)
            seen += "\n" + text(obs)
            if terminated or truncated:
                break


@pytest.mark.slow
def test_expert_recovers_from_random_detours():
    env = HouseholdEnv(max_turns=200)
    rng = np.random.default_rng(0)
    for seed in range(60):
        env.reset(seed=seed, options={"split": "test"})
        for _ in range(15):
            *_, terminated, _, info = env.step(env.random_action(rng))
            if terminated:
                break
        while not terminated:
            *_, terminated, truncated, info = env.step(env.expert_action())
            assert not truncated
        assert info["success"] and info["turn"] <= 15 + 60


def test_expert_commands_are_always_admissible():
    for seed in range(200):
        task = draw_task(np.random.default_rng(seed), HouseConfig())
        if task is None:
            continue
        w = World(task)
        for _ in range(40):
            command = expert_command(w)
            assert command in w.admissible()
            w.execute(command)
            if w.goal_met():
                break
        assert w.goal_met()


# ------------------------------------------------------------------ env
def test_reset_prompt_hints_and_info():
    env = HouseholdEnv()
    obs, info = env.reset(seed=5)
    system, user = obs
    assert system["role"] == "system" and "put <object> in/on <receptacle>" in system["content"]
    intro, hints = user["content"].split(HINTS)
    assert intro.startswith("You are in the ") and f"Your task is to: {env.task.goal.text}." in intro
    assert hints.split(", ") == env.admissible_commands()
    assert info["task_id"] == env.task.task_id and info["turn"] == 0 and info["split"] == "train"
    obs, *_ = env.step(env.admissible_commands()[-1])
    assert obs[0]["content"].split(HINTS)[1].split(", ") == env.admissible_commands()


def test_garbage_commands_say_nothing_happens_and_change_nothing():
    env = HouseholdEnv()
    _, info = env.reset(seed=1)
    key = info["state_key"]
    for action in ["", "fly to the moon", "take apple 99 from nowhere", "go to", "\u00e9\u00e8 go to mars",
                   '<tool_call>\n{"name": "go", "arguments": {}}\n</tool_call>', "x" * 2000]:
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs[-1]["content"].startswith(NOTHING_HAPPENS + HINTS)
        assert reward == 0.0 and not terminated and info["state_key"] == key
    quiet = HouseholdEnv(admissible_hints=False)
    obs, _ = quiet.reset(seed=1)
    assert HINTS not in obs[-1]["content"]
    obs, *_ = quiet.step("dance")
    assert obs == ({"role": "user", "content": f"{NOTHING_HAPPENS} {FORMAT_HINT}"},)
    obs, *_ = quiet.step(quiet.expert_action())
    assert HINTS not in obs[0]["content"]


def test_success_message_and_truncation():
    env = HouseholdEnv()
    env.reset(seed=2)
    while True:
        obs, reward, terminated, truncated, info = env.step(env.expert_action())
        if terminated:
            break
    assert obs[-1]["content"].endswith(DONE) and reward == 1.0
    short = HouseholdEnv(max_turns=30)
    short.reset(seed=2)
    for turn in range(30):
        *_, terminated, truncated, info = short.step("look")
    assert truncated and not terminated and not info["success"] and info["turn"] == 30


def test_same_seed_same_episode_and_seeds_vary():
    a, b = HouseholdEnv(), HouseholdEnv()
    for seed in range(5):
        obs_a, info_a = a.reset(seed=seed, options={"split": "test"})
        obs_b, info_b = b.reset(seed=seed, options={"split": "test"})
        assert obs_a == obs_b and info_a == info_b
        for _ in range(6):
            step_a = a.step(a.expert_action())
            step_b = b.step(b.expert_action())
            assert step_a == step_b
    ids = {a.reset(seed=s)[1]["task_id"] for s in range(50)}
    assert len(ids) == 50


@pytest.mark.slow
def test_splits_by_hash_are_disjoint_and_about_one_in_five():
    env = HouseholdEnv()
    ids = {}
    for split in ("train", "test"):
        ids[split] = set()
        for seed in range(150):
            env.reset(seed=seed, options={"split": split})
            test_bucket = zlib.crc32(env.task.description.encode()) % 5 == 0
            assert test_bucket == (split == "test")
            ids[split].add(env.task.task_id)
    assert not ids["train"] & ids["test"]
    draws = [draw_task(np.random.default_rng(s), HouseConfig()) for s in range(1000)]
    share = np.mean([t.split == "test" for t in draws if t is not None])
    assert 0.15 < share < 0.25


def test_state_key_is_the_world_state_not_the_turn_or_what_was_seen():
    env = HouseholdEnv()
    env.reset(seed=0)
    w = env.world
    receptacle = next(r for r in env.task.layout.in_room(w.room) if r.openable)
    _, _, _, _, at = env.step(f"go to {receptacle.name}")
    for action in ("look", "inventory", f"examine {receptacle.name}", "nonsense"):
        assert env.step(action)[-1]["state_key"] == at["state_key"]
    opened = env.step(f"open {receptacle.name}")[-1]["state_key"]
    assert opened != at["state_key"]
    closed = env.step(f"close {receptacle.name}")[-1]
    assert closed["state_key"] == at["state_key"] and closed["turn"] != at["turn"]  # seen more, same world
    hash(closed["state_key"])
    # two different routes to the same world state give the same key
    routes = ([], ["go to " + r.name for r in env.task.layout.in_room(w.room)][:2])
    keys = set()
    for route in routes:
        env.reset(seed=0)
        for action in route:
            env.step(action)
        keys.add(env.step(f"go to {receptacle.name}")[-1]["state_key"])
    assert len(keys) == 1


def test_kwargs_control_the_house_and_bad_kwargs_fail_clearly():
    small, big = HouseholdEnv(rooms=(1, 1), families=("pick",)), HouseholdEnv(rooms=(4, 5), receptacles=(3, 4))
    small_turns, big_turns = [], []
    for seed in range(40):
        for env, turns in ((small, small_turns), (big, big_turns)):
            env.reset(seed=seed)
            turns.append(len(env.task.layout.rooms))
            if env is small:
                assert env.task.goal.family == "pick"
    assert set(small_turns) == {1} and set(big_turns) <= {4, 5}
    with pytest.raises(ValueError, match="rooms"):
        HouseholdEnv(rooms=(0, 2))
    with pytest.raises(ValueError, match="rooms"):
        HouseholdEnv(rooms=(2, 9))
    with pytest.raises(ValueError, match="families"):
        HouseholdEnv(families=("swim",))
    with pytest.raises(ValueError, match="families"):
        HouseholdEnv(families="pick")
    with pytest.raises(ValueError, match="max_expert_steps"):
        HouseholdEnv(max_expert_steps=40, max_turns=30)
    with pytest.raises(ValueError, match="min_expert_steps"):
        HouseholdEnv(min_expert_steps=12, max_expert_steps=10)
    assert HouseholdEnv(max_turns=3).config.max_expert_steps == 30  # a short smoke run: truncated episodes
    with pytest.raises(ValueError, match="admissible_hints"):
        HouseholdEnv(admissible_hints="yes")
    assert set(FAMILIES) == {"pick", "clean", "heat", "cool", "look", "pick_two"}


@pytest.mark.slow
def test_players_random_is_uniform_over_admissible_and_weak_is_in_range():
    env = HouseholdEnv()
    env.reset(seed=3)
    commands = env.admissible_commands()
    rng = np.random.default_rng(0)
    drawn = [env.random_action(rng) for _ in range(50 * len(commands))]
    assert set(drawn) == set(commands)
    counts = np.array([drawn.count(c) for c in commands])
    assert counts.min() > 20 and counts.max() < 85
    successes = []
    for seed in range(80):
        env.reset(seed=seed, options={"split": "test"})
        rng = np.random.default_rng(10_000 + seed)
        while True:
            *_, terminated, truncated, info = env.step(env.weak_expert_action(rng))
            if terminated or truncated:
                break
        successes.append(info["success"])
    assert 0.2 <= np.mean(successes) <= 0.6


@pytest.mark.slow
def test_registered_env_passes_the_checker():
    env = gymnasium.make("turnrl/Household-v0", disable_env_checker=True)
    assert isinstance(env.unwrapped, HouseholdEnv) and env.unwrapped.max_turns == 50
    report = check("turnrl/Household-v0", seeds=20)
    assert report.ok, report.format()


def test_hydra_group_file_builds_the_env():
    from hydra import compose, initialize_config_module

    from turnrl.train.factories import env_factory
    from turnrl.conf.schema import register_configs

    register_configs()
    with initialize_config_module(config_module="turnrl.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["env=household"])
    env = env_factory(cfg)()
    assert isinstance(env.unwrapped, HouseholdEnv) and env.unwrapped.config.rooms == (2, 3)
    assert env.unwrapped.max_turns == 50 and env.unwrapped.admissible_hints
    _, info = env.reset(seed=0)
    assert info["task_id"]
