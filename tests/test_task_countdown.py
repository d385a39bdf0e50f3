"""Countdown: an expression checked by walking its syntax tree, never run.

Hostile expressions (code, powers, huge numbers, deep nesting, other numerals) pay nothing and run
nothing; the rules (each given number exactly once, exact arithmetic, the target) hold; values are
the hand-computed ones; every generated solution is accepted and its mutations (another number, a
number used twice, one left out, another target) are not; on a seeded fuzz the parser agrees with an
independent recursive-descent parser of the same grammar, and every value it computes is the one
Python's own arithmetic on exact fractions gives.
"""

from __future__ import annotations

import random
import re
import sys
from fractions import Fraction

import pytest

from task import countdown
from task.countdown import (
    MAX_EXPR_CHARS,
    MAX_LITERALS,
    MAX_MAGNITUDE,
    correctness_reward,
    evaluate,
    format_reward,
    parse_expression,
)
from task.rewards import MAX_DIGITS


def _python_value(text: str) -> Fraction | None:
    """What Python itself makes of an expression in the grammar, each integer literal a Fraction;
    None for a division by zero. An oracle that shares no code with task/countdown.py (the text is
    digits, operators, parentheses and blanks only, so nothing but arithmetic can run)."""
    assert not text.strip(" \t0123456789+-*/()"), ascii(text)
    source = re.sub(r"[0-9]+", lambda m: f"Fraction({int(m.group())})", text.strip())
    try:
        return eval(source, {"__builtins__": {}, "Fraction": Fraction})
    except ZeroDivisionError:
        return None


def _rewards(expression: str, numbers: list[int], target: int) -> tuple[float, float]:
    completions = [[{"role": "assistant", "content": f"<ans>{expression}</ans>"}]]
    correct = correctness_reward([None], completions, target=[target], numbers=[numbers])
    return correct[0], format_reward([None], completions)[0]


# ---------------------------------------------------------------- the rules


@pytest.mark.parametrize(
    ("expression", "numbers", "target", "correct"),
    [
        ("2 * 3 + 4", [2, 3, 4], 10, True),
        ("4 + 3 * 2", [2, 3, 4], 10, True),  # any order of the numbers
        ("4+3*2", [3, 4, 2], 10, True),
        (" ( 2 * 3 ) + 4 ", [2, 3, 4], 10, True),
        ("((2) * (3)) + (4)", [2, 3, 4], 10, True),
        ("7 / 2 * 4", [7, 2, 4], 14, True),  # exact fractions: 7/2 * 4 is 14
        ("5 * 5 - 5", [5, 5, 5], 20, True),  # repeated numbers, each copy used once
        ("(3 + 7) * 25 - 50 * 4", [3, 7, 25, 50, 4], 50, True),
        ("(2 + 3) * 2", [2, 3, 4], 10, False),  # 2 twice, 4 not at all
        ("2 * 3 + 4 + 0", [2, 3, 4], 10, False),  # a number that was not given
        ("2 * 3 + 4 - 4 + 4", [2, 3, 4], 10, False),  # 4 three times
        ("10", [2, 3, 4], 10, False),  # the target itself
        ("2 * 3", [2, 3, 4], 6, False),  # leaves a number out
        ("5 * 5", [5, 5, 5], 25, False),  # leaves one copy out
        ("2 * 3 + 4", [2, 3, 4], 11, False),  # wrong value
        ("7 / 2 + 4", [7, 2, 4], 7, False),  # 7.5: no rounding or flooring
        ("2 / (3 - 3) + 4", [2, 3, 3, 4], 4, False),  # division by zero
        ("4 - 4 / 2 * 2", [4, 4, 2, 2], 0, True),
    ],
)
def test_rules(expression: str, numbers: list[int], target: int, correct: bool) -> None:
    assert _rewards(expression, numbers, target) == (1.0 if correct else 0.0, 0.2)


# Hand-computed values: precedence, left associativity, exact fractions, the magnitude bound (the
# docstring's "numerator or denominator exceeds MAX_MAGNITUDE", on every intermediate value).
@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("2 + 3 * 4", 14),  # * before +: not 20
        ("(2 + 3) * 4", 20),
        ("10 - 3 - 2", 5),  # left to right: not 10 - (3 - 2) = 9
        ("48 / 4 / 2", 6),  # left to right: not 48 / (4 / 2) = 24
        ("2 * 3 - 4 / 8", Fraction(11, 2)),
        ("7 / 2", Fraction(7, 2)),  # neither 3 (floor) nor 3.5 (float)
        ("1 / 3 * 3", 1),
        ("1 / 3 + 1 / 6", Fraction(1, 2)),
        ("1 - 2", -1),  # a negative intermediate is allowed
        ("0 / 5", 0),
        ("(3 - 3) / 5", 0),
        ("99 * 99 * 99 * 99", 96059601),
        (str(MAX_MAGNITUDE), MAX_MAGNITUDE),  # the bound itself is allowed ...
        (f"1 / {MAX_MAGNITUDE}", Fraction(1, MAX_MAGNITUDE)),
        (str(MAX_MAGNITUDE + 1), None),  # ... one more is not, as a literal,
        (f"{MAX_MAGNITUDE - 1} + 2", None),  # as a sum,
        (f"1 / {MAX_MAGNITUDE + 1}", None),  # as a denominator,
        ("100000 * 100000 / 100000", None),  # and on the way: 10^10 before the value 10^5
        ("100000 / 100000 * 100000", 100000),
        ("5 / 0", None),
        ("5 / (3 - 3)", None),
        ("0 / (1 - 1)", None),
        ("1 + 2 / (4 - 2 * 2)", None),  # a zero divisor deep inside
    ],
)
def test_known_values(expression: str, value: int | Fraction | None) -> None:
    expr = parse_expression(expression)
    assert expr is not None
    assert evaluate(expr) == value
    if value is not None:
        assert isinstance(evaluate(expr), Fraction)


def test_magnitude_is_bounded() -> None:
    big = int("9" * MAX_DIGITS)
    # Well formed, but its value is beyond MAX_MAGNITUDE: never correct, even if the target says so.
    assert big * big > MAX_MAGNITUDE
    assert _rewards(f"{big} * {big}", [big, big], big * big) == (0.0, 0.2)
    assert evaluate(parse_expression(f"{big} * {big}")) is None
    assert evaluate(parse_expression("99 * 99 * 99 * 99")) == 99**4  # a real solution's size is fine
    # Fractions are bounded too: a denominator past the bound is rejected, not carried along.
    assert evaluate(parse_expression(f"1 / {big}")) is None


def test_generated_solutions_solve_their_problems() -> None:
    for row in countdown.build_dataset(500, 0).to_list():
        expr = parse_expression(row["solution"])
        assert expr is not None
        assert sorted(countdown.literals(expr)) == sorted(row["numbers"])
        assert evaluate(expr) == row["target"]
        assert countdown.TARGET_LOW <= row["target"] <= countdown.TARGET_HIGH
        assert len(row["numbers"]) in countdown.COUNTS
        assert all(countdown.LOW <= n <= countdown.HIGH for n in row["numbers"])
        assert row["prompt"][1]["content"] == countdown.question(row["numbers"], row["target"])
        assert _python_value(row["solution"]) == row["target"]


def test_each_generated_solution_is_accepted_and_its_mutations_are_not() -> None:
    """The checker accepts the solution the generator guarantees, with the numbers in any order, and
    rejects it for another target, with a number that was not given, with a given number used twice,
    and with a given number left out, whatever the mutated expression's value."""
    rows = countdown.build_dataset(300, 5).to_list() + countdown.build_eval_dataset(100, 5).to_list()
    reused = 0
    for row in rows:
        numbers, target, solution = row["numbers"], row["target"], row["solution"]
        assert _rewards(solution, numbers, target) == (1.0, 0.2)
        assert _rewards(solution, numbers[::-1], target) == (1.0, 0.2)
        assert _rewards(solution, numbers, target + 1) == (0.0, 0.2)
        assert _rewards(solution, [*numbers, 1], target) == (0.0, 0.2)  # one given number unused
        assert _rewards(solution, numbers[1:], target) == (0.0, 0.2)  # a number that was not given
        first = int(re.match(r"[(\s]*([0-9]+)", solution).group(1))
        stranger = next(n for n in range(1, 200) if n not in numbers)
        assert _rewards(re.sub(r"[0-9]+", str(stranger), solution, count=1), numbers, target) == (0.0, 0.2)
        twice = next((n for n in numbers if n != first), None)
        if twice is not None:  # the first number replaced by another given one: that one used twice
            mutated = re.sub(r"[0-9]+", str(twice), solution, count=1)
            assert _rewards(mutated, numbers, target) == (0.0, 0.2), (mutated, numbers, target)
            reused += 1
    assert reused > 0.9 * len(rows)


# ---------------------------------------------------------------- hostile expressions

SENTINEL = "task_countdown_test_pwned"

HOSTILE = [
    f"__import__('sys').modules.setdefault('{SENTINEL}', 1)",
    f"[__import__('sys').modules.setdefault('{SENTINEL}', 1), 3][1]",
    "__import__('os').system('true')",
    "exec('1')",
    "eval('2+2')",
    "open('/etc/passwd').read()",
    "().__class__.__base__.__subclasses__()",
    "2**999999",
    "9**9**9",
    "2 ** 3",
    "(10**10**10)",
    "pow(2, 10)",
    "abs(3)",
    "x",
    "x + 1",
    "lambda: 1",
    "[3]",
    "{3}",
    "(3, 4)",
    "3, 4",
    "'3'",
    "3 if 1 else 4",
    "3 < 4",
    "3 and 4",
    "3 @ 4",
    "3 % 2",
    "3 // 1",
    "3 << 2",
    "3 ^ 1",
    "3 | 4",
    "~3",
    "-3 + 10",  # unary minus: outside the grammar
    "+3",
    "3 - -2",
    "not 3",
    "3.0 + 4",
    "1e3",
    "0x19",
    "0o31",
    "0b11001",
    "1_000",
    "3j",
    "007",
    "(3)(4)",
    "3(4)",
    "3 4",
    "2 5",  # spaced digits
    "\u0663 + \u0664",  # Arabic-Indic digits
    "\uff13 + \uff14",  # full-width digits
    "3 \u2212 4",  # U+2212 minus
    "3 \u00d7 4",  # multiplication sign
    "3\u00a0+ 4",  # no-break space inside
    "3 +\n4",
    "3 + 4 # comment",
    "3 + 4; 5",
    "(" * 150 + "1" + ")" * 150,
    "(" * 5000 + "1" + ")" * 5000,
    "1" + " + 1" * 100,
    "9" * (MAX_DIGITS + 1),
    "9" * 10_000,
    "",
    "   ",
    "()",
    "3 +",
    "* 3",
    "(3 + 4",
    "3 + 4)",
    "\x00",
    "3 + 4\x00",
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("expression", HOSTILE, ids=lambda e: ascii(e)[:40])
def test_hostile_expressions_pay_nothing_and_run_nothing(expression: str) -> None:
    assert parse_expression(expression) is None
    for completion in (
        f"<ans>{expression}</ans>",
        [{"role": "assistant", "content": f"<ans>{expression}</ans>"}],
    ):
        assert correctness_reward([None], [completion], target=[7], numbers=[[3, 4]]) == [0.0]
        assert format_reward([None], [completion]) == [0.0]
    assert SENTINEL not in sys.modules


def test_size_bounds_are_the_documented_ones() -> None:
    within = "(" + " + ".join(["1"] * MAX_LITERALS) + ")"
    assert parse_expression(within) is not None
    assert parse_expression(" + ".join(["1"] * (MAX_LITERALS + 1))) is None
    exact = "1+" + " " * (MAX_EXPR_CHARS - 3) + "1"
    assert len(exact) == MAX_EXPR_CHARS and parse_expression(exact) is not None
    assert parse_expression(f"  {exact}\n") is not None  # surrounding whitespace does not count
    assert parse_expression("1+ " + exact[2:]) is None  # one character more


def test_hostile_columns_never_raise() -> None:
    np = pytest.importorskip("numpy")
    good = "<ans>2 * 3 + 4</ans>"
    for numbers in (None, [], [2, 3], [2, 3, 4, 5], "2, 3, 4", [2.0, 3.0, 4.0], [True, 3, 4], 5, [[2, 3, 4]]):
        assert correctness_reward([None], [good], target=[10], numbers=[numbers]) in ([0.0], [1.0])
    # A string of numbers is taken as the list it spells; arrays and tuples as lists.
    assert correctness_reward([None], [good], target=[10], numbers=["2, 3, 4"]) == [1.0]
    assert correctness_reward([None], [good], target=[10], numbers=[np.array([4, 3, 2])]) == [1.0]
    assert correctness_reward([None], [good], target=np.array([10]), numbers=np.array([[2, 3, 4]])) == [1.0]
    assert correctness_reward([None], [good], target=[np.int64(10)], numbers=[(2, 3, 4)]) == [1.0]
    assert correctness_reward([None], [good], target=[10.0], numbers=[[2, 3, 4]]) == [0.0]
    assert correctness_reward([None], [good], target=[None], numbers=[[2, 3, 4]]) == [0.0]
    assert correctness_reward([None], [good], target=[10], numbers=[[2.0, 3.0, 4.0]]) == [0.0]


# ---------------------------------------------------------------- differential fuzz


class _Reference:
    """An independent recursive-descent parser of the grammar the task documents.

    expr := term (('+' | '-') term)* ; term := atom (('*' | '/') atom)* ; atom := INT | '(' expr ')'
    INT := '0' | [1-9][0-9]* (Python's decimal literals) with at most MAX_DIGITS digits; spaces and
    tabs between tokens; left-associative, so it builds the same tree as Python's parser.
    """

    def __init__(self, text: str) -> None:
        self.tokens: list[str] = []
        i = 0
        while i < len(text):
            c = text[i]
            if c in " \t":
                i += 1
            elif c in "+-*/()":
                self.tokens.append(c)
                i += 1
            elif c in "0123456789":
                j = i
                while j < len(text) and text[j] in "0123456789":
                    j += 1
                self.tokens.append(text[i:j])
                i = j
            else:
                raise ValueError(c)
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise ValueError("end")
        self.pos += 1
        return token

    def expr(self) -> object:
        node = self.term()
        while self.peek() in ("+", "-"):
            node = (self.take(), node, self.term())
        return node

    def term(self) -> object:
        node = self.atom()
        while self.peek() in ("*", "/"):
            node = (self.take(), node, self.atom())
        return node

    def atom(self) -> object:
        token = self.take()
        if token == "(":
            node = self.expr()
            if self.take() != ")":
                raise ValueError(")")
            return node
        if token.isdigit() and (token == "0" or token[0] != "0") and len(token) <= MAX_DIGITS:
            return int(token)
        # Python rejects 012 but takes 00 as zero.
        if token.isdigit() and set(token) == {"0"}:
            return 0
        raise ValueError(token)

    @classmethod
    def parse(cls, text: str) -> object | None:
        stripped = text.strip()
        if not stripped or len(stripped) > MAX_EXPR_CHARS or stripped.strip(" \t0123456789+-*/()"):
            return None
        try:
            parser = cls(stripped)
            tree = parser.expr()
        except ValueError:
            return None
        if parser.peek() is not None or len(_leaves(tree)) > MAX_LITERALS:
            return None
        return tree


def _leaves(tree: object) -> list[int]:
    return [tree] if isinstance(tree, int) else _leaves(tree[1]) + _leaves(tree[2])  # type: ignore[index]


def _random_expression(rng: random.Random, depth: int) -> str:
    """A random well-formed expression, with random spacing and redundant parentheses."""
    if depth == 0 or rng.random() < 0.3:
        text = str(rng.choice([0, 1, 2, 7, 10, 99, 100, 12345, 10**MAX_DIGITS - 1]))
    else:
        left, right = _random_expression(rng, depth - 1), _random_expression(rng, depth - 1)
        before, after = (rng.choice(["", " ", "  ", "\t"]) for _ in range(2))
        text = f"{left}{before}{rng.choice('+-*/')}{after}{right}"
        if rng.random() < 0.5:
            text = f"({text})"
    return f"({text})" if rng.random() < 0.1 else text


def _beyond_bound(value: Fraction) -> bool:
    return abs(value.numerator) > MAX_MAGNITUDE or value.denominator > MAX_MAGNITUDE


def test_parser_agrees_with_a_reference_parser() -> None:
    rng = random.Random(20261129)
    seen = {"parsed": 0, "rejected": 0, "valued": 0, "by zero": 0, "no value": 0}
    for i in range(6000):
        if i % 2:
            text = "".join(rng.choice("0123456789+-*/() \t") for _ in range(rng.randint(0, 20)))
        else:
            text = _random_expression(rng, rng.randint(0, 4))
            if rng.random() < 0.3:  # a near miss: one character changed
                k = rng.randrange(len(text))
                text = text[:k] + rng.choice("0123456789+-*/() x.") + text[k + 1 :]
        expected = _Reference.parse(text)
        got = parse_expression(text)
        assert got == expected, ascii(text)
        seen["parsed" if got is not None else "rejected"] += 1
        if got is None:
            continue
        # The value against Python's own: equal whenever evaluate gives one, and none on a division by
        # zero or a final value past the bound. (An intermediate past the bound also gives none; this
        # oracle cannot see intermediates, so test_known_values checks that case by hand.)
        value, python = evaluate(got), _python_value(text)
        if value is not None:
            assert value == python, ascii(text)
        if python is None or _beyond_bound(python):
            assert value is None, ascii(text)
        outcome = "valued" if value is not None else "by zero" if python is None else "no value"
        seen[outcome] += 1
    # Only worth something if every outcome is common: parsed and rejected texts, values, divisions
    # by zero, values past the bound.
    assert min(seen[k] for k in ("parsed", "rejected", "valued")) > 1000, seen
    assert min(seen[k] for k in ("by zero", "no value")) > 50, seen
