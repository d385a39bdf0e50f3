"""Addition of two integers in 0..999: the toy task of the first lab."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import datasets

NAME = "addition"
LOW, HIGH = 0, 999
# Short on purpose: the tiny char-level CPU model sees it in every prompt too.
SYSTEM_PROMPT = "Add the two numbers. Give the final answer as one integer inside <ans></ans>."


def question(a: int, b: int) -> str:
    """The user turn for one example."""
    return f"What is {a} + {b}?"


def build_dataset(n: int, seed: int) -> datasets.Dataset:
    """``n`` conversational prompts with columns prompt, target, a, b; same (n, seed), same rows."""
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ValueError(f"the number of examples must be a positive integer, got {n!r}")
    import datasets  # here, not at the top: it costs seconds, and `import task` should stay light

    # A private generator: global random state would make the data depend on whatever ran before.
    rng = random.Random(seed)
    rows: dict[str, list] = {"prompt": [], "target": [], "a": [], "b": []}
    for _ in range(n):
        a, b = rng.randint(LOW, HIGH), rng.randint(LOW, HIGH)
        rows["prompt"].append(
            [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question(a, b)}]
        )
        rows["target"].append(a + b)
        rows["a"].append(a)
        rows["b"].append(b)
    return datasets.Dataset.from_dict(rows)
