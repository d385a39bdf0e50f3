"""Toy verifiable tasks for GRPO: each one is a prompt builder plus rewards checked exactly.

A new task is a module beside ``addition.py`` (system prompt, ``build_dataset(n, seed)``, rewards)
and one ``Task`` entry in ``TASKS``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from task import addition
from task.rewards import REWARDS, completion_text, correctness_reward, format_reward, parse_answer

if TYPE_CHECKING:
    import datasets


@dataclass(frozen=True)
class Task:
    """One verifiable task: how to build its prompts and how to score completions."""

    name: str
    system_prompt: str
    build_dataset: Callable[[int, int], datasets.Dataset]
    reward_funcs: tuple[Callable[..., list[float]], ...]
    description: str


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
)

TASKS: dict[str, Task] = {t.name: t for t in (ADDITION,)}


def get_task(name: str) -> Task:
    """The task registered under ``name``; UnknownTaskError lists the known ones."""
    try:
        return TASKS[name]
    except (KeyError, TypeError):  # TypeError: an unhashable name is just as unknown.
        known = ", ".join(sorted(TASKS))
        raise UnknownTaskError(f"unknown task {name!r}; known tasks: {known}") from None


__all__ = [
    "ADDITION",
    "REWARDS",
    "TASKS",
    "Task",
    "UnknownTaskError",
    "completion_text",
    "correctness_reward",
    "format_reward",
    "get_task",
    "parse_answer",
]
