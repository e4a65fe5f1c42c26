"""``turnrl.conf.validate.validate``: every choice field, range and cross-field rule, each
message naming the key, the bad value, the allowed values and the fix; ``train`` runs it
before any work."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

import turnrl.conf
from turnrl.train.factories import advantage_fn
from turnrl.conf.schema import Config, register_configs
from turnrl.conf.validate import choice_fields, problems, validate

register_configs()
CONF = Path(turnrl.conf.__file__).parent


def default_config() -> Config:
    return OmegaConf.to_object(OmegaConf.structured(Config))


def with_values(**dotted) -> Config:
    """The default config with ``a__b__c=value`` set at ``a.b.c``."""
    cfg = default_config()
    for key, value in dotted.items():
        *path, name = key.split("__")
        node = cfg
        for part in path:
            node = getattr(node, part)
        setattr(node, name, value)
    return cfg


def test_the_default_config_is_valid():
    assert problems(default_config()) == []
    validate(default_config())


@pytest.mark.parametrize("overrides", [[f"algorithm={p.stem}"] for p in sorted((CONF / "algorithm").glob("*.yaml"))]
                         + [[f"env={p.stem}"] for p in sorted((CONF / "env").glob("*.yaml"))]
                         + [["+experiment=dpo_then_grpo"]], ids=str)
def test_every_shipped_config_is_valid(overrides):
    with initialize_config_module(config_module="turnrl.conf", version_base="1.3"):
        validate(OmegaConf.to_object(compose(config_name="config", overrides=overrides)))


CHOICES = [  # (key, a bad value, one allowed value the message must list)
    ("agent.backend", "torch", "vllm"),
    ("agent.dtype", "float8", "bfloat16"),
    ("agent.vllm.dtype", "float64", "float16"),
    ("agent.http.route_strategy", "random", "least_loaded"),
    ("agent.tool_parser", "yaml", "hermes"),
    ("agent.temperature_schedule", "exponential", "cosine"),
    ("agent.warmstart.player", "random", "expert"),
    ("agent.chat_format", "chatml3", "chatml"),
    ("agent.on_context_limit", "truncate", "compact"),
    ("algorithm.advantage", "a2c", "grpo"),
    ("algorithm.kl_estimator", "k4", "k3"),
    ("algorithm.kl_placement", "advantage", "reward"),
    ("algorithm.tis", "tokens", "sequence"),
    ("algorithm.loss_agg", "mean", "seq-mean-token-mean"),
    ("algorithm.policy_loss", "grpo", "gspo"),
    ("algorithm.turn_ratio", "mean", "geometric"),
    ("algorithm.critic", "joint", "shared"),
    ("algorithm.entropy_schedule", "step", "linear"),
    ("trainer.mixed_precision", "fp16", "bf16"),
    ("trainer.infra_failures", "skip", "refill"),
]


@pytest.mark.parametrize("key,bad,allowed", CHOICES, ids=[c[0] for c in CHOICES])
def test_a_choice_field_outside_its_registry_fails_naming_key_value_choices_and_fix(key, bad, allowed):
    with pytest.raises(ValueError) as err:
        validate(with_values(**{key.replace(".", "__"): bad}))
    message = str(err.value)
    assert f"{key}={bad!r} is not one of" in message
    assert repr(allowed) in message and f"set {key} to one of them" in message


def test_the_choices_cover_every_choice_field():
    assert {key for key, _, _ in choice_fields(default_config())} == {key for key, _, _ in CHOICES}


def test_advantage_kwargs_the_estimator_does_not_take_fail_in_validate_and_in_advantage_fn():
    cfg = with_values(algorithm__advantage_kwargs={"normalize_std": False, "gama": 0.9})
    with pytest.raises(ValueError, match=r"algorithm.advantage_kwargs has \['gama'\].*'grpo' does not take; "
                                         r"it accepts \[.*'normalize_std'.*\]: remove"):
        validate(cfg)
    with pytest.raises(ValueError, match=r"algorithm.advantage_kwargs has \['gama'\]"):
        advantage_fn(cfg)
    validate(with_values(algorithm__advantage_kwargs={"normalize_std": False}))


@pytest.mark.parametrize("values,expected", [
    ({"algorithm__ppo_epochs": 0}, "algorithm.ppo_epochs=0 must be >= 1"),
    ({"algorithm__num_minibatches": 0}, "algorithm.num_minibatches=0 must be >= 1"),
    ({"algorithm__critic_epochs": 0}, "algorithm.critic_epochs=0 must be >= 1"),
    ({"trainer__micro_batch_size": 0}, "trainer.micro_batch_size=0 must be >= 1"),
    ({"trainer__micro_batch_tokens": 0}, "trainer.micro_batch_tokens=0 must be >= 1"),
    ({"trainer__lora_rank": -1}, "trainer.lora_rank=-1 must be >= 0"),
    ({"algorithm__kl_coef": -0.1}, "algorithm.kl_coef=-0.1 must be >= 0"),
    ({"algorithm__tis_cap": 0.0}, "algorithm.tis_cap=0.0 must be > 0"),
    ({"trainer__threads": -1}, "trainer.threads=-1 must be null"),
    ({"algorithm__dual_clip": 1.0}, "algorithm.dual_clip=1.0 must be > 1"),
    ({"algorithm__gspo_clip_low": -3e-4}, "algorithm.gspo_clip_low=-0.0003 must be >= 0"),
    ({"algorithm__gspo_clip_high": -1.0}, "algorithm.gspo_clip_high=-1.0 must be >= 0"),
    ({"algorithm__cispo_clip_low": -0.1}, "algorithm.cispo_clip_low=-0.1 must be >= 0"),
    ({"algorithm__cispo_clip_high": -0.28}, "algorithm.cispo_clip_high=-0.28 must be >= 0"),
    ({"algorithm__kl_target": 0.01}, "algorithm.kl_target=0.01 (adaptive KL) needs kl_target > 0 and an initial "
                                     "algorithm.kl_coef > 0, got kl_coef=0.0"),
    ({"algorithm__state_similarity": 1.5}, "algorithm.state_similarity=1.5 must be in (0, 1]"),
    ({"trainer__checkpoint_every": -1}, "trainer.checkpoint_every must be >= 0 (0 = off) and "
                                        "trainer.keep_checkpoints >= 1, got -1 and 1"),
    ({"trainer__keep_checkpoints": 0}, "trainer.keep_checkpoints >= 1, got 0 and 0"),
    ({"trainer__max_staleness": -1}, "trainer.max_staleness must be an int >= 0 (0 = the synchronous algorithm), "
                                     "got -1"),
    ({"trainer__max_staleness": True}, "trainer.max_staleness must be an int >= 0"),
], ids=lambda v: next(iter(v)) if isinstance(v, dict) else "")
def test_a_value_out_of_range_fails_naming_it(values, expected):
    with pytest.raises(ValueError) as err:
        validate(with_values(**values))
    assert expected in str(err.value) and "set" in str(err.value).split(expected, 1)[1]


def test_the_ranges_accept_their_bounds():
    validate(with_values(algorithm__kl_coef=0.01, algorithm__kl_target=0.02, algorithm__dual_clip=3.0,
                         algorithm__state_similarity=1.0, trainer__max_staleness=0, trainer__lora_rank=0,
                         trainer__checkpoint_every=0, algorithm__gspo_clip_low=0.0, algorithm__gspo_clip_high=0.0,
                         algorithm__cispo_clip_low=0.0, algorithm__cispo_clip_high=0.0))


@pytest.mark.parametrize("values,expected,fixed", [
    ({"trainer__async_rollouts": True, "trainer__max_staleness": 2},
     "trainer.max_staleness=2 samples rollouts with weights up to that many updates old, but algorithm.tis='none'",
     {"algorithm__tis": "token"}),
    ({"agent__backend": "http", "trainer__accelerate": True},
     "agent.backend='http' with trainer.accelerate=true", {"agent__backend": "vllm"}),
    ({"agent__vllm__sleep_during_update": True},
     "it needs agent.backend=vllm (got 'transformers') and synchronous rollouts", {"agent__backend": "vllm"}),
    ({"agent__vllm__sleep_during_update": True, "agent__backend": "vllm", "trainer__async_rollouts": True,
      "algorithm__tis": "token"},
     "(trainer.async_rollouts=false, got True)", {"trainer__async_rollouts": False}),
    ({"algorithm__policy_loss": "gspo", "algorithm__dual_clip": 3.0},
     "algorithm.dual_clip=3.0 is set but algorithm.policy_loss='gspo' has no dual clip (the losses with one: "
     "['ppo_clip']); set algorithm.dual_clip=null, or algorithm.policy_loss=ppo_clip", {"algorithm__dual_clip": None}),
    ({"trainer__accelerate": True, "algorithm__advantage": "gae"},
     "algorithm.advantage='gae' with algorithm.critic='separate' trains a critic model on one process; "
     "set algorithm.critic=shared", {"algorithm__critic": "shared"}),
])
def test_switches_that_exclude_or_need_others(values, expected, fixed):
    with pytest.raises(ValueError) as err:
        validate(with_values(**values))
    assert expected in str(err.value)
    validate(with_values(**{**values, **fixed}))  # the fix the message names is enough


def test_async_staleness_zero_needs_no_tis_and_sync_rollouts_ignore_staleness():
    validate(with_values(trainer__async_rollouts=True, trainer__max_staleness=0))
    validate(with_values(trainer__max_staleness=3))  # synchronous: no stale samples to correct
    validate(with_values(trainer__accelerate=True, algorithm__advantage="grpo"))  # no critic at all


def test_every_problem_is_listed_at_once():
    cfg = with_values(algorithm__kl_estimator="k9", trainer__mixed_precision="fp8", trainer__checkpoint_every=-2)
    with pytest.raises(ValueError, match=r"invalid config \(3 problems\)") as err:
        validate(cfg)
    lines = str(err.value).splitlines()[1:]
    assert len(lines) == 3 and all(line.startswith("- ") for line in lines)


def test_train_validates_before_any_work(tmp_path):
    from turnrl.train.loop import train

    # an env id and a model path that would fail on their own once work began: the config's
    # own problems are reported first, and nothing is written
    cfg = with_values(env__id="turnrl/NoSuchEnv-v0", agent__path=str(tmp_path / "no-model"),
                      algorithm__loss_agg="mean")
    run_dir = tmp_path / "run"
    started = []
    with pytest.raises(ValueError, match=r"algorithm.loss_agg='mean' is not one of") as err:
        train(cfg, run_dir, on_rl_start=started.append)
    assert "NoSuchEnv" not in str(err.value) and started == []
    assert not run_dir.exists() or not any(run_dir.iterdir())
