"""Episodes the infrastructure ended leave the gradient: under ``drop`` (and ``refill``, whose
leftover failures are dropped) every registered estimator gives each other row exactly what the
batch without the failed episodes gives it, and the failed rows 0; the learner's update is the
update of the batch without them; ``keep`` is the old behaviour (a failure is an episode with
the reward it got). Plus the per-reason rates of ``rollout_metrics``."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import random

import pytest
import torch

from tests.helpers import learner_settings
from turnrl.policies.sampling import SamplingParams
from turnrl.policies.hf.policy import TransformersPolicy
from turnrl.algorithms import ADVANTAGES, VALUE_TARGETS, Learner, collate
from turnrl.algorithms.anchors import NO_ANCHOR, anchor_index
from turnrl.algorithms.learner.critic import Critic, CriticLearner
from turnrl.bench.credit_lab.estimate import LAB_ESTIMATORS
from turnrl.envs import GuessNumberEnv
from turnrl.rollout import RolloutCollector, Task, Trajectory
from turnrl.rollout.metrics import rollout_metrics
from turnrl.rollout.termination import INFRA_FAILURE_POLICIES, INFRA_TERMINATIONS, MODEL_TERMINATIONS

REASONS = sorted(INFRA_TERMINATIONS)
# every estimator of every registry, by (registry, name): a new one is covered when it registers
ESTIMATORS = ([("ADVANTAGES", name) for name in ADVANTAGES.names()]
              + [("VALUE_TARGETS", name) for name in VALUE_TARGETS.names()]
              + [("LAB_ESTIMATORS", name) for name in LAB_ESTIMATORS.names()])
REGISTRIES = {"ADVANTAGES": ADVANTAGES, "VALUE_TARGETS": VALUE_TARGETS, "LAB_ESTIMATORS": LAB_ESTIMATORS}


def episode(rng: random.Random, group_id: int, turns: int | None = None, prefix: str = "s") -> Trajectory:
    """A random episode: a 2-id prompt, then per turn 0-3 sampled ids and 1-2 observation ids;
    turn rewards in {0, 0.5, 1} (intermediate ones too, for MT-GRPO), state keys drawn from few
    strings so that anchor states repeat within and across episodes."""
    turns = rng.randint(1, 4) if turns is None else turns
    ids, mask, logprobs, spans = [5, 5], [0, 0], [0.0, 0.0], []
    for _ in range(turns):
        sampled = rng.randint(0, 3)  # a zero-length turn happens
        spans.append((len(ids), len(ids) + sampled))
        ids += [rng.randint(10, 40) for _ in range(sampled)]
        mask += [1] * sampled
        logprobs += [-rng.random() for _ in range(sampled)]
        observed = rng.randint(1, 2)
        ids += [7] * observed
        mask += [0] * observed
        logprobs += [0.0] * observed
    keys = [rng.choice([f"{prefix}{k}-{v}" for k in range(turns + 1) for v in "ab"] + [None]) for _ in range(turns)]
    return Trajectory(ids, mask, logprobs, spans, [rng.choice([0.0, 0.5, 1.0]) for _ in range(turns)],
                      False, group_id, f"task{group_id}", rng.choice(sorted(MODEL_TERMINATIONS)), state_keys=keys)


def failed(traj: Trajectory, reason: str, longest: bool = False) -> Trajectory:
    """``traj`` ended by the infrastructure (reward 0, as a crash leaves it); ``longest``: with
    more tokens and turns than any row (the batch's width and turn count are then its own)."""
    traj = dataclasses.replace(traj, termination=reason, turn_rewards=[0.0] * traj.num_turns, error="boom")
    if longest:
        extra = 60
        start = len(traj.token_ids)
        traj = dataclasses.replace(
            traj, token_ids=traj.token_ids + [11] * extra, loss_mask=traj.loss_mask + [1] * extra,
            logprobs=traj.logprobs + [-0.5] * extra,
            turn_spans=traj.turn_spans + [(start + 6 * k, start + 6 * k + 5) for k in range(10)],
            turn_rewards=traj.turn_rewards + [0.0] * 10, state_keys=traj.state_keys + ["s0-a"] * 10)
    return traj


def make_batch(seed: int, groups: int = 3, size: int = 4, fail: dict[int, list[int]] | None = None,
               longest: bool = False) -> tuple[list[Trajectory], list[int]]:
    """``groups`` groups of ``size`` episodes; ``fail`` maps a group to the members the
    infrastructure ended (reasons cycling over ``INFRA_TERMINATIONS``). Returns the episodes and
    the rows that failed. Every failure shares state keys with its group (``s0-a`` ...), so an
    anchor numbering that saw it would differ."""
    rng = random.Random(seed)
    trajectories, bad = [], []
    for g in range(groups):
        for member in range(size):
            traj = episode(rng, group_id=10 * g + 3)  # group ids need not be 0..B-1
            if fail and member in fail.get(g, []):
                traj = failed(traj, REASONS[len(bad) % len(REASONS)], longest=longest and not bad)
                bad.append(len(trajectories))
            trajectories.append(traj)
    return trajectories, bad


def critic_values(trajectories: list[Trajectory], width: int) -> torch.Tensor:
    """``[N, width]`` made-up critic values, a function of each episode alone (so a row has the
    same values in both batches), nonzero on every token (a failed row's too)."""
    out = torch.zeros(len(trajectories), width)
    for row, traj in enumerate(trajectories):
        gen = torch.Generator().manual_seed(hash((tuple(traj.token_ids), traj.group_id)) % 2**31)
        out[row, :len(traj.token_ids)] = torch.rand(len(traj.token_ids), generator=gen) * 2 - 1
    return out


def credit(registry: str, name: str, trajectories: list[Trajectory], policy: str = "drop",
           state_similarity: float | None = None) -> tuple[torch.Tensor, object]:
    """The estimator's ``[N, T]`` output on the collated batch (critic values attached when it
    reads them: every estimator is called the same way)."""
    batch = collate(trajectories, pad_id=0, state_similarity=state_similarity, infra_failures=policy)
    batch = dataclasses.replace(batch, values=critic_values(trajectories, batch.loss_mask.shape[1]))
    return REGISTRIES[registry][name](batch), batch


def assert_as_if_absent(registry: str, name: str, trajectories: list[Trajectory], bad: list[int],
                        policy: str = "drop", state_similarity: float | None = None) -> None:
    """Every row but ``bad`` gets exactly (``torch.equal``) its advantage in the batch without
    the ``bad`` rows, 0 past that batch's width; the ``bad`` rows get 0.

    Exact, not approximate: a dropped row adds no entry to any statistic (``groups.py`` keeps
    only valid entries, in row order, so the sums see the same numbers in the same order), and
    a wider or longer batch only pads with entries that are never valid (returns past a row's
    last turn are exactly 0)."""
    full, batch = credit(registry, name, trajectories, policy, state_similarity)
    kept = [row for row in range(len(trajectories)) if row not in bad]
    alone, _ = credit(registry, name, [trajectories[row] for row in kept], policy, state_similarity)
    assert torch.isfinite(full).all()
    assert torch.equal(full[kept, : alone.shape[1]], alone), (registry, name)
    assert not full[kept, alone.shape[1]:].any()
    assert not full[bad].any(), (registry, name, full[bad])
    assert batch.excluded.tolist() == [row in bad for row in range(len(trajectories))]


# Under state_similarity=0.6 the keys below chain: "'aaaabbbb'" is 0.6-similar (difflib ratio) to
# both others, which are 0.2-similar to each other. A failure leading its group with the bridging
# key would merge the other two into its anchor; without it they are two anchors.
SIMILAR, BRIDGE, LEFT, RIGHT = 0.6, "aaaabbbb", "aaaacccc", "ddddbbbb"


def with_bridging_keys(trajectories: list[Trajectory], bad: list[int]) -> list[Trajectory]:
    """The episodes with the bridging key on every turn of each failure and the two keys it
    bridges on the turns of the others of its group, alternating."""
    out = list(trajectories)
    for row in bad:
        group = [r for r, t in enumerate(out) if t.group_id == out[row].group_id]
        out[row] = dataclasses.replace(out[row], state_keys=[BRIDGE] * out[row].num_turns)
        for i, r in enumerate(r for r in group if r not in bad):
            out[r] = dataclasses.replace(out[r], state_keys=[(LEFT, RIGHT)[(i + k) % 2] for k in range(out[r].num_turns)])
    return out


def test_the_bridging_keys_bridge():
    trajectories, bad = make_batch(0, fail={0: [0]})
    trajectories = with_bridging_keys(trajectories, bad)
    group = trajectories[:4]
    merged, apart = anchor_index(group, 8, SIMILAR), anchor_index(group[1:], 8, SIMILAR)
    assert len(set(merged[merged >= 0].tolist())) == 1  # the failure's key leads: one anchor
    assert len(set(apart[apart >= 0].tolist())) == 2
    index = collate(trajectories, pad_id=0, state_similarity=SIMILAR).state_index
    assert torch.equal(index[1:4], apart[:, : index.shape[1]]) and (index[0] == NO_ANCHOR).all()


@pytest.mark.parametrize("registry,name", ESTIMATORS, ids=[f"{r}.{n}" for r, n in ESTIMATORS])
@pytest.mark.parametrize("case", ["one failure", "a failure in several groups", "the longest episode fails",
                                  "an all-failed group", "similar states"])
def test_every_estimator_gives_the_others_what_the_batch_without_the_failures_gives(registry, name, case):
    fail, longest, similarity = {1: [2]}, False, None  # one failure
    if case == "a failure in several groups":
        fail = {0: [0, 3], 1: [1], 2: [0, 1, 2]}
    elif case == "the longest episode fails":
        fail, longest = {1: [0]}, True
    elif case == "an all-failed group":
        fail = {0: [1], 2: [0, 1, 2, 3]}
    elif case == "similar states":  # anchors merged by text similarity: the failure's key would lead a group
        fail, similarity = {0: [0], 1: [0]}, SIMILAR
    for seed in range(3):
        trajectories, bad = make_batch(seed, fail=fail, longest=longest)
        if case == "similar states":
            trajectories = with_bridging_keys(trajectories, bad)
        assert_as_if_absent(registry, name, trajectories, bad, state_similarity=similarity)
        assert_as_if_absent(registry, name, trajectories, bad, policy="refill", state_similarity=similarity)


@pytest.mark.parametrize("registry,name", ESTIMATORS, ids=[f"{r}.{n}" for r, n in ESTIMATORS])
def test_an_all_failed_batch_gets_zero_credit_without_nan(registry, name):
    trajectories, bad = make_batch(5, groups=2, size=3, fail={0: [0, 1, 2], 1: [0, 1, 2]})
    assert bad == list(range(6))
    adv, batch = credit(registry, name, trajectories)
    assert torch.isfinite(adv).all() and not adv.any()
    assert batch.excluded.all() and not batch.loss_mask.any() and (batch.state_index == NO_ANCHOR).all()


def test_a_dropped_row_has_no_tokens_no_anchors_and_a_group_of_its_own():
    trajectories, bad = make_batch(1, fail={0: [1], 1: [2]})
    batch = collate(trajectories, pad_id=0)  # "drop" is the default
    kept = [row for row in range(len(trajectories)) if row not in bad]
    assert not batch.loss_mask[bad].any() and (batch.state_index[bad] == NO_ANCHOR).all()
    others = set(batch.group_index[kept].tolist())
    assert len({int(batch.group_index[row]) for row in bad} | others) == len(others) + len(bad)
    # the anchors of the others are numbered as in the batch without the failures
    assert torch.equal(batch.state_index[kept], anchor_index([trajectories[r] for r in kept], batch.state_index.shape[1]))
    # what the episode was is kept (logs, shapes): tokens, rewards, turns
    for row in bad:
        n = len(trajectories[row].token_ids)
        assert batch.input_ids[row, :n].tolist() == trajectories[row].token_ids
        assert int(batch.num_turns[row]) == trajectories[row].num_turns
    assert batch.trained_rows().tolist() == kept
    assert batch.rows(torch.tensor(bad)).excluded.all()


def test_keep_is_the_old_behaviour_a_failure_is_an_episode_with_the_reward_it_got():
    trajectories, bad = make_batch(2, fail={0: [1], 2: [0]})
    as_episodes = [dataclasses.replace(t, termination="terminated") for t in trajectories]
    kept = collate(trajectories, pad_id=0, infra_failures="keep")
    plain = collate(as_episodes, pad_id=0, infra_failures="keep")
    assert not kept.excluded.any()
    for key, value in vars(plain).items():
        assert (value is None and getattr(kept, key) is None) or torch.equal(getattr(kept, key), value), key
    assert torch.equal(kept.state_index, anchor_index(trajectories, kept.state_index.shape[1]))
    # the failure's reward 0 moves its group's mean: the others' credit differs from drop's
    keep_adv, drop_adv = ADVANTAGES["grpo"](kept), ADVANTAGES["grpo"](collate(trajectories, pad_id=0))
    group = [row for row in range(4) if row != 1]
    assert kept.loss_mask[1].any() and keep_adv[1].any()
    assert not torch.equal(keep_adv[group], drop_adv[group])


def test_an_unknown_policy_is_refused_naming_the_policies():
    trajectories, _ = make_batch(0, groups=1, size=2)
    with pytest.raises(ValueError, match=r"infra_failures='skip' is not one of \['drop', 'keep', 'refill'\]"):
        collate(trajectories, pad_id=0, infra_failures="skip")
    assert set(INFRA_FAILURE_POLICIES) == {"drop", "keep", "refill"}
    assert inspect.signature(collate).parameters["infra_failures"].default == "drop"


def test_rollout_metrics_count_infra_failures_by_reason():
    trajectories, bad = make_batch(3, groups=2, size=5, fail={0: [0, 1, 4], 1: [2]})
    trajectories[5] = dataclasses.replace(trajectories[5], attempts=2)  # sampled again and then fine
    m = rollout_metrics(trajectories)
    assert m["infra_failure_rate"] == pytest.approx(4 / 10)
    counts = {reason: sum(trajectories[row].termination == reason for row in bad) for reason in REASONS}
    assert counts == {"env_error": 2, "step_timeout": 1, "tool_error": 1}
    for reason in REASONS:
        assert m[f"{reason}_rate"] == pytest.approx(counts[reason] / 10)
    assert m["refill_rate"] == pytest.approx(1 / 10)
    clean = rollout_metrics([dataclasses.replace(t, termination="terminated") for t in trajectories])
    assert clean["infra_failure_rate"] == 0 and all(clean[f"{r}_rate"] == 0 for r in REASONS)


# ---------------------------------------------------------------- the learner
# The update of a batch with failed rows is the update of the batch without them, bit for bit:
# an excluded row is in no minibatch and no micro-batch, so the same rows go through the same
# forward (each micro-batch's forward is cut to its own longest row, so a failure longer than
# every other row changes no shape the model computes on) and the aggregation weighs the same
# tokens. The per-token loss tensors are as wide as the batch, so the loss's sum over a row
# holding more zeros may group its terms differently: the loss value agrees within float64
# summation's bound, m * 2^-53 relative for m nonnegative-weighted terms; its gradient with
# respect to each token's loss is the token's weight whatever the grouping, so the gradient,
# its norm and the step are identical.


@pytest.fixture(scope="module")
def episodes(rollouts):
    """Four GuessNumber episodes sampled by the tiny policy (2 tasks x 2 samples), given
    outcomes of both kinds in each group, and the same four plus two more of the second task,
    which the infrastructure ended (one longer, in tokens and turns, than any other row)."""
    sampled, _ = rollouts("guess_number", 1.0)
    trajectories = [dataclasses.replace(t, turn_rewards=[0.0] * (t.num_turns - 1) + [outcome])
                    for t, outcome in zip(sampled, [1.0, 0.0, 0.25, 1.0])]
    extra = [failed(trajectories[2], "env_error", longest=True), failed(trajectories[3], "step_timeout")]
    return trajectories, trajectories[:3] + [extra[0], trajectories[3], extra[1]]


def update(policy_model, batch, advantages, **settings):
    model = copy.deepcopy(policy_model).double()
    learner = Learner(model, *learner_settings(lr=1e-5, **settings))
    metrics = learner.update(batch, advantages)
    return model, learner, metrics


@pytest.mark.slow
@pytest.mark.parametrize("settings", [{}, {"loss_agg": "seq-mean-token-sum-norm", "num_minibatches": 2,
                                           "micro_batch_size": 1}], ids=["token-mean", "minibatches"])
def test_the_update_of_a_batch_with_failures_is_the_update_without_them(policy_model, episodes, settings):
    clean, with_failures = episodes
    small = collate(clean, pad_id=0)
    full = collate(with_failures, pad_id=0)
    assert full.excluded.tolist() == [False, False, False, True, False, True]
    assert full.input_ids.shape[1] > small.input_ids.shape[1]  # the failure is the longest row
    adv_small, adv_full = ADVANTAGES["rloo"](small), ADVANTAGES["rloo"](full)
    kept = [0, 1, 2, 4]
    assert torch.equal(adv_full[kept, : adv_small.shape[1]], adv_small) and adv_small.any()
    # a row in any minibatch would make the loss NaN (weight 0 times a NaN ratio): it is in none
    full.old_logprobs[3] = float("nan")
    model_small, _, m_small = update(policy_model, small, adv_small.double(), **settings)
    model_full, _, m_full = update(policy_model, full, adv_full.double(), **settings)
    assert m_full["nonfinite_updates"] == 0 and m_full["skipped_updates"] == m_small["skipped_updates"] == 0
    assert m_full["grad_norm"] == m_small["grad_norm"] > 0
    for (name, p), q in zip(model_full.named_parameters(), model_small.parameters()):
        assert torch.equal(p, q), name
    # float64 sums of m terms: within m * 2^-53 * sum|terms|; the loss's terms are weights (summing
    # to at most 1 per minibatch) times |A| times a ratio, the others' are positive
    rounding = int(full.loss_mask.numel()) * 2.0 ** -53
    loss_terms = float(adv_small.abs().max()) * m_small["ratio_max"]
    assert m_full["pg_loss"] == pytest.approx(m_small["pg_loss"], rel=0.0, abs=rounding * loss_terms)
    for key in ("entropy", "ratio"):
        assert m_full[key] == pytest.approx(m_small[key], rel=rounding, abs=0.0), key


@pytest.mark.slow
def test_an_all_failed_batch_updates_without_error_and_with_zero_gradient(policy_model, episodes):
    clean, _ = episodes
    everything_failed = [failed(t, reason) for t, reason in zip(clean, REASONS * 2)]
    batch = collate(everything_failed, pad_id=0)
    for name in ADVANTAGES.names():
        if name in VALUE_TARGETS:  # critic-based: values from a made-up critic
            adv = ADVANTAGES[name](dataclasses.replace(batch, values=critic_values(everything_failed,
                                                                                   batch.loss_mask.shape[1])))
        else:
            adv = ADVANTAGES[name](batch)
        assert torch.isfinite(adv).all() and not adv.any(), name
    for skip in (True, False):
        model, _, metrics = update(policy_model, batch, torch.zeros_like(batch.loss_mask, dtype=torch.float64),
                                   skip_zero_grad=skip)
        assert metrics["grad_norm"] == 0.0 and metrics["nonfinite_updates"] == 0.0
        assert all(v == v for v in metrics.values()), metrics  # no NaN figure
        assert metrics["skipped_updates"] == 1.0  # no row to train on: no step, whatever skip_zero_grad says
        before = copy.deepcopy(policy_model).double()
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before.parameters()))  # zero gradient
    # a separate critic: no row to fit, no step, no NaN figure
    critic = CriticLearner(Critic.from_policy(copy.deepcopy(policy_model)), *learner_settings())
    start = copy.deepcopy(critic.critic.state_dict())
    values = critic.values(batch)
    assert not values.any()
    figures = critic.update(batch, torch.zeros_like(values), values)
    assert all(v == v for v in figures.values()) and figures["critic_nonfinite_updates"] == 0.0
    assert all(torch.equal(v, start[k]) for k, v in critic.critic.state_dict().items())


@pytest.mark.slow
def test_an_update_where_every_episode_failed_before_its_first_token_takes_no_step(fresh_model, tokenizer,
                                                                                    renderer):
    """Every env failed in reset: the episodes hold no token, the batch is one padding column
    wide, and the update completes without a forward, a step or a NaN."""
    class ResetFails(GuessNumberEnv):
        def reset(self, *, seed=None, options=None):
            raise ConnectionError("env server down")

    trajectories = RolloutCollector(ResetFails, TransformersPolicy(fresh_model, tokenizer), renderer).collect(
        [Task(0), Task(1)], 2, SamplingParams(max_new_tokens=4))
    assert {t.termination for t in trajectories} == {"env_error"} and all(not t.token_ids for t in trajectories)
    batch = collate(trajectories, tokenizer.pad_token_id)
    assert batch.input_ids.shape == (4, 1) and bool(batch.excluded.all())
    before = [p.detach().clone() for p in fresh_model.parameters()]
    metrics = Learner(fresh_model, *learner_settings(lr=1e-3)).update(batch, torch.zeros_like(batch.loss_mask))
    assert metrics["skipped_updates"] == 1.0 and metrics["nonfinite_updates"] == 0.0
    assert all(v == v and abs(v) != float("inf") for v in metrics.values()), metrics
    assert all(torch.equal(a, p) for a, p in zip(before, fresh_model.parameters()))
