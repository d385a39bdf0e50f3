"""Chapter 7's README command, run once by the suite (conftest.py: `chapter_run`), read back through
MLflow's client: a task from a file of the reader's own (labs/grpo-own-task/largest_digit.py, what
`uv run python -m task new` writes), checked before anything loaded, trained on the CPU stand-in.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from grpolab.config.settings import lab_settings

from suite import README, chapter, cpu_only, prose

LAB_DIR = Path(__file__).resolve().parent
TASK_FILE = LAB_DIR / "largest_digit.py"

pytestmark = [pytest.mark.slow, cpu_only("reads the CPU profile's README run; on a GPU it trains Qwen3-4B")]


@pytest.fixture
def readme(chapter_run):
    assert chapter_run.code == 0, chapter_run.log()
    (run,) = chapter_run.runs
    assert run.info.status == "FINISHED"
    return chapter_run, run


def test_the_run_says_where_its_task_came_from_and_what_the_check_found(readme, tmp_path):
    chapter_run, run = readme
    tags = run.data.tags
    assert tags["task_source"] == "file" and tags["task_name"] == "largest_digit"
    assert tags["task_file"] == str(TASK_FILE)
    assert tags["task_file_sha256"] == hashlib.sha256(TASK_FILE.read_bytes()).hexdigest()
    assert tags["task_check"] == "passed"
    table = Path(
        chapter_run.client.download_artifacts(run.info.run_id, "task_check/table.md", str(tmp_path))
    ).read_text()
    assert table.startswith("task check: largest_digit passed 9 checks")
    assert table.count("| pass |") == 8 and table.count("| note |") == 1
    assert (
        "Task check: largest_digit passed 9 checks (every check: `task_check/table.md`)."
        in tags["mlflow.note.content"]
    )
    assert run.data.params["task"] == str(TASK_FILE)


def test_the_chapters_task_file_is_what_task_new_writes(tmp_path):
    """The page walks a reader from `uv run python -m task new` to a trained adapter: the chapter trains
    that very file, and its tests are the ones `task new` writes beside it (only the paths they show
    differ: here the chapter's folder, there a temporary one)."""
    from task.__main__ import new

    written = new("largest_digit", tmp_path)
    for path, ours in zip(written, (TASK_FILE, LAB_DIR / "test_largest_digit.py"), strict=True):
        shown = {str(tmp_path / p.name): f"labs/grpo-own-task/{p.name}" for p in written}
        text = path.read_text()
        for theirs, mine in shown.items():
            text = text.replace(theirs, mine)
        assert text == ours.read_text(), f"{ours.name} is not what `task new` writes"


def test_the_books_claims_hold_the_task_from_a_file_learns(chapter_claims):
    assert chapter_claims.failures == [], chapter_claims.figures


def test_the_pages_quote_this_runs_figures_digit_for_digit(readme, chapter_claims):
    """The CPU profile computes the same bits on every x86-64 machine (docs/every-machine.md): the page
    and the README's row quote this run."""
    f = chapter_claims.figures
    n = lab_settings(LAB_DIR, "cpu").eval_prompts
    base, adapter = f["held_out_base"] / n, f["held_out_adapter"] / n
    said = (
        f"held-out accuracy {base:.1%} -> {adapter:.1%}, correctness reward {f['correctness_first']:.3f} -> "
        f"{f['correctness_last']:.3f}"
    )
    assert said in chapter("grpo-own-task").measured, f"the README's row does not quote this run: {said!r}"
    page = prose(LAB_DIR / "README.md")
    assert (
        f"from {base:.1%} to {adapter:.1%}" in page
        and f"{f['correctness_first']:.3f} to {f['correctness_last']:.3f}" in page
    )
    assert "grpo-own-task" in prose(README)
