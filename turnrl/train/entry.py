"""The Hydra entry point of training: ``python -m turnrl.train env=guess_number algorithm=grpo
trainer.steps=50 seed=1`` (also installed as ``turnrl-train``). Composes ``turnrl/conf`` with the
overrides, runs ``turnrl.train.loop.train`` in Hydra's run directory and returns the "after"
held-out figure (what a Hydra sweeper optimises)."""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from turnrl.conf.schema import Config, register_configs
from turnrl.train.loop import train

register_configs()


@hydra.main(config_path="pkg://turnrl.conf", config_name="config", version_base="1.3")
def main(dcfg: DictConfig) -> float:
    cfg: Config = OmegaConf.to_object(dcfg)
    result = train(cfg, HydraConfig.get().runtime.output_dir)
    return result.after
