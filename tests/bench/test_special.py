"""Student's t from the incomplete beta function, against closed forms and table values."""

import math

import pytest

from turnrl.bench.special import t_cdf, t_ppf


def test_t_cdf_matches_the_closed_forms_of_one_and_two_degrees_of_freedom():
    for t in (-30.0, -2.0, -0.3, 0.0, 0.7, 4.0, 100.0):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)  # Cauchy
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)


def test_t_ppf_inverts_the_cdf_and_gives_the_table_values():
    # two-sided 95% critical values (any statistics table)
    for df, value in ((1, 12.706204736), (4, 2.776445105), (10, 2.228138852), (1000, 1.962339081)):
        assert t_ppf(0.975, df) == pytest.approx(value, rel=1e-8)
        assert t_ppf(0.025, df) == pytest.approx(-value, rel=1e-8)
    for p in (0.001, 0.3, 0.5, 0.9, 0.9999):
        assert t_cdf(t_ppf(p, 3), 3) == pytest.approx(p, abs=1e-10)
    with pytest.raises(ValueError, match="p in"):
        t_ppf(1.0, 3)
