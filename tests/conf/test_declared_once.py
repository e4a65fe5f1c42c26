"""Each setting is declared once: the learner's and critic's settings live in
``turnrl.algorithms.config`` and the Hydra schema inherits them; the config-group YAMLs state
only what differs from the schema's defaults."""

import copy
import dataclasses
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_module
from omegaconf import DictConfig, ListConfig, OmegaConf

import turnrl.algorithms
import turnrl.conf
from turnrl.algorithms.config import LossConfig, OptimConfig
from turnrl.conf.schema import AlgorithmConfig, Config, TrainerConfig, register_configs

register_configs()

CONF = Path(turnrl.conf.__file__).parent
SETTINGS = (LossConfig, OptimConfig)
# fields that share a name with a learner setting but are not that setting, so are declared apart:
# the other stages' own optimizer settings (warm start, DPO, reward model), and StepCoefs, the
# per-step values that schedules and the KL controller move (the configs hold the first step's)
DISTINCT = {
    "lr": {"WarmStartConfig", "DPOStageConfig", "RewardModelStageConfig", "DPOConfig", "RewardModelConfig"},
    "max_grad_norm": {"DPOConfig", "RewardModelConfig"},
    "entropy_coef": {"StepCoefs"},
    "kl_coef": {"StepCoefs"},
}


def _own_fields(cls) -> set[str]:
    """Field names ``cls`` declares itself (not inherited)."""
    return set(inspect.get_annotations(cls)) & {f.name for f in dataclasses.fields(cls)}


def _dataclasses_in(package) -> list[type]:
    found = []
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        found += [c for _, c in inspect.getmembers(module, dataclasses.is_dataclass)
                  if isinstance(c, type) and c.__module__ == module.__name__]
    return found


def test_no_learner_or_critic_setting_is_declared_by_another_dataclass():
    classes = _dataclasses_in(turnrl.algorithms) + _dataclasses_in(turnrl.conf)
    assert AlgorithmConfig in classes and TrainerConfig in classes  # the scan sees the schema
    twice = []
    for setting_cls in SETTINGS:
        for cls in classes:
            if cls is setting_cls:
                continue
            for name in _own_fields(cls) & _own_fields(setting_cls):
                if cls.__name__ not in DISTINCT.get(name, ()):
                    twice.append(f"{cls.__module__}.{cls.__name__}.{name} (declared in {setting_cls.__name__})")
    assert twice == [], f"settings declared twice: {twice}"


def test_the_scan_would_catch_a_redeclared_setting():
    @dataclasses.dataclass
    class LearnerConfig:  # the old design: the learner re-declared what the schema declares
        lr: float = 3e-4
        clip_low: float = 0.2

    assert _own_fields(LearnerConfig) & _own_fields(OptimConfig) == {"lr"}
    assert _own_fields(LearnerConfig) & _own_fields(LossConfig) == {"clip_low"}
    assert _own_fields(AlgorithmConfig) & _own_fields(LossConfig) == set()  # inherited, not declared


def test_the_schema_inherits_the_learner_settings():
    assert issubclass(AlgorithmConfig, LossConfig) and issubclass(TrainerConfig, OptimConfig)
    defaults = OmegaConf.structured(Config)
    for name in (f.name for f in dataclasses.fields(LossConfig)):
        assert name in defaults.algorithm
    for name in (f.name for f in dataclasses.fields(OptimConfig)):
        assert name in defaults.trainer


def _compose(overrides):
    with initialize_config_module(config_module="turnrl.conf", version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="config", overrides=overrides))


OVERRIDES = [  # one override per learner/critic setting: each reaches the dataclass the learner gets
    ("algorithm", "clip_low", "0.1", 0.1), ("algorithm", "clip_high", "0.3", 0.3),
    ("algorithm", "ppo_epochs", "2", 2), ("algorithm", "num_minibatches", "3", 3),
    ("algorithm", "kl_coef", "0.05", 0.05), ("algorithm", "kl_estimator", "k1", "k1"),
    ("algorithm", "kl_placement", "reward", "reward"), ("algorithm", "dual_clip", "3.0", 3.0),
    ("algorithm", "log_ratio_clip", "10.0", 10.0), ("algorithm", "tis", "token", "token"),
    ("algorithm", "tis_cap", "5.0", 5.0), ("algorithm", "entropy_coef", "0.01", 0.01),
    ("algorithm", "loss_agg", "seq-mean-token-sum", "seq-mean-token-sum"), ("algorithm", "vf_coef", "0.25", 0.25),
    ("algorithm", "value_clip", "null", None), ("algorithm", "critic_lr", "0.01", 0.01),
    ("algorithm", "critic_epochs", "4", 4),
    ("trainer", "lr", "1e-3", 1e-3), ("trainer", "weight_decay", "0.05", 0.05),
    ("trainer", "max_grad_norm", "0.5", 0.5), ("trainer", "micro_batch_size", "8", 8),
    ("trainer", "mixed_precision", "bf16", "bf16"), ("trainer", "gradient_checkpointing", "true", True),
    ("trainer", "lora_rank", "8", 8), ("trainer", "lora_alpha", "32", 32.0),
    ("trainer", "lora_target_modules", "[q_proj,v_proj]", ["q_proj", "v_proj"]),
]


def test_the_override_table_covers_every_setting():
    covered = {(group, name) for group, name, _, _ in OVERRIDES}
    expected = {("algorithm", f.name) for f in dataclasses.fields(LossConfig)}
    expected |= {("trainer", f.name) for f in dataclasses.fields(OptimConfig)}
    assert covered == expected


def test_every_setting_is_a_hydra_key():
    cfg = _compose([f"{group}.{name}={text}" for group, name, text, _ in OVERRIDES])
    for group, name, _, value in OVERRIDES:
        assert getattr(getattr(cfg, group), name) == value, f"{group}.{name}"
    assert isinstance(cfg.algorithm, LossConfig) and isinstance(cfg.trainer, OptimConfig)


def test_new_hydra_keys_reach_the_learner_and_the_critic(tiny_model, tokenizer, renderer):
    from turnrl.algorithms import Learner
    from turnrl.algorithms.critic import Critic, CriticLearner

    cfg = _compose(["trainer.weight_decay=0.05", "trainer.lr=2e-3", "algorithm.critic_lr=0.02",
                    "algorithm.critic_epochs=3"])
    learner = Learner(copy.deepcopy(tiny_model), cfg.algorithm, cfg.trainer)
    assert [(g["lr"], g["weight_decay"]) for g in learner.optimizer.param_groups] == [(2e-3, 0.05)]
    critic = CriticLearner(Critic.from_policy(tiny_model), cfg.algorithm, cfg.trainer)
    assert [(g["lr"], g["weight_decay"]) for g in critic.optimizer.param_groups] == [(0.02, 0.05)]
    batch = _scripted_batch(tokenizer, renderer)
    critic.update(batch, batch.rewards[:, None] * batch.loss_mask, critic.values(batch))
    steps = {int(state["step"]) for state in critic.optimizer.state.values()}
    assert steps == {3}  # one optimizer step per critic epoch


def test_lora_keys_reach_the_adapters(tiny_model):
    pytest.importorskip("peft", reason="LoRA needs peft (the optional 'lora' extra: pip install 'turnrl[lora]')")
    from turnrl.algorithms import Learner

    cfg = _compose(["trainer.lora_rank=4", "trainer.lora_alpha=12", "trainer.lora_target_modules=[q_proj,down_proj]"])
    model = copy.deepcopy(tiny_model)
    Learner(model, cfg.algorithm, cfg.trainer)
    adapted = {name.rsplit(".", 1)[-1]: module for name, module in model.named_modules() if hasattr(module, "lora_A")}
    assert set(adapted) == {"q_proj", "down_proj"}
    assert all(module.scaling["default"] == pytest.approx(12 / 4) for module in adapted.values())


def _scripted_batch(tokenizer, renderer):
    """4 scripted GuessNumber episodes (an expert and 3 weak players: mixed returns)."""
    import numpy as np

    from turnrl.agents.scripted import scripted_episode
    from turnrl.algorithms import collate
    from turnrl.envs import GuessNumberEnv

    env = GuessNumberEnv(n=32, max_turns=6)
    trajectories = [scripted_episode(env, 0, renderer, player, rng=np.random.default_rng(k))
                    for k, player in enumerate(("expert", "weak", "weak", "weak"))]
    return collate(trajectories, tokenizer.pad_token_id)


# ---------------------------------------------------------------- the YAMLs state only what differs

GROUPS = ("algorithm", "agent", "env", "trainer", "experiment")
GROUP_YAMLS = sorted(p for group in GROUPS for p in (CONF / group).glob("*.yaml"))


def restated_defaults(path: Path) -> list[str]:
    """Dotted keys of a config-group YAML whose value equals the schema's default."""
    text = path.read_text()
    data = yaml.safe_load(text) or {}
    data.pop("defaults", None)
    schema = OmegaConf.structured(Config)
    prefix = "" if "@package _global_" in text else f"{path.parent.name}."
    root = schema if not prefix else OmegaConf.select(schema, prefix[:-1])
    merged = OmegaConf.merge(root, data)  # the YAML's values, converted to the schema's types
    found = []

    def walk(node: dict, default: DictConfig, value: DictConfig, key: str) -> None:
        for name, child in node.items():
            dotted = f"{key}{name}"
            default_child, value_child = default[name], value[name]
            structured = isinstance(default_child, DictConfig) and dataclasses.is_dataclass(
                OmegaConf.get_type(default_child))
            if structured and isinstance(child, dict):
                walk(child, default_child, value_child, f"{dotted}.")
            elif isinstance(default_child, (DictConfig, ListConfig)):
                if OmegaConf.to_container(value_child) == OmegaConf.to_container(default_child):
                    found.append(dotted)
            elif value_child == default_child:
                found.append(dotted)

    walk(data, root, merged, prefix)
    return found


@pytest.mark.parametrize("path", GROUP_YAMLS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_group_yamls_restate_no_schema_default(path):
    restated = restated_defaults(path)
    assert restated == [], f"{path.relative_to(CONF)} restates schema defaults {restated}: remove those keys"


def test_the_yaml_check_catches_a_restated_default(tmp_path):
    (tmp_path / "algorithm").mkdir()
    path = tmp_path / "algorithm" / "mine.yaml"
    path.write_text("clip_low: 0.2\nclip_high: 0.28\nadvantage_kwargs: {}\n")
    assert restated_defaults(path) == ["algorithm.clip_low", "algorithm.advantage_kwargs"]
    (tmp_path / "env").mkdir()
    glob = tmp_path / "env" / "g.yaml"
    glob.write_text("# @package _global_\ntrainer:\n  lr: 3e-4\n  weight_decay: 0.1\nagent:\n  warmstart:\n"
                    "    player: weak\n")
    assert restated_defaults(glob) == ["trainer.lr", "agent.warmstart.player"]
