"""Chapter 7: your own task, from a file, checked before a GPU minute is spent.

The book's chapters train its own toy tasks. This one trains a task that lives in a file of the
reader's own (`largest_digit.py`, beside this lesson, outside task/): the protocol the book's tasks
keep, as module names (its prompts and held-out split, its longest prompt, the one parse of an answer,
its rewards declared with what they pay and their role). `uv run python -m task new NAME` writes a
working one to start from.

Before anything loads, the lab checks the task (task.check, its fast part): a reward that raises on
an odd completion, runs the completion as code, or pays a completion with no answer as right is
refused in one line, before a GPU minute is paid for it. `uv run python -m task check FILE` runs every
check (wrong answers, partial credit, determinism, the held-out split, the lengths, the speed), one
line each, with the worst example it found.

The lesson itself is chapter 1's: the policy, the trainer call, the GRPO config. What changes is
where the task comes from (lab.toml: `task = "largest_digit.py"`), and the same flag takes any task:

    uv run python labs/grpo-own-task/train.py                                          # the chapter's file
    uv run python labs/grpo-first/train.py --task my_task.py                           # a file of yours
    uv run python labs/grpo-first/train.py --task data.jsonl --task-config '{"checker": "number"}'
    uv run python labs/grpo-first/train.py --task reasoning-gym:basic_arithmetic

Usage:
    uv run python labs/grpo-own-task/train.py                   # GPU if there is one, else the CPU stand-in
    uv run python labs/grpo-own-task/train.py --budget-only     # the sheet, from the task's longest prompt
    uv run python -m task check labs/grpo-own-task/largest_digit.py
"""

from __future__ import annotations

from pathlib import Path

import grpolab
from grpolab.chapters import load_chapter
from grpolab.config.settings import LabSettings

LAB_DIR = Path(__file__).resolve().parent
FIRST = load_chapter("grpo-first")  # chapter 1's lesson: the policy, the rewards, the trainer call


def grpo_config(s: LabSettings, output_dir: Path, precision: dict[str, bool]):
    """Chapter 1's GRPOConfig as it is: the task is what this chapter changes."""
    return FIRST.grpo_config(s, output_dir, precision)


def train(run: grpolab.Run) -> None:
    """Chapter 1's lesson on the chapter's task: `run.task` is the file's task, its rewards included."""
    FIRST.train(run, grpo_config)


def main(argv: list[str] | None = None) -> int:
    return grpolab.run_lab(LAB_DIR, train, argv, doc=__doc__)


if __name__ == "__main__":
    grpolab.exit_process(main())
