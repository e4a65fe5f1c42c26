"""The importance corrections of ``algorithm.tis`` against their published formulas on a
hand-computed batch: TIS truncates (Yao et al. 2025), IcePop keeps ratios in [alpha, beta]
(Ling team 2025), MIS masks ratios above the cap (token and sequence), geometric sequence
masking drops rows whose geometric-mean ratio leaves 1 +- band (SkyRL). In a learner update each
correction's weights multiply the tokens' losses (tests/algorithms/test_algorithm_smoke.py)."""

import dataclasses

import pytest
import torch

from turnrl.algorithms.losses.importance import truncated_is_weights
from turnrl.conf.schema import Config
from turnrl.conf.validate import problems

# two rows: ratios r = pi_l / pi_s of [2, 0.25, 1.5] and [1.005, 0.999] on the sampled tokens
RATIOS = [[2.0, 0.25, 1.5, 1.0], [1.005, 0.999, 1.0, 1.0]]
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
SAMPLER = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.7, -1.2, -2.0, -2.0]], dtype=torch.float64)
LEARNER = SAMPLER + torch.tensor(RATIOS, dtype=torch.float64).log() * MASK
RHO = [2.0 * 0.25 * 1.5, 1.005 * 0.999]  # 0.75, 1.003995
GEO = [RHO[0] ** (1 / 3), RHO[1] ** 0.5]  # 0.9086, 1.001995

CASES = {
    ("token", 2.0): [[2.0, 0.25, 1.5, 0], [1.005, 0.999, 0, 0]],
    ("token", 1.2): [[1.2, 0.25, 1.2, 0], [1.005, 0.999, 0, 0]],
    ("sequence", 2.0): [[RHO[0]] * 3 + [0], [RHO[1]] * 2 + [0, 0]],
    ("sequence", 0.9): [[RHO[0]] * 3 + [0], [0.9, 0.9, 0, 0]],
    ("icepop", 1.8): [[0, 0, 1.5, 0], [1.005, 0.999, 0, 0]],  # 2 > beta, 0.25 < alpha = 0.5
    ("icepop", 5.0): [[2.0, 0, 1.5, 0], [1.005, 0.999, 0, 0]],
    ("mis_token", 1.8): [[0, 0.25, 1.5, 0], [1.005, 0.999, 0, 0]],
    ("mis_sequence", 0.9): [[RHO[0]] * 3 + [0], [0, 0, 0, 0]],
    ("mis_sequence", 2.0): [[RHO[0]] * 3 + [0], [RHO[1]] * 2 + [0, 0]],
    ("geo_mask", 2.0): [[0, 0, 0, 0], [1, 1, 0, 0]],  # |0.909 - 1| > 0.01, |1.002 - 1| <= 0.01
    ("none", 2.0): [[1, 1, 1, 0], [1, 1, 0, 0]],
}


@pytest.mark.parametrize("level, cap", list(CASES))
def test_each_correction_gives_its_published_weights(level, cap):
    weights = truncated_is_weights(LEARNER, SAMPLER, MASK, level, cap, floor=0.5, band=0.01)
    assert torch.allclose(weights, torch.tensor(CASES[level, cap], dtype=torch.float64), rtol=1e-12, atol=0)
    assert not weights.requires_grad


def test_the_geometric_mask_reads_the_mean_log_ratio_of_each_row():
    assert abs(GEO[0] - 1) > 0.01 >= abs(GEO[1] - 1)
    wide = truncated_is_weights(LEARNER, SAMPLER, MASK, "geo_mask", band=0.1)
    assert wide.tolist() == MASK.tolist()


@pytest.mark.parametrize("level, kwargs, match", [
    ("bogus", {}, "must be one of"), ("token", {"cap": 0}, "tis_cap"), ("icepop", {"cap": 2.0, "floor": 3.0}, "tis_floor"),
    ("geo_mask", {"band": 1.5}, "tis_band")])
def test_bad_settings_name_the_field(level, kwargs, match):
    with pytest.raises(ValueError, match=match):
        truncated_is_weights(LEARNER, SAMPLER, MASK, level, **kwargs)


@pytest.mark.parametrize("overrides, match", [
    ({"tis": "icepop", "tis_floor": 3.0}, "algorithm.tis_floor"), ({"tis": "geo_mask", "tis_band": 0.0}, "tis_band"),
    ({"tis": "mis"}, "algorithm.tis")])
def test_the_config_check_refuses_bad_bounds(overrides, match):
    cfg = Config()
    cfg.algorithm = dataclasses.replace(cfg.algorithm, **overrides)
    assert any(match in problem for problem in problems(cfg))

