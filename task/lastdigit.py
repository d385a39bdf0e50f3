"""The last digit of a number in 100..99999: chapter 4's task, small enough for the CPU stand-in to learn.

Answer: one integer inside ``<ans></ans>``, scored by the integer-answer rewards of ``task.rewards``
(``correctness_reward``, ``format_reward``): ``<ans>7</ans>`` for 827. Example prompt, the longest
(100 characters)::

    system: Give the last digit of the number as one integer inside <ans></ans>.
    user:   What is the last digit of 99999?

Why this task: the answer is one of ten digits and sits in the prompt, so the tiny CPU model (two
layers, 64 wide) can learn to read it within a minute of GRPO and its held-out accuracy measurably
rises, where a sum stays out of its reach (docs: FACTS, "the CPU stand-in and learning an answer").
And a loose checker is easy to game here: the whole number, echoed, contains its last digit.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from task.dataset import build_rows, messages

if TYPE_CHECKING:
    import datasets

NAME = "lastdigit"
# Wide enough that a held-out set of hundreds is mostly distinct numbers (one in ten is held out);
# the digit to read always sits just before the '?', however long the number.
LOW, HIGH = 100, 99_999
SYSTEM_PROMPT = "Give the last digit of the number as one integer inside <ans></ans>."
REWARD_COLUMNS = ("target",)


def question(number: int) -> str:
    """The user turn for one example."""
    return f"What is the last digit of {number}?"


def _draw(rng: random.Random) -> int:
    return rng.randint(LOW, HIGH)


def _key(problem: int) -> int:
    return problem  # the number is the problem: about 100 000 of them, one in ten held out


def _row(number: int) -> dict[str, Any]:
    return {"prompt": messages(SYSTEM_PROMPT, question(number)), "target": number % 10, "number": number}


def build_dataset(n: int, seed: int) -> datasets.Dataset:
    """``n`` training prompts with columns prompt, target, number; same (n, seed), same rows."""
    return build_rows(n, seed, "train", _draw, _key, _row)


def build_eval_dataset(n: int, seed: int) -> datasets.Dataset:
    """``n`` held-out prompts, none of whose numbers is among any seed's training prompts."""
    return build_rows(n, seed, "eval", _draw, _key, _row)


def worst_case_prompt() -> list[dict[str, str]]:
    """The longest prompt the builder can make: the number with the most digits."""
    return messages(SYSTEM_PROMPT, question(HIGH))


def reference_answer(row: dict[str, Any]) -> str:
    """What belongs inside the tag for a dataset row."""
    return str(row["target"])
