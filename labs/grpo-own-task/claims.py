"""What chapter 7 claims of its CPU run (the README's command: a task from a file of the reader's own),
checked by its tests on the suite's run and by `uv run python -m grpolab.matrix` on every seed and
emulated machine.

The lesson: a task that lives outside the repository's task/ is checked before anything loads and
trained like the book's own. Its stand-in knows the largest digit more often than not but answers
outside the tag; GRPO teaches the tag, and held-out accuracy (greedy, in the tag, numbers no training
prompt holds) rises by at least 12 prompts of 64 (16 to 29 over seeds 0-4, measured 2026-12-05); the
adapter answers in the tag on most held-out prompts; the task check passed; the run doctor finds
nothing that held learning back. Held-out figures are counted in prompts (of 64).
"""

from __future__ import annotations

from grpolab.judging.claims import ChapterStore, Claim, load

CLAIMS = (
    Claim("held-out accuracy rises by at least 12 prompts of 64", "held_out_rise", at_least=12),
    Claim("the adapter answers in the tag on most held-out prompts", "adapter_format", at_least=48),
    Claim("the task check passed", "task_check_passed", at_least=1),
    Claim("the run doctor finds nothing that held learning back", "doctor_findings", at_most=0),
)
FIRST = load("grpo-first")  # chapter 7 trains chapter 1's lesson: its run is read back the same way


def figures(book: ChapterStore) -> dict[str, float]:
    run = book.only("train")
    return FIRST.figures(book) | {"task_check_passed": float(run.data.tags.get("task_check") == "passed")}
