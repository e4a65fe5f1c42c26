"""The lab's statistics: the F tail, the sign-flip and t tests at their stated false-alarm rate,
and the summary figures (angle, scale, bias, variance) on gradients whose mean is known."""

import math

import pytest
import torch

from turnrl.bench.credit_lab.stats import angle_degrees, nmse_at, sign_flip_p, summarize, t_test_p
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


@pytest.fixture
def one_thread():
    """Hundreds of small matrix products: a second thread only costs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_sign_flip_false_alarm_rate_resolution_and_power(one_thread):
    g = torch.Generator().manual_seed(0)
    mix = torch.randn(6, 6, generator=g, dtype=torch.float64)
    null_p = [sign_flip_p(torch.randn(200, 6, generator=g, dtype=torch.float64) @ mix, flips=199, seed=i)
              for i in range(300)]
    rate = sum(p <= 0.05 for p in null_p) / len(null_p)
    assert 0.02 <= rate <= 0.09  # nominal 0.05; 300 draws
    assert min(null_p) >= 1 / 200 and all(abs(p * 200 - round(p * 200)) < 1e-9 for p in null_p)  # a grid of step 1/(flips+1)
    shifted = torch.randn(200, 6, generator=g, dtype=torch.float64) @ mix + 0.5 * mix[0]
    assert sign_flip_p(shifted, flips=999) == 1 / 1000  # as small as 999 flips can say, never 0
    assert sign_flip_p(torch.zeros(50, 3)) == 1.0


def test_directions_of_tiny_spread_are_left_out_the_others_weigh_alike():
    """Hotelling's test, which inverts the covariance, left out directions of variance below
    1e-8 of the gradient's size and called any mean there a certain bias (p = 0), although a
    mean of 2 standard errors there is noise (and float32 round-off of the exact values sits
    there too). The sign-flip test leaves such directions out and whitens the rest, so a bias
    in a narrow but not negligible direction is still seen."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(100, 3, generator=g, dtype=torch.float64)
    tiny = 1.5e-4 * torch.randn(100, 1, generator=g, dtype=torch.float64)
    tiny = tiny - tiny.mean() + 3e-5  # mean 3e-5, standard error 1.5e-5: 2 standard errors
    assert sign_flip_p(torch.cat([x, tiny], dim=1)) > 1e-3
    wide = torch.randn(400, 3, generator=g, dtype=torch.float64) * torch.tensor([10.0, 10.0, 0.5],
                                                                                  dtype=torch.float64)
    wide[:, 2] += 0.125  # 5 standard errors of the narrow direction, 0.1% of the spread's norm
    assert sign_flip_p(wide, flips=999) == 1 / 1000
    assert sign_flip_p(wide, flips=999, cond=0.01) > 1e-3  # narrower than 1% of the widest: left out


def test_gradients_along_the_true_one_leave_only_round_off_untested():
    """Every batch's gradient a multiple of the true one: the residual is round-off, with a
    systematic part that a whitened test would call certain; it is left out (p = 1)."""
    g = torch.Generator().manual_seed(4)
    true = torch.tensor([0.3, -0.2, 0.1, 0.05], dtype=torch.float64)
    along = (1.0 + torch.rand(500, 1, generator=g, dtype=torch.float64)) * true
    grads = along + 1e-17 * (1.0 + torch.rand(500, 4, generator=g, dtype=torch.float64))
    figures = summarize(grads, true, flips=99)
    assert figures["p_direction"] == 1.0 and figures["angle"] < 1e-6 and figures["p_scale"] < 1e-10


def test_t_test_of_a_known_mean():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=torch.float64)
    assert t_test_p(x, 3.0) == pytest.approx(1.0)
    assert t_test_p(x, 0.0) == pytest.approx(0.013236, rel=1e-3)  # t = 4.243, 4 degrees of freedom
    assert t_test_p(torch.full((4,), 2.0), 2.0) == 1.0 and t_test_p(torch.full((4,), 2.0), 1.0) == 0.0


def test_angle_scale_and_bias_on_a_hand_made_case():
    true = torch.tensor([1.0, 0.0], dtype=torch.float64)
    same = summarize(torch.tensor([[1.0, 1.0]] * 10, dtype=torch.float64), true, flips=99)
    assert same["angle"] == pytest.approx(45.0) and same["cosine"] == pytest.approx(math.sqrt(0.5))
    assert same["scale"] == pytest.approx(1.0) and same["bias2"] == pytest.approx(1.0)
    assert same["variance"] == 0.0 and same["nmse"] == pytest.approx(1.0) and nmse_at(same, 16) == pytest.approx(1.0)
    two = summarize(torch.tensor([[2.0, 1.0], [0.0, 1.0]], dtype=torch.float64), true, flips=9)
    # mean (1, 1): along the true direction 1 (scale 1), off it 1 (bias2 1, no spread there);
    # the spread is along it: variance (2 - 0)^2 / 2 = 2 (unbiased)
    assert two["angle"] == pytest.approx(45.0) and two["bias2"] == pytest.approx(1.0)
    assert two["variance"] == pytest.approx(2.0) and nmse_at(two, 4) == pytest.approx(1.5)
    scaled = summarize(torch.tensor([[3.0, 0.0]] * 5, dtype=torch.float64), true, flips=9)
    assert scaled["scale"] == pytest.approx(3.0) and scaled["angle"] == 0.0 and scaled["bias2"] == 0.0
    assert angle_degrees(-1.0) == pytest.approx(180.0) and angle_degrees(1.0 + 1e-15) == 0.0


def test_the_error_at_k_times_the_batch_is_bias_plus_variance_over_k():
    """Averaging k batches' gradients measures what ``nmse_at`` extrapolates from one run."""
    g = torch.Generator().manual_seed(3)
    true = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
    grads = true + torch.tensor([0.0, 0.0, 0.4], dtype=torch.float64) + torch.randn(8000, 3, generator=g,
                                                                                      dtype=torch.float64)
    one = summarize(grads, true, flips=99)
    for k in (4, 16):
        averaged = summarize(grads.reshape(-1, k, 3).mean(dim=1), true, flips=99)
        assert averaged["nmse"] == pytest.approx(nmse_at(one, k), rel=0.1)
        assert averaged["bias2"] == pytest.approx(one["bias2"], rel=0.15)


def test_summary_of_a_scaled_unbiased_estimator():
    g = torch.Generator().manual_seed(2)
    true = torch.tensor([1.0, -2.0, 0.5, 0.0], dtype=torch.float64)
    noise = 0.5 * torch.randn(4000, 4, generator=g, dtype=torch.float64)
    s = summarize(2.0 * true + noise, true, flips=999)
    assert s["scale"] == pytest.approx(2.0, abs=0.03)
    assert s["cosine"] == pytest.approx(1.0, abs=1e-3)
    assert s["p_scale"] < 1e-12 and s["p_unbiased"] < 1e-12 and s["p_direction"] > 1e-3
    assert s["angle"] < 1.0 and s["bias2"] < 1e-3
    # noise per batch 4 * 0.25 = 1 against |2 true|^2 = 21
    assert s["snr"] == pytest.approx(21.0, rel=0.05)
    assert s["nmse"] == pytest.approx(0.25 * 4 / 4 / true.dot(true).item(), rel=0.05)
    assert s["uphill"] == 1.0 and 0.9 < s["step_cosine"] < 1.0
    biased = summarize(true + torch.tensor([0.0, 0.0, 0.0, 0.3], dtype=torch.float64) + noise, true, flips=999)
    assert biased["p_direction"] == 1 / 1000 and biased["cosine"] == pytest.approx(math.sqrt(5.25 / 5.34), abs=2e-3)
    assert math.isfinite(biased["nmse"])
