"""The harness the labs share, in groups by concern, each importing only the groups below it.

From the bottom up (`GROUPS`; each group's own docstring says its job, its modules and what it may
import, and tests/test_layering.py holds the code to it):

- `config`: what a run is asked to do (the recipe, lab.toml, the flags) and how its process computes.
- `memory`: the card, what a run holds on it, and the budget's lines beside what was measured.
- `lifecycle`: a run's life in MLflow: where it is recorded, how it ends, how it resumes.
- `tiny_model`: the CPU stand-in, a tiny Qwen3 built offline, and its shipped weights.
- `model`: the policy and what it trains with: Unsloth's loader and trainer, precision, CUDA set-up.
- `judging`: did it learn: held-out accuracy, the run doctor, the completions, the Overview, the claims.
- `lab`: one lab run end to end (`run_lab`, `Run`), and the fork server that starts lab processes.
- `chapters`: the machinery of the chapters that are more than one run (arms, sweep, headroom, ship).
- `matrix`: every chapter's claims on every seed and every machine this one can stand in for.

Beside them: `recipe.toml` (the book's recipe) and `__main__` (`python -m grpolab runs`).

`import grpolab` stays light: `Run`, `run_lab` and `exit_process` are imported on first use.

May import: task, budgets, grpolab.lifecycle, grpolab.lab.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GROUPS", "Run", "exit_process", "run_lab"]

GROUPS = ("config", "memory", "lifecycle", "tiny_model", "model", "judging", "lab", "chapters", "matrix")


def __getattr__(name: str) -> Any:
    if name == "Run":
        from grpolab.lab.run import Run

        return Run
    if name == "exit_process":
        from grpolab.lifecycle.endings import exit_process

        return exit_process
    if name == "run_lab":
        from grpolab.lab.session import run_lab

        return run_lab
    raise AttributeError(f"module 'grpolab' has no attribute {name!r}")
