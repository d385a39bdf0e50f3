"""Addition of two integers in 0..999: the toy task of the first lab.

Answer: one integer inside ``<ans></ans>``; the rewards are the integer-answer ones in
``task.rewards`` (``correctness_reward``, ``format_reward``). Example prompt, the longest (95
characters, 175 chat-templated)::

    system: Add the two numbers. Give the final answer as one integer inside <ans></ans>.
    user:   What is 999 + 999?

The same task in a smaller range, `small-addition` (0..SMALL_HIGH), is chapter 1's on the CPU: the
tiny stand-in can hold sums of numbers that small (it answers a held-out one right about two times in
three), where sums of three-digit numbers stay out of its reach; Qwen3-4B knows those, so on a GPU
chapter 1 trains the full range. One problem space per range, one split rule: a problem held out in
one range is held out in the other.
"""

from __future__ import annotations

import random
from functools import partial
from typing import TYPE_CHECKING, Any

from task.dataset import build_rows, messages

if TYPE_CHECKING:
    import datasets

NAME = "addition"
LOW, HIGH = 0, 999
SMALL_NAME, SMALL_HIGH = "small-addition", 19
# Short on purpose: the tiny char-level CPU model sees it in every prompt too.
SYSTEM_PROMPT = "Add the two numbers. Give the final answer as one integer inside <ans></ans>."
# The columns the rewards read besides prompts and completions.
REWARD_COLUMNS = ("target",)


def question(a: int, b: int) -> str:
    """The user turn for one example."""
    return f"What is {a} + {b}?"


def _draw(rng: random.Random, high: int = HIGH) -> tuple[int, int]:
    return rng.randint(LOW, high), rng.randint(LOW, high)


def _key(problem: tuple[int, int]) -> tuple[int, int]:
    # 3 + 5 and 5 + 3 are one problem: a model that trained on one has seen the other.
    return min(problem), max(problem)


def _row(problem: tuple[int, int]) -> dict[str, Any]:
    a, b = problem
    return {"prompt": messages(SYSTEM_PROMPT, question(a, b)), "target": a + b, "a": a, "b": b}


def build_dataset(n: int, seed: int, high: int = HIGH) -> datasets.Dataset:
    """``n`` training prompts with columns prompt, target, a, b; same (n, seed), same rows."""
    return build_rows(n, seed, "train", partial(_draw, high=high), _key, _row)


def build_eval_dataset(n: int, seed: int, high: int = HIGH) -> datasets.Dataset:
    """``n`` held-out prompts, none of them (in either order) among any seed's training prompts."""
    return build_rows(n, seed, "eval", partial(_draw, high=high), _key, _row)


def worst_case_prompt(high: int = HIGH) -> list[dict[str, str]]:
    """The longest prompt the builder can make: both numbers with the most digits."""
    return messages(SYSTEM_PROMPT, question(high, high))


def reference_answer(row: dict[str, Any]) -> str:
    """What belongs inside the tag for a dataset row."""
    return str(row["target"])
