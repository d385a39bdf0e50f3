"""The task's pre-flight in a lab: its fast part before anything loads, and its whole table in MLflow.

Before anything loads (grpolab.lab.prepare), every lab checks the task it trains (task.check, `fast`):
a reward that raises on an odd completion, runs the completion as code, or pays a completion with no
answer as right is refused in one line, whatever the task (the book's, a file, a data file,
reasoning-gym). `--ignore-task-check` trains anyway; the run's tag `task_check` says so. Once the
MLflow run is open, the whole check runs (wrong answers, partial credit, determinism, the held-out
split, the lengths in the run's tokens on the CPU, the speed): its table is the artifact
`task_check/table.md`, its verdict opens the Overview's last part, and the task's source (the book, a file
and its sha256, a data file's path, rows and sha256, reasoning-gym's dataset, config and version) is
in the run's tags.
"""

from __future__ import annotations

import sys

from grpolab.config.errors import LabSettingsError

ARTIFACT = "task_check/table.md"
IGNORE_FLAG = "--ignore-task-check"


def preflight(settings, ignore: bool = False):
    """The fast part of the task check; a LabSettingsError naming what failed unless `ignore`."""
    from task.check import check

    report = check(settings.get_task(), fast=True, seed=settings.seed)
    if report.ok:
        return report
    if not ignore:
        raise LabSettingsError(
            f"{report.verdict()}: fix the task, see every check with `uv run python -m task check {settings.task}`, "
            f"or pass {IGNORE_FLAG} to train anyway"
        )
    print(f"warning: {report.verdict()} (training anyway: {IGNORE_FLAG})", file=sys.stderr, flush=True)
    return report


def log(settings, ignored: bool = False):
    """The whole check in the active MLflow run: the task's source and the verdict as tags, the table as
    an artifact. Returns the report (its verdict goes on the Overview)."""
    import mlflow

    from task.check import check

    t = settings.get_task()
    tokenizer = _tokenizer(settings)
    report = check(
        t,
        seed=settings.seed,
        held_out=settings.eval_prompts or 8,
        tokenizer=tokenizer,
        max_prompt_length=settings.prompt_room,
        max_completion_length=settings.max_completion_length,
    )
    verdict = "passed" if report.ok else "failed: " + ",".join(f.check for f in report.failed)
    mlflow.set_tags(
        {
            **dict(t.source),
            "task_name": t.name,
            "task_check": verdict
            + (f" (trained anyway: {IGNORE_FLAG})" if ignored and not report.ok else ""),
        }
    )
    mlflow.log_text(report.markdown(), ARTIFACT)
    return report


def _tokenizer(settings):
    """The tokenizer the run loads, for the lengths in its tokens: the stand-in's (built in a moment), or
    the model's own (Qwen3's, from the Hub's cache, which the load is about to fill); None when it cannot
    be had, and the lengths are then bounded in characters."""
    if settings.model == "tiny-qwen3":
        from grpolab.tiny_model import build_tokenizer

        return build_tokenizer()
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(settings.model)
    except Exception as error:  # offline, a gated model: the character bound still holds
        print(f"note: the task check counts lengths in characters ({type(error).__name__})", file=sys.stderr)
        return None
