"""A safe arithmetic calculator tool (``ast``-based, no names, no calls)."""

from __future__ import annotations

import ast
import math
import operator
from types import MappingProxyType

from turnrl.tools.tool import tool

MAX_EXPRESSION_CHARS = 500
MAX_MAGNITUDE = 10**100
"""Results (and intermediate values) beyond this magnitude are refused."""

_BINARY = MappingProxyType(
    {
        ast.Add: operator.add,
        ast.Sub: operator.sub,
        ast.Mult: operator.mul,
        ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv,
        ast.Mod: operator.mod,
        ast.Pow: operator.pow,
    }
)
_UNARY = MappingProxyType({ast.USub: operator.neg, ast.UAdd: operator.pos})
_ALLOWED = "numbers, + - * / // % **, unary minus and parentheses"

Number = int | float


def evaluate(expression: str) -> Number:
    """Evaluate an arithmetic expression exactly (ints stay ints).

    Args:
        expression: e.g. ``"37 * (24 - 3) ** 2"``.

    Returns:
        The int or float value.

    Raises:
        ValueError: On bad syntax, names/calls/other syntax, division by zero,
            non-real results, or values beyond ``MAX_MAGNITUDE``; the message
            says what was wrong.
    """
    if not isinstance(expression, str):
        raise ValueError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters; split it up")
    if not expression.strip():
        raise ValueError(f"expression is empty; write e.g. '37 * 24' using {_ALLOWED}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ValueError(f"invalid syntax in {expression!r}; use only {_ALLOWED}") from None
    return _eval(tree.body, expression)


def format_number(value: Number) -> str:
    """Render a result: integers as ``"888"``, floats rounded to 6 decimals.

    Integral floats below 1e15 print as integers (``6/3`` -> ``"2"``); trailing
    zeros are stripped (``7/2`` -> ``"3.5"``, ``1/3`` -> ``"0.333333"``); very large
    or very small magnitudes use 6 significant digits (``"1e+20"``, ``"1.5e-08"``).
    """
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if abs(value) >= 1e15 or abs(value) < 1e-6:
        return f"{value:.6g}"
    return f"{value:.6f}".rstrip("0").rstrip(".")


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Args:
        expression: Arithmetic with numbers, + - * / // % ** and parentheses, e.g. "37 * 24".
    """
    return format_number(evaluate(expression))


def _eval(node: ast.AST, source: str) -> Number:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{value!r} is not a number; use only {_ALLOWED}")
        return _checked(value, source)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand, source))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, source), _eval(node.right, source)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            result = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ValueError(f"division by zero in {source!r}") from None
        except OverflowError:
            raise ValueError(f"result of {source!r} is too large") from None
        return _checked(result, source)
    if isinstance(node, ast.Name):
        raise ValueError(f"names are not allowed (found {node.id!r}); use only {_ALLOWED}")
    if isinstance(node, ast.Call):
        raise ValueError(f"function calls are not allowed; use only {_ALLOWED}")
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        raise ValueError(f"operator {type(node.op).__name__} is not allowed; use only {_ALLOWED}")
    raise ValueError(f"{type(node).__name__} is not allowed in {source!r}; use only {_ALLOWED}")


def _check_power(base: Number, exponent: Number) -> None:
    """Refuse powers whose result would exceed MAX_MAGNITUDE, before computing them."""
    if abs(base) > 1 and exponent > 0:
        if exponent * math.log10(abs(base)) > math.log10(MAX_MAGNITUDE):
            raise ValueError(f"{base} ** {exponent} is too large (limit 1e100)")


def _checked(value: object, source: str) -> Number:
    if isinstance(value, complex):
        raise ValueError(f"{source!r} has no real result")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"result of {source!r} is not a finite number")
    if abs(value) > MAX_MAGNITUDE:
        raise ValueError(f"result of {source!r} is too large (limit 1e100)")
    return value
