"""Sorting: put three to eight integers in 0..99 in ascending order.

Answer: the sorted numbers, comma-separated, inside one ``<ans></ans>`` (spaces around each number
allowed). Example prompt, the longest (120 characters, 200 chat-templated)::

    system: Sort the numbers from smallest to largest. Give them comma-separated in <ans></ans>.
    user:   Sort: 99, 99, 99, 99, 99, 99, 99, 99

Correct means the list equals the sorted numbers exactly: every number as often as it was given,
nothing added or dropped. Example::

    >>> parse_answer("<ans>3, 7,15</ans>"), parse_answer("<ans>3 7 15</ans>"), parse_answer("<ans></ans>")
    ((3, 7, 15), None, None)
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from task.dataset import build_rows, messages
from task.rewards import (
    CORRECT_REWARD,
    FORMAT_REWARD,
    RewardRole,
    answer_span,
    correctness_scores,
    declare_reward,
    format_scores,
    int_list_value,
    parse_int_list,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    import datasets

NAME = "sorting"
MIN_COUNT, MAX_COUNT = 3, 8
LOW, HIGH = 0, 99
SYSTEM_PROMPT = "Sort the numbers from smallest to largest. Give them comma-separated in <ans></ans>."
REWARD_COLUMNS = ("target",)


def parse_answer(text: str) -> tuple[int, ...] | None:
    """The list of integers inside the completion's single ``<ans>`` tag; None for anything else."""
    span = answer_span(text)
    return None if span is None else parse_int_list(span)


def _is_sorted_target(answer: tuple[int, ...], target: Any) -> bool:
    return answer == int_list_value(target)


@declare_reward(CORRECT_REWARD, RewardRole.ANSWER)
def correctness_reward(prompts: Any, completions: Sequence[Any], target: Any, **kwargs: Any) -> list[float]:
    """1.0 when the answer's list equals the target (the sorted numbers), else 0.0."""
    return correctness_scores(completions, parse_answer, _is_sorted_target, target)


@declare_reward(FORMAT_REWARD, RewardRole.SHAPING)
def format_reward(prompts: Any, completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """0.2 when the completion holds exactly one ``<ans>`` tag holding comma-separated integers."""
    return format_scores(completions, parse_answer)


# ------------------------------------------------------------------ prompts


def question(numbers: Sequence[int]) -> str:
    """The user turn for one example."""
    return f"Sort: {', '.join(map(str, numbers))}"


def _draw(rng: random.Random) -> tuple[int, ...]:
    return tuple(rng.randint(LOW, HIGH) for _ in range(rng.randint(MIN_COUNT, MAX_COUNT)))


def _key(numbers: tuple[int, ...]) -> tuple[int, ...]:
    # Every order of the same numbers has the same answer: one problem.
    return tuple(sorted(numbers))


def _row(numbers: tuple[int, ...]) -> dict[str, Any]:
    return {
        "prompt": messages(SYSTEM_PROMPT, question(numbers)),
        "target": sorted(numbers),
        "numbers": list(numbers),
    }


def build_dataset(n: int, seed: int) -> datasets.Dataset:
    """``n`` training prompts with columns prompt, target (sorted), numbers; same (n, seed), same rows."""
    return build_rows(n, seed, "train", _draw, _key, _row)


def build_eval_dataset(n: int, seed: int) -> datasets.Dataset:
    """``n`` held-out prompts, none of them (in any order) among any seed's training prompts."""
    return build_rows(n, seed, "eval", _draw, _key, _row)


def worst_case_prompt() -> list[dict[str, str]]:
    """The longest prompt the builder can make: the most numbers, each with the most digits."""
    return messages(SYSTEM_PROMPT, question([HIGH] * MAX_COUNT))


def reference_answer(row: dict[str, Any]) -> str:
    """What belongs inside the tag for a dataset row."""
    return ", ".join(map(str, row["target"]))
