"""Every advantage estimator against a hand-computed 2-group, 3-turn example, and against a
plain-loop reference on random batches (ragged turns, zero-length turns, repeated states)."""

import math
import random

import pytest
import torch

from turnrl.algorithms import ADVANTAGES, VALUE_TARGETS, collate
from turnrl.algorithms.anchors import NO_ANCHOR, anchor_index
from turnrl.rollout import Trajectory

from tests.tolerances import float_tol

TURN_LEN, OBS_LEN, PROMPT = 2, 3, 2


def traj(rewards, states, group_id, turn_lens=None):
    """Prompt ids, then per turn ``turn_lens[k]`` sampled ids followed by observation ids."""
    turn_lens = turn_lens or [TURN_LEN] * len(rewards)
    ids, mask, spans = [5] * PROMPT, [0] * PROMPT, []
    for length in turn_lens:
        spans.append((len(ids), len(ids) + length))
        ids += [6] * length + [7] * OBS_LEN
        mask += [1] * length + [0] * OBS_LEN
    return Trajectory(ids, mask, [0.0] * len(ids), spans, [float(r) for r in rewards], False, group_id,
                      f"task{group_id}", "terminated", state_keys=list(states))


# Group 0 (one task, three samples) and group 1 (two samples). Rewards per turn, states per turn.
#   a: r = [0, 0, 1]    states s0 s1 s2   R = 1
#   b: r = [0.5, 0]     states s0 s1      R = 0.5  (two turns: stopped early)
#   c: r = [0, 0, 0]    states s0 s3 s4   R = 0
#   d: r = [1]          states t0         R = 1
#   e: r = [0, 0.5, 0]  states t0 t1 t1   R = 0.5  (t1 visited twice)
EXAMPLE = [traj([0, 0, 1], ["s0", "s1", "s2"], 0), traj([0.5, 0], ["s0", "s1"], 0),
           traj([0, 0, 0], ["s0", "s3", "s4"], 0), traj([1], ["t0"], 1), traj([0, 0.5, 0], ["t0", "t1", "t1"], 1)]


@pytest.fixture
def batch():
    return collate(EXAMPLE, pad_id=0)


def per_turn(adv, batch):
    """Each row's advantage per turn (checks the value is constant on the turn's tokens and 0
    on every token outside the loss mask)."""
    assert torch.all(adv[batch.loss_mask == 0] == 0)
    rows = []
    for i in range(len(batch)):
        turns = []
        for k in range(int(batch.num_turns[i])):
            on = adv[i][batch.turn_index[i] == k]
            assert torch.allclose(on, on[0].expand_as(on))
            turns.append(float(on[0]))
        rows.append(turns)
    return rows


def approx(rows, expected, tol=1e-4):
    # not rounding: the hand-computed values are typed to 5-6 significant digits and leave out the
    # std's eps = 1e-6 (relative 1e-6 / std >= 0.25 here), |A| <= 2: at most ~2e-5 off
    assert len(rows) == len(expected)
    for got, want in zip(rows, expected):
        assert got == pytest.approx(want, abs=tol), (rows, expected)


def test_grpo(batch):
    # group 0: R = [1, .5, 0], mean .5, unbiased std sqrt((.25 + 0 + .25) / 2) = .5 -> [1, 0, -1]
    # group 1: R = [1, .5], mean .75, std sqrt(2 * .0625 / 1) = .35355 -> [.7071, -.7071]
    s = 1 / math.sqrt(2)
    approx(per_turn(ADVANTAGES["grpo"](batch), batch), [[1] * 3, [0] * 2, [-1] * 3, [s], [-s] * 3])


def test_dr_grpo(batch):
    # R - mean_g R: group 0 [.5, 0, -.5], group 1 [.25, -.25]
    approx(per_turn(ADVANTAGES["dr_grpo"](batch), batch), [[.5] * 3, [0] * 2, [-.5] * 3, [.25], [-.25] * 3])


def test_rloo(batch):
    # a: 1 - (.5 + 0)/2 = .75; b: .5 - (1 + 0)/2 = 0; c: 0 - (1 + .5)/2 = -.75; d: 1 - .5; e: .5 - 1
    approx(per_turn(ADVANTAGES["rloo"](batch), batch), [[.75] * 3, [0] * 2, [-.75] * 3, [.5], [-.5] * 3])


def test_reinforce_pp(batch):
    # gamma = 1 turn returns-to-go: a [1, 1, 1], b [.5, 0], c [0, 0, 0], d [1], e [.5, .5, 0]; two
    # tokens per turn, 24 tokens: eight 1s, six .5s, ten 0s. mean = 11/24 = .458333;
    # unbiased var = (9.5 - 24 * mean^2) / 23 = .193841, std = .440274.
    # 1 -> (1 - .458333)/.440274 = 1.23031; .5 -> .094638; 0 -> -1.04103
    hi, mid, lo = 1.23031, .094638, -1.04103
    approx(per_turn(ADVANTAGES["reinforce_pp"](batch), batch), [[hi] * 3, [mid, lo], [lo] * 3, [hi], [mid, mid, lo]])


def test_reinforce_pp_baseline(batch):
    # group-centred returns c: a .5 (6 tokens), b 0 (4), c -.5 (6), d .25 (2), e -.25 (6).
    # token mean = (3 + 0 - 3 + .5 - 1.5) / 24 = -1/24; sum of squares 3.5;
    # var = (3.5 - 24 / 576) / 23 = .150362, std = .387765; A = (c + 1/24) / std
    a, b, c, d, e = ((v + 1 / 24) / .387765 for v in (.5, 0, -.5, .25, -.25))
    approx(per_turn(ADVANTAGES["reinforce_pp_baseline"](batch), batch), [[a] * 3, [b] * 2, [c] * 3, [d], [e] * 3])


def test_turn_returns_leave_one_out_baseline_at_each_turn(batch):
    # G: a [1, 1, 1], b [.5, 0], c [0, 0, 0], d [1], e [.5, .5, 0]
    # turn 0: a 1 - (.5 + 0)/2 = .75, b .5 - (1 + 0)/2 = 0, c 0 - (1 + .5)/2 = -.75
    # turn 1: a 1 - (0 + 0)/2 = 1, b 0 - (1 + 0)/2 = -.5, c 0 - (1 + 0)/2 = -.5
    # turn 2: only a and c reached it: a 1 - 0 = 1, c 0 - 1 = -1
    # group 1 turn 0: d 1 - .5 = .5, e .5 - 1 = -.5; turns 1, 2: e alone, baseline 0: .5, 0
    approx(per_turn(ADVANTAGES["turn_returns"](batch), batch),
           [[.75, 1, 1], [0, -.5], [-.75, -.5, -1], [.5], [-.5, .5, 0]])


def test_turn_returns_discount(batch):
    # gamma = .5: a [.25, .5, 1], b [.5, 0], c 0s; turn 0: a .25 - (.5 + 0)/2 = 0, b .5 - .125, c -.375
    adv = per_turn(ADVANTAGES["turn_returns"](batch, gamma=0.5), batch)
    assert adv[0][0] == pytest.approx(0) and adv[1][0] == pytest.approx(.375) and adv[2][0] == pytest.approx(-.375)


def test_anchor_groups_of_the_example(batch):
    idx = batch.state_index
    s0, s1 = idx[0, 0], idx[0, 1]
    assert idx[1, 0] == s0 and idx[2, 0] == s0 and idx[1, 1] == s1           # a, b, c share s0; a, b share s1
    assert len({int(idx[0, 2]), int(idx[2, 1]), int(idx[2, 2]), int(s0), int(s1)}) == 5  # s2, s3, s4 alone
    assert idx[3, 0] == idx[4, 0] and idx[4, 1] == idx[4, 2] != idx[4, 0]     # t0 shared, t1 twice in e
    assert idx[3, 0] not in idx[:3]                                           # groups never share anchors
    assert idx[1, 2] == NO_ANCHOR and idx[3, 1] == NO_ANCHOR                  # padded turns


def test_gigpo_mean_normalisation(batch):
    # gamma = .5 step returns: a [.25, .5, 1], b [.5, 0], c [0, 0, 0], d [1], e [.25, .5, 0]
    # anchors: s0 {a .25, b .5, c 0} mean .25 -> a 0, b .25, c -.25; s1 {a .5, b 0} mean .25 -> .25, -.25
    #          s2, s3, s4 alone -> 0; t0 {d 1, e .25} mean .625 -> .375, -.375; t1 {e .5, e 0} -> .25, -.25
    # episode (mean): a .5, b 0, c -.5, d .25, e -.25;  A = episode + omega * step, omega = 1
    adv = ADVANTAGES["gigpo"](batch, omega=1.0, gamma=0.5, normalize="mean")
    approx(per_turn(adv, batch), [[.5, .75, .5], [.25, -.25], [-.75, -.5, -.5], [.625], [-.625, 0, -.5]])


def test_gigpo_std_normalisation_and_omega(batch):
    # s0 returns [.25, .5, 0]: std sqrt((0 + .0625 + .0625)/2) = .25 -> a 0, b 1, c -1
    # episode (std): group 0 [1, 0, -1]; with omega = .5: a0 = 1 + 0, b0 = 0 + .5, c0 = -1 - .5
    adv = per_turn(ADVANTAGES["gigpo"](batch, omega=0.5, gamma=0.5, normalize="std"), batch)
    assert [adv[0][0], adv[1][0], adv[2][0]] == pytest.approx([1, .5, -1.5], abs=1e-4)
    assert adv[0][2] == pytest.approx(1, abs=1e-4)  # s2 alone: episode term only


def test_mt_grpo(batch):
    # outcome = last-turn reward: a 1, b 0, c 0 -> mean 1/3, std .57735 -> A^O [1.1547, -.57735, -.57735]
    #                             d 1, e 0 -> [.7071, -.7071]
    # intermediate rewards over all samples of the group, 0 where a sample has none at the turn:
    # group 0 turn 0: a 0, b .5, c 0 -> mean 1/6, std sqrt((2/36 + 4/36)/2) = .288675 -> [-.57735, 1.1547,
    # -.57735]; turn 1: a 0, b 0 (its final turn), c 0 -> 0. group 1 turn 0: d 0 (final), e 0 -> 0;
    # turn 1: d 0 (ended), e .5 -> mean .25, std .35355 -> e +.7071
    # non-final turn: A^O + turn_coef (1) * A^T; final turn: A^O
    p, m = 1.1547, .57735
    s = 1 / math.sqrt(2)
    approx(per_turn(ADVANTAGES["mt_grpo"](batch), batch),
           [[-m + p, p, p], [p - m, -m], [-m - m, -m, -m], [s], [-s, -s + s, -s]])


def test_mt_grpo_reached(batch):
    # as test_mt_grpo, but each turn's statistics are over the samples that have an intermediate
    # reward there: group 0 the same (a, b, c at turn 0; a, c at turn 1, both 0); e's intermediate
    # turns are alone in group 1 -> A^T = 0. non-final turn: A^T + outcome_weight (1) * A^O
    p, m = 1.1547, .57735
    s = 1 / math.sqrt(2)
    approx(per_turn(ADVANTAGES["mt_grpo_reached"](batch), batch),
           [[-m + p, p, p], [p - m, -m], [-m - m, -m, -m], [s], [-s, -s, -s]])


def test_mt_grpo_without_intermediate_rewards_is_grpo():
    # an outcome paid at the last turn only (the long envs of the credit suite): every A^T is 0,
    # so MT-GRPO's advantages are GRPO's, bit for bit
    rng = random.Random(3)
    trajs = [traj([0] * (n - 1) + [rng.choice([0.0, 1.0])], [f"s{k}" for k in range(n)], i // 4)
             for i, n in enumerate(rng.randint(1, 5) for _ in range(16))]
    sparse = collate(trajs, pad_id=0)
    assert torch.equal(ADVANTAGES["mt_grpo"](sparse), ADVANTAGES["grpo"](sparse))
    assert torch.equal(ADVANTAGES["mt_grpo_reached"](sparse), ADVANTAGES["grpo"](sparse))


def test_observation_tokens_never_cut_a_return():
    # one sample per group would give 0 for group-relative estimators; use two groups in one
    # trajectory pair where only the long observation gaps differ
    short = collate([traj([0, 0, 1], [1, 2, 3], 0), traj([0, 0, 0], [1, 2, 3], 0)], pad_id=0)
    global OBS_LEN
    saved, OBS_LEN = OBS_LEN, 40
    try:
        long = collate([traj([0, 0, 1], [1, 2, 3], 0), traj([0, 0, 0], [1, 2, 3], 0)], pad_id=0)
    finally:
        OBS_LEN = saved
    for name in ("turn_returns", "gigpo", "reinforce_pp", "mt_grpo", "mt_grpo_reached"):
        a, b = per_turn(ADVANTAGES[name](short), short), per_turn(ADVANTAGES[name](long), long)
        approx(a, b)
        assert a[0][0] != 0  # the first turn is credited with the last turn's reward


def test_edge_cases_groups_of_one_equal_rewards_zero_length_turns():
    single = collate([traj([0, 1], ["x", "y"], 0), traj([1], ["z"], 1)], pad_id=0)
    for name in ("grpo", "dr_grpo", "rloo", "gigpo", "mt_grpo", "mt_grpo_reached"):
        assert torch.all(ADVANTAGES[name](single) == 0), name
    # turn_returns has no peer at all: the baseline is 0, so the turns keep their plain returns
    approx(per_turn(ADVANTAGES["turn_returns"](single), single), [[1, 1], [1]])
    equal = collate([traj([0, 1], ["x", "y"], 0), traj([0, 1], ["x", "y"], 0)], pad_id=0)
    for name in set(ADVANTAGES.names()) - set(VALUE_TARGETS.names()):  # GAE is not group-relative
        assert torch.allclose(ADVANTAGES[name](equal), torch.zeros(1)), name
    zero_len = collate([traj([0, 1], ["x", "y"], 0, turn_lens=[0, 2]), traj([0, 0], ["x", "w"], 0)], pad_id=0)
    zero_len.values = torch.rand(zero_len.loss_mask.shape) * zero_len.loss_mask
    for name in ADVANTAGES.names():
        adv = ADVANTAGES[name](zero_len)
        assert torch.isfinite(adv).all() and torch.all(adv[zero_len.loss_mask == 0] == 0), name


def test_similarity_grouping_merges_near_identical_states():
    trajs = [traj([1], ["grid: P..G#"], 0), traj([0], ["grid: P..G."], 0), traj([0], ["grid: ....X"], 0)]
    exact = anchor_index(trajs, 1)
    assert len(set(exact[:, 0].tolist())) == 3
    similar = anchor_index(trajs, 1, similarity=0.85)
    assert similar[0, 0] == similar[1, 0] != similar[2, 0]
    with pytest.raises(ValueError, match="similarity"):
        anchor_index(trajs, 1, similarity=1.5)


# ---------------------------------------------------------------- loop references
def loop_returns(rewards, gamma):
    out, running = [0.0] * len(rewards), 0.0
    for k in range(len(rewards) - 1, -1, -1):
        running = rewards[k] + gamma * running
        out[k] = running
    return out


def mean_std(values):
    m = sum(values) / len(values)
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return m, s


def loop_reference(name, trajs, eps=1e-6, gamma=1.0, omega=1.0, normalize="std", turn_coef=1.0,
                   outcome_weight=1.0):
    """Per-row, per-turn advantages computed with plain Python loops from the formulas."""
    groups = {}
    for i, t in enumerate(trajs):
        groups.setdefault(t.group_id, []).append(i)
    R = [t.reward for t in trajs]
    G = [loop_returns(t.turn_rewards, gamma) for t in trajs]
    out = []
    for i, t in enumerate(trajs):
        members = groups[t.group_id]
        others = [j for j in members if j != i]
        m, s = mean_std([R[j] for j in members])
        if name == "grpo":
            out.append([(R[i] - m) / (s + eps)] * t.num_turns)
        elif name == "rloo":
            out.append([R[i] - sum(R[j] for j in others) / len(others) if others else 0.0] * t.num_turns)
        elif name == "turn_returns":
            row = []
            for k in range(t.num_turns):
                reached = [j for j in others if trajs[j].num_turns > k]
                row.append(G[i][k] - (sum(G[j][k] for j in reached) / len(reached) if reached else 0.0))
            out.append(row)
        elif name == "gigpo":
            normalize = {"mean_norm": "mean", "mean_std_norm": "std"}.get(normalize, normalize)
            episode = (R[i] - m) / ((s + eps) if normalize == "std" else 1.0)
            row = []
            for k in range(t.num_turns):
                peers = [G[j][kk] for j in members for kk in range(trajs[j].num_turns)
                         if trajs[j].state_keys[kk] == t.state_keys[k]]
                sm, ss = mean_std(peers)
                row.append(episode + omega * (G[i][k] - sm) / ((ss + eps) if normalize == "std" else 1.0))
            out.append(row)
        elif name in ("mt_grpo", "mt_grpo_reached"):
            outcome = {j: trajs[j].turn_rewards[-1] for j in members}
            om, os_ = mean_std(list(outcome.values()))
            a_o = (outcome[i] - om) / (os_ + eps)
            row = []
            for k in range(t.num_turns):
                if k == t.num_turns - 1:
                    row.append(a_o)
                elif name == "mt_grpo":  # every sample of the group, 0 without an intermediate reward at k
                    peers = [trajs[j].turn_rewards[k] if trajs[j].num_turns - 1 > k else 0.0 for j in members]
                    tm, ts = mean_std(peers)
                    row.append(a_o + turn_coef * (t.turn_rewards[k] - tm) / (ts + eps))
                else:  # the samples with an intermediate reward at k
                    peers = [trajs[j].turn_rewards[k] for j in members if trajs[j].num_turns - 1 > k]
                    tm, ts = mean_std(peers)
                    row.append((t.turn_rewards[k] - tm) / (ts + eps) + outcome_weight * a_o)
            out.append(row)
    return out


def random_batch(rng):
    trajs = []
    for g in range(rng.randint(1, 4)):
        for _ in range(rng.randint(1, 5)):
            k = rng.randint(1, 4)
            rewards = [rng.choice([0, 0, 0.5, 1, -1]) for _ in range(k)]
            states = [rng.choice("abc") for _ in range(k)]
            lens = [rng.choice([0, 1, 2, 3]) for _ in range(k)]
            trajs.append(traj(rewards, states, g, turn_lens=lens))
    return trajs


@pytest.mark.parametrize("name,kwargs", [
    ("grpo", {}), ("rloo", {}), ("turn_returns", {"gamma": 1.0}), ("turn_returns", {"gamma": 0.7}),
    ("gigpo", {"gamma": 0.9, "omega": 0.5, "normalize": "std"}), ("gigpo", {"gamma": 1.0, "normalize": "mean"}),
    ("gigpo", {"gamma": 0.8, "normalize": "mean_norm"}),
    ("mt_grpo", {}), ("mt_grpo", {"turn_coef": 0.5}), ("mt_grpo_reached", {}), ("mt_grpo_reached", {"outcome_weight": 0.3}),
])
def test_vectorised_matches_the_loop_reference_on_random_batches(name, kwargs):
    rng = random.Random(0)
    for _ in range(30):
        trajs = random_batch(rng)
        batch = collate(trajs, pad_id=0)
        adv = ADVANTAGES[name](batch, **kwargs)
        expected = loop_reference(name, trajs, **kwargs)
        for i, t in enumerate(trajs):
            for k, (start, end) in enumerate(t.turn_spans):
                # float64 statistics (tests/algorithms/test_group_statistics.py) cast once to float32
                # against a float64 loop: float32's rounding at the advantage's size (at least 1)
                tol = float_tol(torch.float32, len(trajs), max(1.0, abs(expected[i][k])))
                assert torch.allclose(adv[i, start:end], torch.tensor(expected[i][k]).expand(end - start),
                                      rtol=0, atol=tol), (name, i, k)
        assert torch.all(adv[batch.loss_mask == 0] == 0)
