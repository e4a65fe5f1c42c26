"""Each setting is declared once: the settings a component reads are declared beside it (the
learner's and critic's in ``turnrl.algorithms.config``, the DPO and reward-model trainers' in
their modules, the tiny model's and the vLLM engine's in ``turnrl.models`` and ``turnrl.policies``) and the Hydra
schema inherits them; the config-group YAMLs state only what differs from the schema's
defaults."""

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

import turnrl
import turnrl.conf
from turnrl.models.causal_lm import TinyModelConfig
from turnrl.policies.vllm_engine import VLLMEngineConfig
from turnrl.algorithms.config import LossConfig, OptimConfig
from turnrl.algorithms.pre_rl.dpo import DPOConfig
from turnrl.algorithms.pre_rl.reward_model import RewardModelConfig
from turnrl.conf.schema import (AlgorithmConfig, Config, DPOStageConfig, ModelConfig, RewardModelStageConfig,
                                TrainerConfig, VLLMConfig, register_configs)

register_configs()

CONF = Path(turnrl.conf.__file__).parent
# (declaring class, the schema class that inherits it, where it is in the composed config)
DECLARED = [
    (LossConfig, AlgorithmConfig, "algorithm"),
    (OptimConfig, TrainerConfig, "trainer"),
    (DPOConfig, DPOStageConfig, "dpo"),
    (RewardModelConfig, RewardModelStageConfig, "reward_model"),
    (TinyModelConfig, ModelConfig, "agent.model"),
    (VLLMEngineConfig, VLLMConfig, "agent.vllm"),
]
SETTINGS = tuple(declaring for declaring, _, _ in DECLARED)
# names that several classes declare as settings (or state) of their own, each under its own key,
# so are declared apart: the classes that may each declare one. lr / max_grad_norm / batch_size:
# the RL updates' (trainer.), the warm start's (agent.warmstart.), DPO's (dpo.) and the reward
# model's (reward_model.); entropy_coef / kl_coef: StepCoefs, the per-step values that schedules and
# the KL controller move (the configs hold the first step's), and the checkpointed KL controller
# state; dtype: the checkpoint's (agent.dtype), the engine's (agent.vllm.dtype), a saved state's
DISTINCT = {
    "lr": {"OptimConfig", "WarmStartConfig", "DPOConfig", "RewardModelConfig"},
    "max_grad_norm": {"OptimConfig", "DPOConfig", "RewardModelConfig"},
    "batch_size": {"WarmStartConfig", "DPOConfig", "RewardModelConfig"},
    "entropy_coef": {"LossConfig", "StepCoefs"},
    "kl_coef": {"LossConfig", "StepCoefs", "TrainingState"},
    "dtype": {"VLLMEngineConfig", "AgentConfig", "TrainingState"},
}


def _own_fields(cls) -> set[str]:
    """Field names ``cls`` declares itself (not inherited)."""
    return set(inspect.get_annotations(cls)) & {f.name for f in dataclasses.fields(cls)}


def _dataclasses_in(package) -> list[type]:
    """Every dataclass defined in ``package`` and its subpackages (``__main__`` modules are not
    imported: they run the CLI)."""
    found = []
    for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        module = importlib.import_module(info.name)
        found += [c for _, c in inspect.getmembers(module, dataclasses.is_dataclass)
                  if isinstance(c, type) and c.__module__ == module.__name__]
    return found


def redeclared(classes, settings=SETTINGS) -> list[str]:
    """``module.Class.field (declared in Setting)`` for every field of a class in ``classes``
    that a class in ``settings`` declares too, unless DISTINCT lets both declare that name."""
    twice = []
    for setting_cls in settings:
        for cls in classes:
            if cls is setting_cls:
                continue
            for name in sorted(_own_fields(cls) & _own_fields(setting_cls)):
                if not {cls.__name__, setting_cls.__name__} <= DISTINCT.get(name, set()):
                    twice.append(f"{cls.__module__}.{cls.__name__}.{name} (declared in {setting_cls.__name__})")
    return twice


def test_no_setting_is_declared_by_another_dataclass():
    classes = _dataclasses_in(turnrl)  # the whole package: turnrl.models, .policies, .algorithms, .conf, ...
    for declaring, schema_cls, _ in DECLARED:  # the scan sees both ends of every pair
        assert declaring in classes and schema_cls in classes
    assert redeclared(classes) == [], "settings declared twice"


def test_the_scan_would_catch_a_redeclared_setting():
    @dataclasses.dataclass
    class LearnerConfig:  # the old design: the learner re-declared what the schema declares
        lr: float = 3e-4
        clip_low: float = 0.2

    @dataclasses.dataclass
    class DPOStageConfig:  # the old design: the schema re-declared the DPO trainer's settings
        steps: int = 0
        beta: float = 0.1
        lr: float = 1e-4

    @dataclasses.dataclass
    class VLLMConfig:  # ... and the vLLM engine's
        dtype: str = "float32"
        enforce_eager: bool = True

    @dataclasses.dataclass
    class ModelConfig:  # ... and the tiny model's
        hidden_size: int = 128

    found = redeclared([LearnerConfig, DPOStageConfig, VLLMConfig, ModelConfig])
    # (an lr of no known kind is reported against every class that declares an lr)
    assert {".".join(entry.split(" (")[0].rsplit(".", 2)[-2:]) for entry in found} == {
        "LearnerConfig.lr", "LearnerConfig.clip_low", "DPOStageConfig.beta", "DPOStageConfig.lr",
        "VLLMConfig.dtype", "VLLMConfig.enforce_eager", "ModelConfig.hidden_size"}
    assert set(found) >= {
        f"{__name__}.LearnerConfig.lr (declared in OptimConfig)",
        f"{__name__}.LearnerConfig.clip_low (declared in LossConfig)",
        f"{__name__}.DPOStageConfig.beta (declared in DPOConfig)",
        f"{__name__}.DPOStageConfig.lr (declared in DPOConfig)",
        f"{__name__}.VLLMConfig.dtype (declared in VLLMEngineConfig)",
        f"{__name__}.VLLMConfig.enforce_eager (declared in VLLMEngineConfig)",
        f"{__name__}.ModelConfig.hidden_size (declared in TinyModelConfig)",
    }
    for _, schema_cls, _ in DECLARED:  # inherited, not declared
        assert redeclared([schema_cls]) == []


@pytest.mark.parametrize("declaring,schema_cls,where", DECLARED, ids=lambda x: getattr(x, "__name__", x))
def test_the_schema_inherits_the_declared_settings(declaring, schema_cls, where):
    assert issubclass(schema_cls, declaring)
    assert OmegaConf.get_type(OmegaConf.select(OmegaConf.structured(Config), where)) is schema_cls
    defaults = OmegaConf.to_object(OmegaConf.structured(Config))
    node = defaults
    for part in where.split("."):
        node = getattr(node, part)
    for f in dataclasses.fields(declaring):  # every setting is a key under ``where``, with the same default
        assert getattr(node, f.name) == getattr(declaring(), f.name), f"{where}.{f.name}"


def _compose(overrides):
    with initialize_config_module(config_module="turnrl.conf", version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="config", overrides=overrides))


OVERRIDES = [  # one override per declared setting: each reaches the dataclass its component gets
    ("algorithm", "clip_low", "0.1", 0.1), ("algorithm", "clip_high", "0.3", 0.3),
    ("algorithm", "ppo_epochs", "2", 2), ("algorithm", "num_minibatches", "3", 3),
    ("algorithm", "kl_coef", "0.05", 0.05), ("algorithm", "kl_estimator", "k1", "k1"),
    ("algorithm", "kl_placement", "reward", "reward"), ("algorithm", "dual_clip", "3.0", 3.0),
    ("algorithm", "log_ratio_clip", "10.0", 10.0), ("algorithm", "tis", "token", "token"),
    ("algorithm", "tis_cap", "5.0", 5.0), ("algorithm", "tis_floor", "0.25", 0.25), ("algorithm", "tis_band", "0.05", 0.05),
    ("algorithm", "entropy_coef", "0.01", 0.01),
    ("algorithm", "loss_agg", "seq-mean-token-sum", "seq-mean-token-sum"), ("algorithm", "vf_coef", "0.25", 0.25),
    ("algorithm", "value_clip", "null", None), ("algorithm", "critic_lr", "0.01", 0.01),
    ("algorithm", "critic_epochs", "4", 4), ("algorithm", "policy_loss", "cispo", "cispo"),
    ("algorithm", "gspo_clip_low", "1e-4", 1e-4), ("algorithm", "gspo_clip_high", "2e-4", 2e-4),
    ("algorithm", "cispo_clip_low", "0.5", 0.5), ("algorithm", "cispo_clip_high", "2.0", 2.0),
    ("algorithm", "turn_ratio", "geometric", "geometric"),
    ("trainer", "lr", "1e-3", 1e-3), ("trainer", "weight_decay", "0.05", 0.05),
    ("trainer", "max_grad_norm", "0.5", 0.5), ("trainer", "skip_zero_grad", "false", False),
    ("trainer", "micro_batch_size", "8", 8), ("trainer", "micro_batch_tokens", "null", None),
    ("trainer", "mixed_precision", "bf16", "bf16"), ("trainer", "gradient_checkpointing", "true", True),
    ("trainer", "lora_rank", "8", 8), ("trainer", "lora_alpha", "32", 32.0),
    ("trainer", "lora_target_modules", "[q_proj,v_proj]", ["q_proj", "v_proj"]),
    ("dpo", "beta", "0.2", 0.2), ("dpo", "lr", "2e-4", 2e-4), ("dpo", "batch_size", "4", 4),
    ("dpo", "max_grad_norm", "0.5", 0.5),
    ("reward_model", "lr", "2e-3", 2e-3), ("reward_model", "batch_size", "8", 8),
    ("reward_model", "max_grad_norm", "0.25", 0.25),
    ("agent.model", "hidden_size", "64", 64), ("agent.model", "num_layers", "1", 1),
    ("agent.model", "num_heads", "2", 2), ("agent.model", "num_kv_heads", "1", 1),
    ("agent.model", "intermediate_size", "256", 256), ("agent.model", "max_positions", "512", 512),
    ("agent.vllm", "dtype", "bfloat16", "bfloat16"), ("agent.vllm", "max_model_len", "512", 512),
    ("agent.vllm", "gpu_memory_utilization", "0.5", 0.5),
    ("agent.vllm", "kv_cache_memory_bytes", "33554432", 33554432),
    ("agent.vllm", "enable_prefix_caching", "false", False), ("agent.vllm", "enforce_eager", "false", False),
    ("agent.vllm", "max_num_seqs", "16", 16), ("agent.vllm", "sleep_during_update", "true", True),
    # (a dict field's new keys need Hydra's +: the override is given whole)
    ("agent.vllm", "extra", "+agent.vllm.extra.enable_chunked_prefill=false", {"enable_chunked_prefill": False}),
]


def _override(where: str, name: str, text: str) -> str:
    return text if text.startswith("+") else f"{where}.{name}={text}"


def _node(cfg, where: str):
    for part in where.split("."):
        cfg = getattr(cfg, part)
    return cfg


def test_the_override_table_covers_every_setting():
    covered = {(where, name) for where, name, _, _ in OVERRIDES}
    expected = {(where, f.name) for declaring, _, where in DECLARED for f in dataclasses.fields(declaring)}
    assert covered == expected


def test_every_setting_is_a_hydra_key():
    cfg = _compose([_override(where, name, text) for where, name, text, _ in OVERRIDES])
    for where, name, _, value in OVERRIDES:
        assert getattr(_node(cfg, where), name) == value, f"{where}.{name}"
        assert getattr(_node(cfg, where), name) != getattr(_node(Config(), where), name), "not a default"
    for declaring, schema_cls, where in DECLARED:
        assert type(_node(cfg, where)) is schema_cls and isinstance(_node(cfg, where), declaring)


def test_new_hydra_keys_reach_the_learner_and_the_critic(tiny_model, tokenizer, renderer):
    from turnrl.algorithms import Learner
    from turnrl.algorithms.learner.critic import Critic, CriticLearner

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


def _largest_step(model, step) -> float:
    """The largest change of one weight of ``model`` in ``step()``."""
    before = [p.detach().clone() for p in model.parameters()]
    step()
    return max(float((p.detach() - b).abs().max()) for p, b in zip(model.parameters(), before))


def test_stage_keys_reach_the_dpo_and_reward_model_trainers(tiny_model, renderer):
    """``dpo.*`` / ``reward_model.*`` reach the trainers, max_grad_norm included (it had no key
    before): clipped to 1e-12 the gradients are far below AdamW's eps, so a step barely moves
    the weights (only AdamW's default weight decay, 0.01, moves a norm weight of 1 by lr / 100),
    where unclipped it moves the largest one by about lr."""
    from turnrl.algorithms.pre_rl.dpo import DPOTrainer, pairs_from_players
    from turnrl.algorithms.pre_rl.reward_model import RewardModel, RewardModelTrainer
    from turnrl.envs import GuessNumberEnv

    pairs = pairs_from_players(GuessNumberEnv(n=32, max_turns=6), renderer, 8)
    assert len(pairs) >= 2
    pad = renderer.tokenizer.pad_token_id
    for clip in (1.0, 1e-12):
        cfg = _compose(["dpo.lr=2e-3", "dpo.beta=0.5", f"dpo.max_grad_norm={clip}",
                        "reward_model.lr=3e-3", f"reward_model.max_grad_norm={clip}"])
        dpo = DPOTrainer(copy.deepcopy(tiny_model), cfg.dpo, pad)
        assert dpo.cfg is cfg.dpo and [g["lr"] for g in dpo.optimizer.param_groups] == [2e-3]
        moved = _largest_step(dpo.model, lambda: dpo.step(pairs))
        assert moved == pytest.approx(2e-3, rel=0.05) if clip == 1.0 else moved < 2e-3 * 0.05
        rm = RewardModelTrainer(RewardModel.from_policy(tiny_model, pad), cfg.reward_model)
        assert rm.cfg is cfg.reward_model and [g["lr"] for g in rm.optimizer.param_groups] == [3e-3]
        moved = _largest_step(rm.model, lambda: rm.step(pairs))
        assert moved == pytest.approx(3e-3, rel=0.05) if clip == 1.0 else moved < 3e-3 * 0.05


def test_agent_keys_reach_the_tiny_model_and_the_vllm_engine(tokenizer, tmp_path):
    """``agent.model.*`` size the model ``build_tiny_model`` gets as it is; ``agent.vllm.*`` is
    the engine's settings object itself (a bad value is refused by the engine's check, before
    anything is saved or vLLM is imported)."""
    from turnrl.models.causal_lm import build_tiny_model
    from turnrl.train.factories import rollout_policy

    cfg = _compose(["agent.model.hidden_size=32", "agent.model.num_layers=1", "agent.model.num_heads=2",
                    "agent.model.num_kv_heads=1", "agent.model.intermediate_size=48", "agent.model.max_positions=256"])
    built = build_tiny_model(cfg.agent.model, tokenizer).config
    assert (built.hidden_size, built.num_hidden_layers, built.num_attention_heads, built.num_key_value_heads,
            built.intermediate_size, built.max_position_embeddings) == (32, 1, 2, 1, 48, 256)
    model = build_tiny_model(cfg.agent.model, tokenizer)
    cfg = _compose(["agent.backend=vllm", "agent.vllm.gpu_memory_utilization=1.5"])
    with pytest.raises(ValueError, match=r"gpu_memory_utilization must be in \(0, 1\], got 1.5"):
        rollout_policy(cfg, model, tokenizer, tmp_path / "sampler", seed=0, own_copy=False)
    assert not (tmp_path / "sampler").exists()
    _compose([]).agent.vllm.check()  # the defaults pass


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

    from turnrl.rollout.scripted import scripted_episode
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
