"""The largest digit of a number: a task of your own, in one file (`uv run python -m task new` wrote it).

Make it yours: the prompts (`SYSTEM_PROMPT`, `question`, `_draw`), what makes two problems the same
(`_key`: the held-out split keeps them apart), what a right answer is (`_row`'s target,
`reference_answer`, `correctness_reward`). Then check it before a run pays for it, and train it:

    uv run python -m task check labs/grpo-own-task/largest_digit.py
    uv run pytest labs/grpo-own-task/test_largest_digit.py
    uv run python labs/grpo-first/train.py --task labs/grpo-own-task/largest_digit.py

Every reward is a plain function with TRL's signature, `(prompts, completions, **columns) ->
list[float]`, declared with the most it pays and its role: an answer reward (what the task is for) or
a shaping one (a form on the way to it). Both rewards read the answer with the one `parse_answer`, so
they never disagree on what an answer is.
"""

from __future__ import annotations

import random
from typing import Any

from task.dataset import build_rows, messages
from task.rewards import (
    CORRECT_REWARD,
    FORMAT_REWARD,
    RewardRole,
    answer_span,
    correctness_scores,
    declare_reward,
    format_scores,
    int_value,
    parse_int,
)

SYSTEM_PROMPT = "Give the largest digit of the number as one integer inside <ans></ans>."
LOW, HIGH = 100, 99_999
REWARD_COLUMNS = ("target",)  # the columns the rewards read, besides prompts and completions


def question(number: int) -> str:
    return f"What is the largest digit of {number}?"


def _draw(rng: random.Random) -> int:
    return rng.randint(LOW, HIGH)


def _key(number: int) -> int:
    return number  # the number is the problem: one in ten is held out, by a hash of it


def _row(number: int) -> dict[str, Any]:
    return {"prompt": messages(SYSTEM_PROMPT, question(number)), "target": max(int(d) for d in str(number))}


def build_dataset(n: int, seed: int):
    """`n` training prompts; the same (n, seed) gives the same rows."""
    return build_rows(n, seed, "train", _draw, _key, _row)


def build_eval_dataset(n: int, seed: int):
    """`n` held-out prompts: no number here is in any training set, whatever the seeds."""
    return build_rows(n, seed, "eval", _draw, _key, _row)


def worst_case_prompt() -> list[dict[str, str]]:
    """The longest prompt the builders make: it sets the budget's prompt length."""
    return messages(SYSTEM_PROMPT, question(HIGH))


def parse_answer(text: str) -> int | None:
    """The one integer inside the completion's one <ans> tag (ASCII digits), or None."""
    span = answer_span(text)
    return None if span is None else parse_int(span)


def reference_answer(row: dict[str, Any]) -> str:
    """A right answer for a row: what belongs inside the tag."""
    return str(row["target"])


@declare_reward(CORRECT_REWARD, RewardRole.ANSWER)
def correctness_reward(prompts: Any, completions: list[Any], target: Any, **kwargs: Any) -> list[float]:
    """1.0 when the answer inside the tag is the number's largest digit, else 0.0."""
    return correctness_scores(
        completions, parse_answer, lambda answer, expected: answer == int_value(expected), target
    )


@declare_reward(FORMAT_REWARD, RewardRole.SHAPING)
def format_reward(prompts: Any, completions: list[Any], **kwargs: Any) -> list[float]:
    """0.2 when the completion holds exactly one tag holding one integer, else 0.0."""
    return format_scores(completions, parse_answer)


REWARD_FUNCS = (correctness_reward, format_reward)
