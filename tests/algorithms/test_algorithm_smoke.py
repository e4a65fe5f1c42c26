"""One training update per algorithm config (``algorithm=<name>``) on the tiny model: the
composed config's estimator, policy loss and loss aggregation run through the real learner, every
parameter that gets gradient moves, nothing is NaN."""

import copy
import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from turnrl.rollout.scripted import scripted_episode
from turnrl.algorithms.losses.importance import CORRECTIONS
from turnrl.algorithms import VALUE_TARGETS, Learner, LossConfig, OptimConfig, collate, token_logprobs
from turnrl.algorithms.learner.critic import Critic, CriticLearner
from turnrl.train.factories import advantage_fn
from turnrl.conf.schema import register_configs
from turnrl.envs import GuessNumberEnv

from tests.tolerances import float_tol, logprob_tol_for, rows_of

register_configs()

ALGORITHMS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "turnrl/conf/algorithm").glob("*.yaml"))
PLAYERS = ("expert", "weak", "weak", "weak")


@pytest.fixture(scope="module")
def mixed_batch(tokenizer, renderer, tiny_model):
    """3 tasks x 4 scripted players (expert and weak: mixed outcomes, turn counts and shared
    anchor states), scored by the tiny model so the update starts on-policy (ratio 1)."""
    env = GuessNumberEnv(n=32, max_turns=6)
    trajs = []
    for group, seed in enumerate((0, 1, 2)):
        for k, player in enumerate(PLAYERS):
            t = scripted_episode(env, seed, renderer, player, rng=np.random.default_rng(100 * seed + k))
            t.group_id = group
            trajs.append(t)
    batch = collate(trajs, tokenizer.pad_token_id)
    with torch.no_grad():
        lp, _, _ = token_logprobs(tiny_model, batch.input_ids, batch.attention_mask, score_mask=batch.loss_mask)
    batch.old_logprobs = lp * batch.loss_mask
    assert len(set(batch.rewards.tolist())) > 1 and len(set(batch.num_turns.tolist())) > 1
    return batch


def compose_algorithm(name):
    with initialize_config_module(config_module="turnrl.conf", version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="config", overrides=[f"algorithm={name}"]))


@pytest.mark.slow
def test_every_estimator_has_a_config():
    from turnrl.algorithms import ADVANTAGES

    configured = {compose_algorithm(name).algorithm.advantage for name in ALGORITHMS}
    assert set(ADVANTAGES.names()) <= configured


@pytest.mark.slow
def test_every_policy_loss_has_a_config():
    from turnrl.algorithms import POLICY_LOSSES

    configured = {compose_algorithm(name).algorithm.policy_loss for name in ALGORITHMS}
    assert set(POLICY_LOSSES.names()) <= configured


@pytest.mark.slow
@pytest.mark.parametrize("name", ALGORITHMS)
def test_one_update_per_algorithm_moves_parameters_without_nan(name, mixed_batch, tiny_model):
    cfg = compose_algorithm(name)
    acfg = cfg.algorithm
    critic = None
    if acfg.advantage in VALUE_TARGETS:
        critic = CriticLearner(Critic.from_policy(tiny_model), dataclasses.replace(acfg, critic_lr=1e-2), OptimConfig())
        mixed_batch = dataclasses.replace(mixed_batch, values=critic.values(mixed_batch))
    advantages = advantage_fn(cfg)(mixed_batch)
    assert advantages.shape == mixed_batch.loss_mask.shape and torch.isfinite(advantages).all()
    assert advantages.abs().sum() > 0 and torch.all(advantages[mixed_batch.loss_mask == 0] == 0)
    model = copy.deepcopy(tiny_model)
    # the composed algorithm config is the learner's loss config as it is
    learner = Learner(model, acfg, dataclasses.replace(cfg.trainer, lr=1e-3, micro_batch_size=5))
    metrics = learner.update(mixed_batch, advantages)
    assert all(np.isfinite(v) for v in metrics.values()), metrics
    before = dict(tiny_model.named_parameters())
    moved = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert len(moved) == len(before)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    if critic is not None:
        targets = VALUE_TARGETS[acfg.advantage](mixed_batch, **acfg.advantage_kwargs)
        head_before = critic.critic.head.weight.clone()
        fit = critic.update(mixed_batch, targets, mixed_batch.values)
        assert np.isfinite(fit["value_loss"]) and not torch.equal(head_before, critic.critic.head.weight)


@pytest.mark.slow
def test_the_critic_fits_its_targets(mixed_batch, tiny_model):
    critic = CriticLearner(Critic.from_policy(tiny_model), LossConfig(critic_lr=3e-3, value_clip=None), OptimConfig())
    assert critic.values(mixed_batch).abs().sum() == 0  # the head starts at zero
    targets = mixed_batch.rewards[:, None] * mixed_batch.loss_mask  # each row's return on its tokens
    losses = [critic.update(mixed_batch, targets, critic.values(mixed_batch))["value_loss"] for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]
    # the policy's own weights are not the critic's
    assert critic.critic.backbone is not tiny_model.get_decoder()


@pytest.mark.slow
def test_value_clipping_limits_the_move_from_old_values(mixed_batch, tiny_model):
    critic = CriticLearner(Critic.from_policy(tiny_model), LossConfig(critic_lr=1e-2, value_clip=0.01), OptimConfig())
    old = critic.values(mixed_batch)
    targets = (old + 5.0) * mixed_batch.loss_mask
    for _ in range(3):
        stats = critic.update(mixed_batch, targets, old)
    assert stats["value_clip_frac"] > 0.5  # most tokens' values left the +-0.01 band


@pytest.mark.slow
def test_mismatch_is_measured_and_tis_corrects_it(mixed_batch, tiny_model):
    advantages = torch.where(mixed_batch.loss_mask > 0, torch.randn(mixed_batch.loss_mask.shape,
                             generator=torch.Generator().manual_seed(0)), torch.zeros(()))
    on_policy = Learner(copy.deepcopy(tiny_model), LossConfig(), OptimConfig(lr=1e-4)).update(mixed_batch, advantages)
    # on policy the gap d is the logprobs' rounding alone (one forward against micro-batched ones);
    # its k3 is expm1(d) - d ~ d^2 / 2 (tests/tolerances.py)
    lp_tol = logprob_tol_for(tiny_model, rows_of(mixed_batch))
    assert on_policy["mismatch_abs"] <= lp_tol
    assert on_policy["mismatch_kl"] <= lp_tol ** 2 / 2 + float_tol(torch.float32, 1, lp_tol)
    # a sampler whose logprobs are 0.1 higher than the learner's on every sampled token
    stale = dataclasses.replace(mixed_batch, old_logprobs=mixed_batch.old_logprobs + 0.1 * mixed_batch.loss_mask)
    off = Learner(copy.deepcopy(tiny_model), LossConfig(), OptimConfig(lr=1e-4)).update(stale, advantages)
    # the same rounding, plus float32's of old + 0.1 at the logprobs' size and of the tokens' mean
    tokens = int(mixed_batch.loss_mask.sum())
    tol = (lp_tol + float_tol(torch.float32, 1, float(mixed_batch.old_logprobs.abs().max()))
           + float_tol(torch.float32, tokens, 1.0))
    assert off["mismatch_abs"] == pytest.approx(0.1, abs=tol)
    assert off["ratio"] == pytest.approx(math.exp(-0.1), abs=tol)  # the ratio is against the sampler
    tis = Learner(copy.deepcopy(tiny_model), LossConfig(tis="token"), OptimConfig(lr=1e-4)).update(stale, advantages)
    assert tis["tis_weight"] == pytest.approx(math.exp(-0.1), abs=tol)
    assert tis["ratio"] == pytest.approx(1.0, abs=tol)  # with TIS the ratio is against the learner


@pytest.mark.slow
def test_every_importance_correction_runs_and_a_masked_row_adds_no_gradient(mixed_batch, tiny_model):
    """Row 0's sampler logprobs are 1.0 above the learner's (its geometric-mean ratio is e^-1):
    geometric masking drops it, so the update's gradient is the one where row 0 has no advantage
    (the other rows are on-policy: weight 1, ratio 1). Every correction runs and reports the
    share of sampled tokens it dropped."""
    advantages = torch.where(mixed_batch.loss_mask > 0, torch.ones(()), torch.zeros(()))
    stale = dataclasses.replace(mixed_batch, old_logprobs=mixed_batch.old_logprobs + mixed_batch.loss_mask
                                * torch.tensor([1.0] + [0.0] * (len(mixed_batch) - 1))[:, None])
    share = float(mixed_batch.loss_mask[0].sum() / mixed_batch.loss_mask.sum())
    stats = {}
    for level in CORRECTIONS:
        learner = Learner(copy.deepcopy(tiny_model), LossConfig(tis=level, tis_cap=5.0), OptimConfig(lr=0.0))
        stats[level] = learner.update(stale, advantages)
        assert math.isfinite(stats[level]["pg_loss"])
    assert stats["geo_mask"]["tis_masked"] == pytest.approx(share) and stats["token"]["tis_masked"] == 0
    assert stats["mis_sequence"]["tis_masked"] == 0  # rho = e^-len < cap: kept, weighted
    no_row0 = torch.where(torch.arange(len(mixed_batch))[:, None] == 0, torch.zeros(()), advantages)
    alone = Learner(copy.deepcopy(tiny_model), LossConfig(), OptimConfig(lr=0.0)).update(mixed_batch, no_row0)
    assert stats["geo_mask"]["grad_norm"] == pytest.approx(alone["grad_norm"], rel=1e-4)
    assert stats["token"]["grad_norm"] != pytest.approx(alone["grad_norm"], rel=1e-2)


@pytest.mark.slow
def test_a_shared_value_head_trains_on_the_policys_own_forward(mixed_batch, tiny_model):
    from turnrl.algorithms.learner.critic import new_value_head

    model = copy.deepcopy(tiny_model)
    head = new_value_head(model.config.hidden_size)
    learner = Learner(model, LossConfig(vf_coef=1.0, value_clip=None), OptimConfig(lr=3e-3), value_head=head)
    assert learner.values(mixed_batch).abs().sum() == 0
    targets = mixed_batch.rewards[:, None] * mixed_batch.loss_mask
    zero_adv = torch.zeros_like(mixed_batch.loss_mask)  # no policy gradient: only the value loss moves weights
    losses = []
    for _ in range(40):
        batch = dataclasses.replace(mixed_batch, values=learner.values(mixed_batch))
        losses.append(learner.update(batch, zero_adv, returns=targets)["value_loss"])
    assert losses[-1] < 0.5 * losses[0], losses
    # the value loss reached the shared backbone: the policy's logprobs changed although A = 0
    before = learner.logprobs(mixed_batch)
    fresh = Learner(copy.deepcopy(tiny_model), LossConfig(), OptimConfig()).logprobs(mixed_batch)
    assert not torch.allclose(before, fresh)
    with pytest.raises(ValueError, match="returns"):
        learner.update(mixed_batch, zero_adv)
