"""A reward a real user could write, that pays for more than the right answer: chapter 4's loose checker.

Plain functions with TRL's signature, declared like every reward here (``task.rewards``), but used
by no task's ``reward_funcs``: a chapter that trains on one says so in its own code, and the task's
exact rewards still score its held-out answers. Each one's docstring says what it was meant to pay
for and the trick it pays for too; tests/test_loose_rewards.py shows each trick paid, and that no
reward of any task pays it.

``contains_answer_reward`` is the lenient checker everyone writes first (``str(answer) in text``):
meant to accept a right answer however the model phrases it, it pays any text that contains the
answer's digits. Example, for "What is the last digit of 827?" (target 7)::

    >>> contains_answer_reward(None, ["<ans>7</ans>", "The answer is 7.", "<ans>827</ans>", "0123456789"], [7] * 4)
    [1.0, 1.0, 1.0, 1.0]
    >>> from task.rewards import correctness_reward
    >>> correctness_reward(None, ["<ans>7</ans>", "The answer is 7.", "<ans>827</ans>", "0123456789"], [7] * 4)
    [1.0, 0.0, 0.0, 0.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from task.rewards import (
    CORRECT_REWARD,
    RewardRole,
    completion_text,
    declare_reward,
    int_value,
    per_completion,
)


@declare_reward(CORRECT_REWARD, RewardRole.ANSWER)
def contains_answer_reward(
    prompts: Any, completions: Sequence[Any], target: Any, **kwargs: Any
) -> list[float]:
    """1.0 when the target's digits appear anywhere in the completion, else 0.0.

    Meant for: a right answer in any phrasing ("7", "The answer is 7.", "<ans>7</ans>"). Pays too
    for: the prompt's number echoed (827 contains 7), a list of guesses ("3, 5, 7"), every digit at
    once ("0123456789"). Total, like every reward here: one float per completion, never an exception.
    """
    if completions is None or isinstance(completions, (str, bytes, dict)):
        return []
    try:
        completions = list(completions)
    except Exception:
        return []
    rewards = []
    for completion, expected in zip(completions, per_completion(target, len(completions)), strict=True):
        value = int_value(expected)
        text = completion_text(completion)
        rewards.append(CORRECT_REWARD if value is not None and str(value) in text else 0.0)
    return rewards
