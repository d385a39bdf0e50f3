"""The task's rewards behind verl's reward signature.

verl's reward loop calls ``compute_score(data_source=..., solution_str=..., ground_truth=...,
extra_info=...)`` once per completion (verl/experimental/reward_loop/reward_manager/naive.py), with
the completion decoded without special tokens, as TRL decodes it for its reward functions. This file
is what ``reward.custom_reward_function.path`` names; verl loads it by path, in its reward workers.

The score is the sum of the task's own rewards, called exactly as TRL calls them: one completion,
``target`` and the task's other reward columns as one-element lists. The dict's other keys are the
rewards one by one: verl logs each (as TRL logs ``rewards/<name>/mean``).

Example::

    >>> compute_score("addition", "<ans>579</ans>", 579, {})
    {'score': 1.2, 'correctness_reward': 1.0, 'format_reward': 0.2}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from task import get_task


def compute_score(
    data_source: str, solution_str: Any, ground_truth: Any, extra_info: Any = None, **kwargs: Any
) -> dict[str, float]:
    """What the task's rewards pay for this completion; total on any completion (never raises on it).

    An unknown ``data_source`` raises: that is a data set built for another task, not model output.
    """
    task = get_task(data_source)
    info = extra_info if isinstance(extra_info, Mapping) else {}
    columns = {"target": [ground_truth]}
    columns.update({name: [info.get(name)] for name in task.reward_columns if name != "target"})
    scores = {
        fn.__name__: float(fn(prompts=[None], completions=[solution_str], **columns)[0])
        for fn in task.reward_funcs
    }
    return {"score": sum(scores.values()), **scores}
