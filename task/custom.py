"""A task in a Python file of the reader's own: the protocol the book's tasks keep, as module names.

    uv run python -m task new my_task                        # writes my_task.py and test_my_task.py
    uv run python -m task check my_task.py                   # what `task check` finds in it
    uv run python labs/grpo-first/train.py --task my_task.py # trains it

A task file defines, at module level (`uv run python -m task new` writes a working one):

| name | what it is |
|---|---|
| `SYSTEM_PROMPT` | the system turn of every prompt; it asks for the answer inside `<ans></ans>` |
| `build_dataset(n, seed)` | `n` training rows (a `datasets.Dataset`): a `prompt` column of chat messages, and the columns the rewards read |
| `build_eval_dataset(n, seed)` | `n` held-out rows, none of whose problems is in any training set |
| `worst_case_prompt()` | the longest prompt the builders can make (the budget's prompt length) |
| `parse_answer(text)` | the answer inside the tag, or None: the one parse both rewards use |
| `reference_answer(row)` | a right answer for a row: what goes inside the tag |
| `REWARD_FUNCS` | the rewards, TRL's signature, each declared with `task.rewards.declare_reward(max, role)` |
| `REWARD_COLUMNS` | (optional) the columns the rewards read; by default, the ones their signatures name |
| `DESCRIPTION` | (optional) one line for people; by default, the module docstring's first line |

The task is named after the file (`my_task`). The file runs as code when it is loaded, like any
Python module: load only files you trust.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

from task.protocol import Task

REQUIRED = (
    "SYSTEM_PROMPT",
    "build_dataset",
    "build_eval_dataset",
    "worst_case_prompt",
    "parse_answer",
    "reference_answer",
    "REWARD_FUNCS",
)


class TaskFileError(ValueError):
    """A task file that does not keep the protocol; one line saying what is missing and how to fix it."""


def file_task(path: Path):
    """The Task a Python file defines (the protocol above)."""

    if not path.is_file():
        raise TaskFileError(f"{path}: no such file: pass --task with the path of your task file")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    # A name of its own per content: two files of one name, or a file edited in a notebook, never share one.
    module_name = f"task_file_{path.stem}_{digest[:12]}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # rewards stay importable by name (pickling, dataset hashes)
        try:
            spec.loader.exec_module(module)
        except Exception as error:
            del sys.modules[module_name]
            raise TaskFileError(f"{path}: loading it raised {type(error).__name__}: {error}") from None
    missing = [name for name in REQUIRED if not hasattr(module, name)]
    if missing:
        raise TaskFileError(
            f"{path}: a task file defines {', '.join(REQUIRED)}; it has no {', '.join(missing)} "
            "(uv run python -m task new NAME writes a working one)"
        )
    rewards = tuple(module.REWARD_FUNCS)
    columns = getattr(module, "REWARD_COLUMNS", None)
    if columns is None:
        columns = _columns_named(rewards)
    doc = (module.__doc__ or "").strip().splitlines()
    try:
        return Task(
            name=path.stem,
            system_prompt=module.SYSTEM_PROMPT,
            build_dataset=module.build_dataset,
            reward_funcs=rewards,
            description=getattr(module, "DESCRIPTION", doc[0] if doc else path.stem),
            build_eval_dataset=module.build_eval_dataset,
            worst_case_prompt=module.worst_case_prompt,
            reward_columns=tuple(columns),
            parse_answer=module.parse_answer,
            reference_answer=module.reference_answer,
            source={"task_source": "file", "task_file": str(path), "task_file_sha256": digest},
        )
    except (ValueError, TypeError) as error:  # an undeclared reward, two of one name, no answer reward
        raise TaskFileError(f"{path}: {error}") from None


def _columns_named(rewards: tuple[Any, ...]) -> tuple[str, ...]:
    """The keyword columns the rewards' signatures require, besides prompts and completions."""
    names: list[str] = []
    for func in rewards:
        for name, param in inspect.signature(func).parameters.items():
            required = param.default is param.empty and param.kind not in (
                param.VAR_KEYWORD,
                param.VAR_POSITIONAL,
            )
            if required and name not in ("prompts", "completions") and name not in names:
                names.append(name)
    return tuple(names)
