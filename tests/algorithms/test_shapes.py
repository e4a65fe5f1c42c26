"""Shape contracts: a tensor of the wrong shape raises, naming the function, the tensor and both
shapes, in GAE, credit assignment and every policy loss (no silent broadcast)."""

import pytest
import torch

from turnrl.algorithms.batch import collate
from turnrl.algorithms.credit.assign import assign_credit
from turnrl.algorithms.credit.gae import token_gae, turn_level_gae
from turnrl.algorithms.losses.token_losses import ppo_clip_loss
from turnrl.algorithms.losses.policy import cispo_loss, gspo_loss
from turnrl.algorithms.shapes import same_shape
from turnrl.rollout import Trajectory


def batch():
    """Two one-turn trajectories, 6 tokens each (3 sampled)."""
    trajs = [Trajectory(token_ids=[1, 2, 3, 4, 5, 6], loss_mask=[0, 0, 0, 1, 1, 1], logprobs=[0.0] * 3 + [-0.5] * 3,
                        turn_spans=[(3, 6)], turn_rewards=[r], success=r > 0, group_id=0, task_id="t",
                        termination="terminated") for r in (1.0, 0.0)]
    return collate(trajs, pad_id=0)


def test_same_shape_names_the_function_the_tensor_and_both_shapes():
    same_shape("f", a=torch.zeros(2, 3), b=torch.ones(2, 3), c=None)
    with pytest.raises(ValueError, match=r"^f: b has shape \[2, 4\], a \[2, 3\]; they must be equal"):
        same_shape("f", a=torch.zeros(2, 3), b=torch.zeros(2, 4))


@pytest.mark.parametrize("fn", [token_gae, turn_level_gae])
def test_gae_refuses_values_of_another_shape(fn):
    b = batch()
    n, t = b.loss_mask.shape
    assert fn(b, torch.zeros(n, t)).shape == (n, t)
    with pytest.raises(ValueError, match=rf"{fn.__name__}: values has shape \[{n}, {t + 3}\], loss_mask \[{n}, {t}\]"):
        fn(b, torch.zeros(n, t + 3))


def test_credit_refuses_an_estimator_or_critic_of_another_shape():
    b = batch()
    n, t = b.loss_mask.shape
    ok = assign_credit(b, lambda x: torch.zeros(n, t))
    assert ok.advantages.shape == (n, t)
    with pytest.raises(ValueError, match=r"assign_credit: advantages has shape \[2, 1\]"):
        assign_credit(b, lambda x: torch.zeros(n, 1))  # a per-row advantage would broadcast silently
    with pytest.raises(ValueError, match=r"assign_credit: values has shape"):
        assign_credit(b, lambda x: torch.zeros(n, t), values=lambda x: torch.zeros(n, t - 1),
                      value_targets=lambda x: torch.zeros(n, t))


@pytest.mark.parametrize("loss", [ppo_clip_loss, gspo_loss, cispo_loss])
def test_policy_losses_refuse_mismatched_tensors(loss):
    lp, w = torch.zeros(2, 5), torch.ones(2, 5)
    value, _ = loss(lp, lp, torch.ones(2, 5), w)
    assert torch.isfinite(value)
    with pytest.raises(ValueError, match=rf"{loss.__name__}: advantages has shape \[2, 1\], logprobs \[2, 5\]"):
        loss(lp, lp, torch.ones(2, 1), w)
    with pytest.raises(ValueError, match=rf"{loss.__name__}: is_weights has shape \[5\]"):
        loss(lp, lp, torch.ones(2, 5), w, is_weights=torch.ones(5))
