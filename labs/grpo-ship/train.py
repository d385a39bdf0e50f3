"""Chapter 6: ship the adapter as a model others run, and prove each step kept what GRPO taught.

A trained adapter is not yet a model anyone runs. Each step after training can quietly throw the
training away: a load path that serves the base, a merge into 4-bit weights that rounds the adapter's
small changes back to where they were, an export that drops the chat template. This lab takes chapter
1's adapter through the steps a user takes it, and scores each on the training run's own held-out
prompts, greedy, with the task's exact checker, against what the adapter scored when it was trained:

    reload        the saved adapter, loaded in a fresh process by Unsloth's loader (PEFT underneath)
    merged_16bit  merged into the base's weights in 16 bit: a plain transformers folder
    merged_4bit   merged into the 4-bit weights and requantized: the trap, measured
    gguf          the 16-bit merge as a GGUF file (llama.cpp's format), read back and scored
    served        the merge registered in MLflow's Model Registry and served over HTTP

One MLflow run (run_kind=ship, tag ship.source_run) holds every stage's accuracy and its difference
from the adapter, the chart, and the verdict on its Overview; the 16-bit merge is a registered model
version whose tag points at the training run.

What this lab simplifies: one adapter, one task, greedy answers only. With no finished run of chapter 1
in the store, on a CPU it trains chapter 1's short form first (lab.toml) and says so.

Usage:
    uv run python labs/grpo-ship/train.py                        # ship chapter 1's latest finished run
    uv run python labs/grpo-ship/train.py --from <run id>        # or a run by its id, or its adapter folder
    uv run python labs/grpo-ship/train.py --budget-only          # the merge's host memory and disk, nothing loads
    uv run mlflow ui --backend-store-uri sqlite:///mlflow.db     # the ship run, and Models: the registered merge
"""

from __future__ import annotations

from pathlib import Path

import grpolab
from grpolab.chapters import load_chapter, ship
from grpolab.config.settings import LabSettings

LAB_DIR = Path(__file__).resolve().parent
FIRST = load_chapter("grpo-first")  # the lesson whose adapter is shipped, and its short form's


def grpo_config(s: LabSettings, output_dir: Path, precision: dict[str, bool]):
    """Chapter 1's GRPOConfig: the short form trains chapter 1's lesson as it is."""
    return FIRST.grpo_config(s, output_dir, precision)


def train(run: grpolab.Run) -> None:
    """The short form's lesson: chapter 1's."""
    FIRST.train(run, grpo_config)


def main(argv: list[str] | None = None) -> int:
    return ship.main(LAB_DIR, train, argv, doc=__doc__)


if __name__ == "__main__":
    grpolab.exit_process(main())
