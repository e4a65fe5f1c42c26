"""The figures of ``turnrl eval`` (``turnrl.eval.metrics``, ``turnrl.eval.report``) on hand-made
inputs, and the command's refusals that need no model (``turnrl.eval.run``, ``turnrl.cli``)."""

from fractions import Fraction
from itertools import combinations
from pathlib import Path

import pytest

from turnrl.cli import EXIT_USAGE, main
from turnrl.conf.schema import Config
from turnrl.eval.metrics import distinct_n, mean_pass_at_k, pairwise_agreement, pass_at_k, pearson
from turnrl.eval.report import EvalReport, episode_stats, pass_at_ks
from turnrl.eval.run import EvalTarget, eval_config, resolve_checkpoint, run_eval
from turnrl.rollout.trajectory import Trajectory
from turnrl.train.setup import config_yaml


def _brute_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """The fraction of the k-subsets of n samples (the first c correct) that hold a correct one."""
    subsets = list(combinations(range(n), k))
    return Fraction(sum(any(i < c for i in s) for s in subsets), len(subsets))


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_equals_the_enumeration_over_subsets_exactly(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == float(_brute_pass_at_k(n, c, k)), (n, c, k)


def test_pass_at_k_edges():
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 6, 5) == 1.0  # every 5 of 10 holds one of the 6 correct
    assert pass_at_k(7, 3, 1) == 3 / 7
    assert pass_at_k(2000, 1, 1000) == 0.5  # large n: exact, no overflow
    with pytest.raises(ValueError, match=r"pass@5 needs at least k=5 samples per task, got n=4"):
        pass_at_k(4, 1, 5)
    for n, c, k in [(0, 0, 1), (4, 5, 1), (4, -1, 1), (4, 1, 0)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_mean_pass_at_1_is_the_success_rate_exactly_and_pass_at_k_rises_with_k():
    correct, n = [0, 1, 3, 7, 2, 5, 1], 7
    assert mean_pass_at_k(correct, n, 1) == sum(correct) / (len(correct) * n)
    values = pass_at_ks(correct, n, [4, 1, 2, 7, 2])
    assert list(values) == [1, 2, 4, 7]
    assert list(values.values()) == sorted(values.values())
    assert values[7] == 6 / 7  # every task with a correct sample, at the full budget
    with pytest.raises(ValueError, match="at least one task"):
        mean_pass_at_k([], 4, 1)


def test_distinct_n_counts_word_ngrams_within_each_text():
    texts = ["the cat sat", "the cat ran", "dog"]
    assert distinct_n(texts, 1) == 5 / 7  # the, cat, sat, ran, dog of 7 words
    assert distinct_n(texts, 2) == 3 / 4  # (the cat) twice, (cat sat), (cat ran); none across texts
    assert distinct_n(["a  b\n a"], 1) == 2 / 3  # any whitespace separates words
    assert distinct_n(["x y", "x y"], 2) == 1 / 2
    assert distinct_n(["", "one"], 2) == 0.0  # no bigram at all
    with pytest.raises(ValueError, match="n >= 1"):
        distinct_n(["a"], 0)


def test_reward_model_agreement_is_the_proxys_order_of_the_verifiers_pairs():
    verifier = [1.0, 0.0, 1.0, 0.0]
    assert pairwise_agreement([2.0, -1.0, 3.0, 0.5], verifier) == 1.0
    assert pairwise_agreement([-2.0, 1.0, -3.0, 0.5], verifier) == 0.0
    assert pairwise_agreement([1.0, 1.0, 1.0, 0.0], verifier) == 0.75  # the two ties (0,1), (2,1) count 1/2
    assert pairwise_agreement([1.0, 2.0], [1.0, 1.0]) is None  # no pair to order
    assert pearson([1.0, 2.0, 3.0], [2.0, 4.0, 6.0]) == pytest.approx(1.0)
    assert pearson([1.0, 2.0, 3.0], [1.0, 1.0, 1.0]) is None
    with pytest.raises(ValueError, match="one value per episode"):
        pearson([1.0], [1.0, 2.0])


def _trajectory(turn_rewards, success, contents, termination="terminated", **fields) -> Trajectory:
    """A real ``Trajectory`` of ``len(contents)`` turns of 2 sampled ids each."""
    k = len(contents)
    return Trajectory(token_ids=[5, 6, 7] * k, loss_mask=[0, 1, 1] * k, logprobs=[0.0, -1.0, -1.0] * k,
                      turn_spans=[(3 * i + 1, 3 * i + 3) for i in range(k)], turn_rewards=turn_rewards,
                      success=success, group_id=0, task_id="t", termination=termination,
                      messages=[{"role": "user", "content": "go"}]
                      + [{"role": "assistant", "content": c} for c in contents], **fields)


def test_episode_stats_and_the_report_of_hand_made_episodes():
    episodes = [
        _trajectory([0.0, 1.0], True, ["a b", "a c"], tool_calls=2, tool_errors=1, verifier_reward=1.0),
        _trajectory([0.0, 0.0, 0.0], False, ["a", "b", "c"], "truncated", parse_errors=2, length_truncated_turns=1,
                    verifier_reward=0.0),
    ]
    stats = episode_stats(episodes, temperature=0.7)
    assert (stats.episodes, stats.success, stats.turns, stats.tokens_sampled) == (2, 0.5, 2.5, 10)
    assert (stats.tool_calls, stats.tool_calls_per_turn, stats.tool_exec_error_rate) == (1.0, 2 / 5, 0.5)
    assert (stats.parse_errors, stats.tool_parse_error_rate, stats.turn_length_cut_rate) == (1.0, 2 / 5, 1 / 5)
    assert stats.terminations == {"terminated": 1, "truncated": 1}
    # each episode's replies as one text, the user's message left out: "a b a c", "a b c"
    assert (stats.distinct_1, stats.distinct_2) == (3 / 7, 4 / 5)
    rm = stats.reward_model
    assert rm.episodes == 2 and rm.pairwise_agreement == 1.0 and rm.proxy_verifier_gap == 0.0
    assert episode_stats(episodes[:1], None).reward_model.pairwise_agreement is None

    report = EvalReport(model="m", backend="transformers", env="e", split="test", tasks=1, samples=2,
                        max_new_tokens=8, greedy=None, sampled=stats, pass_at_k=pass_at_ks([1], 2, [1, 2]))
    assert '"pass_at_k": {\n  "1": 0.5,\n  "2": 1.0\n }' in report.to_json()
    table = report.to_markdown()
    assert "| metric | sampled (T=0.7, 2 per task) |" in table
    assert "| pass@2 | 1.000 |" in table and "| terminations | terminated 1, truncated 1 |" in table
    assert "| reward model: pairwise agreement | 1.000 |" in table
    with pytest.raises(ValueError, match="at least one trajectory"):
        episode_stats([], None)


def test_a_path_that_is_no_checkpoint_is_refused_saying_what_is_expected(tmp_path, capsys):
    with pytest.raises(ValueError, match="is not a checkpoint: expected a run folder"):
        resolve_checkpoint(tmp_path)
    assert main(["eval", "--checkpoint", str(tmp_path), "--out", str(tmp_path / "out")]) == EXIT_USAGE
    assert "turnrl eval: error:" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_overrides_over_a_saved_run_config_set_keys_not_groups():
    target = EvalTarget(Path("run/checkpoint"), config_yaml=config_yaml(Config()))
    cfg = eval_config(target, ["env.kwargs.n=64", "agent.max_new_tokens=12", "agent.http.base_urls=[http://h:1]"])
    assert (cfg.env.kwargs, cfg.agent.max_new_tokens, cfg.agent.path) == ({"n": 64}, 12, "run/checkpoint")
    assert cfg.agent.http.base_urls == ["http://h:1"]
    with pytest.raises(ValueError, match=r"\['env=calc_math'\]: the checkpoint's run fixes its config groups"):
        eval_config(target, ["env=calc_math"])
    with pytest.raises(ValueError, match="both name the model"):
        eval_config(target, ["agent.path=other"])
    with pytest.raises(ValueError, match="is a sweep"):
        eval_config(target, ["seed=1,2"])
    with pytest.raises(ValueError, match="agent.backend"):  # validate's message
        eval_config(target, ["agent.backend=tpu"])


def test_without_a_checkpoint_the_overrides_compose_as_for_training():
    cfg = eval_config(None, ["env=calc_math", "agent.max_new_tokens=40"])
    assert (cfg.env.id, cfg.agent.max_new_tokens, cfg.agent.path) == ("turnrl/CalcMath-v0", 40, None)


def test_a_k_above_the_samples_is_refused_before_any_work():
    with pytest.raises(ValueError, match=r"pass@k for k=\[8\] needs 1 <= k <= samples per task \(4\)"):
        run_eval(Config(), episodes=2, samples=4, ks=[1, 8])
    with pytest.raises(ValueError, match="nothing to evaluate"):
        run_eval(Config(), episodes=2, samples=0, ks=[], greedy=False)
