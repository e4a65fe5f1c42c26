"""Mixture-v0: seed routing by weight, namespaced info, delegation of steps / splits / players,
the union of tools, errors, the checker, and per-row routing through the RolloutCollector."""

import asyncio
import math

import gymnasium
import numpy as np
import pytest

import turnrl.envs  # noqa: F401  (registers the ids)
from turnrl.policies.sampling import SamplingParams
from turnrl.policies.hf.policy import TransformersPolicy
from turnrl.rollout.scripted import scripted_episode
from turnrl.envs import CalcMathEnv, GuessNumberEnv
from turnrl.envs.tasks.calc_math import system_prompt
from turnrl.envs.check import check
from turnrl.envs.games.guess_number import SYSTEM_PROMPT, is_held_out
from turnrl.envs.mixture import MixtureEnv
from turnrl.rollout import RolloutCollector, Task
from turnrl.tools import tool

GUESS, CALC = "turnrl/GuessNumber-v0", "turnrl/CalcMath-v0"
CLASH_ID = "turnrl_test/ClashingCalculator-v0"


def calculator(a: int, b: int) -> str:
    """Add two numbers (a calculator with another signature than turnrl's).

    Args:
        a: First addend.
        b: Second addend.
    """
    return str(a + b)


class ClashingCalculatorEnv(GuessNumberEnv):
    """GuessNumber that declares a ``calculator`` tool whose schema differs from CalcMath's."""

    tools = (tool(calculator),)


if CLASH_ID not in gymnasium.registry:
    gymnasium.register(CLASH_ID, entry_point=ClashingCalculatorEnv)


def sub_env_of(info) -> str:
    return info["env_id"]


# ------------------------------------------------------------------ routing
def test_same_seed_same_sub_env_and_task_and_both_envs_are_used():
    a, b = MixtureEnv(), MixtureEnv()
    names = []
    for seed in range(40):
        obs_a, info_a = a.reset(seed=seed)
        obs_b, info_b = b.reset(seed=seed)
        assert obs_a == obs_b and info_a == info_b
        names.append(sub_env_of(info_a))
        assert a.route(seed) == b.route(seed)
    assert set(names) == {GUESS, CALC}


def test_weights_set_the_share_of_each_sub_env():
    env = MixtureEnv([{"id": GUESS, "weight": 3.0}, {"id": CALC, "weight": 1}])
    picks = [env.route(seed)[0] for seed in range(2000)]
    assert 0.70 < picks.count(0) / len(picks) < 0.80
    assert np.allclose(env.probabilities, [0.75, 0.25])


def test_reset_and_step_delegate_to_the_sub_env_with_namespaced_info():
    env = MixtureEnv()
    for seed in range(10):
        obs, info = env.reset(seed=seed)
        index, sub_seed = env.route(seed)
        own = (GuessNumberEnv() if index == 0 else CalcMathEnv())
        own_obs, own_info = own.reset(seed=sub_seed)
        name = env.names[index]
        assert obs == own_obs and env.current_name == name
        assert info["task_id"] == f"{name}:{own_info['task_id']}"
        assert info["state_key"] == (name, own_info["state_key"]) and info["env_id"] == name
        assert env.max_turns == own.max_turns
        action = own.expert_action()
        assert env.expert_action() == action
        got, want = env.step(action), own.step(action)
        assert got[:4] == want[:4]
        assert got[4]["task_id"] == f"{name}:{want[4]['task_id']}"
        assert got[4]["state_key"] == (name, want[4]["state_key"]) and got[4]["env_id"] == name
        assert {k: v for k, v in got[4].items() if k not in ("task_id", "state_key", "env_id")} == {
            k: v for k, v in want[4].items() if k not in ("task_id", "state_key")}


def test_async_reset_and_step_match_the_sync_ones():
    sync, other = MixtureEnv(), MixtureEnv()

    async def play():
        return await other.areset(seed=3), await other.astep("Answer: 1")

    (obs, info), stepped = asyncio.run(play())
    assert (obs, info) == sync.reset(seed=3) and stepped == sync.step("Answer: 1")


def test_forced_sub_env_and_unseeded_reset():
    env = MixtureEnv()
    for seed in range(5):
        _, info = env.reset(seed=seed, options={"env": CALC})
        assert info["env_id"] == CALC
        sub_seed = env.route(seed)[1]
        assert info["task_id"] == f"{CALC}:{CalcMathEnv().reset(seed=sub_seed)[1]['task_id']}"
    with pytest.raises(ValueError, match="options\\['env'\\]"):
        env.reset(seed=0, options={"env": "turnrl/Nope-v0"})
    _, info = env.reset()
    assert info["env_id"] in env.names


def test_splits_delegate_to_the_sub_env():
    env = MixtureEnv([{"id": GUESS, "kwargs": {"n": 32, "n_min": 16}}, {"id": CALC}])
    assert env.splits == ("train", "test")
    seen = set()
    for seed in range(60):
        for split in ("train", "test"):
            _, info = env.reset(seed=seed, options={"split": split})
            assert info["split"] == split
            seen.add(info["env_id"])
            task = env.task
            held_out = is_held_out(*task) if info["env_id"] == GUESS else task.split == "test"
            assert held_out == (split == "test")
    assert seen == {GUESS, CALC}


def test_max_turns_is_the_current_sub_envs():
    env = MixtureEnv([{"id": GUESS, "kwargs": {"max_turns": 9}}, {"id": CALC, "kwargs": {"num_ops": 1}}])
    assert env.max_turns == 9  # before any reset: the largest
    turns = {}
    for seed in range(20):
        _, info = env.reset(seed=seed)
        turns[info["env_id"]] = env.max_turns
    assert turns == {GUESS: 9, CALC: 4}


def test_players_delegate_and_the_expert_solves_both_splits():
    env = MixtureEnv()
    for split in ("train", "test"):
        for seed in range(60):
            env.reset(seed=seed, options={"split": split})
            while True:
                *_, terminated, truncated, info = env.step(env.expert_action())
                if terminated or truncated:
                    break
            assert info["success"]
    env.reset(seed=1)
    sub = env.current.unwrapped
    assert env.random_action(np.random.default_rng(7)) == sub.random_action(np.random.default_rng(7))
    assert env.weak_expert_action(np.random.default_rng(7)) == sub.weak_expert_action(np.random.default_rng(7))


def test_step_before_reset_and_after_the_end_raise():
    env = MixtureEnv()
    assert env.done and env.task is None
    with pytest.raises(RuntimeError, match="reset"):
        env.step("1")
    with pytest.raises(RuntimeError, match="reset"):
        env.expert_action()
    env.reset(seed=0, options={"env": CALC})
    assert not env.done
    env.step("Answer: 1")
    assert env.done
    with pytest.raises(RuntimeError, match="ended"):
        env.step("Answer: 1")


# -------------------------------------------------------------------- tools
def test_tools_are_the_union_and_a_clash_is_refused():
    assert [t.name for t in MixtureEnv().tools] == ["calculator"]
    twice = MixtureEnv([{"id": CALC, "name": "calc_a"}, {"id": CALC, "name": "calc_b", "kwargs": {"num_ops": 1}}])
    assert len(twice.tools) == 1
    with pytest.raises(ValueError, match="tool 'calculator'.*different schema"):
        MixtureEnv([{"id": CALC}, {"id": CLASH_ID}])


def test_info_tools_are_the_episodes_sub_env_tools():
    env = MixtureEnv()
    calc_schemas = [t.schema() for t in CalcMathEnv().tools]
    seen = set()
    for seed in range(12):
        _, info = env.reset(seed=seed)
        seen.add(info["env_id"])
        assert info["tools"] == ([] if info["env_id"] == GUESS else calc_schemas)
    assert seen == {GUESS, CALC}


def test_tool_parser_and_max_turns_reach_every_sub_env_unless_its_kwargs_say_otherwise():
    env = MixtureEnv([{"id": GUESS}, {"id": CALC, "kwargs": {"tool_parser": "hermes", "max_turns": 7}}],
                     tool_parser="json_fenced", max_turns=3)
    assert [e.unwrapped.tool_parser for e in env.envs] == ["json_fenced", "hermes"]
    assert [e.unwrapped.max_turns for e in env.envs] == [3, 7]


# ------------------------------------------------------------------- errors
@pytest.mark.parametrize("envs, match", [
    ([], "empty"),
    ("turnrl/GuessNumber-v0", "list"),
    ([GUESS], "envs\\[0\\] must be a dict"),
    ([{"id": "turnrl/Nope-v0"}], "not a registered env id"),
    ([{"kwargs": {}}], "not a registered env id"),
    ([{"id": GUESS, "weight": 0}], "weight"),
    ([{"id": GUESS, "weight": -1.0}], "weight"),
    ([{"id": GUESS, "weight": math.nan}], "weight"),
    ([{"id": GUESS, "weight": "1"}], "weight"),
    ([{"id": GUESS, "weight": True}], "weight"),
    ([{"id": GUESS, "wieght": 1}], "unknown keys \\['wieght'\\]"),
    ([{"id": GUESS, "kwargs": [1]}], "kwargs"),
    ([{"id": GUESS}, {"id": GUESS}], "distinct 'name'"),
    ([{"id": GUESS, "name": "a:b"}], "name"),
    ([{"id": "turnrl/Mixture-v0"}], "nesting"),
])
def test_bad_entries_fail_with_a_clear_message(envs, match):
    with pytest.raises(ValueError, match=match):
        MixtureEnv(envs)


def test_sub_env_kwargs_errors_surface():
    with pytest.raises(ValueError, match="num_ops"):
        MixtureEnv([{"id": CALC, "kwargs": {"num_ops": 7}}])


def test_registered_mixture_passes_the_checker():
    env = gymnasium.make("turnrl/Mixture-v0", disable_env_checker=True)
    assert isinstance(env.unwrapped, MixtureEnv)
    report = check("turnrl/Mixture-v0", seeds=20)
    assert report.ok, report.format()


# ------------------------------------------------------------------ rollout
def test_scripted_episode_through_the_mixture(renderer):
    env = MixtureEnv()
    for seed in range(6):
        trajectory = scripted_episode(env, seed, renderer)
        name = env.names[env.route(seed)[0]]
        assert trajectory.success and trajectory.task_id.startswith(f"{name}:")
        assert all(key[0] == name for key in trajectory.state_keys)


@pytest.mark.slow
def test_collector_routes_every_row_to_its_own_sub_env(policy_model, tokenizer, renderer):
    probe = MixtureEnv()
    seeds = [s for s in range(40) if probe.route(s)[0] == 0][:2] + [s for s in range(40) if probe.route(s)[0] == 1][:2]
    tasks = [Task(seeds[0]), Task(seeds[2]), Task(seeds[1], "test"), Task(seeds[3], "test")]
    collector = RolloutCollector(MixtureEnv, TransformersPolicy(policy_model, tokenizer, seed=0), renderer)
    trajectories = collector.collect(tasks, group_size=2, params=SamplingParams(max_new_tokens=8, temperature=1.0))
    assert len(trajectories) == 8
    prompts = {GUESS: SYSTEM_PROMPT, CALC: system_prompt()}
    for row, t in enumerate(trajectories):
        task = tasks[row // 2]
        _, info = probe.reset(seed=task.seed, options={"split": task.split})
        name = info["env_id"]
        assert t.group_id == row // 2 and t.task_id == info["task_id"] and t.task_id.startswith(f"{name}:")
        assert t.messages[0] == {"role": "system", "content": prompts[name]}
        assert t.state_keys[0] == info["state_key"] and all(k[0] == name for k in t.state_keys)
        assert t.error is None and t.termination in ("terminated", "truncated", "context_length")
    assert [t.task_id.split(":")[0] for t in trajectories] == [GUESS, GUESS, CALC, CALC] * 2
    assert [t.env_id for t in trajectories] == [GUESS, GUESS, CALC, CALC] * 2
    from turnrl.rollout.metrics import rollout_metrics

    metrics = rollout_metrics(trajectories)  # each sub-env's own figures
    assert metrics[f"episodes@{GUESS}"] == 4 and metrics[f"episodes@{CALC}"] == 4
    assert metrics[f"success@{GUESS}"] == sum(t.success for t in trajectories if t.env_id == GUESS) / 4


def test_hydra_group_file_builds_the_env():
    from hydra import compose, initialize_config_module

    from turnrl.train.factories import env_factory
    from turnrl.conf.schema import register_configs

    register_configs()
    with initialize_config_module(config_module="turnrl.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["env=mixture"])
    env = env_factory(cfg)()
    assert isinstance(env.unwrapped, MixtureEnv) and env.unwrapped.names == (GUESS, CALC)
    assert env.unwrapped.envs[0].unwrapped.n_min == 16
    _, info = env.reset(seed=0)
    assert info["task_id"]
