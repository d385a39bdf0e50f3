"""The MLflow names of memory figures, with their unit: one home for the unit a run logs its
memory lines in and for the key each figure gets (the harness writes them; notebooks and tests read
them back)."""

from __future__ import annotations

from budgets.units import GIB, MIB

__all__ = ["MEMORY_UNITS", "memory_key", "memory_unit"]

# The unit of a run's memory lines, named in each key. A 16 GB card's lines are tens of MiB to GiBs:
# GiB. The CPU stand-in's are KiB (its 4-bit weights: 77 KiB) beside a GiB runtime: in GiB most read
# 0.00 in MLflow's charts, in MiB each keeps its size (0.07 ... 1280).
MEMORY_UNITS = {"gib": GIB, "mib": MIB}


def memory_unit(on_gpu: bool) -> str:
    """`gib` on a GPU, `mib` on the CPU stand-in (tag `memory_unit` of the run)."""
    return "gib" if on_gpu else "mib"


def memory_key(line: str, figure: str, unit: str) -> str:
    """The MLflow key of a memory line's figure: `base_weights/budget_mib`, `total/measured_gib`."""
    return f"{line}/{figure}_{unit}"
