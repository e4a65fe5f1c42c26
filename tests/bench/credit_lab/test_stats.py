"""The lab's statistics: the F tail, Hotelling's test at its stated false-alarm rate, and the
summary figures on gradients whose mean is known."""

import math

import pytest
import torch

from turnrl.bench.credit_lab.stats import hotelling_p, summarize
from turnrl.bench.special import betainc, f_sf


def test_incomplete_beta_and_f_tail_closed_forms():
    for x in (0.01, 0.3, 0.5, 0.97):
        assert betainc(1.0, 1.0, x) == pytest.approx(x, rel=1e-12)
        assert betainc(2.0, 1.0, x) == pytest.approx(x**2, rel=1e-12)
    assert betainc(3.5, 3.5, 0.5) == pytest.approx(0.5, rel=1e-12)
    for f in (0.1, 1.0, 3.0, 10.0):
        for d2 in (5, 40, 1000):
            # F(2, d2): P(F > f) = (1 + 2 f / d2)^(-d2 / 2)
            assert f_sf(f, 2, d2) == pytest.approx((1 + 2 * f / d2) ** (-d2 / 2), rel=1e-9)
    assert f_sf(0.0, 3, 7) == 1.0
    with pytest.raises(ValueError):
        betainc(1.0, 1.0, 1.5)


def test_hotelling_false_alarm_rate_and_power():
    g = torch.Generator().manual_seed(0)
    mix = torch.randn(6, 6, generator=g, dtype=torch.float64)
    null_p = []
    for _ in range(300):
        x = torch.randn(200, 6, generator=g, dtype=torch.float64) @ mix
        null_p.append(hotelling_p(x)[0])
    rate = sum(p < 0.05 for p in null_p) / len(null_p)
    assert 0.02 <= rate <= 0.09  # nominal 0.05; 300 draws
    shifted = torch.randn(200, 6, generator=g, dtype=torch.float64) @ mix + 0.5 * mix[0]
    assert hotelling_p(shifted)[0] < 1e-6


def test_hotelling_ignores_directions_without_variance_unless_the_mean_is_off_there():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 3, generator=g, dtype=torch.float64)
    x = torch.cat([x, -x.sum(dim=1, keepdim=True), torch.zeros(300, 1, dtype=torch.float64)], dim=1)
    p, rank = hotelling_p(x)
    assert rank == 3 and p > 1e-3
    x[:, 4] = 0.1  # a constant offset: certain bias
    assert hotelling_p(x)[0] == 0.0


def test_summary_of_a_scaled_unbiased_estimator():
    g = torch.Generator().manual_seed(2)
    true = torch.tensor([1.0, -2.0, 0.5, 0.0], dtype=torch.float64)
    noise = 0.5 * torch.randn(4000, 4, generator=g, dtype=torch.float64)
    s = summarize(2.0 * true + noise, true)
    assert s["scale"] == pytest.approx(2.0, abs=0.03)
    assert s["cosine"] == pytest.approx(1.0, abs=1e-3)
    assert s["p_unbiased"] < 1e-12 and s["p_direction"] > 1e-3
    # noise per batch 4 * 0.25 = 1 against |2 true|^2 = 21
    assert s["snr"] == pytest.approx(21.0, rel=0.05)
    assert s["nmse"] == pytest.approx(0.25 * 4 / 4 / true.dot(true).item(), rel=0.05)
    assert s["uphill"] == 1.0 and 0.9 < s["step_cosine"] < 1.0
    biased = summarize(true + torch.tensor([0.0, 0.0, 0.0, 0.3], dtype=torch.float64) + noise, true)
    assert biased["p_direction"] < 1e-12 and biased["cosine"] == pytest.approx(math.sqrt(5.25 / 5.34), abs=2e-3)
    assert math.isfinite(biased["nmse"])
