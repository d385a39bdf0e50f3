"""Toy verifiable tasks for GRPO: each one is a prompt builder plus rewards checked exactly.

| task | asks | answer inside ``<ans></ans>`` |
|---|---|---|
| ``addition`` | a + b, both in 0..999 | one integer: ``1998`` |
| ``small-addition`` | a + b, both in 0..19 (chapter 1's CPU stand-in's) | one integer: ``38`` |
| ``countdown`` | reach a target from 3-4 numbers, each once, with + - * / | an expression: ``(50 + 3) * 2`` |
| ``sorting`` | sort 3-8 integers in 0..99 | the list, comma-separated: ``3, 7, 7, 15`` |
| ``lastdigit`` | the last digit of a number in 100..99999 (chapter 4's); config ``{"ask": ...}``: ``first_digit`` (easier), ``digit_sum`` (harder) | one integer: ``7`` |

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

A new task of the book's is a module beside ``addition.py`` (system prompt, builders,
``worst_case_prompt``, ``parse_answer`` and the two rewards, each declared) and one ``Task`` entry in
``TASKS``. A reader's task needs no change here: ``get_task`` also takes a Python file that keeps the
same protocol (``task.custom``), a data file with a checker (``task.datafile``) or one of
reasoning-gym's datasets (``task.gym``), and ``python -m task check`` checks any of them before a run
pays for it (``task.check``)::

    get_task("my_task.py")                                        # a file of the reader's own
    get_task("questions.jsonl", {"checker": "number"})            # a data file, its checker
    get_task("reasoning-gym:basic_arithmetic", {"max_terms": 3})  # a procedural dataset
    get_task("lastdigit", {"ask": "digit_sum"})                    # a book task's harder question

Of the book's tasks only ``lastdigit`` takes a config: a ladder of questions about one number, so the
run doctor can name the neighbouring question (``t.easier``, ``t.harder``) when a task is solved
already or out of the policy's reach.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache, lru_cache, partial
from pathlib import Path
from typing import Any

from task import addition, countdown, lastdigit, sorting
from task.protocol import Task, UnknownTaskError
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


@cache
def _lastdigit(ask: str) -> Task:
    """lastdigit asking `ask` of its numbers (lastdigit.ASKS): one Task object per question."""
    easier, harder = lastdigit.neighbours(ask)
    return Task(
        name=lastdigit.NAME,
        system_prompt=lastdigit.system_prompt(ask),
        build_dataset=partial(lastdigit.build_dataset, ask=ask),
        reward_funcs=(correctness_reward, format_reward),
        description=(
            f"Give {lastdigit.ASKS[ask][0]} of a number in 100..99999; answer as one integer inside <ans></ans>."
        ),
        build_eval_dataset=partial(lastdigit.build_eval_dataset, ask=ask),
        worst_case_prompt=partial(lastdigit.worst_case_prompt, ask=ask),
        reward_columns=lastdigit.REWARD_COLUMNS,
        parse_answer=parse_answer,
        reference_answer=lastdigit.reference_answer,
        easier=easier,
        harder=harder,
    )


LASTDIGIT = _lastdigit(lastdigit.DEFAULT_ASK)
# The book's tasks that take a config: what it asks of them (the others take none).
CONFIGURABLE = {lastdigit.NAME: lambda config: _lastdigit(lastdigit.read_config(config))}

TASKS: dict[str, Task] = {t.name: t for t in (ADDITION, SMALL_ADDITION, COUNTDOWN, SORTING, LASTDIGIT)}


# What a task spec names besides the registry: a task file, a data file, or a reasoning-gym dataset.
DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


def is_path(spec: str) -> bool:
    """Whether a task spec names a file (a task file or a data file) rather than a registered task."""
    return isinstance(spec, str) and spec.lower().endswith((".py", *DATA_SUFFIXES))


def task_config(config: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """A task's config from JSON text or a mapping; a one-line ValueError for anything else."""
    if config is None or config == "":
        return {}
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError as error:
            raise ValueError(
                f'task_config: not JSON ({error.msg}): pass an object, e.g. \'{{"checker": "number"}}\''
            ) from None
    if not isinstance(config, Mapping):
        raise ValueError(f"task_config: a JSON object is needed, got {type(config).__name__}")
    return dict(config)


def get_task(name: str, config: str | Mapping[str, Any] | None = None) -> Task:
    """The task a spec names: a registered task (``TASKS``), a Python task file (``my_task.py``), a data
    file (``.jsonl``, ``.json``, ``.csv``, ``.parquet``, with ``config`` naming its columns and checker),
    or ``reasoning-gym:<dataset>`` (``config``: the dataset's own arguments). UnknownTaskError when it
    names none of them; a one-line ValueError for a file or config that cannot make a task. The same
    spec and config give the same Task object in a process (its reward functions are the ones TRL logs)."""
    settings = task_config(config)
    if isinstance(name, str) and name in TASKS:
        if name in CONFIGURABLE:
            return CONFIGURABLE[name](settings)
        if settings:
            raise ValueError(
                f"task_config: the book's task {name!r} takes no config, got {json.dumps(settings)}"
            )
        return TASKS[name]
    if isinstance(name, str) and (is_path(name) or name.startswith("reasoning-gym:")):
        key = json.dumps(settings, sort_keys=True)
        if is_path(name):
            path = Path(name).expanduser().resolve()
            stat = path.stat() if path.is_file() else None
            return _load(str(path), key, (stat.st_mtime_ns, stat.st_size) if stat else None)
        return _load(name, key, None)
    known = ", ".join(sorted(TASKS))
    raise UnknownTaskError(
        f"unknown task {name!r}; known tasks: {known}, or a task file (my_task.py), a data file (.jsonl, .json, "
        ".csv, .parquet) or reasoning-gym:<dataset>"
    )


@lru_cache(maxsize=32)
def _load(spec: str, config_json: str, version: Any) -> Task:
    """A task from outside the registry, once per spec, config and file version (`version`)."""
    config = json.loads(config_json)
    if spec.startswith("reasoning-gym:"):
        from task.gym import gym_task

        return gym_task(spec, config)
    path = Path(spec)
    if path.suffix.lower() == ".py":
        if config:
            raise ValueError(
                f"task_config: a task file takes no config (its file is its config), got {config_json}"
            )
        from task.custom import file_task

        return file_task(path)
    from task.datafile import data_task

    return data_task(path, config)


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
    "is_path",
    "parse_answer",
    "reward_info",
    "task_config",
]
