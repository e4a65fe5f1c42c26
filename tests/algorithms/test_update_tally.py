"""``Tally``: a minibatch's figures join the pass's when merged; the metrics are the last pass's
sums, while the ratio extremes and the sampler/learner mismatch carry over from pass to pass."""

import math

import pytest
import torch

from turnrl.algorithms.learner.tally import Tally


def part(tokens, entropy, pg_loss, ratio_max, ratio_min):
    t = Tally(tokens=tokens, entropy=entropy, pg_loss=pg_loss)
    t.add_stats({"clipped": tokens / 2, "approx_kl": 0.0, "ratio": tokens, "dual_clipped": 0.0}, ratio_max, ratio_min)
    return t


def test_merge_sums_tokens_and_keeps_extremes_and_counts_minibatches():
    tally = Tally()
    tally.merge(part(4, 2.0, 0.5, 1.3, 0.9))
    tally.merge(part(6, 3.0, 1.5, 1.1, 0.7))
    m = tally.metrics()
    assert m["entropy"] == pytest.approx(5.0 / 10) and m["pg_loss"] == pytest.approx(1.0)  # mean over minibatches
    assert m["clip_frac"] == pytest.approx(0.5) and m["ratio"] == pytest.approx(1.0)
    assert (m["ratio_max"], m["ratio_min"]) == (1.3, 0.7)


def test_the_next_pass_keeps_extremes_and_mismatch_and_nothing_else():
    tally = Tally()
    tally.add_mismatch(torch.tensor([[0.0, -1.0, -2.0]]), torch.tensor([[0.0, -1.5, -2.0]]),
                       torch.tensor([[0.0, 1.0, 1.0]]))
    tally.merge(part(4, 2.0, 0.5, 1.3, 0.9))
    nxt = tally.next_pass()
    assert (nxt.tokens, nxt.entropy, nxt.counted) == (0.0, 0.0, 0)
    assert (nxt.ratio_max, nxt.ratio_min, nxt.mismatch_tokens) == (1.3, 0.9, 2.0)
    assert nxt.metrics()["mismatch_abs"] == pytest.approx(0.25) and nxt.metrics()["mismatch_max"] == 0.5


def test_no_token_trained_reports_zeros_not_infinities():
    m = Tally().metrics()
    assert m["ratio_min"] == 0.0 and all(math.isfinite(v) for v in m.values())
