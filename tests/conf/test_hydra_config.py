"""Hydra composition: overrides compose, bad keys and types fail naming the key."""

import subprocess
import sys

import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from turnrl.conf.schema import Config, register_configs

register_configs()


def _compose(overrides):
    with initialize_config_module(config_module="turnrl.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def test_default_config_composes_to_the_schema():
    cfg = OmegaConf.to_object(_compose([]))
    assert isinstance(cfg, Config)
    assert cfg.env.id == "turnrl/GuessNumber-v0"
    assert cfg.algorithm.advantage == "grpo"


def test_group_and_field_overrides_compose():
    cfg = OmegaConf.to_object(_compose(["env=calc_math", "algorithm=grpo", "trainer.steps=50", "seed=1",
                                        "algorithm.kl_coef=0.05"]))
    assert cfg.env.id == "turnrl/CalcMath-v0"
    assert cfg.env.kwargs["num_ops"] == 2
    assert cfg.trainer.steps == 50 and cfg.seed == 1 and cfg.algorithm.kl_coef == 0.05


def test_mistyped_key_fails_naming_it():
    with pytest.raises(ConfigCompositionException) as err:
        _compose(["trainer.stepz=5"])
    assert "stepz" in str(err.value.__cause__ or err.value)


def test_wrong_type_fails_naming_the_key():
    with pytest.raises(ConfigCompositionException) as err:
        _compose(["trainer.steps=many"])
    message = str(err.value.__cause__ or err.value)
    assert "steps" in message and "many" in message


def test_unknown_group_option_fails_listing_choices():
    with pytest.raises(Exception) as err:
        _compose(["env=no_such_env"])
    assert "no_such_env" in str(err.value) and "guess_number" in str(err.value)


@pytest.mark.slow
@pytest.mark.e2e
def test_cli_rejects_a_bad_key_before_training():
    proc = subprocess.run(
        [sys.executable, "-m", "turnrl.train", "trainer.stepz=5"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode != 0
    assert "stepz" in proc.stderr + proc.stdout
