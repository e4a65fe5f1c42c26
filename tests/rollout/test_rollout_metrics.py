"""rollout_metrics / unique_ngram_rate on hand-made trajectories."""

import pytest

from turnrl.rollout import Trajectory
from turnrl.rollout.metrics import rollout_metrics, unique_ngram_rate


def traj(sampled_turns, rewards, success=False, termination="terminated", prompt=(7, 7), **counts):
    """A trajectory of ``prompt`` ids, then each turn's sampled ids after a 2-id header."""
    ids, mask, spans = list(prompt), [0] * len(prompt), []
    for turn in sampled_turns:
        ids += [8, 8]
        mask += [0, 0]
        spans.append((len(ids), len(ids) + len(turn)))
        ids += list(turn)
        mask += [1] * len(turn)
    logprobs = [-0.1 * m for m in mask]
    return Trajectory(token_ids=ids, loss_mask=mask, logprobs=logprobs, turn_spans=spans, turn_rewards=rewards,
                      success=success, group_id=0, task_id="t", termination=termination, **counts)


def test_unique_ngram_rate_on_hand_made_sequences():
    assert unique_ngram_rate([[1, 2, 3, 4]]) == 1.0
    assert unique_ngram_rate([[1, 2, 3, 1, 2, 3]]) == pytest.approx(3 / 4)  # 123 231 312 123
    assert unique_ngram_rate([[5, 5, 5, 5, 5]]) == pytest.approx(1 / 3)
    assert unique_ngram_rate([[1, 2, 3], [1, 2, 3]]) == pytest.approx(1 / 2)  # copies across the batch
    assert unique_ngram_rate([[1, 2, 3], [2, 3, 1]]) == 1.0  # n-grams never span two sequences
    assert unique_ngram_rate([[1, 2], [3]]) == 1.0  # nothing long enough: no repeats
    assert unique_ngram_rate([[1, 2, 1, 2]], n=2) == pytest.approx(2 / 3)
    assert unique_ngram_rate([]) == 1.0


def test_rollout_metrics_on_constructed_trajectories():
    trajectories = [
        traj([[1, 2, 3], [4, 5]], [0.0, 1.0], success=True, tool_calls=2, tool_errors=1, parse_errors=0),
        traj([[1, 2, 3]], [0.0], termination="truncated", parse_errors=1, length_truncated_turns=1),
        traj([[9], [9], [9]], [0.0, 0.0, 0.5], termination="env_error", tool_calls=2, tool_errors=0,
             parse_errors=1, error="RuntimeError('x')"),
        traj([[6, 6, 6, 6]], [0.0], termination="context_length", length_truncated_turns=1, empty_actions=1),
    ]
    m = rollout_metrics(trajectories)
    # reward and success are the policy's: over the 3 episodes the model ended (not the env_error one)
    assert m["reward"] == pytest.approx((1.0 + 0.0 + 0.0) / 3)
    assert m["success"] == pytest.approx(1 / 3)
    assert m["episodes"] == 4 and m["infra_failure_rate"] == pytest.approx(1 / 4)
    assert m["turns"] == pytest.approx(7 / 4)
    assert m["gen_tokens"] == pytest.approx((5 + 3 + 3 + 4) / 4)
    assert m["tool_calls"] == pytest.approx(4 / 4)
    assert m["tool_parse_error_rate"] == pytest.approx(2 / 7)  # per turn
    assert m["tool_exec_error_rate"] == pytest.approx(1 / 4)  # per call
    assert m["truncation_rate"] == pytest.approx(1 / 4)
    assert m["turn_length_cut_rate"] == pytest.approx(2 / 7)
    assert m["empty_action_rate"] == pytest.approx(1 / 7)  # per turn
    assert m["env_error_rate"] == pytest.approx(1 / 4)
    assert m["context_limit_rate"] == pytest.approx(1 / 4)
    # sampled ids only (prompt 7s and header 8s are not text the policy wrote), per trajectory:
    # [1,2,3,4,5] -> 3 grams; [1,2,3] -> 1 (a repeat of 123); [9,9,9] -> 1; [6,6,6,6] -> 2 (one distinct)
    assert m["unique_ngram_rate"] == pytest.approx(5 / 7)


def test_rollout_metrics_without_turns_or_calls_do_not_divide_by_zero():
    m = rollout_metrics([traj([], [], termination="env_error")])
    assert m["turns"] == 0 and m["tool_parse_error_rate"] == 0 and m["tool_exec_error_rate"] == 0
    assert m["env_error_rate"] == 1.0 and m["unique_ngram_rate"] == 1.0
    assert rollout_metrics([])["reward"] == 0.0


def test_success_leaves_out_what_the_infrastructure_ended_per_env_too():
    ok, lost = traj([[1]], [1.0], success=True), traj([[2]], [0.0], termination="step_timeout")
    ok.env_id = lost.env_id = "a"
    m = rollout_metrics([ok, lost, traj([[3]], [0.0], termination="tool_error")])
    assert m["success"] == 1.0 and m["reward"] == 1.0 and m["infra_failure_rate"] == pytest.approx(2 / 3)
    assert m["success@a"] == 1.0 and m["episodes@a"] == 2.0
    everything_failed = rollout_metrics([traj([[2]], [0.0], termination="env_error")])
    assert everything_failed["success"] == 0.0 and everything_failed["infra_failure_rate"] == 1.0


def test_trajectory_rejects_inconsistent_lengths():
    with pytest.raises(ValueError, match="one length"):
        Trajectory([1, 2], [0], [0.0, 0.0], [], [], False, 0, "t", "terminated")
    with pytest.raises(ValueError, match="turn rewards"):
        Trajectory([1, 2], [0, 1], [0.0, 0.0], [(1, 2)], [], False, 0, "t", "terminated")
