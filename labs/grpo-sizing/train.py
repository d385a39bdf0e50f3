"""Chapter 2: how much card a GRPO step needs.

What one GRPO step holds grows with prompts per step x completions per prompt x completion length:
the rollouts vLLM keeps in its KV cache while it decodes them, and the activations and logits the
trainer keeps to take the loss over them. The budget sheet (budgets/) writes each of those down as a
line with its formula before anything loads. This chapter holds the sheet to account on the card you
own: it sweeps the knobs the book's hardware chapter names, runs every cell as a short GRPO run of
chapter 1 (the same task, rewards, loader and trainer call), and puts the sheet's prediction beside
what each cell measured, line by line. The book's tables themselves (KV cache per token, rollouts
held at each vLLM share, LoRA vs full training states, the weight sync of a server layout) come out
of the same sheet in notebooks/02-grpo-sizing.ipynb.

The sweep:
    1. Sizing, before anything loads. Every cell's sheet is computed on the card the cells run on
       (the one the driver reports, with what other processes hold) and printed.
    2. A fresh process per cell: `train.py cell --num-generations 8 --per-device-train-batch-size 8
       --max-completion-length 512 --parent-run-id <sweep>` is chapter 1's loop through the harness,
       which prints and checks the cell's sheet again, measures its own peak (a previous cell in the
       same process would leave the peak high) and logs every line as chapter 1 does
       (`<line>/budget_<unit>`, `<line>/measured_<unit>`, ...), in a run nested under the sweep's.
    3. The edge. The largest cell the sheet says fits runs; the first past it (its group doubled)
       is refused by the sheet, naming the line that does not fit, and is logged on the sweep's run.
       `--run-refused` runs it anyway, to record how it runs out of memory.
    4. The grid, read back from the result file each cell's run writes beside its adapter, onto
       the sweep's run: a table and a chart of budget vs measured for every cell, vLLM's rollouts
       held in its KV cache (read from the engine) against the sheet's count, generation time per
       step against the sheet's estimate, and the verdict: how far the sheet was off, at worst and on
       average, and on which line.

What a cell changes from chapter 1: every completion runs to max_completion_length (the end of
sequence is held off until then: vLLM's min_tokens, transformers' min_new_tokens). The sheet budgets
that worst case; a model that answers in six tokens would never show what a long completion costs.

Without a GPU the sweep runs the tiny random Qwen3 on the CPU, and its numbers are the tiny model's.
There is no card to fill there: the host has tens of GiB and a cell needs about 1.5. So the CPU
sweep sizes its grid against a small host of its own: what the sheet says the process holds once the
model is loaded (the Python runtime, its kernel caches, the weights) plus --memory-cap-gib for the
lines the knobs move (activations, logits, the adapter's gradients and optimizer states, the KV
cache of transformers' generate). The first cell whose step needs more is refused; run anyway, it
gets the same --memory-cap-gib, which lets the memory it writes to grow that much after loading and
no more. There is no vLLM on a CPU: no KV-cache rollouts to read, and the generation estimate (a GPU's
memory-bandwidth roofline) says little about a tiny model's decoding.

Standby (Unsloth's UNSLOTH_VLLM_STANDBY) is a flag like any setting, passed on to every cell: on a
GPU, `--unsloth-vllm-standby true` sweeps the grid with vLLM asleep while the trainer runs, and each
cell logs its generate and train phases beside the sheet's, to compare with the sweep without it.

Usage:
    uv run python labs/grpo-sizing/train.py                       # the sweep: GPU grid if there is one, else CPU
    uv run python labs/grpo-sizing/train.py --unsloth-vllm-standby true   # GPU: the same grid with standby
    uv run python labs/grpo-sizing/train.py --run-refused         # and the refused cell, run anyway
    uv run python labs/grpo-sizing/train.py --grid-num-generations 4,8 --grid-max-completion-length 256
    uv run python labs/grpo-sizing/train.py cell --num-generations 16 --max-completion-length 512   # one cell
    uv run mlflow ui --backend-store-uri sqlite:///mlflow.db     # the sweep's run, its cells nested under it
"""

from __future__ import annotations

import sys
from pathlib import Path

import grpolab
from grpolab.chapters import sweep
from grpolab.chapters.sweep import Grid, load_chapter
from grpolab.config.settings import LabSettings

LAB_DIR = Path(__file__).resolve().parent
FIRST = load_chapter("grpo-first")  # chapter 1's lesson: its GRPO config is every cell's

# --- The grids: prompts per step x completions per prompt (the group) x completion tokens ----------
GRIDS = {
    # Qwen3-4B in 4-bit on a 16 GB card, one prompt a step: 9 cells of 3 steps (about 20 minutes),
    # and the edge past 16 x 768.
    "gpu": Grid(prompts_per_step=(1,), num_generations=(4, 8, 16), max_completion_length=(256, 512, 768)),
    # The tiny model: 2 cells of 2 steps, in under 5 minutes on 2 cores (a cell is a fresh process,
    # and importing Unsloth alone takes most of a minute of CPU there). Four prompts a step: a tiny
    # model's memory moves with the number of tokens in the batch, little else.
    "cpu": Grid(prompts_per_step=(4,), num_generations=(8, 16), max_completion_length=(32,)),
}
# The CPU sweep's host lets a step add this much once the model is loaded: by the sheet the grid's
# largest cell (4 x 16 x 32) needs 0.21 GiB of it and the edge (4 x 32 x 32) 0.43.
CPU_MEMORY_CAP_GIB = 0.32


def full_length(s: LabSettings) -> dict[str, int]:
    """Hold the end of sequence off until max_completion_length: each rollout as long as the sheet
    budgets it (vLLM's SamplingParams on a GPU, transformers' GenerationConfig on the CPU)."""
    return {"min_tokens" if s.fast_inference else "min_new_tokens": s.max_completion_length}


def grpo_config(s: LabSettings, output_dir: Path, precision: dict[str, bool]):
    """Chapter 1's GRPOConfig, with every completion running to its full length."""
    config = FIRST.grpo_config(s, output_dir, precision)
    config.generation_kwargs = full_length(s)
    return config


def train(run: grpolab.Run) -> None:
    """One cell: chapter 1's lesson (its policy, rewards and trainer call) with this chapter's config."""
    FIRST.train(run, grpo_config)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["cell"]:
        return grpolab.run_lab(LAB_DIR, train, argv[1:], doc=__doc__)
    return sweep.main(LAB_DIR, GRIDS, argv, doc=__doc__, cpu_cap_gib=CPU_MEMORY_CAP_GIB)


if __name__ == "__main__":
    grpolab.exit_process(main())
