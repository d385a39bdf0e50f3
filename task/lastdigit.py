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

Its config asks other questions of the same numbers, easiest first (``ASKS``): ``{"ask": "first_digit"}``,
the last digit (the default), ``{"ask": "digit_sum"}``. Chapter 8 trains the two ends, a task the model
already solves and one out of its reach, and the run doctor names the next question up or down the
ladder (``Task.harder``, ``Task.easier``) as the step to take.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from task.dataset import build_rows, messages

if TYPE_CHECKING:
    import datasets

NAME = "lastdigit"
# Wide enough that a held-out set of hundreds is mostly distinct numbers (one in ten is held out);
# the digit to read always sits just before the '?', however long the number.
LOW, HIGH = 100, 99_999
REWARD_COLUMNS = ("target",)
DEFAULT_ASK = "last_digit"
# What each config asks of the number, easiest first: (what the system prompt asks for, the answer).
# The first digit sits where every number starts; the last needs its end found; the digit sum needs
# every digit read and added, and is a one-digit answer only when the number is small.
ASKS = {
    "first_digit": ("the first digit", lambda n: int(str(n)[0])),
    "last_digit": ("the last digit", lambda n: n % 10),
    "digit_sum": ("the sum of the digits", lambda n: sum(map(int, str(n)))),
}


def system_prompt(ask: str = DEFAULT_ASK) -> str:
    return f"Give {ASKS[ask][0]} of the number as one integer inside <ans></ans>."


SYSTEM_PROMPT = system_prompt()


def question(number: int, ask: str = DEFAULT_ASK) -> str:
    """The user turn for one example."""
    return f"What is {ASKS[ask][0]} of {number}?"


def neighbours(ask: str) -> tuple[str | None, str | None]:
    """The configs of the next question down and up the ladder (easier, harder), None at its ends;
    the default question's config is `{}`."""
    names = list(ASKS)
    i = names.index(ask)

    def config(j: int) -> str | None:
        if not 0 <= j < len(names):
            return None
        return "{}" if names[j] == DEFAULT_ASK else json.dumps({"ask": names[j]})

    return config(i - 1), config(i + 1)


def read_config(config: Mapping[str, Any]) -> str:
    """The question a config asks; a one-line ValueError for anything else."""
    unknown = sorted(set(config) - {"ask"})
    ask = config.get("ask", DEFAULT_ASK)
    if unknown or ask not in ASKS:
        raise ValueError(
            f'task_config: lastdigit takes only {{"ask": ...}}, one of {", ".join(ASKS)}; got {json.dumps(dict(config))}'
        )
    return ask


def _draw(rng: random.Random) -> int:
    return rng.randint(LOW, HIGH)


def _key(problem: int) -> int:
    return problem  # the number is the problem: about 100 000 of them, one in ten held out


def _row(number: int, ask: str = DEFAULT_ASK) -> dict[str, Any]:
    return {
        "prompt": messages(system_prompt(ask), question(number, ask)),
        "target": ASKS[ask][1](number),
        "number": number,
    }


def build_dataset(n: int, seed: int, ask: str = DEFAULT_ASK) -> datasets.Dataset:
    """``n`` training prompts with columns prompt, target, number; same (n, seed), same rows."""
    return build_rows(n, seed, "train", _draw, _key, partial(_row, ask=ask))


def build_eval_dataset(n: int, seed: int, ask: str = DEFAULT_ASK) -> datasets.Dataset:
    """``n`` held-out prompts, none of whose numbers is among any seed's training prompts."""
    return build_rows(n, seed, "eval", _draw, _key, partial(_row, ask=ask))


def worst_case_prompt(ask: str = DEFAULT_ASK) -> list[dict[str, str]]:
    """The longest prompt the builder can make: the number with the most digits."""
    return messages(system_prompt(ask), question(HIGH, ask))


def reference_answer(row: dict[str, Any]) -> str:
    """What belongs inside the tag for a dataset row."""
    return str(row["target"])
