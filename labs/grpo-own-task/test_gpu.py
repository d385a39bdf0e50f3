"""Chapter 7 on a 16 GB card: the same command with Qwen3-4B, its sheet from the task's own longest prompt.

On the CPU: the GPU profile's sheet (`--budget-only`, nothing loads) takes its prompt length from the
chapter's task file, the longest prompt rendered in Qwen3's chat format at a character a token at most,
never from the book's addition. On a GPU (skipped without one): the chapter's README command trains
Qwen3-4B on the file's task, ends FINISHED, and its task check counted the lengths in Qwen3's tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from grpolab.config.settings import lab_settings
from task.dataset import chatml_chars

from suite import HAS_CUDA, run_command, run_into_store

LAB_DIR = Path(__file__).resolve().parent
README_BUDGET = "uv run python labs/grpo-own-task/train.py --budget-only"


@pytest.mark.slow
def test_the_gpu_sheet_takes_its_prompt_length_from_the_tasks_file():
    settings = lab_settings(LAB_DIR, "gpu")
    longest = chatml_chars(settings.get_task().worst_case_prompt())
    assert (
        settings.max_prompt_length
        == longest
        != chatml_chars(lab_settings(LAB_DIR.parent / "grpo-first", "gpu").get_task().worst_case_prompt())
    )
    result = run_command(README_BUDGET, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    sequence = longest + settings.max_completion_length  # the sheet's T: the task's prompt and a completion
    assert result.stdout.startswith("Qwen3-4B") and f"T {sequence}" in result.stdout, result.stdout[:500]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(
    not HAS_CUDA,
    reason="needs a CUDA GPU: trains Qwen3-4B on the chapter's task file and checks it ends FINISHED with the task check's lengths counted in Qwen3's tokens",
)
def test_the_chapter_trains_qwen3_4b_on_the_tasks_file(tmp_path):
    client, run = run_into_store(
        "uv run python labs/grpo-own-task/train.py --max-steps 4", tmp_path, "grpo-own-task"
    )
    assert run.info.status == "FINISHED" and run.data.tags["task_check"] == "passed"
    table = Path(client.download_artifacts(run.info.run_id, "task_check/table.md", str(tmp_path))).read_text()
    assert "tokens (sheet:" in table  # Qwen3's tokenizer, not the character bound
