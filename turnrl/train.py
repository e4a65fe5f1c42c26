"""``python -m turnrl.train env=guess_number algorithm=grpo trainer.steps=50 seed=1``"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from turnrl.conf.schema import Config, register_configs

register_configs()


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(dcfg: DictConfig) -> float:
    from turnrl.trainer import train

    cfg: Config = OmegaConf.to_object(dcfg)
    result = train(cfg, HydraConfig.get().runtime.output_dir)
    return result.after


if __name__ == "__main__":
    main()
