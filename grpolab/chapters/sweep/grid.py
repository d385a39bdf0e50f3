"""The sweep's grid and its sizing: the cells, each cell's sheet on the host, and the edge past them.

Pure: lab settings and the budget sheet, no processes, no MLflow.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from budgets import BudgetError, compute
from budgets.units import GIB
from grpolab.chapters.sweep.host import Host
from grpolab.config.settings import FLAGS, LabSettingsError, check, flag, lab_settings

KNOBS = ("prompts_per_step", "num_generations", "max_completion_length")
# The settings a cell sets itself: the sweep takes them as grids (--grid-num-generations 4,8,16).
CELL_SETTINGS = ("num_generations", "per_device_train_batch_size", "max_completion_length")
WALK_LIMIT = 4  # past the grid, the group is doubled at most this many times looking for the edge


@dataclass(frozen=True)
class Grid:
    """The values each knob takes; the sweep runs every combination."""

    prompts_per_step: tuple[int, ...]
    num_generations: tuple[int, ...]
    max_completion_length: tuple[int, ...]

    def cells(self) -> list[Cell]:
        return [
            Cell(p, g, c)
            for p in self.prompts_per_step
            for g in self.num_generations
            for c in self.max_completion_length
        ]


@dataclass(frozen=True)
class Cell:
    """One GRPO step's shape: prompts per step x completions per prompt x completion length."""

    prompts_per_step: int
    num_generations: int
    max_completion_length: int

    @property
    def name(self) -> str:
        return f"{self.prompts_per_step}x{self.num_generations}x{self.max_completion_length}"

    def settings(self) -> dict[str, int]:
        """The cell as lab settings: the batch holds whole groups, one optimizer step per batch."""
        return {
            "num_generations": self.num_generations,
            "per_device_train_batch_size": self.prompts_per_step * self.num_generations,
            "max_completion_length": self.max_completion_length,
        }

    def flags(self) -> list[str]:
        return [word for name, value in self.settings().items() for word in (flag(name), str(value))]

    def doubled(self) -> Cell:
        return replace(self, num_generations=2 * self.num_generations)


@dataclass
class Planned:
    """A cell with its settings and its sheet on the host, before it runs."""

    cell: Cell
    settings: Any
    sheet: Any
    where: str = "grid"  # "grid", or "past the grid" (the walk to the edge)

    @property
    def fits(self) -> bool:
        return self.sheet.fits

    @property
    def binding(self) -> str | None:
        """The line the sheet blames when the cell does not fit."""
        return self.sheet.problems[0].name if self.sheet.problems else None

    def summary(self) -> str:
        gib = self.sheet.total_bytes / GIB, self.sheet.capacity_bytes / GIB
        if self.fits:
            return f"{self.cell.name:<12} fits     peak {gib[0]:6.2f} of {gib[1]:.2f} GiB ({self.where})"
        return f"{self.cell.name:<12} REFUSED  {self.sheet.verdict(accepts=FLAGS).removeprefix('does not fit: ')}"


def plan_cell(
    lab_dir: Path, host: Host, overrides: dict[str, Any], cell: Cell, where: str = "grid"
) -> Planned:
    """One cell's settings and its sheet on the host's card (the settings' own `gpu` without one)."""
    settings = lab_settings(lab_dir, host.profile, {**overrides, **cell.settings()})
    check(settings)  # a cell that cannot work at all (a completion longer than the sequence) is bad input
    plan = settings.plan()
    if host.card is not None:
        plan = plan.with_(gpu=host.card, other_processes_gib=host.other_processes_gib)
    return Planned(cell, settings, compute(plan), where)


def plan_sweep(
    lab_dir: Path, host: Host, overrides: dict[str, Any], grid: Grid
) -> tuple[list[Planned], Planned | None]:
    """Every cell's sheet, and the edge: the first cell past the largest that fits.

    When the grid has refused cells the edge is the refused one the sheet misses by least. When all
    fit, the group of the grid's largest cell is doubled until the sheet refuses (at most WALK_LIMIT
    times); the cells found on the way still fit and run too ("past the grid")."""
    planned = [plan_cell(lab_dir, host, overrides, cell) for cell in grid.cells()]
    refused = [p for p in planned if not p.fits]
    if refused:
        return planned, min(refused, key=lambda p: p.sheet.total_bytes)
    fitting = max(planned, key=lambda p: p.sheet.total_bytes).cell
    for _ in range(WALK_LIMIT):
        fitting = fitting.doubled()
        try:
            nxt = plan_cell(lab_dir, host, overrides, fitting, "past the grid")
        except (LabSettingsError, BudgetError):
            return planned, None
        planned.append(nxt)
        if not nxt.fits:
            return planned, nxt
    return planned, None
