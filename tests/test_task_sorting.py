"""Sorting: the sorted list, comma-separated, inside one tag; exactly the given numbers, in order."""

from __future__ import annotations

import random
import re

import pytest

from task import sorting
from task.rewards import MAX_DIGITS, MAX_ITEMS
from task.sorting import correctness_reward, format_reward, parse_answer

# (text inside the tag, parsed list)
CASES: list[tuple[str, tuple[int, ...] | None]] = [
    ("1,2,3", (1, 2, 3)),
    ("1, 2, 3", (1, 2, 3)),
    (" 1 ,2 ,  3 ", (1, 2, 3)),
    ("\n1,\n2\n", (1, 2)),
    ("7", (7,)),
    ("3, 3, 1", (3, 3, 1)),  # well formed, not sorted: correctness decides
    ("-1, 0, 007", (-1, 0, 7)),
    (", ".join(["9" * MAX_DIGITS] * MAX_ITEMS), (int("9" * MAX_DIGITS),) * MAX_ITEMS),
    ("", None),
    ("  ", None),
    ("1 2 3", None),  # spaced digits, no commas
    ("5 79", None),
    ("1,,2", None),
    ("1,2,", None),
    (",1,2", None),
    ("1;2;3", None),
    ("1, 2 and 3", None),
    ("[1, 2, 3]", None),
    ("(1, 2, 3)", None),
    ("+1, 2", None),
    ("1.0, 2", None),
    ("1e1, 2", None),
    ("\u0663, 4", None),
    ("\uff13, 4", None),
    ("1\uff0c2", None),  # full-width comma
    ("9" * (MAX_DIGITS + 1) + ", 1", None),
    (", ".join(["1"] * (MAX_ITEMS + 1)), None),
    ("1," * 100_000 + "1", None),
]


@pytest.mark.parametrize(
    ("inner", "expected"), CASES, ids=lambda c: ascii(c)[:40] if isinstance(c, str) else None
)
def test_parse_and_format(inner: str, expected: tuple[int, ...] | None) -> None:
    text = f"The list: <ans>{inner}</ans>"
    assert parse_answer(text) == expected
    assert format_reward([None], [text]) == [0.2 if expected is not None else 0.0]
    if expected is not None:
        assert correctness_reward([None], [text], target=[list(expected)]) == [1.0]
    assert correctness_reward([None], [text], target=[[1, 2, 3]]) == [1.0 if expected == (1, 2, 3) else 0.0]


@pytest.mark.parametrize(
    ("answer", "correct"),
    [
        ("3, 7, 7, 15", True),
        ("3,7,7,15", True),
        ("15, 7, 7, 3", False),  # descending
        ("7, 3, 7, 15", False),  # the given order
        ("3, 7, 15", False),  # a duplicate dropped
        ("3, 7, 7, 7, 15", False),  # a duplicate added
        ("3, 7, 7, 15, 16", False),
        ("3, 7, 7", False),
        ("0, 3, 7, 7, 15", False),
    ],
)
def test_only_the_exact_sorted_list_is_correct(answer: str, correct: bool) -> None:
    completions = [[{"role": "assistant", "content": f"<ans>{answer}</ans>"}]]
    assert correctness_reward([None], completions, target=[[3, 7, 7, 15]]) == [1.0 if correct else 0.0]
    assert format_reward([None], completions) == [0.2]


def test_targets_in_other_shapes() -> None:
    np = pytest.importorskip("numpy")
    good = "<ans>3, 7, 15</ans>"
    for target in ([3, 7, 15], (3, 7, 15), np.array([3, 7, 15]), "3, 7, 15", [np.int64(3), 7, 15]):
        assert correctness_reward([None], [good], target=[target]) == [1.0], target
    assert correctness_reward([None], [good], target=np.array([[3, 7, 15]])) == [1.0]
    for target in (None, [], [3.0, 7.0, 15.0], [True, 7, 15], ["3", "7", "15"], "3 7 15", 3, [[3, 7, 15]]):
        assert correctness_reward([None], [good], target=[target]) == [0.0], target


def test_rows_hold_their_sorted_numbers() -> None:
    for row in sorting.build_dataset(500, 0).to_list():
        assert row["target"] == sorted(row["numbers"])
        assert sorting.MIN_COUNT <= len(row["numbers"]) <= sorting.MAX_COUNT
        assert all(sorting.LOW <= n <= sorting.HIGH for n in row["numbers"])
        assert row["prompt"][1]["content"] == sorting.question(row["numbers"])


# The format as a regex, for a differential fuzz: one tag pair, 1..MAX_ITEMS comma-separated integers.
_OUTSIDE = r"(?:(?!<ans>|</ans>).)*"
_INT = rf"\s*-?[0-9]{{1,{MAX_DIGITS}}}\s*"
_REFERENCE = re.compile(
    rf"{_OUTSIDE}<ans>({_INT}(?:,{_INT}){{0,{MAX_ITEMS - 1}}})</ans>{_OUTSIDE}", re.DOTALL
)


def test_fuzz_against_reference_regex() -> None:
    rng = random.Random(7)
    pieces = [
        "<ans>",
        "</ans>",
        ",",
        ", ",
        " ",
        "\n",
        "-",
        "+",
        "1",
        "23",
        "007",
        "9" * 13,
        ";",
        ".",
        "\u0663",
        "",
    ]
    seen = {"list": 0, "none": 0}
    for _ in range(4000):
        items = [str(rng.randint(-5, 120)) for _ in range(rng.randint(0, 6))]
        inner = rng.choice([", ", ",", " , "]).join(items)
        if rng.random() < 0.6:
            k = rng.randint(0, len(inner))
            inner = inner[:k] + rng.choice(pieces) + inner[k:]
        text = rng.choice(["", "x ", "<ans>"]) + "<ans>" + inner + "</ans>" + rng.choice(["", ".", "</ans>"])
        match = _REFERENCE.fullmatch(text)
        expected = tuple(int(v) for v in match.group(1).split(",")) if match else None
        assert parse_answer(text) == expected, ascii(text)
        seen["list" if expected is not None else "none"] += 1
    assert min(seen.values()) > 500, seen
