"""The run's "after" figure is the mean of its last evaluations after the first one: the first
(before any RL step) is the "before" and never averaged into the "after"."""

import pytest

from turnrl.train.report import after_value, before_after_table


def evals(*success):
    return [{"success": s, "reward": s, "turns": 1.0, "gen_tokens": 1.0, "tool_parse_error_rate": 0.0,
             "tool_exec_error_rate": 0.0, "truncation_rate": 0.0} for s in success]


def test_after_is_the_last_three_evaluations_after_the_first():
    assert after_value(evals(0.1, 0.5, 0.6, 0.7, 0.8), "success") == pytest.approx(0.7)
    assert after_value(evals(0.1, 0.5, 0.7), "success") == pytest.approx(0.6)  # not (0.1 + 0.5 + 0.7) / 3
    assert after_value(evals(0.1, 0.5), "success") == pytest.approx(0.5)
    assert after_value(evals(0.3), "success") == pytest.approx(0.3)  # no evaluation after it: before = after
    assert before_after_table(evals(0.1, 0.5, 0.7)).endswith("held-out success: before 0.10 after 0.60")
