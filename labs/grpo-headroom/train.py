"""Chapter 5: spend the headroom, on group size, completion length and batch, each GiB priced in learning.

Chapter 1 shows why the book's recipe fits a 16 GB card, and what it leaves: on an RTX 5080 it peaks
at about 11 of 15.9 GiB. The book's next job is "to spend the headroom deliberately: on group size,
on completion length, on batch". A 16 GB user asks it before every run: with 5 GiB left, which
knob buys the most learning? This chapter answers with arms:

    1. The sheet first. For each knob, the budget sheet finds the largest value that still fits
       the card (`budgets.largest`, what `--headroom` prints). Each arm raises one knob from the
       recipe to the same fraction of that range (--fraction, 0.5 by default), so every arm spends
       about the same GiB: more completions per group (a finer baseline for the advantage), longer
       completions (room to reason before the tag), more prompts per step (more groups per
       update); on a GPU, standby too (Unsloth's larger vLLM share, paid in sleep and wake time).
       The recipe itself is the arm that spends nothing.
    2. Every arm a process of its own (chapter 2's cells, nested under this chapter's run): a
       chapter about memory needs each arm's peak to be its own, which arms sharing a process (as
       chapter 4's do) cannot give.
    3. Priced. From each arm's run: the sheet's peak and the measured one, held-out accuracy before
       and after (the same held-out prompts for all), minutes of training and decode speed. On the
       chapter's run: held-out accuracy gained per GiB spent beyond the recipe, and per minute of
       training, as a chart, a table, and the verdict that opens its Overview.

The budget the arms are compared on: the same number of steps. That is the question as a user meets
it: a run of N steps, and memory to spend on it. An arm that draws more completions per step also
takes longer; the price per minute says what that time bought, so an arm cannot win on GiB alone
by training longer unseen.

Without a GPU the arms run chapter 1's CPU stand-in (sums of numbers in 0..19) on a small host of
the chapter's own, as chapter 2's sweep does: what the sheet says the process holds once loaded,
plus --memory-cap-gib for what the knobs move, so that the headroom is a range at all (the real
host has tens of GiB). The ranking is the stand-in's, on that host: a 2-layer model's, not
Qwen3-4B's on a 16 GB card.

Usage:
    uv run python labs/grpo-headroom/train.py                             # the arms: GPU if there is one, else CPU
    uv run python labs/grpo-headroom/train.py --budget-only --profile gpu  # every GPU arm's sheet, nothing runs
    uv run python labs/grpo-headroom/train.py --fraction 0.25             # spend a quarter of each knob's headroom
    uv run mlflow ui --backend-store-uri sqlite:///mlflow.db              # the chapter's run, its arms nested under it
"""

from __future__ import annotations

import sys
from pathlib import Path

import grpolab
from grpolab.chapters import headroom, load_chapter
from grpolab.config.settings import LabSettings

LAB_DIR = Path(__file__).resolve().parent
FIRST = load_chapter("grpo-first")  # chapter 1's lesson: every arm trains it

FRACTION = 0.5  # how far each arm goes into its knob's headroom
# The CPU host's room for a step once the stand-in is loaded: by the sheet, the recipe (1 x 16 x 32)
# needs a small part of it, and each knob has a range of a few times its value. 0.15 GiB, not the 0.25
# it was: the group arm draws 30 completions a group, not 45, and trains in about half the time (at
# 45 it was about half the chapter's training), and every arm still rises 11 to 25 of 32 held-out
# prompts on seeds 0-4 (the matrix, 2026-12-07); the other arms' cells are the same at either size.
CPU_MEMORY_CAP_GIB = 0.15


def grpo_config(s: LabSettings, output_dir: Path, precision: dict[str, bool]):
    """Chapter 1's GRPOConfig as it is: an arm differs from the recipe only in the knob it spends on."""
    return FIRST.grpo_config(s, output_dir, precision)


def train(run: grpolab.Run) -> None:
    """One arm: chapter 1's lesson (its policy, rewards and trainer call) with this chapter's config."""
    FIRST.train(run, grpo_config)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["cell"]:  # one arm, in the process the chapter started for it
        return grpolab.run_lab(LAB_DIR, train, argv[1:], doc=__doc__)
    return headroom.main(LAB_DIR, argv, __doc__, CPU_MEMORY_CAP_GIB, FRACTION)


if __name__ == "__main__":
    grpolab.exit_process(main())
