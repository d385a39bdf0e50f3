"""A reward whose parse reads another tag than the prompt asks for: chapter 8's parse that never pays.

open-r1's and DeepSeek-R1's recipes put the answer in ``<answer></answer>``. Their accuracy reward,
copied onto a task whose prompt asks for ``<ans></ans>`` (every task here), parses a tag the model
is never told to write: it pays nothing on any completion, right or wrong, and the run trains on the
format reward alone. Nothing crashes and the loss is finite; only the reward's curve, flat at zero
beside completions that hold an answer in the prompt's tag, says so (the run doctor's
``reward_never_pays``). Like ``task.loose``, no task's ``reward_funcs`` holds it: a chapter that
trains on it says so in its own code. Example, for "What is the last digit of 827?" (target 7)::

    >>> answer_tag_reward(None, ["<ans>7</ans>", "<answer>7</answer>"], [7, 7])
    [0.0, 1.0]
    >>> from task.rewards import correctness_reward
    >>> correctness_reward(None, ["<ans>7</ans>", "<answer>7</answer>"], [7, 7])
    [1.0, 0.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from task.rewards import CORRECT_REWARD, RewardRole, correctness_scores, declare_reward, int_value, parse_int

OPEN, CLOSE = "<answer>", "</answer>"


def parse_answer_tag(text: str) -> int | None:
    """The integer inside the completion's single ``<answer>`` tag (open-r1's); None for anything else."""
    if not isinstance(text, str) or text.count(OPEN) != 1 or text.count(CLOSE) != 1:
        return None
    start, end = text.index(OPEN) + len(OPEN), text.index(CLOSE)
    return parse_int(text[start:end]) if start <= end else None


def _same_int(answer: int, expected: Any) -> bool:
    return answer == int_value(expected)


@declare_reward(CORRECT_REWARD, RewardRole.ANSWER)
def answer_tag_reward(prompts: Any, completions: Sequence[Any], target: Any, **kwargs: Any) -> list[float]:
    """1.0 when the completion's one integer inside ``<answer></answer>`` equals the target, else 0.0.

    Meant for: a right answer in open-r1's tag. Pays nothing where the prompt asks for ``<ans>``: the
    model writes the prompt's tag, and this parse never finds its own. Total, like every reward here.
    """
    return correctness_scores(completions, parse_answer_tag, _same_int, target)
