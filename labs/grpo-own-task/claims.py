"""What chapter 7 claims of its CPU run (the README's command: a task from a file of the reader's own),
checked by its tests on the suite's run and by `uv run python -m grpolab.matrix` on every seed and
emulated machine.

The lesson: a task that lives outside the repository's task/ is checked before anything loads and
trained like the book's own. Held-out accuracy (greedy, numbers no training prompt holds) never falls,
and rises on four seeds of five (0 to 17 prompts, measured 2026-12-05: the stand-in learns the
commonest answer, 9, first; the chapter's page says so); the task check passed; the run doctor finds
nothing that held learning back. Held-out figures are counted in prompts (of 64).
"""

from __future__ import annotations

from grpolab.judging.claims import ChapterStore, Claim, load

CLAIMS = (
    Claim("held-out accuracy never falls (prompts of 64)", "held_out_rise", at_least=0),
    Claim("the task check passed", "task_check_passed", at_least=1),
    Claim("the run doctor finds nothing that held learning back", "doctor_findings", at_most=0),
)
FIRST = load("grpo-first")  # chapter 7 trains chapter 1's lesson: its run is read back the same way


def figures(book: ChapterStore) -> dict[str, float]:
    run = book.only("train")
    return FIRST.figures(book) | {"task_check_passed": float(run.data.tags.get("task_check") == "passed")}
