"""Countdown: reach a target from three or four numbers, each used exactly once, with + - * /.

Answer: one arithmetic expression inside ``<ans></ans>``. Example prompt, the longest (126 characters,
206 chat-templated)::

    system: Use each number once with + - * / ( ) to make the target. Put the expression in <ans></ans>.
    user:   Numbers: 99 99 99 99. Target: 999.

The expression is checked, never run: ``parse_expression`` lets only digits, ``+ - * /``, parentheses
and spaces through, parses them with ``ast.parse(mode="eval")`` and keeps nothing but binary
``+ - * /`` over decimal integer literals of at most ``MAX_DIGITS`` digits (no names, calls,
attributes, powers, floor division, unary signs or floats), at most ``MAX_EXPR_CHARS`` characters and
``MAX_LITERALS`` numbers. ``evaluate`` computes it in exact fractions (``7 / 2`` is 7/2, not 3.5
or 3) and gives up on a division by zero or on any intermediate value whose numerator or denominator
exceeds ``MAX_MAGNITUDE``. Correct means: the numbers used are exactly the given ones (as a
multiset) and the value equals the target. Example::

    >>> parse_answer("<ans>(50 + 3) * 2</ans>")
    ('*', ('+', 50, 3), 2)
    >>> [parse_answer(f"<ans>{e}</ans>") for e in ("2**99", "__import__('os')", "-3 + 10", "0x19")]
    [None, None, None, None]
"""

from __future__ import annotations

import ast
import random
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from task.dataset import build_rows, messages
from task.rewards import (
    CORRECT_REWARD,
    FORMAT_REWARD,
    MAX_DIGITS,
    RewardRole,
    answer_span,
    correctness_scores,
    declare_reward,
    format_scores,
    int_list_value,
    int_value,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    import datasets

NAME = "countdown"
COUNTS = (3, 4)  # how many numbers a problem gives
LOW, HIGH = 1, 99  # each number
TARGET_LOW, TARGET_HIGH = 1, 999
# The generator keeps every intermediate value a positive integer no larger than this.
MAX_INTERMEDIATE = 9999
# Terse: the tiny char-level CPU model sees it in every prompt (206 characters templated at most).
SYSTEM_PROMPT = "Use each number once with + - * / ( ) to make the target. Put the expression in <ans></ans>."
REWARD_COLUMNS = ("target", "numbers")

# Bounds on what counts as a well-formed expression: far above what a solution needs
# ("((99 * 99) - (99 + 99))" is 23 characters and 4 numbers), far below anything costly to parse.
MAX_EXPR_CHARS = 80
MAX_LITERALS = 8
# Bound on every intermediate value's numerator and denominator while evaluating.
MAX_MAGNITUDE = 10**9

# Only these characters reach the parser: no letters, underscores, dots, quotes, brackets or commas,
# so every literal is a plain decimal integer and no name, call or attribute can even be written.
_EXPRESSION_CHARS = re.compile(r"[0-9+\-*/() \t]+")
_OPERATORS: dict[type[ast.operator], str] = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}

# An expression tree: an integer literal, or (operator, left, right).
Expr = int | tuple[str, "Expr", "Expr"]


class _Malformed(Exception):
    """A node outside the grammar."""


def parse_expression(raw: Any) -> Expr | None:
    """The expression tree of ``raw`` (whitespace around allowed), or None if it is not in the grammar."""
    if not isinstance(raw, str):
        return None
    source = raw.strip()
    if not source or len(source) > MAX_EXPR_CHARS or _EXPRESSION_CHARS.fullmatch(source) is None:
        return None
    try:
        tree = ast.parse(source, mode="eval")
        expr = _tree(tree.body)
    except (SyntaxError, ValueError, RecursionError, MemoryError, _Malformed):
        return None
    return expr if len(literals(expr)) <= MAX_LITERALS else None


def _tree(node: ast.AST) -> Expr:
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return (_OPERATORS[type(node.op)], _tree(node.left), _tree(node.right))
    if isinstance(node, ast.Constant) and type(node.value) is int and node.value < 10**MAX_DIGITS:
        return node.value
    raise _Malformed(type(node).__name__)


def literals(expr: Expr) -> list[int]:
    """The integer literals of an expression, left to right."""
    if isinstance(expr, int):
        return [expr]
    _, left, right = expr
    return literals(left) + literals(right)


def evaluate(expr: Expr) -> Fraction | None:
    """The exact value of an expression; None on division by zero or an intermediate over MAX_MAGNITUDE."""
    if isinstance(expr, int):
        value = Fraction(expr)
    else:
        op, left_expr, right_expr = expr
        left, right = evaluate(left_expr), evaluate(right_expr)
        if left is None or right is None or (op == "/" and right == 0):
            return None
        if op == "+":
            value = left + right
        elif op == "-":
            value = left - right
        elif op == "*":
            value = left * right
        else:
            value = left / right
    if abs(value.numerator) > MAX_MAGNITUDE or value.denominator > MAX_MAGNITUDE:
        return None
    return value


def parse_answer(text: str) -> Expr | None:
    """The expression inside the completion's single ``<ans>`` tag; None for anything else."""
    span = answer_span(text)
    return None if span is None else parse_expression(span)


def _solves(expr: Expr, target: Any, numbers: Any) -> bool:
    wanted, given = int_value(target), int_list_value(numbers)
    if wanted is None or given is None or Counter(literals(expr)) != Counter(given):
        return False
    return evaluate(expr) == wanted


@declare_reward(CORRECT_REWARD, RewardRole.ANSWER)
def correctness_reward(
    prompts: Any, completions: Sequence[Any], target: Any, numbers: Any, **kwargs: Any
) -> list[float]:
    """1.0 when the expression uses exactly the given numbers, each once, and equals the target."""
    return correctness_scores(completions, parse_answer, _solves, target, numbers)


@declare_reward(FORMAT_REWARD, RewardRole.SHAPING)
def format_reward(prompts: Any, completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """0.2 when the completion holds exactly one ``<ans>`` tag holding a well-formed expression."""
    return format_scores(completions, parse_answer)


# ------------------------------------------------------------------ prompts


@dataclass(frozen=True)
class Problem:
    numbers: tuple[int, ...]
    target: int
    solution: str  # one expression that reaches the target: proof that the problem can be solved


def question(numbers: Sequence[int], target: int) -> str:
    """The user turn for one example."""
    return f"Numbers: {' '.join(map(str, numbers))}. Target: {target}."


def _draw(rng: random.Random) -> Problem:
    """Numbers, then a random way of combining all of them; its value, if in range, is the target."""
    while True:
        numbers = [rng.randint(LOW, HIGH) for _ in range(rng.choice(COUNTS))]
        pool = [(n, str(n)) for n in numbers]
        while len(pool) > 1:
            i, j = rng.sample(range(len(pool)), 2)
            (a, left), (b, right) = pool[i], pool[j]
            ops = ["+"]
            if a > b:
                ops.append("-")
            if a * b <= MAX_INTERMEDIATE:
                ops.append("*")
            if b > 1 and a % b == 0:
                ops.append("/")
            op = rng.choice(ops)
            value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
            pool = [p for k, p in enumerate(pool) if k not in (i, j)]
            pool.append((value, f"({left} {op} {right})"))
        target, solution = pool[0]
        if TARGET_LOW <= target <= TARGET_HIGH:
            return Problem(tuple(numbers), target, solution[1:-1])


def _key(problem: Problem) -> tuple[tuple[int, ...], int]:
    # The same numbers in another order ask the same question.
    return tuple(sorted(problem.numbers)), problem.target


def _row(problem: Problem) -> dict[str, Any]:
    return {
        "prompt": messages(SYSTEM_PROMPT, question(problem.numbers, problem.target)),
        "target": problem.target,
        "numbers": list(problem.numbers),
        "solution": problem.solution,
    }


def build_dataset(n: int, seed: int) -> datasets.Dataset:
    """``n`` training prompts with columns prompt, target, numbers, solution; same (n, seed), same rows."""
    return build_rows(n, seed, "train", _draw, _key, _row)


def build_eval_dataset(n: int, seed: int) -> datasets.Dataset:
    """``n`` held-out prompts, none of them (numbers in any order) among any seed's training prompts."""
    return build_rows(n, seed, "eval", _draw, _key, _row)


def worst_case_prompt() -> list[dict[str, str]]:
    """The longest prompt the builder can make: the most numbers, each and the target at the most digits."""
    return messages(SYSTEM_PROMPT, question([HIGH] * max(COUNTS), TARGET_HIGH))


def reference_answer(row: dict[str, Any]) -> str:
    """What belongs inside the tag for a dataset row: the generator's own solution."""
    return row["solution"]
