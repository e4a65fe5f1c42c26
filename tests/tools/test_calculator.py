import pytest

from turnrl.tools import calculator
from turnrl.tools.calculator import evaluate, format_number


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("37 * 24", "888"),
        ("2 + 3 * 4", "14"),
        ("(2 + 3) * 4", "20"),
        ("-5 - -3", "-2"),
        ("7 / 2", "3.5"),
        ("6 / 3", "2"),
        ("1 / 3", "0.333333"),
        ("2 / 3", "0.666667"),
        ("7 // 2", "3"),
        ("-7 % 3", "2"),
        ("2 ** 10", "1024"),
        ("2 ** 0.5", "1.414214"),
        ("1.25 * 4", "5"),
        ("10 ** 100 // 10 ** 98", "100"),
    ],
)
def test_correct_results(expression, expected):
    assert calculator(expression) == expected


def test_exact_integer_arithmetic():
    assert evaluate("123456789 * 987654321") == 123456789 * 987654321
    assert format_number(1e20) == "1e+20"
    assert format_number(1.5e-8) == "1.5e-08"


@pytest.mark.parametrize(
    "expression, message",
    [
        ("x + 1", "names are not allowed"),
        ("abs(-1)", "function calls are not allowed"),
        ("__import__('os')", "function calls are not allowed"),
        ("9 ** 9 ** 9", "too large"),
        ("10 ** 101", "too large"),
        ("(10 ** 60) * (10 ** 60)", "too large"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("2 +", "invalid syntax"),
        ("", "empty"),
        ("'a' * 3", "not a number"),
        ("1 << 3", "not allowed"),
        ("(-8) ** 0.5", "no real result"),
        ("1" * 600, "longer than"),
    ],
)
def test_refusals_raise_value_error(expression, message):
    with pytest.raises(ValueError, match=message):
        calculator(expression)
