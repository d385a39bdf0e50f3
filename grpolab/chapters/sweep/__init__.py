"""A sweep: one chapter run per cell of a grid, each in a fresh process, nested under one MLflow run.

Sizing comes first. Every cell's budget sheet is computed on the card the cells will run on before
any of them starts: a cell the sheet refuses is not started (its binding line is logged on the
sweep's run, never as an empty FAILED child), and the first cell past the largest that fits can be
run anyway (`run_refused`) to record how it runs out of memory.

Each cell is the chapter's own train.py in a process of its own (`train.py cell --num-generations 8
--per-device-train-batch-size 32 --max-completion-length 64 --parent-run-id <sweep>`), so its peak
is its own. The harness opens the cell's run as a child of the sweep's (MLflow's tag
`mlflow.parentRunId`), logs its budget and measured lines under chapter 1's names, and writes the
run's result file in the cell's own folder (grpolab.memory.run_result). The sweep reads that file, puts the
grid side by side (a table, a chart, the verdict: how far the sheet was off, at worst and on
average, and on which line) and logs that on its own run.

One module per job:

- host: the card the sheets are computed on (the detected GPU, or the CPU sweep's capped host);
- grid: the grid, each cell's sheet, the edge past the largest cell that fits;
- cells: a cell in its own process, and what became of it, read from its result file;
- report: the verdict, the table and the chart (pure: no MLflow, no processes);
- loop: the sweep's MLflow run, every cell run or refused under it, the report logged on it;
- cli: the flags and `main`.

The sweep's process never creates a CUDA context (it would sit on the card under every cell): the
card is read through NVML alone (grpolab.memory.device). Nothing here imports Unsloth, TRL or transformers.
"""

from __future__ import annotations

from grpolab.chapters import load_chapter
from grpolab.chapters.sweep.cells import run_cell
from grpolab.chapters.sweep.cli import main, parser
from grpolab.chapters.sweep.grid import (
    CELL_SETTINGS,
    KNOBS,
    WALK_LIMIT,
    Cell,
    Grid,
    Planned,
    plan_cell,
    plan_sweep,
)
from grpolab.chapters.sweep.host import Host, cpu_host, find_host
from grpolab.chapters.sweep.loop import _forwarded, run_sweep
from grpolab.chapters.sweep.report import Outcome, chart, figures, table, verdict

__all__ = [
    "CELL_SETTINGS",
    "KNOBS",
    "WALK_LIMIT",
    "Cell",
    "Grid",
    "Host",
    "Outcome",
    "Planned",
    "_forwarded",
    "chart",
    "cpu_host",
    "figures",
    "find_host",
    "load_chapter",
    "main",
    "parser",
    "plan_cell",
    "plan_sweep",
    "run_cell",
    "run_sweep",
    "table",
    "verdict",
]
