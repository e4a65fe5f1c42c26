"""``env._target_``: a user env class, not registered with gymnasium, built from a dotted path.

The env classes live in a module this file writes to a temporary folder (outside the
package), put on ``sys.path`` here and on ``PYTHONPATH`` for the training subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import gymnasium
import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from turnrl.train.factories import env_factory
from turnrl.conf.schema import Config, register_configs
from turnrl.envs import check

register_configs()

MODULE = "turnrl_test_user_envs"
SOURCE = textwrap.dedent('''
    """User envs for the env._target_ tests."""
    import zlib

    import gymnasium

    from turnrl.envs.base import MultiTurnEnv, TurnOutcome

    WORDS = ("apple", "river", "stone", "cloud", "tiger", "maple", "ocean", "piano")


    class EchoEnv(MultiTurnEnv):
        """Say the word back; a wrong word gets a reminder. Test split: crc32(word) % 4 == 0."""

        default_max_turns = 2

        def __init__(self, size=len(WORDS), *, max_turns=None, tool_parser="hermes"):
            if not 1 <= size <= len(WORDS):
                raise ValueError(f"size must be in [1, {len(WORDS)}], got {size!r}")
            self.size = size
            super().__init__(tool_parser=tool_parser, max_turns=max_turns)

        def _new_task(self, rng, split):
            words = [w for w in WORDS[: self.size] if (zlib.crc32(w.encode()) % 4 == 0) == (split == "test")]
            return words[int(rng.integers(len(words)))]

        def _task_id(self, task):
            return f"echo-{task}"

        def _start_episode(self, task):
            return [{"role": "user", "content": f"Say {task}."}]

        def _on_turn(self, action, parse, tool_results):
            if action.strip() == self.task:
                return TurnOutcome(reward=1.0, terminated=True, success=True)
            return TurnOutcome(messages=({"role": "user", "content": f"No. Say {self.task}."},))

        def _state_key(self):
            return self.task

        def expert_action(self):
            return self.task

        def random_action(self, rng):
            return str(rng.choice(WORDS[: self.size]))


    class PlainEnv(gymnasium.Env):
        """A gymnasium env whose constructor takes no tool_parser."""

        def __init__(self, level=1):
            self.level = level


    class NotAnEnv:
        pass
''')


@pytest.fixture(scope="module")
def user_module(tmp_path_factory):
    folder = tmp_path_factory.mktemp("user_envs")
    (folder / f"{MODULE}.py").write_text(SOURCE)
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))
    sys.modules.pop(MODULE, None)


def config(target, **kwargs) -> Config:
    cfg = Config()
    cfg.env._target_, cfg.env.kwargs = target, kwargs
    return cfg


def test_target_builds_the_class_with_kwargs_and_the_agents_parser(user_module):
    cfg = config(f"{MODULE}.EchoEnv", size=4)
    cfg.agent.tool_parser = "json_fenced"
    make = env_factory(cfg)
    env = make()
    assert type(env).__name__ == "EchoEnv" and env.size == 4 and env.tool_parser == "json_fenced"
    assert f"{MODULE}" not in str(list(gymnasium.registry))  # built without registration
    assert make() is not env
    obs, info = env.reset(seed=0)
    _, reward, terminated, _, info = env.step(env.expert_action())
    assert reward == 1.0 and terminated and info["success"]
    assert check(env, seeds=3).ok


def test_tool_parser_is_passed_only_to_classes_that_take_it(user_module):
    env = env_factory(config(f"{MODULE}.PlainEnv", level=3))()
    assert env.level == 3  # PlainEnv(tool_parser=...) would have raised TypeError


@pytest.mark.parametrize("target, message", [
    ("no_such_module_xyz.Env", "cannot import module 'no_such_module_xyz' (ModuleNotFoundError"),
    (f"{MODULE}.Missing", f"module '{MODULE}' has no attribute 'Missing'"),
    (f"{MODULE}.NotAnEnv", "not a gymnasium.Env subclass"),
    (f"{MODULE}.WORDS", "not a gymnasium.Env subclass"),
    ("EchoEnv", "must be a dotted path package.module.ClassName"),
])
def test_bad_targets_fail_naming_the_path(user_module, target, message):
    with pytest.raises(ValueError) as err:
        env_factory(config(target))
    assert message in str(err.value) and repr(target) in str(err.value)


def test_the_envs_own_message_on_bad_kwargs_and_url_excludes_target(user_module):
    with pytest.raises(ValueError, match=r"size must be in \[1, 8\], got 99"):
        env_factory(config(f"{MODULE}.EchoEnv", size=99))
    cfg = config(f"{MODULE}.EchoEnv")
    cfg.env.url = "http://127.0.0.1:1"
    with pytest.raises(ValueError, match="are both set; set one"):
        env_factory(cfg)


def test_target_with_a_registered_id_is_refused_so_the_saved_config_cannot_lie(user_module):
    with initialize_config_module(config_module="turnrl.conf", version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name="config", overrides=[f"env._target_={MODULE}.EchoEnv"]))
    assert cfg.env.id == "turnrl/GuessNumber-v0"  # env=guess_number, the default group, set it
    with pytest.raises(ValueError, match=r"env\._target_='turnrl_test_user_envs\.EchoEnv' and "
                                         r"env\.id='turnrl/GuessNumber-v0' are both set; .*env=custom"):
        env_factory(cfg)


def test_hydra_env_custom_composes_and_requires_a_target(user_module):
    with initialize_config_module(config_module="turnrl.conf", version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name="config", overrides=[
            "env=custom", f"env._target_={MODULE}.EchoEnv", "+env.kwargs.size=3"]))
        assert cfg.env._target_ == f"{MODULE}.EchoEnv" and cfg.env.kwargs == {"size": 3} and cfg.env.id is None
        assert env_factory(cfg)().size == 3
        bare = OmegaConf.to_object(compose(config_name="config", overrides=["env=custom"]))
    with pytest.raises(ValueError, match=r"env\._target_='<set env\._target_=package\.module\.ClassName>'"):
        env_factory(bare)


@pytest.mark.slow
@pytest.mark.e2e
def test_train_runs_a_target_env_from_pythonpath(user_module, tmp_path):
    pythonpath = os.pathsep.join([str(user_module), os.environ.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "-m", "turnrl.train", "env=custom", f"env._target_={MODULE}.EchoEnv", "+env.kwargs.size=8",
         "trainer.steps=2", "trainer.tasks_per_step=2", "trainer.group_size=2", "trainer.eval_episodes=4",
         "trainer.eval_every=1", "trainer.threads=1", "trainer.progress=false", "trainer.tensorboard=false",
         "trainer.save_checkpoint=false", "agent.warmstart.steps=0", "agent.tokenizer.corpus_episodes=10",
         "agent.max_new_tokens=4", f"hydra.run.dir={tmp_path}"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": pythonpath})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert (tmp_path / "metrics.jsonl").read_text().count('"kind": "train"') == 2
    saved = OmegaConf.load(tmp_path / ".hydra" / "config.yaml").env  # names the env that ran, not a default id
    assert saved._target_ == f"{MODULE}.EchoEnv" and saved.id is None and saved.kwargs == {"size": 8}
    assert "held-out success: before " in (tmp_path / "summary.txt").read_text()
