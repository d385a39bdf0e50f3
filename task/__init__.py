"""Toy verifiable tasks for GRPO: each one is a prompt builder plus rewards checked exactly.

| task | asks | answer inside ``<ans></ans>`` |
|---|---|---|
| ``addition`` | a + b, both in 0..999 | one integer: ``1998`` |
| ``small-addition`` | a + b, both in 0..19 (chapter 1's CPU stand-in's) | one integer: ``38`` |
| ``countdown`` | reach a target from 3-4 numbers, each once, with + - * / | an expression: ``(50 + 3) * 2`` |
| ``sorting`` | sort 3-8 integers in 0..99 | the list, comma-separated: ``3, 7, 7, 15`` |
| ``lastdigit`` | the last digit of a number in 100..99999 (chapter 4's) | one integer: ``7`` |

Every task pays ``correctness_reward`` 1.0 for a right answer and ``format_reward`` 0.2 for exactly one
tag holding a well-formed answer of its type, both parsed by the task's one ``parse_answer``, so the
metric names ``rewards/correctness_reward/mean`` and ``rewards/format_reward/mean`` mean the same for
every task. Each reward is declared (``task.rewards.declare_reward``) with the most it pays and its
role, answer or shaping; ``t.rewards`` lists the declarations. What a lab or a budget reads, without a
GPU::

    t = get_task("countdown")
    t.build_dataset(512, seed)        # training prompts: columns prompt, target, ... (t.reward_columns)
    t.build_eval_dataset(200, seed)   # held-out prompts, disjoint by content from every training set
    t.reward_funcs                    # (correctness_reward, format_reward), TRL's signature
    t.rewards                         # their RewardInfo: metric, max_reward (1.0, 0.2), role
    t.max_reward                      # the most one completion can earn: 1.2
    t.max_prompt_chars()              # characters of the longest prompt's messages (template not counted)

A new task is a module beside ``addition.py`` (system prompt, builders, ``worst_case_prompt``,
``parse_answer`` and the two rewards, each declared) and one ``Task`` entry in ``TASKS``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from task import addition, countdown, lastdigit, sorting
from task.dataset import prompt_chars
from task.rewards import (
    REWARDS,
    RewardInfo,
    RewardRole,
    completion_text,
    correctness_reward,
    declare_reward,
    format_reward,
    parse_answer,
    reward_info,
)

if TYPE_CHECKING:
    import datasets


@dataclass(frozen=True)
class Task:
    """One verifiable task: how to build its prompts and how to score completions.

    Parameters that describe the task:
        name: the registry key, the lab's ``task`` setting.
        description: one line for people: what is asked and what the answer looks like.
        system_prompt: the system turn of every prompt.
    Parameters that build prompts (conversational rows; same (n, seed), same rows; n >= 1):
        build_dataset: ``(n, seed) -> Dataset`` of training rows.
        build_eval_dataset: ``(n, seed) -> Dataset`` of held-out rows; no row's problem (up to order
            where order does not matter) is in any training set, whatever the seeds.
        worst_case_prompt: ``() -> messages``, the longest prompt the builders can make;
            ``max_prompt_chars()`` counts its characters.
    Parameters that score completions:
        reward_funcs: ``(correctness_reward, format_reward)``, each
            ``(prompts, completions, **columns) -> list[float]``, total: one float per completion,
            and declared with ``declare_reward``; their names distinct, at least one an answer reward.
        reward_columns: the dataset columns the rewards read besides prompts and completions.
        parse_answer: ``text -> answer | None``, the one parser both rewards use.
        reference_answer: ``row -> str``, a correct answer for a row (what goes inside the tag).
    """

    name: str
    system_prompt: str
    build_dataset: Callable[[int, int], datasets.Dataset]
    reward_funcs: tuple[Callable[..., list[float]], ...]
    description: str
    build_eval_dataset: Callable[[int, int], datasets.Dataset]
    worst_case_prompt: Callable[[], list[dict[str, str]]]
    reward_columns: tuple[str, ...]
    parse_answer: Callable[[str], Any]
    reference_answer: Callable[[dict[str, Any]], str]

    def __post_init__(self) -> None:
        # Checked when the task is built (at import for the registry's): a reward nobody declared, or
        # two logged under one name, would otherwise reach the run doctor's verdicts unread.
        names = [r.name for r in self.rewards]
        if len(set(names)) != len(names):
            raise ValueError(
                f"task {self.name!r}: TRL logs one metric per name, and rewards share one: {names}"
            )
        if not any(r.role is RewardRole.ANSWER for r in self.rewards):
            raise ValueError(f"task {self.name!r}: no reward is declared an answer reward: {names}")

    @property
    def rewards(self) -> tuple[RewardInfo, ...]:
        """The declarations of ``reward_funcs``, in the same order."""
        return tuple(reward_info(f) for f in self.reward_funcs)

    @property
    def max_reward(self) -> float:
        """The most one completion can earn: TRL's ``reward`` is the sum of the rewards (weights 1)."""
        return sum(r.max_reward for r in self.rewards)

    def max_prompt_chars(self) -> int:
        """Characters in the longest prompt's messages, system and user, without the chat template.

        Every row's prompt is at most this long. With a character-level tokenizer (the CPU profile's
        tiny model) it bounds the prompt's tokens once the template's own tokens are added; for a
        real chat template, render ``worst_case_prompt()`` through it and count.
        """
        return prompt_chars(self.worst_case_prompt())


class UnknownTaskError(KeyError, ValueError):
    """A task name not in ``TASKS``; a KeyError for lookups, a ValueError for argument checks."""

    def __str__(self) -> str:
        # KeyError.__str__ would quote the message like a key; print it as the plain sentence it is.
        return str(self.args[0]) if self.args else ""


ADDITION = Task(
    name=addition.NAME,
    system_prompt=addition.SYSTEM_PROMPT,
    build_dataset=addition.build_dataset,
    reward_funcs=(correctness_reward, format_reward),
    description="Add two integers in 0..999; answer as one integer inside <ans></ans>.",
    build_eval_dataset=addition.build_eval_dataset,
    worst_case_prompt=addition.worst_case_prompt,
    reward_columns=addition.REWARD_COLUMNS,
    parse_answer=parse_answer,
    reference_answer=addition.reference_answer,
)

SMALL_ADDITION = Task(
    name=addition.SMALL_NAME,
    system_prompt=addition.SYSTEM_PROMPT,
    build_dataset=partial(addition.build_dataset, high=addition.SMALL_HIGH),
    reward_funcs=(correctness_reward, format_reward),
    description=(
        f"Add two integers in 0..{addition.SMALL_HIGH} (chapter 1's on the CPU stand-in); answer as one "
        "integer inside <ans></ans>."
    ),
    build_eval_dataset=partial(addition.build_eval_dataset, high=addition.SMALL_HIGH),
    worst_case_prompt=partial(addition.worst_case_prompt, high=addition.SMALL_HIGH),
    reward_columns=addition.REWARD_COLUMNS,
    parse_answer=parse_answer,
    reference_answer=addition.reference_answer,
)

COUNTDOWN = Task(
    name=countdown.NAME,
    system_prompt=countdown.SYSTEM_PROMPT,
    build_dataset=countdown.build_dataset,
    reward_funcs=(countdown.correctness_reward, countdown.format_reward),
    description=(
        "Reach a target in 1..999 from 3 or 4 numbers in 1..99, each used once, with + - * / and "
        "parentheses; answer as one expression inside <ans></ans>."
    ),
    build_eval_dataset=countdown.build_eval_dataset,
    worst_case_prompt=countdown.worst_case_prompt,
    reward_columns=countdown.REWARD_COLUMNS,
    parse_answer=countdown.parse_answer,
    reference_answer=countdown.reference_answer,
)

SORTING = Task(
    name=sorting.NAME,
    system_prompt=sorting.SYSTEM_PROMPT,
    build_dataset=sorting.build_dataset,
    reward_funcs=(sorting.correctness_reward, sorting.format_reward),
    description=(
        "Sort 3 to 8 integers in 0..99 in ascending order; answer as the comma-separated list "
        "inside <ans></ans>."
    ),
    build_eval_dataset=sorting.build_eval_dataset,
    worst_case_prompt=sorting.worst_case_prompt,
    reward_columns=sorting.REWARD_COLUMNS,
    parse_answer=sorting.parse_answer,
    reference_answer=sorting.reference_answer,
)

LASTDIGIT = Task(
    name=lastdigit.NAME,
    system_prompt=lastdigit.SYSTEM_PROMPT,
    build_dataset=lastdigit.build_dataset,
    reward_funcs=(correctness_reward, format_reward),
    description="Give the last digit of a number in 100..99999; answer as one integer inside <ans></ans>.",
    build_eval_dataset=lastdigit.build_eval_dataset,
    worst_case_prompt=lastdigit.worst_case_prompt,
    reward_columns=lastdigit.REWARD_COLUMNS,
    parse_answer=parse_answer,
    reference_answer=lastdigit.reference_answer,
)

TASKS: dict[str, Task] = {t.name: t for t in (ADDITION, SMALL_ADDITION, COUNTDOWN, SORTING, LASTDIGIT)}


def get_task(name: str) -> Task:
    """The task registered under ``name``; UnknownTaskError lists the known ones."""
    try:
        return TASKS[name]
    except (KeyError, TypeError):  # TypeError: an unhashable name is just as unknown.
        known = ", ".join(sorted(TASKS))
        raise UnknownTaskError(f"unknown task {name!r}; known tasks: {known}") from None


__all__ = [
    "ADDITION",
    "COUNTDOWN",
    "LASTDIGIT",
    "REWARDS",
    "SMALL_ADDITION",
    "SORTING",
    "TASKS",
    "RewardInfo",
    "RewardRole",
    "Task",
    "UnknownTaskError",
    "completion_text",
    "correctness_reward",
    "declare_reward",
    "format_reward",
    "get_task",
    "parse_answer",
    "reward_info",
]
