"""The ``turn-mean`` loss aggregation against weights computed by hand."""

import pytest
import torch

from turnrl.algorithms import AGGREGATIONS


def flat(x) -> list[float]:
    """Nested (ragged) lists of numbers as one flat list."""
    return [v for item in x for v in flat(item)] if isinstance(x, (list, tuple)) else [float(x)]


def close(got, want):
    """Equal to float64 rounding (the hand-computed values are exact decimals)."""
    torch.testing.assert_close(torch.tensor(flat(got), dtype=torch.float64),
                               torch.tensor(flat(want), dtype=torch.float64), rtol=0, atol=1e-12)


# ---------------------------------------------------------------- turn-mean aggregation
def test_turn_mean_weighs_every_turn_of_the_batch_once():
    # row 0: turn 0 of 3 tokens, an observation, turn 1 of 2; row 1: one turn of 1 token; 3 turns
    mask = torch.tensor([[1, 1, 1, 0, 1, 1, 0], [1, 0, 0, 0, 0, 0, 0]], dtype=torch.float64)
    turns = torch.tensor([[0, 0, 0, -1, 1, 1, -1], [0, -1, -1, -1, -1, -1, -1]])
    w = AGGREGATIONS["turn-mean"](mask, turns)
    close(w.tolist(), [[1 / 9] * 3 + [0] + [1 / 6] * 2 + [0], [1 / 3] + [0] * 6])
    per_turn = [float(w[0, :3].sum()), float(w[0, 4:6].sum()), float(w[1, 0])]
    close(per_turn, [1 / 3] * 3)
    with pytest.raises(ValueError, match="turn_index"):
        AGGREGATIONS["turn-mean"](mask)
    with pytest.raises(ValueError, match="turn_index -1"):
        AGGREGATIONS["turn-mean"](mask, torch.full_like(turns, -1))
    # the other modes take turn_index and ignore it
    for name in AGGREGATIONS.names():
        if name != "turn-mean":
            assert torch.equal(AGGREGATIONS[name](mask, turns), AGGREGATIONS[name](mask)), name
