"""A safe arithmetic evaluator (an `ast` walker) and the seeded expression generator of `CalcEnv`.

Only numbers, `+ - * / // % **`, unary `+ -` and parentheses are evaluated; names, calls, attribute
access, subscripts, strings and everything else are refused with `ExpressionError`. Sizes are
bounded so no expression can take long: the text length, the exponent, and the magnitude of every
intermediate result.

>>> safe_eval("2 + 3 * (4 - 1)"), safe_eval("7 / 2"), safe_eval("-2 ** 3")
(11, 3.5, -8)
"""

from __future__ import annotations

import ast
import math
import operator
import random
import time
from collections.abc import Callable
from typing import Any

from producers.envs.errors import ExpressionError

MAX_CHARS = 500
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10**100

Number = int | float

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_REFUSED = {
    ast.Name: "names are not allowed",
    ast.Call: "function calls are not allowed",
    ast.Attribute: "attribute access is not allowed",
    ast.Subscript: "subscripts are not allowed",
}


def safe_eval(expression: str, deadline: float | None = None) -> Number:
    """The value of an arithmetic `expression`; `ExpressionError` says why one is refused.
    `deadline` (a `time.monotonic()` value) stops the evaluation once passed."""
    if not isinstance(expression, str):
        raise ExpressionError(f"expression: expected a string, got {type(expression).__name__}")
    if len(expression) > MAX_CHARS:
        raise ExpressionError(f"expression of {len(expression)} characters; at most {MAX_CHARS}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ExpressionError(
            f"not an arithmetic expression: {expression!r} ({type(exc).__name__})"
        ) from None
    try:
        return _eval(tree.body, deadline)
    except RecursionError:
        raise ExpressionError("expression nested too deeply") from None


def _eval(node: ast.AST, deadline: float | None) -> Number:
    if deadline is not None and time.monotonic() >= deadline:
        raise ExpressionError("evaluation stopped: the step deadline passed")
    if isinstance(node, ast.Constant):
        if type(node.value) not in (int, float):
            raise ExpressionError(f"only numbers are allowed, got {node.value!r}")
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand, deadline))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, deadline), _eval(node.right, deadline)
        return _apply(node.op, left, right)
    if isinstance(node, ast.BinOp | ast.UnaryOp):
        raise ExpressionError(f"operator {type(node.op).__name__} is not allowed: {ast.unparse(node)[:80]!r}")
    reason = _REFUSED.get(type(node), f"{type(node).__name__} is not allowed")
    raise ExpressionError(f"{reason}: {ast.unparse(node)[:80]!r}")


def _apply(op: ast.operator, left: Number, right: Number) -> Number:
    if isinstance(op, ast.Pow):
        _check_power(left, right)
    try:
        value = _BINARY[type(op)](left, right)
    except ZeroDivisionError:
        raise ExpressionError("division by zero") from None
    except OverflowError:
        raise ExpressionError("result too large") from None
    if isinstance(value, complex):
        raise ExpressionError("the result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ExpressionError("result too large")
    if abs(value) > MAX_MAGNITUDE:
        raise ExpressionError("result too large (more than 100 digits)")
    return value


def _check_power(base: Number, exponent: Number) -> None:
    if abs(exponent) > MAX_EXPONENT:
        raise ExpressionError(f"exponent {exponent} too large; at most {MAX_EXPONENT}")
    if abs(base) > 1 and exponent > 0 and exponent * math.log10(abs(base)) > 100:
        raise ExpressionError("result too large (more than 100 digits)")


# --- the seeded task generator -------------------------------------------------------------------


def generate_expression(rng: random.Random, difficulty: int) -> str:
    """An expression for `difficulty` (1: two numbers below 10 added or subtracted; each level adds
    an operand, a digit and more operators: 2 `*`, 3 `//` and parentheses, 4 `/`). Deterministic per `rng`.

    >>> generate_expression(random.Random(0), 1)
    '7 - 1'
    """
    ops = ["+", "-"] + (["*"] if difficulty >= 2 else []) + (["//"] if difficulty >= 3 else [])
    ops += ["/"] if difficulty >= 4 else []
    high, divisor_high = 10**difficulty - 1, 10 ** max(1, (difficulty + 1) // 2) - 1
    for _ in range(100):  # redraw an expression the evaluator refuses (none known; a guard)
        text = str(rng.randint(1, high))
        for i in range(1, difficulty + 1):
            op = rng.choice(ops)
            term = rng.randint(2, divisor_high) if op in ("/", "//") else rng.randint(1, high)
            text = f"{text} {op} {term}"
            if difficulty >= 3 and i < difficulty and rng.random() < 0.4:
                text = f"({text})"
        try:
            safe_eval(text)
        except ExpressionError:
            continue
        return text
    raise ExpressionError(f"no valid expression drawn for difficulty={difficulty}")


def parse_number(value: Any) -> Number:
    """A submitted answer as a number: an int or float, or a numeric literal string ("1,234" too).

    >>> parse_number(" 42 "), parse_number("3.5"), parse_number(7)
    (42, 3.5, 7)
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ExpressionError(f"answer: expected a number, got {value!r}")
    if isinstance(value, int | float):
        return value
    text = value.strip().replace(",", "").replace("_", "")
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        raise ExpressionError(f"answer: expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ExpressionError(f"answer: expected a finite number, got {value!r}")
    return number


def same_number(a: Number, b: Number) -> bool:
    """Equal as answers: exact for integers, within 1e-6 (relative or absolute) otherwise.

    >>> same_number(1 / 3, 0.333333), same_number(10**20, 10**20 + 1)
    (True, False)
    """
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)
